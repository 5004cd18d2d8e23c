"""Array helpers of the KV-cache dialect, shared by ``cuprope.kvcache`` and
``cuprope.cos_sin_cache``: the token geometry of q/k/v, index arrays
(positions, slots, page tables) checked for dtype, device, shape and
contiguity, and host views of them (fp8 torch tensors as ml_dtypes'
``float8_e4m3fn``)."""
from __future__ import annotations

import numpy as np

from . import kvcache_reference as kref
from ._core import host, validate
from ._core.arrays import describe

__all__ = ["token_geometry", "index_info", "addressing", "scale_info", "to_host", "np_view"]


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


def scale_info(x, name, device, sizes):
    """An fp8 scale: a float32 array on ``device`` of one of ``sizes`` (contiguous)."""
    if x is None:
        raise ValueError(f"{name} is needed: an fp8 target is stored as e4m3 of x * (1/{name})")
    info = describe(x, name)
    if info.dtype != "float32":
        raise TypeError(f"{name} must be a float32 array, got {info.dtype}")
    if info.device != device:
        raise ValueError(f"{name} is on device {info.device}, not with the tensors ({device})")
    if tuple(info.shape) not in sizes or (info.size > 1 and info.strides[0] != 1):
        raise ValueError(f"{name} must have shape " + " or ".join(str(list(s)) for s in sizes)
                         + f" (contiguous), got {list(info.shape)}")
    return info


def addressing(dev, tshapes, slot_mapping, kv_indices, kv_indptr, batch_indices,
               cache_positions, kv_last_page_len):
    """{name: info} of the addressing arrays (slot_mapping, or the paged ones)."""
    paged = {"kv_indices": kv_indices, "kv_indptr": kv_indptr, "batch_indices": batch_indices,
             "cache_positions": cache_positions}
    if slot_mapping is not None:
        if any(x is not None for x in paged.values()) or kv_last_page_len is not None:
            raise ValueError("give slot_mapping or the paged indices (kv_indices, kv_indptr, "
                             "batch_indices, cache_positions), not both")
        return {"slot_mapping": index_info(slot_mapping, "slot_mapping", dev, tshapes,
                                           ("int64",))}
    missing = [n for n, x in paged.items() if x is None]
    if missing:
        raise ValueError(f"give slot_mapping, or all of the paged indices (missing: "
                         f"{', '.join(missing)})")
    out = {n: index_info(paged[n], n, dev, tshapes) for n in ("batch_indices", "cache_positions")}
    kvi = describe(kv_indices, "kv_indices")
    out["kv_indices"] = index_info(kv_indices, "kv_indices", dev, [tuple(kvi.shape[:1])])
    if len(kvi.shape) != 1:
        raise ValueError(f"kv_indices must be 1-D, got shape {list(kvi.shape)}")
    ipi = describe(kv_indptr, "kv_indptr")
    if len(ipi.shape) != 1 or ipi.shape[0] < 1:
        raise ValueError(f"kv_indptr must be 1-D [B + 1], got shape {list(ipi.shape)}")
    out["kv_indptr"] = index_info(kv_indptr, "kv_indptr", dev, [tuple(ipi.shape)])
    if kv_last_page_len is not None:
        out["kv_last_page_len"] = index_info(kv_last_page_len, "kv_last_page_len", dev,
                                             [(ipi.shape[0] - 1,)])
    return out
