"""How the fused QK-norm + RoPE kernels (kernels/qknorm.cuh) are launched:
geometry, struct fields and LaunchSpecs of the kernel and of the weight
gradients' reduction, for the eager launcher, the fast path and the JAX
lowering alike (their inputs: a validated ``QkNormCall`` and array infos or
avals).
"""
from __future__ import annotations

import dataclasses

from .._core import engine, loader
from . import kernels
from .._core.launch import SMEM_LIMIT, TensorPlan, pick_vec
from .._core.launcher import LaunchSpec
from .._core.layout import canon_sizes, canon_strides
from ..rope.engine import position_fields

QKNORM_ARGS = kernels.QKNORM_ARGS  # struct QkNormArgs: a RopeArgs, then the norm's fields
W_DTYPE = {"float32": 0, "float16": 1, "bfloat16": 2}  # QkNormArgs.w_dtype
ROUNDINGS = ("exact", "cast_then_weight", "weight_then_cast")  # QkNormArgs.rounding codes

WARPS = loader.tuning("CUPROPE_QKNORM_WARPS")  # per block, every QK-norm kernel (kQkWarps)
THREADS = 32 * WARPS
# The flat entries keep the struct in static shared memory beside the bodies'
# dynamic shared memory; both launchers budget for it, so that they choose the
# same kernel (a launch without opting in gets SMEM_LIMIT bytes in all).
SMEM_BUDGET = SMEM_LIMIT - QKNORM_ARGS.size

# The per-call words of a QK-norm launch (LaunchSpec.calls) and the values
# Plan.run takes: (in0, in1, out0, out1, q weight, k weight, positions or
# cos, seq_offsets or sin, offset, then, backward, the saved q, k and the
# partial rows); forward, x is the input itself.
_COMMON = (("in_ptr0", 0, 0), ("in_ptr1", 1, 0), ("out_ptr0", 2, 0), ("out_ptr1", 3, 0),
           ("w_ptr0", 4, 0), ("w_ptr1", 5, 0), ("pos_ptr", 6, 0), ("seq_off_ptr", 7, 0),
           ("offset", 8, 0))
FORWARD_CALLS = _COMMON + (("x_ptr0", 0, 0), ("x_ptr1", 1, 0))
BACKWARD_CALLS = _COMMON + (("x_ptr0", 9, 0), ("x_ptr1", 10, 0), ("part_ptr", 11, 0))


@dataclasses.dataclass(frozen=True)
class Geometry:
    """One QK-norm launch: ``vec`` 0 runs ``qknorm_kernel`` (one partial row of
    the weight gradient per warp), else ``qknorm_rows_kernel`` at that pack
    width (one per block); ``blocks`` of THREADS threads, ``smem`` bytes of
    dynamic shared memory, a partial buffer of ``part_rows`` x ``part_cols``
    float32 (backward with a weight; ``part_cols`` 0 otherwise)."""

    dtype: str
    interleaved: bool
    backward: bool
    vec: int
    blocks: int
    smem: int
    part_rows: int
    part_cols: int
    step_groups: int = 1
    model: bool = False  # qknorm_rows_kernel's model modes' instantiation

    @property
    def kernel_name(self) -> str:
        """The by-value kernel's name expression (the eager path's)."""
        if self.vec:
            return kernels.qknorm_rows_kernel_name(self.dtype, self.interleaved, self.backward,
                                                  self.model)
        return kernels.qknorm_kernel_name(self.dtype, self.interleaved, self.backward)

    @property
    def flat_name(self) -> str:
        """Its flat entry's name expression (the JAX lowering's)."""
        return kernels.qknorm_flat_kernel_name(self.dtype, self.interleaved, self.vec,
                                              self.backward, self.model)


DW_PAD = loader.tuning("CUPROPE_QKNORM_DW_PAD")  # floats after each dw row (kernels kDwPad)
# the rows kernel's load ring, forward and backward (qknorm_ring_stages)
STAGES = (loader.tuning("CUPROPE_QKNORM_STAGES"), loader.tuning("CUPROPE_QKNORM_STAGES_BWD"))


def ring_bytes(backward):
    """Shared bytes of the rows kernel's load ring (qknorm_ring_stages): per
    warp its stages of 32 lanes x 16-byte packs, two forward (x), four
    backward (x, dy)."""
    return WARPS * STAGES[backward] * 32 * (4 if backward else 2) * 16


def fast_rows_bytes(npairs, vec, part_cols):
    """Shared bytes of the fast backward's dw rows: one per head row of each warp."""
    return WARPS * (32 // (npairs // vec)) * (part_cols + DW_PAD) * 4


def weight_lengths(call):
    """The q and k weights' lengths (0 without one)."""
    return [0 if w is None else w.shape[0] for w in call.winfos]


# qknorm_rows_kernel counts its work items (at most tokens x heads) in 32
# bits, the grid's warps (below 2^20) added: RowCursor.
ROWS_MAX_ITEMS = 2**31 - 2**20


def _heads(call, ins):
    """The heads of q and k together."""
    return sum(canon_sizes(i.shape, call.layout)[2] for i in ins)


def fast_vec(call, ins, out_infos, backward, part_cols):
    """The fast path's pack width, or 0 where qknorm_kernel runs: the norm
    per head, R = D, every tensor (and the caller's cos/sin tables) aligned
    for the widest packs, at most 32 lanes per head, at most ROWS_MAX_ITEMS
    heads in all, shared memory within SMEM_BUDGET."""
    cfg = call.config
    npairs = cfg.rotary_dim // 2
    widest = loader.vec_widths(call.dtype)[0]
    heads = _heads(call, ins)
    if (call.over != "head" or cfg.rotary_dim != call.d
            or call.b * call.s * heads > ROWS_MAX_ITEMS
            or npairs % widest or npairs // widest > 32
            or (call.tables and not _tables_aligned(call, widest))):
        return 0
    plans = engine.tensor_plans(ins, out_infos, call.layout)
    if backward:
        plans += [TensorPlan(x.ptr, x.ptr, canon_strides(x.strides, call.layout),
                             canon_strides(x.strides, call.layout), p.heads)
                  for x, p in zip(call.infos, plans)]
    vec = pick_vec(call.dtype, plans, npairs, 0, call.b, call.s, (widest, 1))
    need = slice_bytes(call, npairs, True) + 8 * call.d + ring_bytes(backward) + (
        fast_rows_bytes(npairs, widest, part_cols) if backward else 0)
    return widest if vec == widest and need <= SMEM_BUDGET else 0


def slice_bytes(call, npairs, rows) -> int:
    """The block's cos/sin slices: a warp's is npairs float2; in the rows
    kernel's model modes at fp32 twice that (a token's cos and sin rows of
    the caller's tables, kSlice)."""
    wide = rows and call.rounding != "exact" and call.dtype == "float32"
    return WARPS * npairs * 8 * (2 if wide else 1)


def _tables_aligned(call, vec):
    """Whether every lane's table packs (``vec`` elements at its chunk's
    offsets in a token's cos and sin rows) are aligned loads."""
    cinfo, sinfo, (tsb, tss) = call.tables
    piece = vec * loader.ITEMSIZE[call.dtype]
    strides = (tsb if call.b > 1 else 0) | (tss if call.s > 1 else 0)
    return cinfo.ptr % piece == 0 and sinfo.ptr % piece == 0 and strides % vec == 0


def geometry(call, ins, out_infos, backward, sms) -> Geometry:
    """The launch for ``call`` on a GPU of ``sms`` multiprocessors: the fast
    path when it applies (fast_vec), else qknorm_kernel; at most 8 (fast
    path) or 4 blocks per multiprocessor, the warps taking the tokens in a
    grid-stride loop."""
    npairs = call.config.rotary_dim // 2
    part_cols = sum(weight_lengths(call)) if backward else 0
    vec = fast_vec(call, ins, out_infos, backward, part_cols)
    tokens, cap = call.b * call.s, (8 if vec else 4) * WARPS * sms
    groups = 1
    if not backward:
        groups = (step_groups(call, ins, npairs, vec, tokens, cap) if vec
                  else unit_groups(call, ins, tokens, cap))
    warps = min(tokens * groups, cap)
    blocks = max(1, -(-warps // WARPS))
    smem = slice_bytes(call, npairs, bool(vec))
    if vec:
        smem += 8 * call.d + ring_bytes(backward) + (
            fast_rows_bytes(npairs, vec, part_cols) if backward else 0)
    if smem > SMEM_BUDGET:
        raise ValueError(f"rotary_dim {call.config.rotary_dim} is too large for the QK-norm "
                         f"kernels: {smem} bytes of shared memory per block (at most "
                         f"{SMEM_BUDGET})")
    return Geometry(call.dtype, call.config.interleaved, backward, vec, blocks, smem,
                    blocks if vec else blocks * WARPS, part_cols, groups,
                    model=bool(vec) and call.rounding != "exact")


def step_groups(call, ins, npairs, vec, tokens, cap) -> int:
    """How many warps share one token's heads in qknorm_rows_kernel: a warp
    walks 32 / (npairs / vec) heads a step, so a token of H heads takes
    ceil(H / that) dependent steps; with fewer tokens than the grid holds
    warps (decode), the steps are split into contiguous groups, each a
    warp's (every group non-empty), so the load latencies overlap; up to an
    eighth of the grid's warps (every warp also forms its token's cos/sin:
    past that the split measured slower in the prologue on an H200).
    Forward only (the backward kernel keeps one warp per token)."""
    heads = _heads(call, ins)
    return _groups(-(-heads // (32 // (npairs // vec))), tokens, cap)


def unit_groups(call, ins, tokens, cap) -> int:
    """The same split for qknorm_kernel, whose warp walks one unit a step (a
    head, or a tensor's heads for the norm over the token): at decode a
    token's units spread over warps instead of one warp's chain of them."""
    heads = [canon_sizes(i.shape, call.layout)[2] for i in ins]
    units = sum(h > 0 for h in heads) if call.over == "token" else sum(heads)
    return _groups(max(units, 1), tokens, cap)


def _groups(steps, tokens, cap) -> int:
    """Contiguous non-empty groups of ``steps`` for ``tokens`` tokens, up to
    an eighth of the ``cap`` warps."""
    want = max(1, min(steps, cap // 8 // max(tokens, 1)))
    per = -(-steps // want)
    return -(-steps // per)


def struct_fields(call, ins, out_infos, geo, *, inv_freq_ptr, stream_map_ptr, part_ptr):
    """QkNormArgs by field name for ``call`` launched as ``geo``: ``ins`` are
    q, k (forward) or grad_q, grad_k (backward), ``out_infos`` their outputs;
    the pointers are the infos' own (0 for avals: XLA passes the buffers)."""
    cfg, lay = call.config, call.layout
    pos = position_fields(cfg, call.pos_info) or (0, 0, 0, 0)
    fields = dict(
        in_ptr=[i.ptr for i in ins], out_ptr=[o.ptr for o in out_infos],
        heads=[canon_sizes(i.shape, lay)[2] for i in ins], n_batch=call.b, n_seq=call.s,
        head_dim=call.d, rot_dim=cfg.rotary_dim, inv_freq_ptr=inv_freq_ptr,
        freq_sh=cfg.rotary_dim // 2 if cfg.per_head else 0, stream_map_ptr=stream_map_ptr,
        scale=cfg.scale, sin_sign=1.0, offset=call.offset, pos_is64=pos[0],
        pos_s_stream=pos[1], pos_sb=pos[2], pos_ss=pos[3],
        pos_ptr=0 if call.pos_info is None else call.pos_info.ptr,
        seq_off_ptr=0 if call.seq_info is None else call.seq_info.ptr,
        seq_off_is64=int(call.seq_info is not None and call.seq_info.dtype == "int64"))
    for side, infos in (("in", ins), ("out", out_infos)):
        st = [canon_strides(i.strides, lay) for i in infos]
        for n, name in enumerate(("sb", "ss", "sh")):
            fields[f"{side}_{name}"] = [st[0][n], st[1][n]]
    if call.tables:
        cinfo, sinfo, (tsb, tss) = call.tables
        fields.update(pos_ptr=cinfo.ptr, seq_off_ptr=sinfo.ptr, pos_sb=tsb, pos_ss=tss,
                      offset=0, inv_freq_ptr=0)
    xst = [canon_strides(i.strides, lay) for i in call.infos]
    w, wlen = call.winfos, weight_lengths(call)
    fields.update(
        x_ptr=[i.ptr for i in call.infos], x_sb=[xst[0][0], xst[1][0]],
        x_ss=[xst[0][1], xst[1][1]], x_sh=[xst[0][2], xst[1][2]],
        w_ptr=[0 if x is None else x.ptr for x in w],
        w_dtype=[0 if x is None else W_DTYPE[x.dtype] for x in w], w_col=[0, wlen[0]],
        part_ptr=part_ptr, part_cols=geo.part_cols, norm_token=int(call.over == "token"),
        rope_first=int(call.order == "rope_then_norm"),
        rounding=ROUNDINGS.index(call.rounding), table=int(call.tables is not None),
        step_groups=geo.step_groups, eps=call.eps, weight_offset=call.weight_offset)
    return fields


def spec(call, ins, out_infos, geo, *, inv_freq_ptr, stream_map_ptr, part_ptr) -> LaunchSpec:
    """The LaunchSpec of the QK-norm kernel of ``call`` launched as ``geo``
    (struct_fields' arguments; Plan.run takes FORWARD_CALLS' or
    BACKWARD_CALLS' values)."""
    raw = QKNORM_ARGS.pack(**struct_fields(call, ins, out_infos, geo, inv_freq_ptr=inv_freq_ptr,
                                           stream_map_ptr=stream_map_ptr, part_ptr=part_ptr))
    return LaunchSpec(geo.kernel_name, kernels.FAMILY, (geo.blocks, 1, 1), (THREADS, 1, 1), geo.smem,
                      [(QKNORM_ARGS, raw)], BACKWARD_CALLS if geo.backward else FORWARD_CALLS,
                      flat=geo.flat_name, vec=max(geo.vec, 1),
                      align=max(geo.vec, 1) * loader.ITEMSIZE[geo.dtype])


# The per-call words of a weight-gradient reduction: Plan.run(stream, out_ptr, part_ptr).
DW_CALLS = (("out_ptr", 0, 0), ("part_ptr", 1, 0))


def dw_specs(call, geo, *, part_ptr=0, out_ptrs=(0, 0), out_dtype=None):
    """The weight-gradient reductions of a backward launched as ``geo``: per
    weight (q's, then k's; absent ones left out), (tensor index, the
    LaunchSpec of qknorm_dw_kernel summing the partial rows at ``part_ptr``
    into the weight gradient at ``out_ptrs[i]``, in ``out_dtype`` (default:
    the weight's dtype; "float32" for partial sums reduced later); its
    Plan.run takes DW_CALLS' values, the output and the partial rows). Blocks
    of THREADS threads, one column per lane."""
    out, wlen = [], weight_lengths(call)
    for i, w in enumerate(call.winfos):
        if w is None:
            continue
        raw = kernels.DW_ARGS.pack(part_ptr=part_ptr, rows=geo.part_rows, stride=geo.part_cols,
                                   col0=0 if i == 0 else wlen[0], cols=wlen[i],
                                   out_ptr=out_ptrs[i], out_dtype=W_DTYPE[out_dtype or w.dtype])
        out.append((i, LaunchSpec(kernels.QKNORM_DW_KERNEL, kernels.FAMILY, (-(-wlen[i] // 32), 1, 1),
                                  (THREADS, 1, 1), 0, [(kernels.DW_ARGS, raw)], DW_CALLS)))
    return out


_WORKSPACE: dict = {}  # (device, stream) -> the backward's partial-sum buffer (grown, kept)


def workspace(device, stream_ptr, n):
    """A float32 CuPy buffer of at least n elements for (device, stream),
    kept and reused (no allocation once warm: CUDA-graph capturable)."""
    import cupy
    buf = _WORKSPACE.get((device, stream_ptr))
    if buf is None or buf.size < n:
        with cupy.cuda.Device(device):
            buf = cupy.empty(n, dtype=cupy.float32)
        _WORKSPACE[(device, stream_ptr)] = buf
    return buf
