"""Packs kernel arguments, picks the vector width and the grid, launches.

Everything here is per call and on the host hot path: no allocation of
tables (they are cached per device in RopeConfig), no synchronisation.
"""
from __future__ import annotations

import struct

import numpy as np

from ._loader import ITEMSIZE, MODULES, kernel_name, vec_widths

THREADS = 256      # kernels/rope.cuh kThreads
SMEM_LIMIT = 32 * 1024
MAX_TOKENS = 2 ** 31 - 1  # the kernel indexes tokens in 32 bits

# Mirrors struct RopeArgs in kernels/rope.cuh: 34 int64, 2 float64, 2 int64.
_ARGS = struct.Struct("<34q2d2q")
_ARGS_DTYPE = np.dtype([("raw", np.uint8, (_ARGS.size,))])

_SM_COUNT: dict[int, int] = {}
_FUNCS: dict = {}


def sm_count(device: int) -> int:
    n = _SM_COUNT.get(device)
    if n is None:
        import cupy
        n = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
        _SM_COUNT[device] = n
    return n


def rows_in_flight(dtype: str, vec: int) -> int:
    """kernels/rope.cuh rows_in_flight<T, VEC>()."""
    return 2 if ITEMSIZE[dtype] * vec >= 16 else 4


def _function(device, dtype, interleaved, vec):
    key = (device, dtype, interleaved, vec)
    fn = _FUNCS.get(key)
    if fn is None:
        fn = MODULES.functions(device)[kernel_name(dtype, interleaved, vec)]
        _FUNCS[key] = fn
    return fn


class TensorPlan:
    """One rotated tensor in canonical [B, S, H, D] terms (strides in elements)."""

    __slots__ = ("in_ptr", "out_ptr", "in_strides", "out_strides", "heads")

    def __init__(self, in_ptr, out_ptr, in_strides, out_strides, heads):
        self.in_ptr, self.out_ptr = in_ptr, out_ptr
        self.in_strides, self.out_strides = in_strides, out_strides
        self.heads = heads


def pick_vec(dtype, plans, npairs, tail, n_batch, n_seq) -> int:
    """Widest pairs-per-thread whose loads stay aligned for every tensor.

    ``tail``: pass-through elements copied per head (0 in-place). Every pointer
    (in elements), every stride of a dim longer than one, R/2 and the tail must
    be multiples of the width."""
    itemsize = ITEMSIZE[dtype]
    acc = npairs | tail
    for p in plans:
        if (p.in_ptr | p.out_ptr) % itemsize:
            return 1
        acc |= (p.in_ptr | p.out_ptr) // itemsize
        for n, a, b in zip((n_batch, n_seq, p.heads), p.in_strides, p.out_strides):
            if n > 1:
                acc |= a | b
    for vec in vec_widths(dtype):
        if acc % vec == 0:
            return vec
    return 1


def grid_for(device, dtype, vec, npairs, chunks, htot, tokens, shared_freq):
    """(grid, block, tokens per block, heads per block, shared bytes)."""
    bdx = min(chunks, THREADS)
    bdy = max(1, THREADS // bdx)
    rows_target = bdy * rows_in_flight(dtype, vec) * 2
    if htot <= rows_target:
        tpb = rows_target // htot
        tpb = min(tpb, -(-tokens // (2 * sm_count(device))))
        if shared_freq:
            tpb = min(tpb, SMEM_LIMIT // (8 * npairs))
        tpb = max(tpb, 1)
        hpb, grid_y = htot, 1
    else:
        tpb, hpb = 1, rows_target
        grid_y = -(-htot // hpb)
    smem = tpb * npairs * 8 if shared_freq else 0
    return (-(-tokens // tpb), grid_y, 1), (bdx, bdy, 1), tpb, hpb, smem


def launch(*, device, stream_ptr, dtype, interleaved, plans, n_batch, n_seq, head_dim,
           rot_dim, copy_rest, pos, seq_off, offset, inv_freq_ptr, freq_sh, stream_map_ptr,
           scale, sin_sign):
    """Launch one rope kernel over one or two tensors (q and k).

    pos: None or (ptr, is64, stride_stream, stride_b, stride_s);
    seq_off: None or (ptr, is64)."""
    npairs = rot_dim // 2
    tail = head_dim - rot_dim if copy_rest else 0
    vec = pick_vec(dtype, plans, npairs, tail, n_batch, n_seq)
    chunks = (npairs + tail) // vec
    heads = [p.heads for p in plans] + [0] * (2 - len(plans))
    grid, block, tpb, hpb, smem = grid_for(device, dtype, vec, npairs, chunks,
                                           heads[0] + heads[1], n_batch * n_seq, freq_sh == 0)
    p0 = plans[0]
    p1 = plans[1] if len(plans) > 1 else p0
    pos_ptr, pos_is64, pss, psb, pst = pos if pos is not None else (0, 0, 0, 0, 0)
    so_ptr, so_is64 = seq_off if seq_off is not None else (0, 0)
    raw = _ARGS.pack(
        p0.in_ptr, p1.in_ptr, p0.out_ptr, p1.out_ptr,
        p0.in_strides[0], p1.in_strides[0], p0.in_strides[1], p1.in_strides[1],
        p0.in_strides[2], p1.in_strides[2],
        p0.out_strides[0], p1.out_strides[0], p0.out_strides[1], p1.out_strides[1],
        p0.out_strides[2], p1.out_strides[2],
        heads[0], heads[1],
        n_batch, n_seq, head_dim, rot_dim, int(copy_rest),
        pos_ptr, pos_is64, pss, psb, pst, so_ptr, so_is64, offset,
        inv_freq_ptr, freq_sh, stream_map_ptr,
        scale, sin_sign,
        tpb, hpb)
    args = np.frombuffer(raw, dtype=_ARGS_DTYPE)
    _function(device, dtype, interleaved, vec)(grid, block, (args,), shared_mem=smem,
                                              stream=_Stream(stream_ptr))
    return vec


class _Stream:
    """Minimal stand-in for a CuPy stream: CuPy's launcher reads only ``.ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr
