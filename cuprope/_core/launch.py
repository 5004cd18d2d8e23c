"""The geometry pieces every op's launch shares: the device's
multiprocessor count (read once), the shared memory a block gets without
opting in, a rotated tensor in canonical terms (``TensorPlan``) and the
widest aligned pack width (``pick_vec``). Nothing here allocates or touches
a device but ``sm_count``.
"""
from __future__ import annotations

from .kernels import ITEMSIZE, vec_widths

SMEM_LIMIT = 48 * 1024  # per block, the most a launch gets without opting in

_SM_COUNT: dict[int, int] = {}


def sm_count(device: int) -> int:
    n = _SM_COUNT.get(device)
    if n is None:
        import cupy
        n = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
        _SM_COUNT[device] = n
    return n


class TensorPlan:
    """One rotated tensor in canonical [B, S, H, D] terms (strides in elements)."""

    __slots__ = ("in_ptr", "out_ptr", "in_strides", "out_strides", "heads")

    def __init__(self, in_ptr, out_ptr, in_strides, out_strides, heads):
        self.in_ptr, self.out_ptr = in_ptr, out_ptr
        self.in_strides, self.out_strides = in_strides, out_strides
        self.heads = heads


def pick_vec(dtype, plans, npairs, tail, n_batch, n_seq, widths=None) -> int:
    """Widest pairs-per-thread whose loads stay aligned for every tensor.

    ``tail``: pass-through elements copied per head (0 in-place). Every pointer
    (in elements), every stride of a dim longer than one, R/2 and the tail must
    be multiples of the width. ``widths``: the widths instantiated (widest
    first, ending with 1); default ``vec_widths(dtype)``."""
    itemsize = ITEMSIZE[dtype]
    acc = npairs | tail
    for p in plans:
        if (p.in_ptr | p.out_ptr) % itemsize:
            return 1
        acc |= (p.in_ptr | p.out_ptr) // itemsize
        for n, a, b in zip((n_batch, n_seq, p.heads), p.in_strides, p.out_strides):
            if n > 1:
                acc |= a | b
    for vec in (vec_widths(dtype) if widths is None else widths):
        if acc % vec == 0:
            return vec
    return 1
