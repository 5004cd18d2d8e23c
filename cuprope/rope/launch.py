"""The rotation's launch as data: the vector width, the grid and the packed
RopeArgs of one call signature, as a launcher.LaunchSpec (``rope_spec``; the
core, the cos/sin tables, LRPE and the JAX lowering state their launches
through it). ``rope_spec`` allocates nothing and touches no device.
"""
from __future__ import annotations

from . import decode
from .args import ROPE_ARGS
from .._core.launch import SMEM_LIMIT, TensorPlan, pick_vec
from .._core.launcher import LaunchSpec
from .._core.loader import ITEMSIZE, tuning
from .kernels import (KV_ANGLES, KV_TABLES_T, LRPE_ACTS, SEQ_SLICES, SRC_PER_HEAD, SRC_SHARED,
                      SRC_TABLE, family_of, flat_kernel_name, kernel_name, lrpe_vec_widths,
                      seq_stats_kernel_name)

# The tuning values come from loader.TUNING, the same ones the kernels compile
# with (kernels.py has the defaults and what they measured). By element size:
# warps per block of the warp-per-(token, head group) kernels;
WARPS_PER_BLOCK = {2: tuning("CUPROPE_WARPS16"), 4: tuning("CUPROPE_WARPS32")}
# the depth of the shared-memory load ring of the plain shared-angle and
# cos/sin-table kernels with 16-byte packs;
STAGES = {2: tuning("CUPROPE_STAGES16"), 4: tuning("CUPROPE_STAGES32")}
SLOT_BYTES = 32 * 16  # one 16-byte pack per lane of a warp
# token runs (the per-head source with implicit positions): rows a lane
# advances between exact cos/sin (0 turns token runs off), and the depth of
# their load ring.
RUNS = {2: tuning("CUPROPE_RUN16"), 4: tuning("CUPROPE_RUN32")}
RUN_STAGES = {2: tuning("CUPROPE_RUN_STAGES16"), 4: tuning("CUPROPE_RUN_STAGES32")}
TOKEN_RUNS = tuning("CUPROPE_TOKEN_RUNS")
TOKEN_TILE = tuning("CUPROPE_TOKEN_TILE")  # a fixed tile (0: chosen per shape)
# The most warp steps (32 // min(chunks, 32) heads each) one warp takes per
# token, by angle source; 0 = no cap. Measured on an H200: short warps fill
# the GPU evenly to the end of the launch, but each warp pays the cos/sin (or
# table) prologue, so 1 step loses and 3 wins for the computed angles; the
# table source re-reads its tables per warp and wants 5.
# The shared source's prologue grows with R and with a stream map (MRoPE), and
# its cap with it (steps_cap).
MAX_STEPS = {SRC_SHARED: tuning("CUPROPE_MAX_STEPS"), SRC_PER_HEAD: tuning("CUPROPE_MAX_STEPS"),
             SRC_TABLE: tuning("CUPROPE_MAX_STEPS_TABLE")}
SOFTMAX_HEAD = LRPE_ACTS["softmax"]
SOFTMAX_SEQ = LRPE_ACTS["softmax_seq"]



def steps_cap(src, npairs, stream_map) -> int:
    """The most warp steps per token (0: no cap): MAX_STEPS, times the shared
    source's cos/sin prologue per lane (one sincos per 32 pairs, a position
    per stream per pair under a stream map) relative to R = 128 with one
    stream."""
    cap = MAX_STEPS[src]
    if cap and src == SRC_SHARED:
        cap *= -(-npairs // 64) * (2 if stream_map else 1)
    return cap


def ring_stages(itemsize, vec, src, act=0, backward_act=False) -> int:
    """Stages of the per-warp load ring the kernel uses (0: none), as
    rope_kernel's kStages decides it."""
    if src == SRC_PER_HEAD or act or backward_act or itemsize * vec != 16:
        return 0
    return STAGES[itemsize]


def ring_bytes(stages, src) -> int:
    """Shared bytes of one warp's load ring: two packs per stage, and four
    for the cos/sin-table packs (kernels/rope.cuh kSlots)."""
    if not stages:
        return 0
    return (2 * stages + (4 if src == SRC_TABLE else 0)) * SLOT_BYTES


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


def token_tile(sms, itemsize, chunks, htot, n_batch, n_seq) -> int:
    """Tokens per warp for token runs (0: use heads per warp instead).

    A warp then owns one head of ``tile`` consecutive tokens; each lane takes
    every rpw-th of them and computes exact cos/sin once per RUNS rows. Runs
    need at least one full run per lane (else a token's heads split over
    warps, as for decode); the tile is 1, 2 or 4 runs per lane, the longest
    that still gives ~16 blocks per SM."""
    rpw = 32 // min(chunks, 32)
    run = rpw * RUNS[itemsize]
    if not TOKEN_RUNS or not run or n_seq < run:
        return 0
    if TOKEN_TILE:
        return TOKEN_TILE
    want = 16 * sms * WARPS_PER_BLOCK[itemsize]
    m = 1
    while m < 4 and n_batch * htot * -(-n_seq // (2 * m * run)) >= want:
        m *= 2
    return m * run


def token_ring_bytes(itemsize, vec, backward_act) -> int:
    """Shared bytes of one warp's token-run load ring: with 16-byte packs,
    RUN_STAGES stages of two packs per lane (four in the LRPE backward, which
    also loads x); none otherwise."""
    if itemsize * vec != 16:
        return 0
    return (4 if backward_act else 2) * RUN_STAGES[itemsize] * SLOT_BYTES


def _token_grid(itemsize, per_warp, units):
    """(grid, block, shared bytes) for token runs: ``units`` warps of
    ``per_warp`` shared bytes each (the step rotation per pair, the ring)."""
    wpb = WARPS_PER_BLOCK[itemsize]
    while wpb > 1 and wpb * per_warp > SMEM_LIMIT:
        wpb //= 2
    return (-(-units // wpb), 1, 1), (32 * wpb, 1, 1), wpb * per_warp


# The per-call words of a rope launch (LaunchSpec.calls) and the values
# Plan.run takes: (in0, in1, out0, out1, positions or cos, sequence offsets
# or sin, offset); and of an LRPE launch: (x or dO, out, x of the fused
# backward, statistics, offset).
ROPE_CALLS = (("in_ptr0", 0, 0), ("in_ptr1", 1, 0), ("out_ptr0", 2, 0), ("out_ptr1", 3, 0),
              ("pos_ptr", 4, 0), ("seq_off_ptr", 5, 0), ("offset", 6, 0))
LRPE_CALLS = (("in_ptr0", 0, 0), ("in_ptr1", 0, 0), ("out_ptr0", 1, 0), ("out_ptr1", 1, 0),
              ("aux_ptr", 2, 0), ("stats_ptr", 3, 0), ("offset", 4, 0))


def rope_spec(*, sms, dtype, interleaved, plans, n_batch, n_seq, head_dim, rot_dim,
              copy_rest, pos, seq_off, inv_freq_ptr, freq_sh, stream_map_ptr, scale, sin_sign,
              act=0, backward_act=False, aux=None, table=None, calls=ROPE_CALLS,
              angles=None, decode_tables=False, pdl=False) -> LaunchSpec:
    """The LaunchSpec of one rope launch over one or two tensors (q and k) on
    a GPU of ``sms`` multiprocessors (no device is touched: the JAX lowering
    plans too). Plan.run then takes ``calls``' values: ROPE_CALLS (the core,
    the tables) or LRPE_CALLS (cuprope.lrpe, every activation).

    plans: TensorPlan per tensor (pointers only decide the vector width);
    pos: None or (is64, stride_stream, stride_b, stride_s); seq_off: None or is64.

    table: the cos/sin-table angle source, (cos_ptr, sin_ptr, stride_b,
    stride_s) of two [B, S, R] tables in ``dtype`` with a contiguous last dim
    (pointers only decide the vector width). ``run`` then takes the cos and
    sin pointers where it takes positions and sequence offsets; sin_sign < 0
    selects the backward; inv_freq, pos, seq_off and scale are unused.

    LRPE (cuprope/lrpe/api.py; one tensor, half split, R = D): ``act`` is the
    kernels' activation code, ``backward_act`` selects the fused backward
    through it, reading x from ``aux`` (a TensorPlan whose in_ptr/in_strides
    describe x). Act 5 (softmax over the sequence) gets a statistics pass,
    the spec's ``pre``, run first with the same words.

    angles: a callable giving (pointer, rows) of the config's angle table
    ((0, 0): none; ``decode.AngleSource``), called only when the launch takes
    the decode rows (``cuprope.rope.decode``: few tokens, shared angles);
    None: never (the JAX lowering).

    decode_tables: a launch of few tokens by the cos/sin-table source takes
    the decode rows too (their KV_TABLES_T source: the same roundings, so
    the same bits); False: never (the JAX lowering).

    pdl: a programmatic dependent launch (LaunchSpec.pdl), of the decode
    rows or of rope_kernel alike."""
    npairs = rot_dim // 2
    tail = head_dim - rot_dim if copy_rest else 0
    lrpe = act != 0 or backward_act
    if lrpe and (interleaved or len(plans) != 1 or tail or rot_dim != head_dim):
        raise ValueError("LRPE kernels take one half-split tensor with R = D")
    if table is not None and (lrpe or freq_sh):
        raise ValueError("the cos/sin-table source takes plain RoPE with no per-head table")
    extra = [] if aux is None else [aux]
    if table is not None:  # the tables' pointers and strides must allow the width too
        extra.append(TensorPlan(table[0], table[1], (table[2], table[3], 0),
                                (table[2], table[3], 0), 1))
    vec = pick_vec(dtype, plans + extra, npairs, tail, n_batch, n_seq,
                   lrpe_vec_widths(dtype) if lrpe else None)
    # pass-through chunks of two packs where the tail allows: a rotated chunk
    # is two packs too, so every lane moves the same bytes
    copy_packs = 0 if not copy_rest else (2 if tail % (2 * vec) == 0 else 1)
    chunks = npairs // vec + (tail // (vec * copy_packs) if copy_packs else 0)
    heads = [p.heads for p in plans] + [0] * (2 - len(plans))
    src = SRC_TABLE if table is not None else (SRC_PER_HEAD if freq_sh else SRC_SHARED)
    stages = ring_stages(ITEMSIZE[dtype], vec, src, act, backward_act)
    htot = heads[0] + heads[1]
    grid, block, groups, per_group, smem = grid_for(sms, ITEMSIZE[dtype], npairs, chunks, htot,
                                                    n_batch * n_seq, src == SRC_SHARED,
                                                    ring_bytes(stages, src),
                                                    steps_cap(src, npairs, stream_map_ptr))
    tile = 0
    run_smem = npairs * 8 + token_ring_bytes(ITEMSIZE[dtype], vec, backward_act)
    if (src == SRC_PER_HEAD and pos is None and not stream_map_ptr and act != SOFTMAX_HEAD
            and run_smem <= SMEM_LIMIT):
        tile = token_tile(sms, ITEMSIZE[dtype], chunks, htot, n_batch, n_seq)
    if tile:  # one warp per (sequence, token tile, head)
        grid, block, smem = _token_grid(ITEMSIZE[dtype], run_smem,
                                        htot * n_batch * -(-n_seq // tile))
    p0 = plans[0]
    p1 = plans[1] if len(plans) > 1 else p0
    pos_is64, pss, psb, pst = pos if pos is not None else (0, 0, 0, 0)
    if table is not None:
        if pos is not None or seq_off is not None:
            raise ValueError("the cos/sin tables take the position fields")
        psb, pst = table[2], table[3]
    aux_strides = aux.in_strides if aux is not None else (0, 0, 0)
    tokens = n_batch * n_seq
    decode_rows = ((angles is not None and src == SRC_SHARED or decode_tables and src == SRC_TABLE)
                   and not lrpe and not stream_map_ptr and decode.fits(dtype, vec, tokens))
    # pointers and the offset are written per call (ROPE_CALLS, LRPE_CALLS)
    args = ROPE_ARGS.pack(
        **dict(zip(("in_sb", "in_ss", "in_sh"), zip(p0.in_strides, p1.in_strides))),
        **dict(zip(("out_sb", "out_ss", "out_sh"), zip(p0.out_strides, p1.out_strides))),
        heads=heads, n_batch=n_batch, n_seq=n_seq, head_dim=head_dim, rot_dim=rot_dim,
        copy_rest=copy_packs, pos_is64=pos_is64, pos_s_stream=pss, pos_sb=psb, pos_ss=pst,
        seq_off_is64=int(bool(seq_off)), inv_freq_ptr=inv_freq_ptr, freq_sh=freq_sh,
        stream_map_ptr=stream_map_ptr, scale=scale, sin_sign=sin_sign, head_groups=groups,
        heads_per_group=per_group, aux_sb=aux_strides[0], aux_ss=aux_strides[1],
        aux_sh=aux_strides[2], stats_plane=n_batch * heads[0] * head_dim, tok_tile=tile)
    if decode_rows:
        ptr, n = angles() if src == SRC_SHARED else (0, 0)
        spec = decode.spec(sms, dtype=dtype, interleaved=interleaved, vec=vec,
                           src=KV_ANGLES if src == SRC_SHARED else KV_TABLES_T,
                           rope_args=args, kv=dict(cs_ptr=ptr, cs_st=rot_dim, cs_rows=n),
                           calls=calls, htot=htot, chunks=chunks, n_batch=n_batch,
                           n_seq=n_seq, pdl=pdl)
        if spec is not None:
            return spec
    key = (dtype, interleaved, vec, src, act, backward_act)
    family = family_of(act, src)
    align = vec * ITEMSIZE[dtype]
    pre = None
    if act == SOFTMAX_SEQ:
        cols = n_batch * heads[0] * npairs
        pre = LaunchSpec(seq_stats_kernel_name(dtype, backward_act), family,
                         (-(-cols // 32), 1, 1), (32, SEQ_SLICES, 1), 0, [(ROPE_ARGS, args)],
                         calls)
    return LaunchSpec(kernel_name(*key), family, grid, block, smem, [(ROPE_ARGS, args)], calls,
                      flat=flat_kernel_name(*key), pre=pre, vec=vec, align=align, pdl=pdl)
