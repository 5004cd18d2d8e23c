"""The geometry pieces every op's launch shares: the device's
multiprocessor count (read once), a rotated tensor in canonical terms
(``TensorPlan``), the widest aligned pack width (``pick_vec``) and the
warp-per-(token, head group) grid (``grid_for``). Nothing here allocates or
touches a device but ``sm_count``.
"""
from __future__ import annotations

from .loader import ITEMSIZE, tuning, vec_widths

SMEM_LIMIT = 48 * 1024  # per block, the most a launch gets without opting in

_SM_COUNT: dict[int, int] = {}


def sm_count(device: int) -> int:
    n = _SM_COUNT.get(device)
    if n is None:
        import cupy
        n = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
        _SM_COUNT[device] = n
    return n


# Warps per block of the warp-per-(token, head group) kernels, by element
# size (loader.TUNING: the values the kernels compile with).
WARPS_PER_BLOCK = {2: tuning("CUPROPE_WARPS16"), 4: tuning("CUPROPE_WARPS32")}


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


def grid_for(sms, itemsize, npairs, chunks, htot, tokens, shared_cs, ring=0, max_steps=0):
    """(grid, block, head groups per token, heads per group, shared bytes).

    One warp per (token, head group). A warp covers 32 // min(chunks, 32) heads
    per step; with few tokens the heads of a token are split over several warps
    so the GPU still fills (decode). ``shared_cs``: the warp keeps the token's
    cos/sin in shared memory (the shared angle source); ``ring``: the bytes
    of its load ring (ring_bytes); ``max_steps``: the most steps per warp (0:
    no cap)."""
    rpw = 32 // min(chunks, 32)
    steps = -(-htot // rpw)                     # warp steps to cover all heads
    wpb = WARPS_PER_BLOCK[itemsize]
    want = 16 * sms * wpb
    groups = max(1, min(steps, -(-want // tokens)))
    if max_steps:
        groups = max(groups, -(-steps // max_steps))
    per_group = -(-steps // groups) * rpw
    groups = -(-htot // per_group)
    smem_per_warp = (npairs * 8 if shared_cs else 0) + ring
    while wpb > 1 and wpb * smem_per_warp > SMEM_LIMIT:
        wpb //= 2
    if smem_per_warp > SMEM_LIMIT:
        raise ValueError(f"rotary_dim {2 * npairs} is too large: one warp's cos/sin table and load "
                         f"ring need {smem_per_warp} bytes of shared memory (at most {SMEM_LIMIT})")
    units = tokens * groups
    return (-(-units // wpb), 1, 1), (32 * wpb, 1, 1), groups, per_group, wpb * smem_per_warp
