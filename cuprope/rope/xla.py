"""The CUDA lowering of the rotation's JAX primitive (``cuprope.rope.jax``:
RoPE by a config, the cos/sin tables, LRPE's rotate-1d): the same
LaunchSpec the eager path plans (``launch.rope_spec``) as one kernel call
(``cuprope._core.xla``), its checks the eager call's on traced operands.
"""
from __future__ import annotations

import numpy as np

from .._core import launcher, validate
from .._core.launch import TensorPlan
from .._core.layout import canon_sizes, canon_strides
from .._core.xla import (AvalInfo, constant_operand, emit, kernel_call, layout_of, row_major,
                         sm_count)
from ..config import LAYOUTS
from .kernels import ENTRY, LRPE_ACTS
from .launch import rope_spec

def theta_table(call) -> np.ndarray:
    """LRPE's θ of a static call, float64 ``[rows, E]``."""
    rows, flat = call.theta
    return np.frombuffer(flat, dtype=np.float64).reshape(rows, -1)


def check_avals(call, avals):
    """The eager call's checks (cuprope._core.validate) on traced operands."""
    from ..config import config_by_key
    infos = [AvalInfo(a) for a in avals]
    xs, rest = infos[:call.n], infos[call.n:]
    names = ("q", "k") if call.n == 2 else ("x",)
    if call.kind == "rope":
        cfg = config_by_key(call.key)
        rows = cfg.inv_freq.shape[0] if cfg.per_head else None
        b, s, _ = validate.check_rotated(xs, names, cfg.layout, cfg.rotary_dim, rows)
        pos = rest[0] if call.has_pos else None
        seq = rest[-1] if call.has_seq else None
        validate.check_indices(cfg, 0, b, s, pos, seq, xs[0].shape)
    elif call.kind == "table":
        if call.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {call.layout!r}")
        validate.check_float(rest[0], "cos")
        r = validate.table_rotary_dim(rest[0])
        b, s, _ = validate.check_rotated(xs, names, call.layout, r)
        validate.check_tables(rest[0], rest[1], xs[0], b, s, call.layout)
    else:
        validate.check_bnhd(xs[0], "x")
        b, n = xs[0].shape[:2]
        validate.check_tokens(b * n, "B*N")
        if call.offset < 0 or (n and call.offset + n - 1 > validate.MAX_POSITION):
            raise ValueError(f"offset must be >= 0 with offset + N - 1 <= 2**31 - 1, got "
                             f"offset {call.offset} for N = {n}")
        if call.has_x and (rest[0].shape != xs[0].shape or rest[0].dtype != xs[0].dtype):
            raise ValueError("x and do must have the same shape and dtype")


def tensor_plan(aval, layout):
    """A TensorPlan of an XLA buffer: row-major, and aligned (the flat entry's
    array parameters make XLA check the alignment the vector width assumes)."""
    st = canon_strides(row_major(aval.shape), layout)
    return TensorPlan(0, 0, st, st, canon_sizes(aval.shape, layout)[2])


def _plan(call, avals):
    """(LaunchSpec, the XLA inputs by pointer role: an operand index or a
    host table to embed as a constant)."""
    from ..config import config_by_key
    xs = avals[:call.n]
    layout = call.layout
    b, s, _ = canon_sizes(xs[0].shape, layout)
    d = xs[0].shape[-1]
    inputs = {"in_ptr0": 0, "in_ptr1": 1} if call.n == 2 else {"in_ptr0": 0}
    rest = iter(range(call.n, len(avals)))
    kw = dict(dtype=np.dtype(xs[0].dtype).name, plans=[tensor_plan(a, layout) for a in xs],
              n_batch=b, n_seq=s, head_dim=d, copy_rest=True, pos=None, seq_off=None,
              inv_freq_ptr=0, freq_sh=0, stream_map_ptr=0, scale=1.0,
              sin_sign=-1.0 if call.inverse else 1.0)
    if call.kind == "rope":
        cfg = config_by_key(call.key)
        if call.has_pos:
            inputs["pos_ptr"] = i = next(rest)
            p = avals[i]
            st, shape = row_major(p.shape), p.shape
            s_stream = 0
            if cfg.n_streams > 1:
                s_stream, st, shape = st[0], st[1:], shape[1:]
            sb, ss = (0, st[0]) if len(shape) == 1 else st
            kw["pos"] = (int(np.dtype(p.dtype) == np.int64), s_stream, sb, ss)
        if call.has_seq:
            inputs["seq_off_ptr"] = i = next(rest)
            kw["seq_off"] = np.dtype(avals[i].dtype) == np.int64
        inputs["inv_freq_ptr"] = cfg.inv_freq
        if cfg.stream_map is not None:
            inputs["stream_map_ptr"] = cfg.stream_map
        kw.update(interleaved=cfg.interleaved, rot_dim=cfg.rotary_dim, scale=cfg.scale,
                  inv_freq_ptr=1, stream_map_ptr=int(cfg.stream_map is not None),
                  freq_sh=cfg.rotary_dim // 2 if cfg.per_head else 0)
    elif call.kind == "table":
        inputs["pos_ptr"], inputs["seq_off_ptr"] = next(rest), next(rest)  # cos, sin
        c = avals[inputs["pos_ptr"]]
        st = row_major(c.shape)
        tb, ts = (0, st[0]) if len(c.shape) == 2 else ((st[0] if c.shape[0] > 1 else 0), st[1])
        kw.update(interleaved=call.interleaved, rot_dim=c.shape[-1], table=(0, 0, tb, ts))
    else:
        theta = theta_table(call)
        table = np.zeros((theta.shape[0], d // 2))
        table[:, :theta.shape[1]] = theta  # angle 0: the pair passes through exactly
        inputs["inv_freq_ptr"] = table
        act = (LRPE_ACTS["softmax_seq"] if call.act == "softmax" and call.dim == 1
               else LRPE_ACTS.get(call.act, 0))
        fused_x = call.inverse and act != 0
        kw.update(interleaved=False, rot_dim=d, copy_rest=False, act=act, backward_act=fused_x,
                  inv_freq_ptr=1, freq_sh=d // 2 if table.shape[0] > 1 else 0)
        if fused_x:
            inputs["aux_ptr"] = i = next(rest)
            kw["aux"] = tensor_plan(avals[i], layout)
    return rope_spec(sms=sm_count(), **kw), inputs


def seq_stats_call(ctx, ins, pre, inputs, words):
    """LRPE's softmax over the sequence: the statistics pass (``pre``, the
    spec's LaunchSpec of ``lrpe_seq_stats_kernel``) as its own kernel call
    through ``lrpe_seq_stats_flat_kernel`` (kernels/lrpe.cuh: the by-value
    kernel's work in one-dimensional blocks), before the rotation. Its
    parameters: the packed RopeArgs ``words`` (a constant), x (dO in the
    backward), the frequency table, aux (x, backward) and the float
    statistics planes it returns, ``[2 or 3, B*H*D]`` flat. Returns (that
    result, its (shape, dtype))."""
    import jax
    (st, _), = pre.params
    fused_x = "aux_ptr" in inputs
    operands = [constant_operand(words)[0], ins[inputs["in_ptr0"]],
                constant_operand(inputs["inv_freq_ptr"])[0]]
    layouts = [[0], layout_of(ctx.avals_in[inputs["in_ptr0"]]), [0]]
    if fused_x:
        operands.append(ins[inputs["aux_ptr"]])
        layouts.append(layout_of(ctx.avals_in[inputs["aux_ptr"]]))
    params = [("array", 8), ("array", 0), ("array", 8),
              ("array", 0) if fused_x else ("scalar", 0, "u64"), ("array", 0)]
    shape = ((3 if fused_x else 2) * int(words[st.slot("stats_plane")]),)
    stats = jax.core.ShapedArray(shape, np.float32)
    name = pre.kernel.replace("lrpe_seq_stats_kernel<", "lrpe_seq_stats_flat_kernel<", 1)
    out = kernel_call(name, entry=ENTRY, grid=pre.grid, warps=pre.block[0] * pre.block[1] // 32,
                      smem=0,
                      params=params, operands=operands, operand_layouts=layouts,
                      result_avals=[stats])
    return out[0], (shape, np.dtype(np.float32))


def lower_cuda(ctx, *ins, call):
    """The lowering rule of ``cuprope.jax``'s primitive: the eager path's
    LaunchSpec as one kernel call whose operands are the inputs in
    pointer-role order (embedded tables as constants). LRPE's softmax over
    the sequence runs its statistics call first; the rotation then reads the
    statistics through ``stats_ptr``, a result aliased to its operand, which
    XLA's buffer order (operands, then results) places in the unused
    ``in_ptr1`` slot (one tensor: the kernel never reads in_ptr[1])."""
    spec, inputs = _plan(call, ctx.avals_in)
    vector_roles = {"in_ptr0", "in_ptr1", "aux_ptr", "out_ptr0", "out_ptr1"}
    if call.kind == "table":
        vector_roles |= {"pos_ptr", "seq_off_ptr"}  # the cos and sin tables
    outputs = ("out_ptr0", "out_ptr1") if call.n == 2 else ("out_ptr0",)
    sources = {r: ("operand", src) if isinstance(src, int) else ("constant", src)
               for r, src in inputs.items()}
    sources.update({r: "out" for r in outputs})
    align = {r: spec.align if r in vector_roles else 8 if r == "inv_freq_ptr" else 0
             for r in sources}
    fixed = {"offset": call.offset}
    if spec.pre is None:
        return emit(ctx, ins, launcher.flat_call(spec, sources, align, fixed=fixed))
    (st, raw), = spec.params
    words = np.frombuffer(raw, dtype=np.int64).copy()
    words[st.slot("offset")] = call.offset
    stats, stats_result = seq_stats_call(ctx, ins, spec.pre, inputs, words)
    sources.update({"in_ptr1": ("part",), "stats_ptr": "out"})
    align.update({"in_ptr1": 0, "stats_ptr": 0})
    results = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out] + [stats_result]
    fc = launcher.flat_call(spec, sources, align, fixed=fixed, results=results)
    out = emit(ctx, ins, fc, part=stats,
               aliases={fc.operands.index(("part",)): len(ctx.avals_out)})
    return out[:len(ctx.avals_out)]
