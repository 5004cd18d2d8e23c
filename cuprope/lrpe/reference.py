"""Float64 reference for LRPE rotate-1d: an activation, then RoPE with angles
given per head, and the backward through both. Canonical layout
``[B, N, H, D]``; every head splits at D/2, pair i = (x[i], x[i + D/2]). θ
comes as ``theta2`` ``[1 or H, E]`` (E <= D/2; see
``cuprope.lrpe.normalize_theta``); pairs i >= E pass through. The NumPy
backend of ``cuprope.lrpe`` and the tests' oracle, written from the
formulas, not from the kernel.
"""
from __future__ import annotations

import numpy as np

__all__ = ["ACTS", "activation", "rotate", "forward_reference", "backward_reference"]

ACTS = ("none", "relu", "sigmoid", "silu", "softmax")


def activation(x, act: str, dim=None) -> np.ndarray:
    """act(x) in float64 over canonical ``[B, N, H, D]``: elementwise, or a
    softmax over the head dim (dim None / -1) or the sequence (dim 1)."""
    x = np.asarray(x, dtype=np.float64)
    if act == "none":
        return x.copy()
    if act == "relu":
        return np.where(x < 0, 0.0, x)
    if act == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if act == "silu":
        return x / (1.0 + np.exp(-x))
    if act == "softmax":
        axis = 1 if dim == 1 else -1
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(x - np.max(x, axis=axis, keepdims=True))
            return e / np.sum(e, axis=axis, keepdims=True)
    raise ValueError(f"act must be one of {ACTS}, got {act!r}")


def rotate(x, theta2, offset: int = 0, *, inverse: bool = False) -> np.ndarray:
    """LRPE's rotation in float64 over canonical ``[B, N, H, D]``.

    theta2: ``[1 or H, E]`` (normalize_theta). Pair i = (x[i], x[i + D/2]) with
    i < E rotates by (t + offset)·θ[h, i]: (x1 cos − x2 sin, x1 sin + x2 cos);
    ``inverse`` uses −sin (Rᵀ). Pairs i >= E are returned unchanged."""
    x = np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    e = theta2.shape[1]
    t = np.arange(x.shape[1], dtype=np.int64) + np.int64(offset)
    ang = t.astype(np.float64)[:, None, None] * theta2[None, :, :]  # [N, 1 or H, E]
    cos, sin = np.cos(ang), np.sin(ang) * (-1.0 if inverse else 1.0)
    x1, x2 = x[..., :e], x[..., half:half + e]
    out = x.copy()
    out[..., :e] = x1 * cos - x2 * sin
    out[..., half:half + e] = x1 * sin + x2 * cos
    return out


def forward_reference(x, theta2, offset: int = 0, act: str = "none", dim=None) -> np.ndarray:
    """O = rotate(act(x, dim)) in float64 (canonical ``[B, N, H, D]``)."""
    return rotate(activation(x, act, dim), theta2, offset)


def backward_reference(x, do, theta2, offset: int = 0, act: str = "none", dim=None) -> np.ndarray:
    """dX in float64: g = Rᵀ dO, then act'(x) ⊙ g, or s ⊙ (g − Σ g ⊙ s) for a
    softmax s over its dim."""
    g = rotate(do, theta2, offset, inverse=True)
    if act == "none":
        return g
    x = np.asarray(x, dtype=np.float64)
    if act == "relu":
        return np.where(x > 0, g, 0.0)
    if act == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-x))
        return g * s * (1.0 - s)
    if act == "silu":
        s = 1.0 / (1.0 + np.exp(-x))
        return g * s * (1.0 + x * (1.0 - s))
    if act == "softmax":
        s = activation(x, "softmax", dim)
        axis = 1 if dim == 1 else -1
        return s * (g - np.sum(g * s, axis=axis, keepdims=True))
    raise ValueError(f"act must be one of {ACTS}, got {act!r}")
