"""Kernel launches through the CUDA driver by ctypes, for launches that have
gone through CuPy once (launcher.Plan): :class:`Driver` binds a kernel, its
grid and its parameter array into a :class:`Bound` whose arguments are
converted once, so a launch converts nothing.
"""
from __future__ import annotations

import ctypes

_u = ctypes.c_uint

# cuda.h: CUlaunchAttributeID and CUfunction_attribute values
PROGRAMMATIC_STREAM_SERIALIZATION = 6
FUNC_PTX_VERSION = 5


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h): 7 unsigned ints, the stream at byte 32,
    then the attribute pointer and count (56 bytes)."""

    _fields_ = [("grid", _u * 3), ("block", _u * 3), ("smem", _u), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("n_attrs", _u)]


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute`` (cuda.h): the id (4 bytes, padded to 8), then
    the 64-byte value union, whose int members (such as
    programmaticStreamSerializationAllowed) sit at its start (72 bytes)."""

    _fields_ = [("id", _u), ("_pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("_rest", ctypes.c_char * 60)]


class Stream:
    """Minimal stand-in for a CuPy stream: CuPy's launcher reads only ``.ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class Bound:
    """One kernel with its grid and parameter array, its driver call's
    arguments converted once. ``launch(stream)`` is True when the driver
    accepted the launch; with the stream unchanged, ``call(*args)`` is the
    launch itself (0: accepted), which the hot paths make inline.

    ``cuLaunchKernelEx`` takes four arguments: a ``CUlaunchConfig`` (grid,
    block, shared bytes, stream) built once per launch and patched only when
    the stream changes, the function, the parameter array and NULL. Each is
    a ctypes object made once, so a call converts nothing: it takes about a
    third of the host time of a ``cuLaunchKernel`` call that converts its
    eleven arguments (measured with stubbed driver functions). Drivers
    without it (before CUDA 12) get
    ``cuLaunchKernel`` with its arguments preconverted.

    Programmatic dependent launch (``pdl``): the launch carries one
    ``CUlaunchAttribute``, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    = 1, which only ``cuLaunchKernelEx`` takes: without it (or without a
    driver library) such a bind raises instead of launching without the
    attribute."""

    __slots__ = ("call", "args", "_cfg", "_stream_at", "stream", "_keep")

    def __init__(self, call, args, cfg, stream_at, keep):
        self.call, self.args, self._cfg, self._stream_at = call, args, cfg, stream_at
        self._keep = keep  # what the converted pointers point into
        self.stream = 0

    def attributes(self) -> tuple:
        """(id, int value) of each launch attribute the driver gets."""
        cfg = self._cfg
        if cfg is None or not cfg.n_attrs:
            return ()
        arr = ctypes.cast(cfg.attrs, ctypes.POINTER(LaunchAttribute))
        return tuple((arr[i].id, arr[i].value) for i in range(cfg.n_attrs))

    def launch(self, stream_ptr) -> bool:
        return self.launch_rc(stream_ptr) == 0

    def launch_rc(self, stream_ptr) -> int:
        """The launch on ``stream_ptr``; the driver's CUresult (0: accepted)."""
        if stream_ptr != self.stream:
            if self._cfg is not None:
                self._cfg.stream = stream_ptr
            else:
                self.args[self._stream_at] = ctypes.c_void_p(stream_ptr)
            self.stream = stream_ptr
        return self.call(*self.args)


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

    def bind(self, func_ptr, grid, block, smem, param_addrs, keep, pdl=False):
        """A Bound launch of the function at ``func_ptr`` whose kernel
        parameters sit at ``param_addrs`` (one address per parameter); ``keep``
        holds what those addresses point into. None without a driver.
        ``pdl``: a programmatic dependent launch (RuntimeError where the
        driver cannot make one)."""
        if self._ok is None:
            self._load()
        if pdl and not (self._ok and self._ex):
            raise RuntimeError(
                "enable_pdl needs the CUDA driver's cuLaunchKernelEx (CUDA 12 or newer); "
                + ("this driver has none" if self._ok else "no driver library (libcuda.so.1)")
                + ": call without enable_pdl")
        if not self._ok:
            return None
        params = (ctypes.c_void_p * len(param_addrs))(*param_addrs)
        pvoid = ctypes.c_void_p(ctypes.addressof(params))
        fvoid = ctypes.c_void_p(func_ptr)
        if self._ex:
            attrs = None
            if pdl:
                attrs = (LaunchAttribute * 1)()
                attrs[0].id, attrs[0].value = PROGRAMMATIC_STREAM_SERIALIZATION, 1
            cfg = LaunchConfig((_u * 3)(*grid), (_u * 3)(*block), smem, None,
                               None if attrs is None else ctypes.addressof(attrs),
                               0 if attrs is None else 1)
            return Bound(self._fn, (ctypes.byref(cfg), fvoid, pvoid, None), cfg, -1,
                         (params, keep, attrs))
        args = [fvoid, *(_u(v) for v in grid), *(_u(v) for v in block), _u(smem),
                ctypes.c_void_p(0), pvoid, None]
        return Bound(self._fn, args, None, 8, (params, keep))

    def _lib(self):
        if self._ok is None:
            self._load()
        return ctypes.CDLL("libcuda.so.1") if self._ok else None

    def ptx_version(self, func_ptr) -> int:
        """The virtual architecture the function's code was compiled for (90
        for compute_90: ``__CUDA_ARCH__`` / 10), 0 where the driver cannot
        say."""
        lib = self._lib()
        if lib is None:
            return 0
        out = ctypes.c_int(0)
        rc = lib.cuFuncGetAttribute(ctypes.byref(out), ctypes.c_int(FUNC_PTX_VERSION),
                                    ctypes.c_void_p(func_ptr))
        return out.value if rc == 0 else 0

    def error_name(self, rc) -> str:
        """The driver's name of a CUresult (``CUDA_ERROR_INVALID_VALUE``)."""
        lib = self._lib()
        name = ctypes.c_char_p()
        if lib is None or lib.cuGetErrorName(ctypes.c_int(rc), ctypes.byref(name)) != 0:
            return f"CUresult {rc}"
        return name.value.decode()


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
