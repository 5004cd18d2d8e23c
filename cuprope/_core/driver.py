"""Kernel launches through the CUDA driver (``cuLaunchKernel`` by ctypes),
for plans that have launched once through CuPy (launch.LaunchPlan)."""
from __future__ import annotations


class Stream:
    """Minimal stand-in for a CuPy stream: CuPy's launcher reads only ``.ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class Driver:
    """``cuLaunchKernel`` through ctypes: about a microsecond of host time,
    against several for CuPy's generic launcher. The first launch of a plan
    goes through CuPy (which makes the device's context current); later ones
    come here, and any driver error falls back to CuPy for a clear exception."""

    def __init__(self):
        self._fn = None
        self._ok = None

    def _load(self):
        import ctypes
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuLaunchKernel
        except (OSError, AttributeError):
            self._ok = False
            return
        u = ctypes.c_uint
        fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p]
        fn.restype = ctypes.c_int
        self._fn = fn
        self._ok = True

    def params_for(self, plan):
        if self._ok is None:
            self._load()
        if not self._ok:
            return None
        import ctypes
        # kernelParams[i] points at argument i's bytes: here the RopeArgs struct itself.
        arr = (ctypes.c_void_p * 1)(plan.buf.ctypes.data)
        func = plan.func
        ptr = getattr(func, "ptr", None)
        if ptr is None:  # a cupy RawKernel: its Function for the current device
            ptr = func.kernel.ptr
        return (arr, ctypes.addressof(arr), int(ptr))

    def launch(self, plan, stream_ptr) -> bool:
        _, params, func = plan._params
        g, b = plan.grid, plan.block
        return self._fn(func, g[0], g[1], g[2], b[0], b[1], b[2], plan.smem, stream_ptr,
                        params, None) == 0


DRIVER = Driver()
