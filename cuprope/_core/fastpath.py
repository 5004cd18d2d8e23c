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
from typing import Any, Callable, NamedTuple


class Adapter(NamedTuple):
    """How the fast paths read one framework's arrays.

    ``collect(arrays, key, ptrs)`` appends each array's signature to the list
    ``key`` and its pointer to ``ptrs`` (None and 0 for None), or raises
    NoFastPath when an array is not of that framework; ``ptr(a)``: the data
    pointer; ``alloc(x)``: a new output laid out as the general path's;
    ``stream(device)``: the current stream's handle; ``current_device()``."""

    collect: Callable
    ptr: Callable
    alloc: Callable
    stream: Callable
    current_device: Callable


class Ticket(NamedTuple):
    """A call's fast-path identity: ``key`` (the settings' header and every
    array's signature), ``ptrs`` (the arrays' pointers, 0 for None) and
    ``pairs`` (the (i, j) array pairs the general path checks for overlap)."""

    key: tuple
    ptrs: list
    pairs: Any


# ADAPTERS maps the module of the framework's array type to its Adapter; an
# adapter is built when a call of its framework first takes the general path.

ADAPTERS: dict = {}
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
    ADAPTERS on first use; None for other kinds."""
    if kind == "torch":
        mod, build = "torch", _torch_adapter
    elif kind == "cupy":
        import cupy
        mod, build = cupy.ndarray.__module__, _cupy_adapter
    else:
        return None
    fw = ADAPTERS.get(mod)
    if fw is None:
        fw = ADAPTERS[mod] = build()
    return fw


def adapter_of(x):
    """The registered adapter for ``x``'s framework, or None."""
    return ADAPTERS.get(type(x).__module__)


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
    """The Ticket of a call whose arrays are all of ``fw``'s framework (on a
    GPU), else None (also for fw None: no fast path for the framework)."""
    if fw is None:
        return None
    key, ptrs = list(header), []
    try:
        fw.collect(arrays, key, ptrs)
    except NoFastPath:
        return None
    return Ticket(tuple(key), ptrs, pairs)


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
    entry = plans.get(tkt.key)
    return None if entry is None else entry.launch(tkt.ptrs)


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
        fw.collect(arrays, key, ptrs)
        entry = plans.get(tuple(key))
    except NoFastPath:
        return False
    except TypeError:  # an unhashable setting: the general path says what is wrong
        return False
    if entry is None:
        return False
    hit = entry.variants.get(entry.variant(ptrs) if entry.guards else ())
    if hit is None or fw.current_device() != hit.device:
        return False
    hit.run(fw.stream(hit.device), *ptrs)
    return True


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
    return Adapter(torch_collector(), torch.Tensor.data_ptr, torch.empty_like, stream,
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

    return Adapter(collect, operator.attrgetter("data.ptr"), alloc, stream,
                   cupy.cuda.runtime.getDevice)
