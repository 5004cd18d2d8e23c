"""What cuprope needs to know about an array from any framework.

``describe`` turns a NumPy/CuPy/PyTorch/JAX array, or any object with
``__dlpack__`` or ``__cuda_array_interface__``, into an ``ArrayInfo``: raw
pointer, shape, strides in elements, dtype name and device. Torch tensors are
read directly (no DLPack round trip). ``wrap_like`` hands a CuPy result back in
the caller's framework.
"""
from __future__ import annotations

import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INDEX_DTYPES = ("int32", "int64")


class ArrayInfo:
    """kind: "numpy", "torch", "cupy", "jax" or "dlpack" (another GPU producer,
    imported through CuPy); device: CUDA ordinal, or -1 for host memory.
    ``array`` is the object to compute with: the tensor itself for numpy, torch
    and cupy, a CuPy view of it for jax and dlpack."""

    __slots__ = ("obj", "array", "kind", "ptr", "shape", "strides", "dtype", "device", "itemsize")

    def __init__(self, obj, array, kind, ptr, shape, strides, dtype, device, itemsize):
        self.obj, self.array, self.kind = obj, array, kind
        self.ptr, self.shape, self.strides = ptr, shape, strides
        self.dtype, self.device, self.itemsize = dtype, device, itemsize

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def extent(self) -> tuple[int, int]:
        """[lo, hi) byte range the array can touch (for overlap checks)."""
        if self.size == 0:
            return (self.ptr, self.ptr)
        lo = hi = 0
        for n, st in zip(self.shape, self.strides):
            if st >= 0:
                hi += (n - 1) * st
            else:
                lo += (n - 1) * st
        return (self.ptr + lo * self.itemsize, self.ptr + (hi + 1) * self.itemsize)


class _Interface:
    __slots__ = ("__array_interface__",)

    def __init__(self, d):
        self.__array_interface__ = d


def _pointer_view(info: ArrayInfo) -> np.ndarray:
    """A NumPy array with ``info``'s address, shape and strides. Its memory is
    never read: it only lets ``np.shares_memory`` do the address arithmetic."""
    return np.asarray(_Interface({
        "shape": tuple(info.shape), "typestr": f"|V{info.itemsize}", "version": 3,
        "data": (info.ptr, True), "strides": tuple(s * info.itemsize for s in info.strides)}))


def overlaps(a: ArrayInfo, b: ArrayInfo) -> bool:
    """True when ``a`` and ``b`` share at least one element of memory (exact for
    interleaved strided views, such as q and k slices of one fused qkv tensor)."""
    if a.size == 0 or b.size == 0 or a.device != b.device:
        return False
    (alo, ahi), (blo, bhi) = a.extent(), b.extent()
    if not (alo < bhi and blo < ahi):
        return False
    try:
        return bool(np.shares_memory(_pointer_view(a), _pointer_view(b), max_work=100_000))
    except np.exceptions.TooHardError:
        return True


_TORCH_DTYPES: dict = {}


def _torch_dtype_name(t) -> str:
    if not _TORCH_DTYPES:
        import torch
        _TORCH_DTYPES.update({torch.float32: "float32", torch.float16: "float16",
                              torch.bfloat16: "bfloat16", torch.int32: "int32",
                              torch.int64: "int64", torch.float64: "float64"})
    return _TORCH_DTYPES.get(t, str(t).replace("torch.", ""))


def _numpy_dtype_name(dt) -> str:
    return np.dtype(dt).name


def framework(obj) -> str:
    mod = type(obj).__module__
    if isinstance(obj, np.ndarray):
        return "numpy"
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return "jax"
    if hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__"):
        return "dlpack"
    return "other"


def describe(obj, name: str) -> ArrayInfo:
    """ArrayInfo for ``obj``; TypeError naming ``name`` if it is not an array,
    or is a torch tensor on neither a CUDA device nor the CPU (``meta``,
    ``mps``, ...)."""
    kind = framework(obj)
    if kind == "numpy":
        return ArrayInfo(obj, obj, "numpy", obj.ctypes.data, obj.shape,
                         tuple(s // obj.itemsize for s in obj.strides),
                         _numpy_dtype_name(obj.dtype), -1, obj.itemsize)
    if kind == "torch":
        if obj.requires_grad:
            obj_eff = obj.detach()
        else:
            obj_eff = obj
        dev = obj_eff.device
        if dev.type not in ("cuda", "cpu"):
            raise TypeError(f"{name} is a torch tensor on device {str(dev)!r}: cuprope takes CUDA "
                            f"or CPU tensors")
        return ArrayInfo(obj, obj_eff, "torch", obj_eff.data_ptr(), tuple(obj_eff.shape),
                         tuple(obj_eff.stride()), _torch_dtype_name(obj_eff.dtype),
                         dev.index if dev.type == "cuda" else -1, obj_eff.element_size())
    if kind == "jax":
        if _jax_on_host(obj):
            arr = np.asarray(obj)
            return ArrayInfo(obj, arr, "jax", arr.ctypes.data, arr.shape,
                             tuple(s // arr.itemsize for s in arr.strides),
                             _numpy_dtype_name(arr.dtype), -1, arr.itemsize)
        import cupy
        arr = cupy.from_dlpack(obj)
        return _cupy_info(obj, arr, "jax")
    if kind == "cupy":
        return _cupy_info(obj, obj, "cupy")
    if kind == "dlpack":
        import cupy
        arr = cupy.from_dlpack(obj) if hasattr(obj, "__dlpack__") else cupy.asarray(obj)
        return _cupy_info(obj, arr, "dlpack")
    raise TypeError(f"{name} must be an array (NumPy, CuPy, PyTorch, JAX or any DLPack "
                    f"producer), got {type(obj).__name__}")


def _cupy_info(obj, arr, kind) -> ArrayInfo:
    return ArrayInfo(obj, arr, kind, arr.data.ptr, arr.shape,
                     tuple(s // arr.itemsize for s in arr.strides),
                     _numpy_dtype_name(arr.dtype), arr.device.id, arr.itemsize)


def _jax_on_host(obj) -> bool:
    try:
        return all(d.platform == "cpu" for d in obj.devices())
    except AttributeError:
        return False


def empty_like(info: ArrayInfo):
    """A new array in the computing framework with ``info``'s shape and dtype
    (C-contiguous for CuPy/NumPy; torch's ``empty_like`` for torch)."""
    if info.kind == "torch":
        import torch
        return torch.empty_like(info.array)
    if info.device < 0:
        return np.empty(info.array.shape, dtype=info.array.dtype)
    import cupy
    with cupy.cuda.Device(info.device):
        return cupy.empty(info.array.shape, dtype=info.array.dtype)


def wrap_like(info: ArrayInfo, result):
    """Return ``result`` (computed in ``info.array``'s framework) as the caller's type."""
    if info.kind == "jax":
        import jax.dlpack
        import jax.numpy as jnp
        if info.device < 0:
            return jnp.asarray(result)
        return jax.dlpack.from_dlpack(result)
    return result
