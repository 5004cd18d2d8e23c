"""Tensor layouts in canonical ``[B, S, H, D]`` terms.

Public layouts (``RopeConfig.layout``, ``cuprope.config.LAYOUTS``): ``"bshd"`` ``[B, S, H, D]``,
``"bhsd"`` ``[B, H, S, D]`` and ``"thd"`` ``[T, H, D]`` (packed tokens: one
sequence of T). One-head tensors ``[B, N, D]`` use the internal layout
``"bsd"`` (H = 1). Every kernel sees sizes and strides in the canonical order.
"""
from __future__ import annotations

DIMS = {"bshd": "[B, S, H, D]", "bhsd": "[B, H, S, D]", "thd": "[T, H, D]", "bsd": "[B, S, D]"}


def ndim(layout: str) -> int:
    """Number of dims of a tensor in ``layout``."""
    return 3 if layout in ("thd", "bsd") else 4


def _canon(seq, layout, absent):
    """A shape's or strides' (batch, sequence, head) entries; ``absent`` for a
    dim the layout does not have."""
    if layout == "bshd":
        return seq[0], seq[1], seq[2]
    if layout == "bhsd":
        return seq[0], seq[2], seq[1]
    if layout == "thd":
        return absent, seq[0], seq[1]
    return seq[0], seq[1], absent


def canon_sizes(shape, layout: str):
    """(B, S, H) of a tensor of ``shape``."""
    return _canon(shape, layout, 1)


def canon_strides(strides, layout: str):
    """(batch, sequence, head) strides; 0 for a dim the layout does not have."""
    return _canon(strides, layout, 0)


def to_canon(a, layout: str):
    """A NumPy view of ``a`` as ``[B, S, H, D]``."""
    if layout == "bhsd":
        return a.transpose(0, 2, 1, 3)
    if layout == "thd":
        return a[None]
    if layout == "bsd":
        return a[:, :, None, :]
    return a


def from_canon(y, layout: str):
    """Inverse of :func:`to_canon`."""
    if layout == "bhsd":
        return y.transpose(0, 2, 1, 3)
    if layout == "thd":
        return y[0]
    if layout == "bsd":
        return y[:, :, 0, :]
    return y
