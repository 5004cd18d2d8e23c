"""Float64 NumPy reference for every rotation cuprope computes.

This module is the CPU backend and the tests' oracle. It is written from the
published formulas (RoFormer's block-diagonal R_m, its element-wise cos/sin
form, the half-split "rotate_half" form), not from the CUDA kernel.

Canonical layout here: ``x`` is ``[B, S, H, D]``. The public API maps the
``bhsd`` and ``thd`` layouts onto it with views before calling in.
"""
from __future__ import annotations

import numpy as np

__all__ = [
    "default_inv_freq",
    "token_positions",
    "pair_angles",
    "rotate",
    "rotate_with_tables",
    "round_to_dtype",
]


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """θ_i = base^(−2i/R) for i = 0 … R/2 − 1, float64 ``[R/2]``: the
    default table of ``rotary_dim`` R (positive, even) and frequency base
    ``base``."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer, got {rotary_dim}")
    i = np.arange(rotary_dim // 2, dtype=np.float64)
    return np.power(float(base), -2.0 * i / rotary_dim)


def token_positions(batch: int, seq: int, *, positions=None, offset: int = 0,
                    seq_offsets=None, n_streams: int = 1) -> np.ndarray:
    """Positions as int64 ``[n_streams, B, S]``.

    ``positions``: None (implicit 0…S−1), or an integer array ``[S]``,
    ``[B, S]``, or with a leading stream axis ``[n_streams, S]`` /
    ``[n_streams, B, S]``. ``offset`` is added to every position and
    ``seq_offsets[b]`` to every position of sequence b.
    """
    if positions is None:
        p = np.broadcast_to(np.arange(seq, dtype=np.int64), (n_streams, batch, seq))
    else:
        p = np.asarray(positions).astype(np.int64)
        if p.ndim == 1:
            p = p[None, None, :]
        elif p.ndim == 2 and n_streams == 1:
            p = p[None]
        elif p.ndim == 2:
            p = p[:, None, :]
        p = np.broadcast_to(p, (n_streams, batch, seq))
    p = p + np.int64(offset)
    if seq_offsets is not None:
        p = p + np.asarray(seq_offsets).astype(np.int64)[None, :, None]
    return p


def pair_angles(pos: np.ndarray, inv_freq: np.ndarray, stream_map=None) -> np.ndarray:
    """Angles m·θ_j in float64.

    pos: int64 ``[n_streams, B, S]``; inv_freq: ``[P]`` or ``[H, P]``;
    stream_map: None or ``[P]`` stream index per pair.
    Returns ``[B, S, 1, P]`` for a shared table, ``[B, S, H, P]`` per head.
    """
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    npairs = inv_freq.shape[-1]
    smap = np.zeros(npairs, dtype=np.int64) if stream_map is None else np.asarray(stream_map)
    pos_pair = pos[smap].astype(np.float64)          # [P, B, S]
    pos_pair = np.moveaxis(pos_pair, 0, -1)[:, :, None, :]  # [B, S, 1, P]
    table = inv_freq if inv_freq.ndim == 2 else inv_freq[None, :]
    return pos_pair * table[None, None, :, :]


def rotate(x, angles, *, rotary_dim: int, interleaved: bool, scale: float = 1.0,
           inverse: bool = False) -> np.ndarray:
    """Apply the rotation in float64.

    x: ``[B, S, H, D]``; angles: ``[B, S, H or 1, R/2]``. Pairs are (2j, 2j+1)
    when ``interleaved`` else (j, j + R/2); dims ≥ R are returned unchanged.
    Each pair becomes (x1·cos − x2·sin, x2·cos + x1·sin)·scale; ``inverse``
    uses −sin (the transposed rotation, i.e. the backward of the forward).
    """
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    half = rotary_dim // 2
    cos = np.cos(angles) * scale
    sin = np.sin(angles) * scale * (-1.0 if inverse else 1.0)
    if interleaved:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = x1 * cos - x2 * sin
        out[..., 1:rotary_dim:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rotary_dim] = x2 * cos + x1 * sin
    return out


def rotate_half(x, rotary_dim, interleaved, transposed=False):
    """HF's rotate_half on the first R dims: (x1, x2) -> (-x2, x1), pairs split
    in halves or, ``interleaved``, (2j, 2j+1) (HF's rotate_every_two).
    ``transposed``: its transpose (y1, y2) -> (y2, -y1), as autograd applies it."""
    sign1, sign2 = (1.0, -1.0) if transposed else (-1.0, 1.0)
    y = np.empty_like(x[..., :rotary_dim])
    if interleaved:
        y[..., 0::2] = sign1 * x[..., 1:rotary_dim:2]
        y[..., 1::2] = sign2 * x[..., 0:rotary_dim:2]
    else:
        half = rotary_dim // 2
        y[..., :half] = sign1 * x[..., half:rotary_dim]
        y[..., half:] = sign2 * x[..., :half]
    return y


def rotate_with_tables(x, cos, sin, *, interleaved: bool, inverse: bool, dtype) -> np.ndarray:
    """HF's ``x * cos + rotate_half(x) * sin`` on the first R dims, evaluated
    the way PyTorch evaluates it eagerly in ``dtype``: every product and the
    sum rounded to ``dtype``. Dims ≥ R pass through.

    x: ``[B, S, H, D]`` values of ``dtype``; cos, sin: ``[B, S, 1, R]`` values
    of ``dtype`` (any float array). ``inverse``: the gradient autograd forms for
    that expression, ``g * cos + rotate_halfᵀ(g * sin)``, rounded the same way.
    Returns float64 holding ``dtype`` values."""
    def rnd(v):
        return round_to_dtype(v, dtype).astype(np.float64)

    x = np.asarray(x, dtype=np.float64)
    cos = np.asarray(cos, dtype=np.float64)
    sin = np.asarray(sin, dtype=np.float64)
    r = cos.shape[-1]
    xr = x[..., :r]
    out = x.copy()
    if inverse:
        out[..., :r] = rnd(rnd(xr * cos) + rotate_half(rnd(xr * sin), r, interleaved, True))
    else:
        out[..., :r] = rnd(rnd(xr * cos) + rnd(rotate_half(xr, r, interleaved) * sin))
    return out


def round_to_dtype(y, dtype):
    """Float64 ``y`` correctly rounded (nearest even) to ``dtype``.

    float32/float16: NumPy's casts round once. bfloat16: ml_dtypes casts through
    float32, which would round twice; rounding to float32 *to odd* first (sticky
    low bit) makes the second rounding exact."""
    y = np.asarray(y, dtype=np.float64)
    name = np.dtype(dtype).name
    if name != "bfloat16":
        return y.astype(dtype)
    t = y.astype(np.float32)
    back = t.astype(np.float64)
    with np.errstate(invalid="ignore"):
        too_far = np.abs(back) > np.abs(y)
    t = np.where(too_far, np.nextafter(t, np.float32(0)), t)
    inexact = t.astype(np.float64) != y
    bits = t.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32).astype(dtype)
