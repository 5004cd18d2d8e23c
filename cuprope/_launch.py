"""Packs kernel arguments, picks the vector width and the grid, launches.

Everything here is per call and on the host hot path: no allocation of
tables (they are cached per device in RopeConfig), no synchronisation.
"""
from __future__ import annotations

import struct

import numpy as np

from ._loader import ITEMSIZE, MODULES, kernel_name, vec_widths

THREADS = 256      # kernels/rope.cuh kThreads
UNROLL = 2         # kernels/rope.cuh kUnroll
ITEMS_PER_BLOCK = THREADS * UNROLL
SMEM_LIMIT = 32 * 1024

# Mirrors struct RopeArgs in kernels/rope.cuh: 34 int64, 2 float64, 2 int64.
_ARGS = struct.Struct("<34q2d2q")
_ARGS_DTYPE = np.dtype([("raw", np.uint8, (_ARGS.size,))])

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


def pick_vec(dtype, plans, npairs, head_dim, rot_dim, copy_rest, n_batch, n_seq) -> int:
    """Widest pairs-per-thread whose loads stay aligned for every tensor."""
    for vec in vec_widths(dtype):
        if npairs % vec or (copy_rest and (head_dim - rot_dim) % vec):
            continue
        nbytes = vec * ITEMSIZE[dtype]
        ok = True
        for p in plans:
            for ptr in (p.in_ptr, p.out_ptr):
                if ptr % nbytes:
                    ok = False
            for strides in (p.in_strides, p.out_strides):
                for n, st in zip((n_batch, n_seq, p.heads), strides):
                    if n > 1 and st % vec:
                        ok = False
        if ok:
            return vec
    return 1


def launch(*, device, stream_ptr, dtype, interleaved, plans, n_batch, n_seq, head_dim,
           rot_dim, copy_rest, pos, seq_off, offset, inv_freq_ptr, freq_sh, stream_map_ptr,
           scale, sin_sign):
    """Launch one rope kernel over one or two tensors (q and k).

    pos: None or (ptr, is64, stride_stream, stride_b, stride_s);
    seq_off: None or (ptr, is64)."""
    npairs = rot_dim // 2
    vec = pick_vec(dtype, plans, npairs, head_dim, rot_dim, copy_rest, n_batch, n_seq)
    chunks = npairs // vec + ((head_dim - rot_dim) // vec if copy_rest else 0)
    heads = [p.heads for p in plans] + [0] * (2 - len(plans))
    htot = heads[0] + heads[1]
    tokens = n_batch * n_seq
    per_tok = htot * chunks
    if per_tok <= ITEMS_PER_BLOCK:
        tpb = ITEMS_PER_BLOCK // per_tok
        tpb = min(tpb, -(-tokens // (4 * sm_count(device))), SMEM_LIMIT // (8 * npairs))
        tpb = max(tpb, 1)
        hpb, grid_y = htot, 1
    else:
        tpb = 1
        groups = -(-per_tok // ITEMS_PER_BLOCK)
        hpb = -(-htot // groups)
        grid_y = -(-htot // hpb)
    grid_x = -(-tokens // tpb)
    smem = 0 if freq_sh else tpb * npairs * 8

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
    fn = MODULES.functions(device)[kernel_name(dtype, interleaved, vec)]
    fn((grid_x, grid_y, 1), (THREADS, 1, 1), (args,), shared_mem=smem, stream=_Stream(stream_ptr))
    return vec


class _Stream:
    """Minimal stand-in for a CuPy stream: CuPy's launcher reads only ``.ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr
