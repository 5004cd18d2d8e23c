"""Float32 copies of cos/sin caches held in a third dtype (vLLM's op reads its
cache in whatever float dtype it comes, apart from the query's). The kernel
reads the cache in float32 or in the query's dtype; a float16 or bfloat16
cache that is neither is copied to float32 on the GPU: every 16-bit value is
exact in float32, so the rotation equals vLLM's, which widens each cache
value to float before it multiplies. :func:`float32_copy` says what is kept.
"""
from __future__ import annotations

import weakref

__all__ = ["held", "float32_copy", "clear"]

_MAX_COPIES = 8  # caches kept at once (one per model in practice)
_COPIES: dict = {}  # id(source) -> _Copy


class _Copy:
    __slots__ = ("ref", "sig", "version", "array")

    def __init__(self, ref, sig, version, array):
        self.ref, self.sig, self.version, self.array = ref, sig, version, array


def _signature(t):
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


def held(cache):
    """The kept float32 copy of ``cache`` when ``cache`` is unchanged since
    it was made, else ``cache`` itself (a dict lookup when nothing is kept)."""
    if not _COPIES:
        return cache
    c = _COPIES.get(id(cache))
    if c is None or c.ref() is not cache or cache._version != c.version \
            or _signature(cache) != c.sig:
        return cache
    return c.array


def _versioned(info):
    """Whether ``info``'s array has a version counter to key a kept copy on."""
    return info.kind == "torch" and not info.obj.is_inference()


def _capturing(stream_ptr) -> bool:
    import cupy
    return bool(cupy.cuda.runtime.streamIsCapturing(stream_ptr))


def _convert(info, stream_ptr):
    """A contiguous float32 copy of the GPU array ``info`` made on the stream
    ``stream_ptr``, in ``info``'s framework (torch, else CuPy)."""
    if info.kind == "torch":
        import torch
        src = info.array
        if torch.cuda.current_stream(info.device).cuda_stream == stream_ptr:
            return src.to(torch.float32, memory_format=torch.contiguous_format)
        with torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr, device=src.device)):
            return src.to(torch.float32, memory_format=torch.contiguous_format)
    import cupy
    with cupy.cuda.Device(info.device), cupy.cuda.ExternalStream(stream_ptr):
        return cupy.ascontiguousarray(info.array.astype(cupy.float32))


def _finished(stream_ptr):
    """Wait on the host for the copy just queued on ``stream_ptr`` (once per
    kept copy: a later call may launch on another stream)."""
    import cupy
    cupy.cuda.runtime.streamSynchronize(stream_ptr)


def float32_copy(info, stream_ptr):
    """The float32 copy of the GPU cos/sin cache ``info`` (an ArrayInfo):
    the kept one when ``held`` would return it, else a new one, kept when the
    array has a version counter and the stream is not capturing.

    A torch tensor's copy is kept, keyed by the tensor's identity, data
    pointer, metadata and version counter (an in-place write makes a new
    copy), so a decode loop pays the copy once; ``held`` swaps a cache for
    its kept copy before the fast path looks the call up. Arrays without a
    version counter (CuPy, JAX, torch inference tensors), and calls on a
    capturing stream, are copied on each call (on the launch stream
    ``stream_ptr``). A CUDA graph captured after a copy was kept reads that
    copy on every replay: write such a cache in place only outside captured
    graphs (or hold it in float32 or the query's dtype). Returns a
    contiguous float32 array in ``info``'s framework (torch, else CuPy)."""
    src = info.obj
    if _versioned(info):
        kept = held(src)
        if kept is not src:
            return kept
    out = _convert(info, stream_ptr)
    if _versioned(info) and not _capturing(stream_ptr):
        _finished(stream_ptr)
        _keep(src, out)
    return out


def _keep(src, out):
    key = id(src)

    def drop(_ref, key=key):
        c = _COPIES.get(key)
        if c is not None and c.ref is _ref:
            del _COPIES[key]

    _COPIES.pop(key, None)
    for old in list(_COPIES)[:max(0, len(_COPIES) + 1 - _MAX_COPIES)]:  # the oldest first
        _COPIES.pop(old, None)
    _COPIES[key] = _Copy(weakref.ref(src, drop), _signature(src), src._version, out)


def clear():
    """Drop every kept copy."""
    _COPIES.clear()
