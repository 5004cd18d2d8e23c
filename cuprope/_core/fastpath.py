"""The fast path: a repeated call skips validation and plan building.

A call made only of torch CUDA tensors, or only of CuPy arrays, whose shapes,
strides, dtypes, devices and settings were seen before on this thread reuses
the validated launch plan: per call it reads the pointers, allocates outputs
as the general path would and launches. Anything unusual (out= that may
overlap, misalignment, another current device, a stream= argument) takes the
general path (cuprope/_core/engine.py), which validates and raises as usual.

The general path registers its plan under :func:`fast_key` after a launch
(engine.run_plan); :func:`fast_path` looks it up. ``owner`` is whatever holds
the plan cache in ``_plans`` (a RopeConfig, or a table source).
"""
from __future__ import annotations

import threading

from .validate import MAX_POSITION

# A framework is an adapter tuple (key, ptr, alloc, stream, current_device):
#   key(xs, config, inverse, positions, seq_offsets, outs, inplace): the plan
#       cache key, or NoFastPath when an argument is not of that framework;
#   ptr(a): data pointer; alloc(x): a new output laid out as the general
#   path's; stream(device): the current stream's handle; current_device().
# _FAST maps the module of the framework's array type to its adapter; an
# adapter is built when a call of its framework first takes the general path.

_FAST: dict = {}


class NoFastPath(Exception):
    pass


def span(info):
    """Byte range [lo, hi) the tensor can touch, relative to its data pointer."""
    lo, hi = info.extent()
    return (lo - info.ptr, hi - info.ptr)


def fast_adapter(kind):
    """The adapter for arrays of ``kind`` ("torch" or "cupy"), registered in
    _FAST on first use; None for other kinds."""
    if kind == "torch":
        mod, build = "torch", _torch_adapter
    elif kind == "cupy":
        import cupy
        mod, build = cupy.ndarray.__module__, _cupy_adapter
    else:
        return None
    fw = _FAST.get(mod)
    if fw is None:
        fw = _FAST[mod] = build()
    return fw


def fast_key(kind, xs, config, inverse, idx1, idx2, outs, inplace, stream):
    """The fast-path cache key of a call about to take the general path, or
    None when its framework has no fast path (or stream= was given)."""
    if stream is not None:
        return None
    fw = fast_adapter(kind)
    if fw is None:
        return None
    try:
        return fw[0](xs, config, inverse, idx1, idx2, outs, inplace)
    except NoFastPath:
        return None


def remember(owner, key, plan, infos, out_infos, outs_given):
    """Register ``plan`` for the fast path under ``key`` (None: nothing to do),
    with the byte spans its overlap checks need when outputs are given."""
    if key is None:
        return
    spans = None
    if outs_given:
        spans = ([span(i) for i in infos], [span(o) for o in out_infos])
    owner._plans[key] = (plan, spans)


def fast_path(xs, config, inverse, positions, offset, seq_offsets, outs, inplace, stream):
    """Result tuple, or None when the general path must run."""
    if not config._plans or stream is not None or (inplace and outs is not None):
        return None
    if type(offset) is not int or not -MAX_POSITION <= offset <= MAX_POSITION:
        return None
    fw = _FAST.get(type(xs[0]).__module__)
    if fw is None:
        return None
    key_fn, ptr, alloc, current_stream, current_device = fw
    try:
        key = key_fn(xs, config, inverse, positions, seq_offsets, outs, inplace)
    except NoFastPath:
        return None
    entry = config._plans.get(key)
    if entry is None:
        return None
    plan, spans = entry
    dev = plan.device  # the key holds the device
    if current_device() != dev:
        return None
    in0, in1 = ptr(xs[0]), ptr(xs[-1])
    if outs is not None:
        # an output touching any input's byte range, or the other output's:
        # let the general path decide (it checks exactly, and raises)
        prev = None
        for o, (olo, ohi) in zip(outs, spans[1]):
            po = ptr(o)
            lo, hi = po + olo, po + ohi
            for px, (xlo, xhi) in zip((in0, in1), spans[0]):
                if lo < px + xhi and px + xlo < hi:
                    return None
            if prev is not None and lo < prev[1] and prev[0] < hi:
                return None
            prev = (lo, hi)
        res = tuple(outs)
    else:
        res = xs if inplace else tuple([alloc(x) for x in xs])
    out0, out1 = ptr(res[0]), ptr(res[-1])
    if (out0 | out1) % plan.align:
        return None
    plan.run(current_stream(dev), in0, in1, out0, out1,
             0 if positions is None else ptr(positions),
             0 if seq_offsets is None else ptr(seq_offsets), offset)
    return tuple(res)


# torch


def _index_key(t):
    if t is None:
        return None
    if type(t).__module__ != "torch" or not t.is_cuda:
        raise NoFastPath
    return (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() % 16)  # cos/sin tables: aligned


def _torch_key(xs, config, inverse, positions, seq_offsets, outs, inplace):
    """Cache key for a call made only of torch CUDA tensors (else NoFastPath)."""
    parts = [threading.get_ident(), inverse, inplace]
    for x in xs:
        if type(x).__module__ != "torch" or not x.is_cuda:
            raise NoFastPath
        parts.append((x.dtype, x.shape, x.stride(), x.device, x.data_ptr() % 16))
    if inplace and len(xs) == 2:
        parts.append(xs[1].data_ptr() - xs[0].data_ptr())
    if outs is not None:
        for o in outs:
            if type(o).__module__ != "torch" or not o.is_cuda:
                raise NoFastPath
            parts.append((o.dtype, o.shape, o.stride(), o.device, o.data_ptr() % 16))
    parts.append(_index_key(positions))
    parts.append(_index_key(seq_offsets))
    return tuple(parts)


def _torch_adapter():
    import cupy
    import torch

    stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if stream is None:
        def stream(device):
            return torch.cuda.current_stream(device).cuda_stream
    # torch.empty_like: what the general path allocates (requires_grad=False)
    return (_torch_key, torch.Tensor.data_ptr, torch.empty_like, stream,
            cupy.cuda.runtime.getDevice)


# CuPy


def _cupy_adapter():
    import operator

    import cupy

    ndarray, empty, get_stream = cupy.ndarray, cupy.empty, cupy.cuda.get_current_stream

    def part(a):
        if type(a) is not ndarray:
            raise NoFastPath
        data = a.data
        return (a.dtype, a.shape, a.strides, data.device_id, data.ptr % 16)

    def index_part(a):
        return None if a is None else part(a)

    def key(xs, config, inverse, positions, seq_offsets, outs, inplace):
        """Cache key for a call made only of CuPy arrays (else NoFastPath)."""
        parts = ["cupy", threading.get_ident(), inverse, inplace]
        for x in xs:
            parts.append(part(x))
        if inplace and len(xs) == 2:
            parts.append(xs[1].data.ptr - xs[0].data.ptr)
        if outs is not None:
            for o in outs:
                parts.append(part(o))
        parts.append(index_part(positions))
        parts.append(index_part(seq_offsets))
        return tuple(parts)

    def alloc(x):
        # C-contiguous on the current device (checked to be x's): as
        # _arrays.empty_like, so the strides match those the plan was made for
        return empty(x.shape, dtype=x.dtype)

    def stream(device):
        return get_stream().ptr  # the current device's (checked to be ``device``)

    return (key, operator.attrgetter("data.ptr"), alloc, stream, cupy.cuda.runtime.getDevice)
