"""Kernel launches through the CUDA driver by ctypes, for launches that have
gone through CuPy once (launcher.Plan).

``cuLaunchKernelEx`` takes four arguments: a ``CUlaunchConfig`` (grid,
block, shared bytes, stream) built once per launch and patched only when the
stream changes, the function, the parameter array and NULL. Each is a ctypes
object made once, so a call converts nothing (benchmarks/NOTES.md 36: about
a third of ``cuLaunchKernel``'s eleven converted arguments). Drivers without
it (before CUDA 12) get ``cuLaunchKernel`` with its arguments preconverted.
"""
from __future__ import annotations

import ctypes

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


def capturing(stream_ptr) -> bool:
    """Whether work put on the stream now would be captured into a CUDA
    graph (or is refused for a capture elsewhere: legacy-stream work during
    one); False without a driver library."""
    if DRIVER._ok is None:
        DRIVER._load()
    if not DRIVER._ok:
        return False
    status = ctypes.c_int(0)
    rc = ctypes.CDLL("libcuda.so.1").cuStreamIsCapturing(ctypes.c_void_p(stream_ptr),
                                                          ctypes.byref(status))
    return rc != 0 or status.value != 0
