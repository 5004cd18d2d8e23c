"""The fast paths: a repeated call skips validation and planning. A call made
only of torch CUDA tensors, or only of CuPy arrays, whose arrays' (dtype,
shape, strides, device, 16-byte alignment) and settings were seen before on
this thread replays the launcher.Plan the general path built and validated
for them (``Plan.run`` with the new pointers). Anything unusual (stream=,
check=True, another current device, an overlap not validated before) takes
the general path. Every op with a fast path uses this one implementation; the
entries live in the owner's ``cuprope.config.LaunchCache.fast``.
"""
from __future__ import annotations

import threading

from .validate import MAX_POSITION

# A framework is an adapter tuple (collect, ptr, alloc, stream, current_device):
#   collect(arrays, key, ptrs): appends each array's signature to the list
#       ``key`` and its pointer to ``ptrs`` (None and 0 for None), or raises
#       NoFastPath when an array is not of that framework;
#   ptr(a): data pointer; alloc(x): a new output laid out as the general
#   path's; stream(device): the current stream's handle; current_device().
# _FAST maps the module of the framework's array type to its adapter; an
# adapter is built when a call of its framework first takes the general path.

_FAST: dict = {}
get_ident = threading.get_ident


class NoFastPath(Exception):
    pass


def span(info):
    """Byte range [lo, hi) the array can touch, relative to its data pointer
    (None for an empty array: it overlaps nothing)."""
    if info is None or info.size == 0:
        return None
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


def adapter_of(x):
    """The registered adapter for ``x``'s framework, or None."""
    return _FAST.get(type(x).__module__)


class Entry:
    """The launches registered under one key: ``guards`` (i, j, lo, hi), the
    windows of ptrs[j] - ptrs[i] where arrays i and j may overlap;
    ``variants`` maps the differences inside their windows (None outside) to
    a launch; ``variant(ptrs)`` gives those differences (a function compiled
    from the guards' integers: one expression per guard, no loop).

    The guards come from ``pairs``, the (i, j) array pairs the general path
    checks for overlap. For each, the byte ranges intersect only when
    ptrs[j] - ptrs[i] lies in a window that the arrays' spans fix (the key
    fixes the spans); a call whose differences fall in windows uses only a
    launch registered with exactly those differences (same overlap verdict,
    same "is the output this input" decisions), so e.g. q and k slices of
    one fused qkv tensor stay fast."""

    __slots__ = ("guards", "variants", "variant")

    def __init__(self, guards):
        self.guards, self.variants = guards, {}
        terms = "".join(f"(d if {int(lo)} < (d := p[{int(j)}] - p[{int(i)}]) < {int(hi)} "
                        f"else None), " for i, j, lo, hi in guards)
        ns: dict = {}
        exec(f"def variant(p):\n    return ({terms})\n", ns)  # noqa: S102 - integers only
        self.variant = ns["variant"]

    def launch(self, ptrs):
        """The launch registered for these pointers' differences, or None
        (fast_call makes the same lookup inline)."""
        return self.variants.get(self.variant(ptrs) if self.guards else ())


def ticket(fw, header, arrays, pairs=()):
    """(key, ptrs, pairs) of a call whose arrays are all of ``fw``'s framework
    (on a GPU), else None (also for fw None: no fast path for the framework)."""
    if fw is None:
        return None
    key, ptrs = list(header), []
    try:
        fw[0](arrays, key, ptrs)
    except NoFastPath:
        return None
    return tuple(key), ptrs, pairs


def remember(plans, tkt, spans, payload):
    """Register ``payload`` (a Plan) in ``plans`` (a LaunchCache.fast) under
    the ticket's key and pointer differences (None ticket: nothing to do).
    ``spans``: span() of each array a pair names, by index."""
    if tkt is None:
        return
    key, ptrs, pairs = tkt
    entry = plans.get(key)
    if entry is None:
        guards = []
        for i, j in pairs:
            a, b = spans[i], spans[j]
            if a is not None and b is not None:
                guards.append((i, j, a[0] - b[1], a[1] - b[0]))
        entry = plans[key] = Entry(tuple(guards))
    entry.variants[entry.variant(ptrs)] = payload


def registered(plans, tkt):
    """The launch registered under the ticket's key and pointer differences
    (whichever device is current), or None (also for a None ticket): a
    general-path call that has validated its arrays reuses it."""
    if tkt is None:
        return None
    entry = plans.get(tkt[0])
    return None if entry is None else entry.launch(tkt[1])


def lookup(plans, key, ptrs, current_device):
    """The launch registered for this key and these pointers, or None (also
    when another device is current)."""
    entry = plans.get(key)
    hit = None if entry is None else entry.launch(ptrs)
    if hit is None or current_device() != hit.device:
        return None
    return hit


def fast_call(plans, fw, header, arrays):
    """Run the Plan registered for ``arrays`` (its per-call words taken from
    their pointers) and return True, or return False: the general path must
    run. ``fw``: adapter_of(arrays[0]). (ticket and lookup, inline: this is
    every fast call's host time.)"""
    if not plans or fw is None:
        return False
    key, ptrs = list(header), []
    try:
        fw[0](arrays, key, ptrs)
        entry = plans.get(tuple(key))
    except NoFastPath:
        return False
    except TypeError:  # an unhashable setting: the general path says what is wrong
        return False
    if entry is None:
        return False
    hit = entry.variants.get(entry.variant(ptrs) if entry.guards else ())
    if hit is None or fw[4]() != hit.device:
        return False
    hit.run(fw[3](hit.device), *ptrs)
    return True


# The core (rope_call, tables): arrays xs, then the given outputs, then the
# two index arrays (positions and sequence offsets, or cos and sin).


def _rope_ticket(fw, xs, inverse, idx1, idx2, outs, inplace, pdl=False):
    """The core's ticket (fast_path builds the same key inline)."""
    n = len(xs)
    pairs = ((0, 1),) if inplace and n == 2 else ()
    if outs is not None:
        pairs = tuple((i, n + j) for i in range(n) for j in range(len(outs))) + (
            ((n, n + 1),) if len(outs) == 2 else ())
    arrays = xs + (idx1, idx2) if outs is None else (*xs, *outs, idx1, idx2)
    return ticket(fw, ("rope", get_ident(), inverse, inplace, outs is None, pdl), arrays, pairs)


def fast_key(kind, xs, config, inverse, idx1, idx2, outs, inplace, stream, pdl=False):
    """The fast-path ticket of a core call about to take the general path, or
    None when its framework has no fast path (or stream= was given).
    ``pdl``: enable_pdl, part of the key (a plan launches with it or not)."""
    if stream is not None:
        return None
    fw = fast_adapter(kind)
    if fw is None:
        return None
    return _rope_ticket(fw, xs, inverse, idx1, idx2, outs, inplace, pdl)


def remember_rope(owner, tkt, plan, infos, out_infos):
    """Register a core plan that has just launched (cuprope.rope.engine.run_plan)."""
    if tkt is not None:
        remember(owner._launches.fast, tkt,
                 [span(i) for i in infos] + [span(o) for o in out_infos], plan)


def fast_path(xs, config, inverse, positions, offset, seq_offsets, outs, inplace, stream,
              pdl=False):
    """Result tuple of a core call, or None when the general path must run."""
    fast = config._launches.fast
    if not fast or stream is not None or (inplace and outs is not None):
        return None
    if type(offset) is not int or not -MAX_POSITION <= offset <= MAX_POSITION:
        return None
    fw = _FAST.get(type(xs[0]).__module__)
    if fw is None:
        return None
    key, ptrs = ["rope", get_ident(), inverse, inplace, outs is None, pdl], []
    try:
        fw[0](xs + (positions, seq_offsets) if outs is None else (*xs, *outs, positions,
                                                                   seq_offsets), key, ptrs)
    except NoFastPath:
        return None
    plan = lookup(fast, tuple(key), ptrs, fw[4])
    if plan is None:
        return None
    n = len(xs)
    if outs is not None:
        res = tuple(outs)
        out0, out1 = ptrs[n], ptrs[2 * n - 1]
    elif inplace:
        res = xs
        out0, out1 = ptrs[0], ptrs[n - 1]
    else:
        ptr, alloc = fw[1], fw[2]
        res = tuple([alloc(x) for x in xs])
        out0, out1 = ptr(res[0]), ptr(res[-1])
        if (out0 | out1) % plan.align:
            return None
    plan.run(fw[3](plan.device), ptrs[0], ptrs[n - 1], out0, out1, ptrs[-2], ptrs[-1], offset)
    return tuple(res)


# torch


def torch_collector(min_device=0):
    """``collect`` for torch tensors: a tensor of exactly torch.Tensor on a
    CUDA device (get_device() >= min_device; -1 lets CPU tensors in, for
    tests and host-only timing) adds (dtype, shape, strides, device, pointer
    mod 16) to the key."""
    import torch
    tensor = torch.Tensor

    def collect(arrays, key, ptrs):
        for t in arrays:
            if t is None:
                key.append(None)
                ptrs.append(0)
                continue
            if type(t) is not tensor:
                raise NoFastPath
            dev = t.get_device()
            if dev < min_device:
                raise NoFastPath
            p = t.data_ptr()
            ptrs.append(p)
            key += (t.dtype, t.shape, t.stride(), dev, p & 15)

    return collect


def _torch_adapter():
    import cupy
    import torch

    stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if stream is None:
        def stream(device):
            return torch.cuda.current_stream(device).cuda_stream
    # torch.empty_like: what the general path allocates (requires_grad=False).
    # The current device is the runtime's (cudaGetDevice), which the driver
    # launch runs on: torch's may be a lazily set target device that is not
    # yet current.
    return (torch_collector(), torch.Tensor.data_ptr, torch.empty_like, stream,
            cupy.cuda.runtime.getDevice)


# CuPy


def _cupy_adapter():
    import operator

    import cupy

    ndarray, empty, get_stream = cupy.ndarray, cupy.empty, cupy.cuda.get_current_stream

    def part(a):
        """(pointer, signature) of a CuPy array (NoFastPath for another type)."""
        if type(a) is not ndarray:
            raise NoFastPath
        data = a.data
        p = data.ptr
        return p, (a.dtype, a.shape, a.strides, data.device_id, p & 15)

    def collect(arrays, key, ptrs):
        # a signature per array (nested: the torch collector's flat key is
        # its hot path, this one's is not)
        for p, sig in [(0, None) if a is None else part(a) for a in arrays]:
            ptrs.append(p)
            key.append(sig)

    def alloc(x):
        # C-contiguous on the current device (checked to be x's): as
        # _arrays.empty_like, so the strides match those the plan was made for
        return empty(x.shape, dtype=x.dtype)

    def stream(device):
        return get_stream().ptr  # the current device's (checked to be ``device``)

    return (collect, operator.attrgetter("data.ptr"), alloc, stream, cupy.cuda.runtime.getDevice)
