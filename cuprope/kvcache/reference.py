"""The NumPy side of ``cuprope.kvcache``: fp8 e4m3 quantisation as the CUDA
intrinsic does it (:func:`quantize_e4m3`), the reader that dequantises a
cache, where each token's row of a paged cache lies, and the host backend of
both ops.
"""
from __future__ import annotations

import numpy as np

from .. import reference

__all__ = ["E4M3_MAX", "FP8_DTYPES", "quantize_e4m3", "scaled_e4m3", "dequantize",
           "cache_rows", "rotate_cos_sin_cache", "rotate_config", "encode", "check_indices", "np_dtype"]

E4M3_MAX = 448.0
FP8_DTYPES = ("float8_e4m3fn", "uint8")  # a cache of raw e4m3 bytes may be uint8 (CuPy)


def _e4m3():
    import ml_dtypes
    return ml_dtypes.float8_e4m3fn


def quantize_e4m3(x) -> np.ndarray:
    """float32 ``x`` as e4m3 bit patterns (uint8, the shape of x): nearest even,
    saturating to ±448, NaN to 0x7f.

    fp8 e4m3 (``ml_dtypes.float8_e4m3fn``: no infinities, one NaN pattern
    per sign, largest finite 448). The kernels store
    ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)``: round to nearest
    even, finite values beyond ±448 and ±Inf saturate to ±448, NaN becomes
    0x7f (the positive NaN, whatever its sign). ml_dtypes rounds to nearest
    even too but turns overflow and ±Inf into NaN and keeps NaN's sign, so
    this clips to ±448 first and writes 0x7f for NaN."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        bits = np.clip(x, -E4M3_MAX, E4M3_MAX).astype(_e4m3()).view(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), bits)


def scaled_e4m3(x, scale) -> np.ndarray:
    """e4m3 bits of ``x · (1/scale)`` as the kernels form it: x in float32,
    1/scale rounded to float32, their product rounded to float32, then
    :func:`quantize_e4m3`. ``scale`` broadcasts against x (per head: shape
    ``[H, 1]`` against ``[..., H, D]``)."""
    inv = np.float32(1.0) / np.asarray(scale, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return quantize_e4m3(np.asarray(x, dtype=np.float32) * inv)


def dequantize(cache, scale=1.0, *, head_axis: int = -2):
    """float32 values of an e4m3 cache: ``e4m3 · scale``.

    cache: fp8 e4m3 array (``float8_e4m3fn``, or its bytes as uint8) of any
    shape, NumPy or torch (CPU or GPU); scale: a number, a ``[]``/``[1]``
    array, or per head ``[H]``, H the size of ``head_axis`` (-2 for NHD pages
    ``[..., page_size, H, D]``, -3 for HND ``[..., H, page_size, D]``).
    Returns float32 in the cache's framework and device."""
    if type(cache).__module__.startswith("torch"):
        import torch
        vals = cache.view(torch.float8_e4m3fn).to(torch.float32)
        s = torch.as_tensor(scale, dtype=torch.float32, device=cache.device).reshape(-1)
        if s.numel() > 1:
            shape = [1] * cache.dim()
            shape[head_axis] = s.numel()
            s = s.reshape(shape)
        return vals * s
    c = np.asarray(cache)
    vals = c.view(_e4m3()).astype(np.float32)
    s = np.asarray(scale, dtype=np.float32).reshape(-1)
    if s.size > 1:
        shape = [1] * c.ndim
        shape[head_axis] = s.size
        s = s.reshape(shape)
    return vals * s


def cache_rows(n_pages, page_size, *, slot_mapping=None, batch_indices=None,
               cache_positions=None, kv_indices=None, kv_indptr=None):
    """(valid, page, row) per token, int64 ``[T]`` each (page/row 0 where not
    valid): flat slots (slot = page·page_size + row; negative: padding) or
    FlashInfer's paged indices (token of batch b at position p: page
    ``kv_indices[kv_indptr[b] + p // page_size]``, row ``p % page_size``).
    A token is not valid (not written) when padding (a negative slot, batch
    index or position) or when any index leaves its range."""
    if slot_mapping is not None:
        slot = np.asarray(slot_mapping, dtype=np.int64).reshape(-1)
        valid = (slot >= 0) & (slot < n_pages * page_size)
        slot = np.where(valid, slot, 0)
        return valid, slot // page_size, slot % page_size
    bi = np.asarray(batch_indices, dtype=np.int64).reshape(-1)
    p = np.asarray(cache_positions, dtype=np.int64).reshape(-1)
    indptr = np.asarray(kv_indptr, dtype=np.int64)
    indices = np.asarray(kv_indices, dtype=np.int64)
    n_seqs = indptr.shape[0] - 1
    valid = (bi >= 0) & (bi < n_seqs) & (p >= 0)
    b = np.where(valid, bi, 0)
    lo, hi = indptr[b], indptr[b + 1]
    j = lo + np.where(valid, p, 0) // page_size
    valid &= (lo >= 0) & (j < hi) & (j < indices.shape[0])
    page = indices[np.where(valid, j, 0)] if indices.size else np.zeros_like(j)
    valid &= (page >= 0) & (page < n_pages)
    return valid, np.where(valid, page, 0), np.where(valid, p % page_size, 0)


def rotate_cos_sin_cache(x, pos, cos_sin_cache, *, interleaved: bool) -> np.ndarray:
    """x ``[T, H, D]`` rotated in float64 by the rows ``pos`` of a
    cos_sin_cache ``[rows, R]`` (cos in the first R/2 columns, sin in the
    rest): pairs (j, j + R/2) or, interleaved, (2j, 2j + 1) turn by
    (cos_j, sin_j); dims >= R pass through."""
    table = np.asarray(cos_sin_cache, dtype=np.float64)[np.asarray(pos, dtype=np.int64)]
    r = table.shape[-1]
    cos, sin = table[:, None, : r // 2], table[:, None, r // 2:]
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    if interleaved:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2], out[..., 1:r:2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., : r // 2], x[..., r // 2: r]
        out[..., : r // 2], out[..., r // 2: r] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


def rotate_config(x, pos, config) -> np.ndarray:
    """x ``[T, H, D]`` rotated in float64 by a RopeConfig at positions ``pos``
    (``[T]``, or ``[n_streams, T]`` under a stream map): cuprope.reference."""
    p = reference.token_positions(1, x.shape[0], positions=pos, n_streams=config.n_streams)
    ang = reference.pair_angles(p, config.inv_freq, config.stream_map)
    return reference.rotate(np.asarray(x, np.float64)[None], ang, rotary_dim=config.rotary_dim,
                            interleaved=config.interleaved, scale=config.scale)[0]


def encode(values, dtype_name, scale=None) -> np.ndarray:
    """What the kernels store for float64 ``values`` computed from inputs of
    dtype ``dtype_name``: rounded once to that dtype (the rotated values the
    core produces), and with a ``scale`` (fp8 targets) its e4m3 bits
    (:func:`scaled_e4m3`; a per-head scale ``[H]`` against values
    ``[..., H, D]``)."""
    rounded = reference.round_to_dtype(values, np_dtype(dtype_name))
    if scale is None:
        return rounded
    s = np.asarray(scale, dtype=np.float32).reshape(-1)
    return scaled_e4m3(rounded, s[:, None] if s.size > 1 else s[0])


def np_dtype(name):
    """The NumPy dtype of a dtype name (bfloat16 and float8_e4m3fn from ml_dtypes)."""
    if name == "float8_e4m3fn":
        return np.dtype(_e4m3())
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def check_indices(h, pages, page_size):
    """``check=True`` of ``cuprope.kvcache``: ValueError naming the first index
    out of range. ``h``: the addressing arrays by argument name, host int64
    ``[N]`` (slot_mapping, or kv_indices, kv_indptr, batch_indices,
    cache_positions and optionally kv_last_page_len)."""
    if "slot_mapping" in h:
        bad = np.flatnonzero(h["slot_mapping"] >= pages * page_size)
        if bad.size:
            raise ValueError(f"slot_mapping[{bad[0]}] = {h['slot_mapping'][bad[0]]} is past the "
                             f"cache ({pages} pages of {page_size} = {pages * page_size} slots)")
        return
    indptr, indices = h["kv_indptr"], h["kv_indices"]
    if indptr[0] < 0 or np.any(np.diff(indptr) < 0) or indptr[-1] > indices.size:
        raise ValueError(f"kv_indptr must rise from >= 0 to at most len(kv_indices) = "
                         f"{indices.size}, got {indptr.tolist()[:8]}...")
    if np.any((indices < 0) | (indices >= pages)):
        j = int(np.flatnonzero((indices < 0) | (indices >= pages))[0])
        raise ValueError(f"kv_indices[{j}] = {indices[j]} is not a page of the cache "
                         f"(0 <= page < {pages})")
    bi, p = h["batch_indices"], h["cache_positions"]
    n_seqs = indptr.size - 1
    live = (bi >= 0) & (p >= 0)
    if np.any(live & (bi >= n_seqs)):
        j = int(np.flatnonzero(live & (bi >= n_seqs))[0])
        raise ValueError(f"batch_indices[{j}] = {bi[j]} but kv_indptr holds {n_seqs} sequences")
    b = np.where(live, bi, 0)
    n_pages_b = indptr[b + 1] - indptr[b]
    limit = n_pages_b * page_size
    if "kv_last_page_len" in h:
        limit = np.maximum(n_pages_b - 1, 0) * page_size + h["kv_last_page_len"][b]
    if np.any(live & (p >= limit)):
        j = int(np.flatnonzero(live & (p >= limit))[0])
        raise ValueError(f"cache_positions[{j}] = {p[j]} is past sequence {bi[j]}'s "
                         f"{int(limit[j])} cache rows")
