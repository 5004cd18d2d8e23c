"""Array helpers of the KV-cache dialect, shared by ``cuprope.kvcache`` and
``cuprope.cos_sin_cache``: the token geometry of q/k/v, index arrays
(positions, slots, page tables) checked for dtype, device, shape and
contiguity, and host views of them (fp8 torch tensors as ml_dtypes'
``float8_e4m3fn``)."""
from __future__ import annotations

import numpy as np

from . import reference as kref
from .._core import host, validate
from .._core.arrays import describe

__all__ = ["token_geometry", "index_info", "to_host", "np_view"]


def token_geometry(info, name):
    """(B, S, H, D, (batch, token, head strides)) of a ``[T, H, D]`` (B = 1,
    S = T) or ``[B, S, H, D]`` array."""
    shp, st = tuple(info.shape), tuple(info.strides)
    if len(shp) == 3:
        return 1, shp[0], shp[1], shp[2], (0, st[0], st[1])
    if len(shp) == 4:
        return shp[0], shp[1], shp[2], shp[3], st[:3]
    raise ValueError(f"{name} must be [T, H, D] or [B, S, H, D], got shape {list(shp)}")


def index_info(x, name, device, shapes, dtypes=("int32", "int64")):
    """An index array: one of ``dtypes`` (TypeError), on ``device``, one of
    ``shapes`` and C-contiguous (ValueError)."""
    info = describe(x, name)
    if info.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {info.dtype}")
    validate.check_index(info, name, device, [tuple(s) for s in shapes])
    expect = 1
    for n, st in zip(reversed(info.shape), reversed(info.strides)):
        if n > 1 and st != expect:
            raise ValueError(f"{name} must be contiguous")
        expect *= n
    return info


def to_host(info) -> np.ndarray:
    """A host NumPy copy (or view) of an index or scale array (a device sync
    for GPU arrays)."""
    if info.device < 0:
        return np_view(info)
    if info.kind == "torch":
        return info.array.detach().cpu().numpy()
    return info.array.get()


def np_view(info) -> np.ndarray:
    """A NumPy view of a host array, fp8 torch tensors as ``float8_e4m3fn``."""
    if info.kind == "torch" and info.dtype == "float8_e4m3fn":
        import torch
        return info.array.view(torch.uint8).numpy().view(kref.np_dtype("float8_e4m3fn"))
    return host.to_numpy(info)
