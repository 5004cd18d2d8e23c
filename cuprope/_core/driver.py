"""Kernel launches through the CUDA driver by ctypes, for launches that have
gone through CuPy once (PackedLaunch, below).

``cuLaunchKernelEx`` takes four arguments: a ``CUlaunchConfig`` (grid,
block, shared bytes, stream) built once per launch and patched only when the
stream changes, the function, the parameter array and NULL. Each is a ctypes
object made once, so a call converts nothing (benchmarks/NOTES.md 36: about
a third of ``cuLaunchKernel``'s eleven converted arguments). Drivers without
it (before CUDA 12) get ``cuLaunchKernel`` with its arguments preconverted.
"""
from __future__ import annotations

import ctypes

import numpy as np

_u = ctypes.c_uint


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h): 7 unsigned ints, the stream at byte 32,
    then the attribute pointer and count (56 bytes)."""

    _fields_ = [("grid", _u * 3), ("block", _u * 3), ("smem", _u), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("n_attrs", _u)]


class Stream:
    """Minimal stand-in for a CuPy stream: CuPy's launcher reads only ``.ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class Bound:
    """One kernel with its grid and parameter array, its driver call's
    arguments converted once. ``launch(stream)`` is True when the driver
    accepted the launch; with the stream unchanged, ``call(*args)`` is the
    launch itself (0: accepted), which the hot paths make inline."""

    __slots__ = ("call", "args", "_cfg", "_stream_at", "stream", "_keep")

    def __init__(self, call, args, cfg, stream_at, keep):
        self.call, self.args, self._cfg, self._stream_at = call, args, cfg, stream_at
        self._keep = keep  # what the converted pointers point into
        self.stream = 0

    def launch(self, stream_ptr) -> bool:
        if stream_ptr != self.stream:
            if self._cfg is not None:
                self._cfg.stream = stream_ptr
            else:
                self.args[self._stream_at] = ctypes.c_void_p(stream_ptr)
            self.stream = stream_ptr
        return self.call(*self.args) == 0


class Driver:
    """The driver's launch entry point, loaded on first use; ``bind`` is None
    where there is no driver library (the caller keeps launching through CuPy)."""

    def __init__(self):
        self._fn = None
        self._ex = False
        self._ok = None

    def _load(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            self._ok = False
            return
        fn = getattr(lib, "cuLaunchKernelEx", None)
        self._ex = fn is not None
        if fn is None:
            fn = getattr(lib, "cuLaunchKernel", None)
        if fn is None:
            self._ok = False
            return
        fn.restype = ctypes.c_int  # no argtypes: every argument is passed as a ctypes object
        self._fn, self._ok = fn, True

    def bind(self, func_ptr, grid, block, smem, param_addrs, keep):
        """A Bound launch of the function at ``func_ptr`` whose kernel
        parameters sit at ``param_addrs`` (one address per parameter); ``keep``
        holds what those addresses point into. None without a driver."""
        if self._ok is None:
            self._load()
        if not self._ok:
            return None
        params = (ctypes.c_void_p * len(param_addrs))(*param_addrs)
        pvoid = ctypes.c_void_p(ctypes.addressof(params))
        fvoid = ctypes.c_void_p(func_ptr)
        if self._ex:
            cfg = LaunchConfig((_u * 3)(*grid), (_u * 3)(*block), smem, None, None, 0)
            return Bound(self._fn, (ctypes.byref(cfg), fvoid, pvoid, None), cfg, -1,
                         (params, keep))
        args = [fvoid, *(_u(v) for v in grid), *(_u(v) for v in block), _u(smem),
                ctypes.c_void_p(0), pvoid, None]
        return Bound(self._fn, args, None, 8, (params, keep))


DRIVER = Driver()


class PackedLaunch:
    """A kernel, its grid and its packed argument structs in one buffer
    (``words``: its int64 view, where per-call fields are written), launched
    through CuPy the first time and through the CUDA driver after that
    (driver.Bound; a driver error falls back to CuPy, which raises clearly).

    ``structs``: (bytes, NumPy dtype) per kernel parameter, in order.
    ``patches``: (slot, index, addend) per pointer field ``run_patched`` fills
    from a list of pointers (words[slot] = ptrs[index] + addend).

    A launch belongs to one thread (its buffer is reused across launches; the
    driver copies kernel arguments at launch)."""

    __slots__ = ("device", "func", "grid", "block", "smem", "words", "patches", "_views",
                 "_addrs", "_raw", "bound")

    def __init__(self, device, func, grid, block, smem, structs, patches=()):
        import ctypes
        self.device, self.func, self.grid, self.block, self.smem = device, func, grid, block, smem
        raw = bytearray(b"".join(bytes(b) for b, _ in structs))  # each launch owns its buffer
        self._raw = raw
        self.words = memoryview(raw).cast("q")
        base = ctypes.addressof((ctypes.c_char * len(raw)).from_buffer(raw))
        views, addrs, off = [], [], 0
        for b, dt in structs:
            views.append(np.frombuffer(raw, dtype=np.uint8, count=len(b), offset=off).view(dt))
            addrs.append(base + off)
            off += len(b)
        self._views, self._addrs = tuple(views), tuple(addrs)
        self.patches = tuple(patches)
        self.bound = None

    def run_patched(self, stream_ptr, ptrs):
        w = self.words
        for slot, i, add in self.patches:
            w[slot] = ptrs[i] + add
        b = self.bound
        if b is None or b.stream != stream_ptr or b.call(*b.args):
            self.launch(stream_ptr)

    def launch(self, stream_ptr):
        """Through the driver once this has launched once through CuPy."""
        b = self.bound
        if b is None or not b.launch(stream_ptr):
            self.bound = None
            self.func(self.grid, self.block, self._views, shared_mem=self.smem,
                      stream=Stream(stream_ptr))
            func = self.func
            ptr = getattr(func, "ptr", None)
            if ptr is None:  # a cupy RawKernel: its Function for the current device
                ptr = func.kernel.ptr
            self.bound = DRIVER.bind(int(ptr), self.grid, self.block, self.smem, self._addrs,
                                     self._raw)
