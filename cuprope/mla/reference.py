"""Float64 NumPy reference of DeepSeek MLA's rope + latent-cache append,
written from the formulas (not from the kernels): :func:`rotate_pe` (the
rotation), :func:`mla_reference` (q_pe and k_pe by a RopeConfig) and
:func:`expected_cache_rows` (the cache rows the kernels store).
"""
from __future__ import annotations

import numpy as np

from ..kvcache import reference as kref

__all__ = ["rotate_pe", "mla_reference", "expected_cache_rows"]


def rotate_pe(x, positions, inv_freq, *, scale=1.0, interleaved=True) -> np.ndarray:
    """x ``[T, ..., R]`` rotated in float64 by ``positions`` ``[T]``
    (int) and ``inv_freq`` ``[R/2]``; the middle axes (heads) share the
    token's angles. Returns float64, x's shape.

    For token t at position p and pair j: ``theta_j = p * inv_freq[j]``,
    ``c = cos(theta_j) * scale``, ``s = sin(theta_j) * scale`` (``scale``:
    the config's, YaRN's mscale factor), and the pair ``(x1, x2)`` turns to
    ``(x1 c - x2 s, x2 c + x1 s)``. The pair is ``(x[2j], x[2j+1])`` when
    ``interleaved`` (DeepSeek-V3's ``rope_interleave``, vLLM's
    ``is_neox_style=False``), else ``(x[j], x[j + R/2])``."""
    x = np.asarray(x, dtype=np.float64)
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    r = x.shape[-1]
    if inv_freq.shape != (r // 2,):
        raise ValueError(f"inv_freq must have {r // 2} entries for a rope dim of {r}")
    theta = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (r // 2,)
    c = (np.cos(theta) * scale).reshape(shape)
    s = (np.sin(theta) * scale).reshape(shape)
    if interleaved:
        i1, i2 = np.arange(0, r, 2), np.arange(1, r, 2)
    else:
        i1, i2 = np.arange(r // 2), np.arange(r // 2, r)
    out = np.empty_like(x)
    x1, x2 = x[..., i1], x[..., i2]
    out[..., i1] = x1 * c - x2 * s
    out[..., i2] = x2 * c + x1 * s
    return out


def mla_reference(q_pe, k_pe, positions, config):
    """(rotated q_pe ``[T, H, R]``, rotated k_pe ``[T, R]``) in float64 by
    a RopeConfig (its inv_freq, scale and pairing)."""
    kw = dict(scale=config.scale, interleaved=config.interleaved)
    return (rotate_pe(q_pe, positions, config.inv_freq, **kw),
            rotate_pe(k_pe, positions, config.inv_freq, **kw))


def expected_cache_rows(ckv, k_rot, dtype_name, scale=None) -> np.ndarray:
    """The ``[T, Dc + R]`` rows ``[ckv_t | rotated k_pe_t]`` the kernels store
    for float64 ``ckv`` and rotated ``k_rot``: each rounded once to
    ``dtype_name`` (the inputs'), and with a ``scale`` (an e4m3 cache) their
    e4m3 bytes, of ``value * (1/scale)`` (cuprope.kvcache.reference.scaled_e4m3)."""
    rows = np.concatenate([np.asarray(ckv, np.float64), np.asarray(k_rot, np.float64)], axis=-1)
    return kref.encode(rows, dtype_name, scale)
