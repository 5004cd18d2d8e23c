"""Float64 reference of the fused QK-norm + RoPE (``cuprope.qknorm``), and a
NumPy emulation of Hugging Face's roundings of the same computation. Written
from the formulas, not from the kernel. Canonical layout: ``x`` is
``[B, S, H, D]`` (float64, or any float array); ``angles`` are the core
reference's ``[B, S, H or 1, R/2]`` (``cuprope.reference.pair_angles``), or
HF's cos/sin tables as a tuple ``(cos, sin)``, each ``[B or 1, S, 1, R]``.
"""
from __future__ import annotations

import numpy as np

from .. import reference

__all__ = ["forward", "backward", "model_forward", "model_backward", "rotation", "ROUNDINGS"]

ROUNDINGS = ("exact", "cast_then_weight", "weight_then_cast")


def _unit_axes(over):
    return (-1,) if over == "head" else (-2, -1)


def _weight_factor(weight, offset, h, d, over):
    """w' as ``[H or 1, D]`` float64 (ones when there is no weight)."""
    if weight is None:
        return np.ones((1, d))
    w = np.asarray(weight, dtype=np.float64) + float(offset)
    return w.reshape(1, d) if over == "head" else w.reshape(h, d)


def _rsqrt_ms(v, eps, over):
    axes = _unit_axes(over)
    return 1.0 / np.sqrt(np.mean(v * v, axis=axes, keepdims=True) + eps)


def rotation(x, angles, rotary_dim, interleaved, scale, inverse=False):
    """The rotation (``inverse``: its transpose) by ``angles`` (``[B, S, H or
    1, R/2]``) or by HF's tables, ``angles = (cos, sin)`` each ``[B or 1, S,
    1, R]``: x·cos + rotate_half(x)·sin, transposed x·cos + rotate_halfᵀ(x·sin)."""
    if not isinstance(angles, tuple):
        return reference.rotate(x, angles, rotary_dim=rotary_dim, interleaved=interleaved,
                                scale=scale, inverse=inverse)
    cos, sin = (np.asarray(t, dtype=np.float64) for t in angles)
    r = cos.shape[-1]
    out = np.array(x, dtype=np.float64)
    xr = out[..., :r].copy()
    if inverse:
        out[..., :r] = xr * cos + reference.rotate_half(xr * sin, r, interleaved, True)
    else:
        out[..., :r] = xr * cos + reference.rotate_half(xr, r, interleaved) * sin
    return out


def forward(x, angles, *, rotary_dim, interleaved, scale=1.0, weight=None, weight_offset=0.0,
            eps=1e-6, over="head", order="norm_then_rope"):
    """y in float64 ``[B, S, H, D]``.

    The norm of a row v (a head's D values, or with ``over="token"`` all
    H·D values of a token of one tensor)::

        N(v) = v · rsqrt(mean(v²) + eps) · w',   w' = weight_offset + weight

    (w' = 1 when there is no weight; ``weight`` is ``[D]`` for
    ``over="head"``, ``[H·D]`` for ``over="token"``).
    ``order="norm_then_rope"``: y = R(N(x)) on dims < R (dims ≥ R: N(x));
    ``"rope_then_norm"``: y = N(R(x)). ``angles`` and x as the module
    docstring says."""
    x = np.asarray(x, dtype=np.float64)
    wf = _weight_factor(weight, weight_offset, x.shape[2], x.shape[3], over)
    if order == "rope_then_norm":
        z = rotation(x, angles, rotary_dim, interleaved, scale)
        return z * _rsqrt_ms(z, eps, over) * wf
    n = x * _rsqrt_ms(x, eps, over) * wf
    return rotation(n, angles, rotary_dim, interleaved, scale)


def _norm_backward(v, u_in, wf, eps, over):
    """(dv, dw terms) of N at v for the incoming gradient u_in = dL/dN(v):
    dv = r (w'u − n̂ · mean(n̂ · w'u)), dw terms u · n̂ (per element)."""
    r = _rsqrt_ms(v, eps, over)
    nhat = v * r
    u = wf * u_in
    dot = np.mean(nhat * u, axis=_unit_axes(over), keepdims=True)
    return r * (u - nhat * dot), u_in * nhat


def backward(x, dy, angles, *, rotary_dim, interleaved, scale=1.0, weight=None,
             weight_offset=0.0, eps=1e-6, over="head", order="norm_then_rope"):
    """(dx ``[B, S, H, D]``, dw) in float64; dw has the weight's shape
    (``[D]`` or ``[H·D]``), summed over every token (and head), or None
    without a weight."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    h, d = x.shape[2], x.shape[3]
    wf = _weight_factor(weight, weight_offset, h, d, over)
    if order == "rope_then_norm":
        z = rotation(x, angles, rotary_dim, interleaved, scale)
        dz, terms = _norm_backward(z, dy, wf, eps, over)
        dx = rotation(dz, angles, rotary_dim, interleaved, scale, inverse=True)
    else:
        g = rotation(dy, angles, rotary_dim, interleaved, scale, inverse=True)
        dx, terms = _norm_backward(x, g, wf, eps, over)
    if weight is None:
        return dx, None
    dw = terms.sum(axis=(0, 1, 2)) if over == "head" else terms.sum(axis=(0, 1)).reshape(-1)
    return dx, dw


# ---------------------------------------------------------------- HF's roundings
def _f32(v):
    return np.asarray(v, dtype=np.float64).astype(np.float32)


def _to(v, dtype):
    """float64 values rounded once to ``dtype``, back as float64."""
    return reference.round_to_dtype(v, dtype).astype(np.float64)


def _model_norm(v, dtype, weight, offset, eps, over, rounding):
    """PyTorch's eager evaluation on the CPU of HF's norm modules at ``v``
    (values of ``dtype``): the fp32 variance (the correctly rounded mean of the
    fp32 squares: PyTorch's own summation order can differ in the last bit),
    ``1 / sqrt`` in fp32, ``v · r`` in fp32, then
      cast_then_weight (Qwen3RMSNorm, LlamaRMSNorm): round to dtype, times
        w'_T = (offset + w) rounded to dtype, rounded to dtype;
      weight_then_cast (Gemma3RMSNorm, Olmo2RMSNorm, Llama4TextL2Norm): times
        the fp32 (offset + w), rounded once to dtype."""
    vf = _f32(v)
    sq = (vf * vf).astype(np.float64)
    axes = _unit_axes(over)
    var = _f32(np.sum(sq, axis=axes, keepdims=True) / np.prod([v.shape[a] for a in axes]))
    r = np.float32(1.0) / np.sqrt(var + np.float32(eps))
    n = vf * r
    h, d = v.shape[2], v.shape[3]
    if weight is None:
        return _to(n, dtype)
    w = _f32(np.asarray(weight, dtype=np.float64).reshape((1, d) if over == "head" else (h, d)))
    wf = np.float32(offset) + w
    if rounding == "cast_then_weight":
        return _to(_to(n, dtype) * _to(wf, dtype), dtype)
    return _to(n * wf, dtype)


def model_forward(x, dtype, *, rotary_dim, interleaved, rounding, angles=None, scale=1.0,
                  tables=None, weight=None, weight_offset=0.0, eps=1e-6, over="head",
                  order="norm_then_rope"):
    """The model's own rounding sequence (``rounding`` a model mode of
    ROUNDINGS): the norm as ``_model_norm``, its output rounded to ``dtype``
    before the rotation; the rotation by HF's cos/sin ``tables`` (``[B or 1,
    S, 1, R]``) with PyTorch's roundings (``reference.rotate_with_tables``),
    or by ``angles`` in float64 rounded once. ``rope_then_norm``: the
    rotation rounded to dtype, then the norm. Returns float64 holding
    ``dtype`` values, ``[B, S, H, D]``."""
    x = np.asarray(x, dtype=np.float64)

    def rope(v):
        if tables is not None:
            return reference.rotate_with_tables(v, tables[0], tables[1], interleaved=interleaved,
                                                inverse=False, dtype=dtype)
        return _to(rotation(v, angles, rotary_dim, interleaved, scale), dtype)

    if order == "rope_then_norm":
        return _model_norm(rope(x), dtype, weight, weight_offset, eps, over, rounding)
    return rope(_model_norm(x, dtype, weight, weight_offset, eps, over, rounding))


def model_backward(x, dy, dtype, *, rotary_dim, interleaved, rounding, angles=None, scale=1.0,
                   tables=None, weight=None, weight_offset=0.0, eps=1e-6, over="head",
                   order="norm_then_rope"):
    """The gradient autograd forms for ``model_forward`` on the CPU, op by op
    in PyTorch's dtypes (x, dy: values of ``dtype``, ``[B, S, H, D]``):

      g = the rotation's backward of dy (HF's tables: PyTorch's roundings; or
          the transposed rotation rounded to dtype), or dy for rope_then_norm;
      cast_then_weight: dh = (g·w'_T)_T, dw terms (g·h)_T with h = (v·r)_T,
          dn = dh; weight_then_cast: dn = g·w' and dw terms g·n in fp32;
          no weight: dn = g;
      through n = v·r, r = rsqrt(var + eps), var = mean(v²) in fp32:
          dr = Σ dn·v, du = (−0.5·dr)·r³ (r·r·r), dv = dn·r + (du / N)·(2v),
      rounded to dtype (rope_then_norm: then the transposed rotation, rounded).
    Sums (dr, dw) are correctly rounded to fp32 (PyTorch's order can differ in
    the last bit). Returns (dx float64 holding dtype values, dw float64 of the
    fp32 sum, or None)."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)

    def rope_t(v, inverse):
        if tables is not None:
            return reference.rotate_with_tables(v, tables[0], tables[1], interleaved=interleaved,
                                                inverse=inverse, dtype=dtype)
        return _to(rotation(v, angles, rotary_dim, interleaved, scale, inverse), dtype)

    if order == "rope_then_norm":
        v, gin = rope_t(x, False), dy
    else:
        v, gin = x, rope_t(dy, True)
    axes = _unit_axes(over)
    count = np.prod([v.shape[a] for a in axes])
    vf = _f32(v)
    var = _f32(np.sum((vf * vf).astype(np.float64), axis=axes, keepdims=True) / count)
    r = np.float32(1.0) / np.sqrt(var + np.float32(eps))
    n = vf * r
    h, d = v.shape[2], v.shape[3]
    dw = None
    if weight is None:
        dn = _f32(gin)
    else:
        w = _f32(np.asarray(weight, dtype=np.float64).reshape((1, d) if over == "head" else (h, d)))
        wf = np.float32(weight_offset) + w
        if rounding == "cast_then_weight":
            dn = _f32(_to(gin * _to(wf, dtype), dtype))
            terms = _to(gin * _to(n, dtype), dtype)
        else:
            dn = _f32(gin) * wf
            terms = (_f32(gin) * n).astype(np.float64)
        dw = _f32(terms.sum(axis=(0, 1, 2)) if over == "head"
                  else terms.sum(axis=(0, 1)).reshape(-1)).astype(np.float64)
    dr = _f32(np.sum((dn * vf).astype(np.float64), axis=axes, keepdims=True))
    du = (np.float32(-0.5) * dr) * (r * r * r)
    dv = dn * r + (du / np.float32(count)) * (np.float32(2.0) * vf)
    dx = _to(dv, dtype)
    if order == "rope_then_norm":
        dx = rope_t(dx, True)
    return dx, dw
