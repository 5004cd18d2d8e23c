"""Test-side helpers: the float64 expectation for a call and the tolerance rule.

The expectation is built from ``cuprope.reference`` (written from the seed
formulas) on canonical [B, S, H, D] views; it never calls the kernel path.
"""
import numpy as np

from cuprope import reference

MANTISSA = {"float16": (10, -14), "bfloat16": (7, -126)}


def to_canon(a, layout):
    if layout == "bhsd":
        return a.transpose(0, 2, 1, 3)
    if layout == "thd":
        return a[None]
    return a


def from_canon(a, layout):
    if layout == "bhsd":
        return a.transpose(0, 2, 1, 3)
    if layout == "thd":
        return a[0]
    return a


def expected(x, cfg, *, inverse=False, positions=None, offset=0, seq_offsets=None):
    """float64 result of rotating host array ``x`` (any float dtype) with ``cfg``."""
    xc = to_canon(np.asarray(x, dtype=np.float64), cfg.layout)
    b, s = xc.shape[:2]
    pos = reference.token_positions(b, s, positions=positions, offset=offset,
                                    seq_offsets=seq_offsets, n_streams=cfg.n_streams)
    ang = reference.pair_angles(pos, cfg.inv_freq, cfg.stream_map)
    y = reference.rotate(xc, ang, rotary_dim=cfg.rotary_dim, interleaved=cfg.interleaved,
                         scale=cfg.scale, inverse=inverse)
    return from_canon(y, cfg.layout)


def ulp(values, dtype):
    """One unit in the last place of ``values`` (already rounded to ``dtype``)."""
    m, emin = MANTISSA[dtype]
    v = np.abs(np.asarray(values, dtype=np.float64))
    e = np.floor(np.log2(np.where(v > 0, v, 1.0)))
    e = np.where(v > 0, np.maximum(e, emin), emin)
    return np.exp2(e - m)


def round_to(ref, dtype):
    if dtype == "bfloat16":
        import ml_dtypes
        return reference.round_to_dtype(ref, ml_dtypes.bfloat16).astype(np.float64)
    return ref.astype(dtype).astype(np.float64)


def assert_matches(out, ref, xmax, dtype, scale=1.0):
    """fp32: max|out − ref| ≤ 1e-6·max|x|·scale. fp16/bf16: each element within
    one ulp of ref rounded to the dtype, plus 1e-6·max|x|·scale. NaN fails."""
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert not np.isnan(out).any(), "output holds NaN (an element was not written)"
    err = np.abs(out - ref)
    slack = 1e-6 * xmax * max(1.0, abs(scale))
    if dtype == "float32":
        bound = np.full(ref.shape, slack)
    else:
        bound = ulp(round_to(ref, dtype), dtype) + slack
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), ref.shape)
        raise AssertionError(f"{bad.sum()} of {err.size} elements off; worst at {i}: "
                             f"out={out[i]!r} ref={ref[i]!r} err={err[i]:.3e} bound={bound[i]:.3e}")
    return float(err.max())
