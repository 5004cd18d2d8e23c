"""The launch of DeepSeek MLA's fused call (``kernels/mla.cuh``) as a
launcher.LaunchSpec: kernel ``mla_rope_kernel`` of its ``mla`` family
(``mla/kernels.py``), one warp per (token, group of rows) of CUPROPE_THREADS-thread
blocks, the warp's cos/sin slice in dynamic shared memory, and three argument structs:
RopeArgs (q_pe as tensor 0 with its output, k_pe as tensor 1, positions,
frequencies), KvArgs (ckv as ``v``, the k_pe and ckv cache rows, the
addressing, the fp8 scales) and MlaArgs (q_nope and its output, the widths).
"""
from __future__ import annotations

from .._core import launcher
from .._core.launch import sm_count
from .._core.loader import tuning
from ..rope.args import KV_ARGS, ROPE_ARGS
from .kernels import FAMILY as MLA_FAMILY, MLA_ARGS, mla_kernel_name

THREADS = tuning("CUPROPE_THREADS")  # the kernel's bound (kThreads)
WARPS = THREADS // 32
# The warps per SM the host fills before a warp takes more than one row of a
# token (rows_per_warp): with few tokens the rows spread over many warps
# (decode); with many, a warp takes a whole token and computes its cos/sin once.
RESIDENT_WARPS_PER_SM = tuning("CUPROPE_MLA_WARPS_PER_SM")
FIXED_ROWS_PER_WARP = tuning("CUPROPE_MLA_ROWS_PER_WARP")  # 0: from the warps per SM


def rows_per_warp(device, tokens, heads) -> int:
    """Rows a warp covers: enough warps to fill the GPU, at most a token's."""
    rows = heads + 1
    if FIXED_ROWS_PER_WARP > 0:
        return min(rows, FIXED_ROWS_PER_WARP)
    want = sm_count(device) * RESIDENT_WARPS_PER_SM
    return max(1, min(rows, -(-tokens * rows // want)))


def mla_spec(device, *, dtype, interleaved, vec, fp8, rope, kv, mla, calls=(), pdl=False):
    """One ``mla_rope_kernel`` launch on ``device``: ``rope``, ``kv``,
    ``mla`` are the three structs' fields by name (``rope`` needs heads =
    (H, 1), n_seq = T, rot_dim; head_groups and heads_per_group are set
    here); ``calls`` the words Plan.run writes per call ((field, value
    index, addend), a field of any struct by name); ``pdl`` a programmatic
    dependent launch. Its plan allocates
    nothing on the device (CUDA-graph safe)."""
    tokens, heads = rope["n_seq"], rope["heads"][0]
    per = rows_per_warp(device, tokens, heads)
    groups = -(-(heads + 1) // per)
    warps = tokens * groups
    grid = (max(1, -(-warps // WARPS)), 1, 1)
    smem = WARPS * (rope["rot_dim"] // 2) * 8  # a float2 per pair per warp
    ra = ROPE_ARGS.pack(head_groups=groups, heads_per_group=per, **rope)
    return launcher.LaunchSpec(mla_kernel_name(dtype, interleaved, vec, fp8), MLA_FAMILY, grid,
                               (THREADS, 1, 1), smem,
                               [(ROPE_ARGS, ra), (KV_ARGS, KV_ARGS.pack(**kv)),
                                (MLA_ARGS, MLA_ARGS.pack(**mla))], calls, vec=vec, pdl=pdl)
