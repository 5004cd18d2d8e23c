"""Public array API: forward and backward RoPE for one tensor or for q and k.

Every function takes NumPy, CuPy, PyTorch or JAX arrays (or any DLPack /
CUDA-array-interface producer) and returns the caller's type. GPU arrays run
the CUDA kernels on the array's own device and on the caller's current stream
(torch's for torch tensors, CuPy's otherwise; ``stream=`` overrides). Host
arrays run the float64 NumPy reference and are cast back to their dtype.

Shapes, by ``config.layout``:
  * ``"bshd"``: x ``[B, S, H, D]``; positions ``[S]`` or ``[B, S]``
  * ``"bhsd"``: x ``[B, H, S, D]``; positions ``[S]`` or ``[B, S]``
  * ``"thd"``:  x ``[T, H, D]`` (packed tokens); positions ``[T]``
With a multi-stream config (``stream_map``), positions gain a leading stream
axis ``[n_streams, ...]``. Positions are int32 or int64; without them token s
of a sequence sits at ``offset + seq_offsets[b] + s``; with them at
``offset + seq_offsets[b] + positions[..]``. dtypes: float32, float16,
bfloat16 (math in fp32, angles in float64). Any stride for batch, sequence and
head dims; the last dim must be contiguous.
"""
from __future__ import annotations

import threading

import numpy as np

from . import reference
from ._core.arrays import FLOAT_DTYPES, INDEX_DTYPES, describe, empty_like, overlaps, wrap_like
from .config import RopeConfig

MAX_TOKENS = 2 ** 31 - 1  # the kernel indexes tokens in 32 bits

__all__ = ["rope_forward", "rope_backward", "rope_qk_forward", "rope_qk_backward"]


def rope_forward(x, config: RopeConfig, *, positions=None, offset: int = 0, seq_offsets=None,
                 out=None, inplace: bool = False, stream=None):
    """Rotate ``x`` by its positions. Returns the rotated array (``x`` itself
    when ``inplace``; ``out`` when given). See the module docstring for shapes."""
    return _rope((x,), ("x",), config, False, positions, offset, seq_offsets,
                 None if out is None else (out,), inplace, stream)[0]


def rope_backward(grad_out, config: RopeConfig, *, positions=None, offset: int = 0,
                  seq_offsets=None, out=None, inplace: bool = False, stream=None):
    """Gradient of ``rope_forward`` w.r.t. its input: the transposed rotation
    (sin → −sin) with the same positions, table and scale."""
    return _rope((grad_out,), ("grad_out",), config, True, positions, offset, seq_offsets,
                 None if out is None else (out,), inplace, stream)[0]


def rope_qk_forward(q, k, config: RopeConfig, *, positions=None, offset: int = 0,
                    seq_offsets=None, out=None, inplace: bool = False, stream=None):
    """Rotate q and k in one launch; cos/sin are computed once per (token, pair)
    and shared by every head of both. q and k share B, S (or T), D and dtype;
    their head counts may differ (GQA/MQA). ``out``: a (q_out, k_out) pair.
    Returns (q_rotated, k_rotated)."""
    return _rope((q, k), ("q", "k"), config, False, positions, offset, seq_offsets,
                 _pair(out), inplace, stream)


def rope_qk_backward(grad_q, grad_k, config: RopeConfig, *, positions=None, offset: int = 0,
                     seq_offsets=None, out=None, inplace: bool = False, stream=None):
    """Gradients of ``rope_qk_forward`` w.r.t. q and k, in one launch."""
    return _rope((grad_q, grad_k), ("grad_q", "grad_k"), config, True, positions, offset,
                 seq_offsets, _pair(out), inplace, stream)


def _pair(out):
    if out is None:
        return None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a (q_out, k_out) pair")
    return tuple(out)


def _canon(shape_or_strides, layout):
    """(B, S, H) sizes or strides from a tensor's shape/strides."""
    s = shape_or_strides
    if layout == "bshd":
        return s[0], s[1], s[2]
    if layout == "bhsd":
        return s[0], s[2], s[1]
    return 1, s[0], s[1]


def _canon_strides(strides, layout):
    if layout == "thd":
        return 0, strides[0], strides[1]
    return _canon(strides, layout)


def _check_tensor(info, name, config):
    if info.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float32, float16 or bfloat16, got {info.dtype}")
    want = 3 if config.layout == "thd" else 4
    if len(info.shape) != want:
        dims = {"bshd": "[B, S, H, D]", "bhsd": "[B, H, S, D]", "thd": "[T, H, D]"}[config.layout]
        raise ValueError(f"{name} must be {dims} for layout {config.layout!r}, "
                         f"got shape {tuple(info.shape)}")
    d = info.shape[-1]
    if config.rotary_dim > d:
        raise ValueError(f"rotary_dim ({config.rotary_dim}) must be <= the head dim of "
                         f"{name} ({d})")
    if info.strides[-1] != 1 and d > 1 and info.size > 0:
        raise ValueError(f"{name}: the last (head) dim must be contiguous (stride 1), "
                         f"got stride {info.strides[-1]}")
    if config.per_head:
        h = _canon(info.shape, config.layout)[2]
        if config.inv_freq.shape[0] != h:
            raise ValueError(f"{name} has {h} heads but the per-head inv_freq table has "
                             f"{config.inv_freq.shape[0]} rows")


def _check_out(out, src, name):
    if out.kind != src.kind:
        raise TypeError(f"{name} must be a {src.kind} array like its input, got {out.kind}")
    if out.kind == "jax":
        raise TypeError("JAX arrays are immutable: out= and inplace=True are not supported for them")
    if tuple(out.shape) != tuple(src.shape) or out.dtype != src.dtype:
        raise ValueError(f"{name} must have shape {tuple(src.shape)} and dtype {src.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if out.device != src.device:
        raise ValueError(f"{name} is on device {out.device} but its input is on {src.device}")
    if out.strides[-1] != 1 and out.shape[-1] > 1 and out.size > 0:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1)")


def _check_writable(info, name):
    flags = getattr(info.array, "flags", None)
    if flags is not None and hasattr(flags, "writeable") and not flags.writeable:
        raise ValueError(f"{name} is read-only")


def _same_view(a, b):
    return a.ptr == b.ptr and tuple(a.strides) == tuple(b.strides)


def _check_index(info, name, device, shapes):
    if info.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must have dtype int32 or int64, got {info.dtype}")
    if info.device != device:
        where = "host" if info.device < 0 else f"cuda:{info.device}"
        there = "host" if device < 0 else f"cuda:{device}"
        raise ValueError(f"{name} is on {where} but the tensors are on {there}")
    if tuple(info.shape) not in shapes:
        raise ValueError(f"{name} must have shape " + " or ".join(str(list(s)) for s in shapes)
                         + f", got {list(info.shape)}")


def _validate_call(xs, names, config, outs, inplace):
    """Describe and check the rotated tensors and the outputs (shared with
    cuprope.tables). ``config`` needs ``layout``, ``rotary_dim``, ``per_head``.
    Returns (infos, out_infos or None, (B, S, D))."""
    infos = [describe(x, n) for x, n in zip(xs, names)]
    for info, n in zip(infos, names):
        _check_tensor(info, n, config)
    layout = config.layout
    b, s, _ = _canon(infos[0].shape, layout)
    d = infos[0].shape[-1]
    if len(infos) == 2:
        q, k = infos
        if q.kind != k.kind:
            raise TypeError(f"{names[0]} and {names[1]} must come from the same framework, "
                            f"got {q.kind} and {k.kind}")
        if q.device != k.device:
            raise ValueError(f"{names[0]} and {names[1]} are on different devices "
                             f"({q.device} and {k.device})")
        if q.dtype != k.dtype:
            raise TypeError(f"{names[0]} and {names[1]} must share a dtype, got {q.dtype} and {k.dtype}")
        bk, sk, _ = _canon(k.shape, layout)
        if (b, s) != (bk, sk):
            what = "token count" if layout == "thd" else "batch and sequence sizes"
            raise ValueError(f"{names[0]} and {names[1]} must have the same {what}, "
                             f"got {(b, s)} and {(bk, sk)}")
        if k.shape[-1] != d:
            raise ValueError(f"{names[0]} and {names[1]} must have the same head dim, "
                             f"got {d} and {k.shape[-1]}")
    if b * s > MAX_TOKENS:
        raise ValueError(f"at most {MAX_TOKENS} tokens (B*S) per call, got {b * s}")

    out_infos = None
    if inplace:
        if outs is not None:
            raise ValueError("give either out= or inplace=True, not both")
        if infos[0].kind == "jax":
            raise TypeError("JAX arrays are immutable: inplace=True is not supported for them")
        for info, n in zip(infos, names):
            _check_writable(info, n)
        out_infos = infos
    elif outs is not None:
        out_infos = [describe(o, "out") for o in outs]
        for o, src in zip(out_infos, infos):
            _check_out(o, src, "out")
            _check_writable(o, "out")
    if out_infos is not None:
        for i, o in enumerate(out_infos):
            for j, src in enumerate(infos):
                if overlaps(o, src) and not (i == j and _same_view(o, src)):
                    raise ValueError("out overlaps an input without being exactly that input; "
                                     "use inplace=True (or out=input) for in-place rotation")
        if len(out_infos) == 2 and overlaps(out_infos[0], out_infos[1]):
            raise ValueError("the two outputs overlap")

    return infos, out_infos, (b, s, d)


def _empty_result(infos, out_infos):
    res = [o.obj for o in out_infos] if out_infos else [wrap_like(i, empty_like(i)) for i in infos]
    return tuple(res)


def _fast_key(kind, xs, config, inverse, idx1, idx2, outs, inplace, stream):
    """The fast-path cache key of a call about to take the general path, or
    None when its framework has no fast path (or stream= was given)."""
    if stream is not None:
        return None
    fw = _fast_adapter(kind)
    if fw is None:
        return None
    try:
        return fw[0](xs, config, inverse, idx1, idx2, outs, inplace)
    except _NoFastPath:
        return None


def _rope(xs, names, config, inverse, positions, offset, seq_offsets, outs, inplace, stream):
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    res = _fast_path(xs, config, inverse, positions, offset, seq_offsets, outs, inplace, stream)
    if res is not None:
        return res
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    offset = int(offset)
    if not -(2 ** 62) < offset < 2 ** 62:
        raise ValueError(f"offset out of range: {offset}")
    infos, out_infos, (b, s, d) = _validate_call(xs, names, config, outs, inplace)
    layout = config.layout
    device = infos[0].device

    # positions
    n_str = config.n_streams
    if layout == "thd":
        pshapes = [(s,)] if n_str == 1 else [(n_str, s)]
    else:
        pshapes = [(s,), (b, s)] if n_str == 1 else [(n_str, s), (n_str, b, s)]
    pos_info = seq_info = None
    if positions is not None:
        pos_info = describe(positions, "positions")
        _check_index(pos_info, "positions", device, pshapes)
    if seq_offsets is not None:
        seq_info = describe(seq_offsets, "seq_offsets")
        _check_index(seq_info, "seq_offsets", device, [(b,)])
        if seq_info.strides[0] != 1 and b > 1:
            raise ValueError("seq_offsets must be contiguous")

    if all(i.size == 0 for i in infos):
        return _empty_result(infos, out_infos)
    if device < 0:
        return _numpy_backend(infos, out_infos, config, inverse, pos_info, seq_info, offset)
    cache_key = _fast_key(infos[0].kind, xs, config, inverse, positions, seq_offsets, outs,
                          inplace, stream)
    return _gpu_backend(infos, out_infos, config, inverse, pos_info, seq_info, offset, stream,
                        (b, s, d), cache_key)


# ---------------------------------------------------------------- NumPy backend

def _to_numpy(info):
    a = info.array
    if info.kind == "torch":
        if info.dtype == "bfloat16":
            import ml_dtypes
            import torch
            return a.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return a.numpy()
    return np.asarray(a)


def _from_numpy(info, arr):
    if info.kind == "torch":
        import torch
        if info.dtype == "bfloat16":
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)
    return wrap_like(info, arr)


def _to_canon(a, layout):
    if layout == "bhsd":
        return a.transpose(0, 2, 1, 3)
    if layout == "thd":
        return a[None]
    return a


def _numpy_backend(infos, out_infos, config, inverse, pos_info, seq_info, offset):
    layout = config.layout
    b, s, _ = _canon(infos[0].shape, layout)
    pos = reference.token_positions(
        b, s, positions=None if pos_info is None else _to_numpy(pos_info), offset=offset,
        seq_offsets=None if seq_info is None else _to_numpy(seq_info), n_streams=config.n_streams)
    angles = reference.pair_angles(pos, config.inv_freq, config.stream_map)
    results = []
    for i, info in enumerate(infos):
        x = _to_numpy(info)
        y = reference.rotate(_to_canon(x, layout).astype(np.float64), angles,
                             rotary_dim=config.rotary_dim, interleaved=config.interleaved,
                             scale=config.scale, inverse=inverse)
        y = y[0] if layout == "thd" else (y.transpose(0, 2, 1, 3) if layout == "bhsd" else y)
        y = reference.round_to_dtype(y, x.dtype)
        results.append(y)
    if out_infos is None:
        return tuple(_from_numpy(info, y) for info, y in zip(infos, results))
    for o, y in zip(out_infos, results):  # all computed before any is written
        _to_numpy(o)[...] = y
    return tuple(o.obj for o in out_infos)


# ---------------------------------------------------------------- GPU backend

def _stream_ptr(stream, info):
    if stream is not None:
        if isinstance(stream, (int, np.integer)):
            return int(stream)
        if hasattr(stream, "cuda_stream"):
            return int(stream.cuda_stream)
        if hasattr(stream, "__cuda_stream__"):
            return int(stream.__cuda_stream__()[1])
        if hasattr(stream, "ptr"):
            return int(stream.ptr)
        raise TypeError(f"stream must be a stream object or a raw cudaStream_t int, "
                        f"got {type(stream).__name__}")
    if info.kind == "torch":
        import torch
        return torch.cuda.current_stream(info.device).cuda_stream
    import cupy
    with cupy.cuda.Device(info.device):
        return cupy.cuda.get_current_stream().ptr


def _gpu_backend(infos, out_infos, config, inverse, pos_info, seq_info, offset, stream, bsd,
                 cache_key=None):
    b, s, d = bsd
    device = infos[0].device
    stream_ptr = _stream_ptr(stream, infos[0])
    copy_rest, outs_given, out_infos = _outputs(infos, out_infos)
    # Only what the plan key needs is computed before the lookup.
    pos = None
    if pos_info is not None:
        st, shp = pos_info.strides, pos_info.shape
        if config.n_streams == 1:
            pst_stream, rest, rest_shape = 0, st, shp
        else:
            pst_stream, rest, rest_shape = st[0], st[1:], shp[1:]
        psb, pss = (0, rest[0]) if len(rest_shape) == 1 else rest
        pos = (int(pos_info.dtype == "int64"), pst_stream, psb, pss)
    seq64 = None if seq_info is None else seq_info.dtype == "int64"
    # Plans are reused for calls with the same signature (any framework).
    gkey = ("G", threading.get_ident(), inverse, copy_rest, device, pos, seq64,
            tuple((i.dtype, tuple(i.shape), i.strides, i.ptr % 16) for i in infos),
            tuple((o.strides, o.ptr % 16) for o in out_infos))
    entry = config._plans.get(gkey)
    if entry is None:
        from ._core.launch import make_plan

        inv_freq, smap = config.device_tables(device)
        plan = make_plan(
            device=device, dtype=infos[0].dtype, interleaved=config.interleaved,
            plans=_tensor_plans(infos, out_infos, config.layout),
            n_batch=b, n_seq=s, head_dim=d, rot_dim=config.rotary_dim, copy_rest=copy_rest,
            pos=pos, seq_off=seq64, inv_freq_ptr=inv_freq.data.ptr,
            freq_sh=config.rotary_dim // 2 if config.per_head else 0,
            stream_map_ptr=0 if smap is None else smap.data.ptr, scale=config.scale,
            sin_sign=-1.0 if inverse else 1.0)
        config._plans[gkey] = (plan, None)
    else:
        plan = entry[0]
    return _run_plan(plan, config, infos, out_infos, outs_given, stream_ptr,
                     0 if pos_info is None else pos_info.ptr,
                     0 if seq_info is None else seq_info.ptr, offset, cache_key)


def _outputs(infos, out_infos):
    """(copy_rest, outs_given, out_infos): whether dims >= R must be copied
    (out-of-place), whether the caller gave outputs, and the outputs
    (allocated like the inputs when not given)."""
    copy_rest = out_infos is None or not all(_same_view(o, i) for o, i in zip(out_infos, infos))
    outs_given = out_infos is not None and not all(o is i for o, i in zip(out_infos, infos))
    if out_infos is None:
        out_infos = [describe(empty_like(i), "out") for i in infos]
    return copy_rest, outs_given, out_infos


def _tensor_plans(infos, out_infos, layout):
    from ._core.launch import TensorPlan
    return [TensorPlan(i.ptr, o.ptr, _canon_strides(i.strides, layout),
                       _canon_strides(o.strides, layout), _canon(i.shape, layout)[2])
            for i, o in zip(infos, out_infos)]


def _run_plan(plan, config, infos, out_infos, outs_given, stream_ptr, idx1, idx2, offset,
              cache_key):
    """Launch ``plan`` (on the tensors' device), remember it for the fast path
    under ``cache_key`` and hand the outputs back in the caller's framework.
    idx1, idx2: the positions and sequence-offset pointers (cos and sin for
    the table source)."""
    import cupy

    device = infos[0].device
    ptrs = (infos[0].ptr, infos[-1].ptr, out_infos[0].ptr, out_infos[-1].ptr, idx1, idx2)
    if cupy.cuda.runtime.getDevice() != device:
        with cupy.cuda.Device(device):
            plan.run(stream_ptr, *ptrs, offset)
    else:
        plan.run(stream_ptr, *ptrs, offset)
    if cache_key is not None:
        spans = None
        if outs_given:
            spans = ([_span(i) for i in infos], [_span(o) for o in out_infos])
        config._plans[cache_key] = (plan, spans)
    if infos[0].kind == "jax":
        # JAX reads the result on its own stream; make it complete first.
        cupy.cuda.runtime.streamSynchronize(stream_ptr)
    return tuple(wrap_like(i, o.obj) for i, o in zip(infos, out_infos))


# ---------------------------------------------------------------- fast path
#
# A call made only of torch CUDA tensors, or only of CuPy arrays, whose shapes,
# strides, dtypes, devices and settings were seen before on this thread reuses
# the validated launch plan: per call it reads the pointers, allocates outputs
# as the general path would and launches. Anything unusual (out= that may
# overlap, misalignment, another current device, a stream= argument) takes the
# general path above, which validates and raises as usual.
#
# A framework is an adapter tuple (key, ptr, alloc, stream, current_device):
#   key(xs, config, inverse, positions, seq_offsets, outs, inplace): the plan
#       cache key, or _NoFastPath when an argument is not of that framework;
#   ptr(a): data pointer; alloc(x): a new output laid out as the general
#   path's; stream(device): the current stream's handle; current_device().
# _FAST maps the module of the framework's array type to its adapter; an
# adapter is built when a call of its framework first takes the general path.

_FAST: dict = {}


class _NoFastPath(Exception):
    pass


def _span(info):
    """Byte range [lo, hi) the tensor can touch, relative to its data pointer."""
    lo, hi = info.extent()
    return (lo - info.ptr, hi - info.ptr)


def _fast_adapter(kind):
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


def _fast_path(xs, config, inverse, positions, offset, seq_offsets, outs, inplace, stream):
    """Result tuple, or None when the general path must run."""
    if not config._plans or stream is not None or (inplace and outs is not None):
        return None
    if type(offset) is not int or not -(2 ** 62) < offset < 2 ** 62:
        return None
    fw = _FAST.get(type(xs[0]).__module__)
    if fw is None:
        return None
    key_fn, ptr, alloc, current_stream, current_device = fw
    try:
        key = key_fn(xs, config, inverse, positions, seq_offsets, outs, inplace)
    except _NoFastPath:
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
        raise _NoFastPath
    return (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() % 16)  # cos/sin tables: aligned


def _torch_key(xs, config, inverse, positions, seq_offsets, outs, inplace):
    """Cache key for a call made only of torch CUDA tensors (else _NoFastPath)."""
    parts = [threading.get_ident(), inverse, inplace]
    for x in xs:
        if type(x).__module__ != "torch" or not x.is_cuda:
            raise _NoFastPath
        parts.append((x.dtype, x.shape, x.stride(), x.device, x.data_ptr() % 16))
    if inplace and len(xs) == 2:
        parts.append(xs[1].data_ptr() - xs[0].data_ptr())
    if outs is not None:
        for o in outs:
            if type(o).__module__ != "torch" or not o.is_cuda:
                raise _NoFastPath
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
            raise _NoFastPath
        data = a.data
        return (a.dtype, a.shape, a.strides, data.device_id, data.ptr % 16)

    def index_part(a):
        return None if a is None else part(a)

    def key(xs, config, inverse, positions, seq_offsets, outs, inplace):
        """Cache key for a call made only of CuPy arrays (else _NoFastPath)."""
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
