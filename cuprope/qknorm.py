"""Fused QK-norm + RoPE: the per-head (or per-token) norm of q and k that
Qwen3, Gemma 3 and OLMo 2 apply right before RoPE, and Llama 4 right after
it, forward and backward, q and k in one launch.

Shapes (``config.layout`` as in ``cuprope.api``): q ``[B, S, Hq, D]``
(``"bshd"``), ``[B, Hq, S, D]`` (``"bhsd"``) or ``[T, Hq, D]`` (``"thd"``), k
the same with Hk heads (GQA/MQA); float32, float16 or bfloat16; any batch,
sequence and head strides, a contiguous last dim. Weights: 1-D contiguous,
``[D]`` for ``norm_over="head"``, ``[H·D]`` (that tensor's heads) for
``norm_over="token"``, any float dtype, on q's device.

Semantics, per row v (one head's D values, or with ``norm_over="token"`` all
H·D values of one token of one tensor):

    N(v) = v · rsqrt(mean(v²) + eps) · w',   w' = weight_offset + weight

(w' = 1 without a weight). ``norm="rms"`` takes weights (Qwen3: offset 0,
Gemma 3: offset 1); ``norm="l2"`` is Llama 4's ``Llama4TextL2Norm``, the same
formula with no weight. ``order="norm_then_rope"``: y = R(N(x)) (dims ≥ R:
N(x)); ``"rope_then_norm"``: y = N(R(x)). R is ``config``'s rotation (every
frequency scheme, per-head tables, stream maps, partial rotary, positions,
offsets, ``seq_offsets``), or HF's own cos/sin ``tables=(cos, sin)``.

``rounding``: ``"exact"`` (fp32 from float64 angles, rounded once);
``"cast_then_weight"`` (Qwen3RMSNorm / LlamaRMSNorm: v·r rounded to the dtype,
times the weight in the dtype) or ``"weight_then_cast"`` (Gemma3RMSNorm,
Olmo2RMSNorm, Llama4TextL2Norm: v·r·(offset + w) in fp32, rounded once). In
the two model modes the norm's output is rounded to the dtype before the
rotation (the rotation's before the norm for ``rope_then_norm``), and with
``tables`` the rotation is HF's ``q·cos + rotate_half(q)·sin`` with PyTorch's
roundings, so a Qwen3 or Gemma 3 attention block gets HF's q and k bit for bit
(the fp32 sums aside: their order is PyTorch's own; bf16 squares and products
are exact in fp32). The backward is the exact gradient with
``rounding="exact"``; in the model modes it is the gradient autograd forms for
HF's modules, op by op in their dtypes (``qknorm_reference.model_backward``).
"""
from __future__ import annotations

import struct

import numpy as np

from . import qknorm_reference as qref
from . import reference
from ._core import engine, host, validate
from ._core.args import pack_args
from ._core.arrays import describe, empty_like, overlaps, wrap_like
from ._core.driver import Stream
from ._core.layout import canon_sizes, canon_strides, to_canon
from ._core.launch import SMEM_LIMIT, TensorPlan, pick_vec, sm_count
from ._core.loader import (MODULES, QKNORM_DW_KERNEL, qknorm_kernel_name,
                           qknorm_rows_kernel_name, vec_widths)
from .config import RopeConfig

__all__ = ["rope_qk_norm_forward", "rope_qk_norm_backward"]

NORMS = ("rms", "l2")
ORDERS = ("norm_then_rope", "rope_then_norm")
NORM_OVER = ("head", "token")
W_DTYPE = {"float32": 0, "float16": 1, "bfloat16": 2}

# The int64 fields of struct QkNormArgs after its RopeArgs (kernels/qknorm.cuh), in
# order, (name, count); then two doubles, eps and weight_offset. ARGS_EXTRA packs them
# (tests/test_qknorm.py compares both with the C struct).
ARGS_EXTRA_FIELDS = (("x_ptr", 2), ("x_sb", 2), ("x_ss", 2), ("x_sh", 2), ("w_ptr", 2),
                 ("w_dtype", 2), ("w_col", 2), ("part_ptr", 1), ("part_cols", 1),
                 ("norm_token", 1), ("rope_first", 1), ("rounding", 1), ("table", 1))
ARGS_EXTRA = struct.Struct("<" + "q" * sum(n for _, n in ARGS_EXTRA_FIELDS) + "dd")
_WARPS = 8  # per block (256 threads)
_WORKSPACE: dict = {}  # (device, stream) -> the backward's partial-sum buffer (grown, kept)


def rope_qk_norm_forward(q, k, config, *, q_weight=None, k_weight=None, eps=1e-6, norm="rms",
                         weight_offset=0.0, order="norm_then_rope", norm_over="head",
                         rounding="exact", tables=None, positions=None, offset=0,
                         seq_offsets=None, out=None, inplace=False, stream=None):
    """(q_out, k_out): q and k normalised and rotated (module docstring).
    ``out=(q_out, k_out)`` or ``inplace=True`` as in ``rope_qk_forward``."""
    c = _Call(q, k, None, None, config, q_weight, k_weight, eps, norm, weight_offset, order,
              norm_over, rounding, tables, positions, offset, seq_offsets)
    out_infos = validate.output_infos(c.infos, ("q", "k"), validate.pair(out), inplace)
    c.check_outputs(out_infos)
    if all(i.size == 0 for i in c.infos):
        return engine.empty_result(c.infos, out_infos)
    if c.device < 0:
        return c.host_forward(out_infos)
    return c.gpu(out_infos, stream, backward=False)[:2]


def rope_qk_norm_backward(q, k, grad_q, grad_k, config, *, q_weight=None, k_weight=None,
                          eps=1e-6, norm="rms", weight_offset=0.0, order="norm_then_rope",
                          norm_over="head", rounding="exact", tables=None, positions=None,
                          offset=0, seq_offsets=None, out=None, stream=None):
    """(dq, dk, dq_weight, dk_weight) of ``rope_qk_norm_forward`` with the same
    arguments, from the saved inputs ``q``, ``k`` (before the norm) and the
    incoming ``grad_q``, ``grad_k`` (shaped like q, k). The weight gradients
    (None without a weight) sum over every token and head in a fixed order
    (the same bits on every run), in the weight's dtype. ``out=(dq, dk)``."""
    c = _Call(q, k, grad_q, grad_k, config, q_weight, k_weight, eps, norm, weight_offset, order,
              norm_over, rounding, tables, positions, offset, seq_offsets)
    out_infos = validate.output_infos(c.ginfos, ("grad_q", "grad_k"), validate.pair(out), False,
                                      any_input=True)
    c.check_outputs(out_infos, c.infos)
    if all(i.size == 0 for i in c.infos):
        dq, dk = engine.empty_result(c.ginfos, out_infos)
        return (dq, dk) + c.zero_weight_grads()
    if c.device < 0:
        return c.host_backward(out_infos)
    return c.gpu(out_infos, stream, backward=True)


def _choice(value, name, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


class _Call:
    """One validated call: the tensors' infos and the norm's settings."""

    def __init__(self, q, k, gq, gk, config, q_weight, k_weight, eps, norm, weight_offset, order,
                 norm_over, rounding, tables, positions, offset, seq_offsets):
        if not isinstance(config, RopeConfig):
            raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
        for value, name, allowed in ((norm, "norm", NORMS), (order, "order", ORDERS),
                                     (norm_over, "norm_over", NORM_OVER),
                                     (rounding, "rounding", qref.ROUNDINGS)):
            _choice(value, name, allowed)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"eps must be a non-negative float, got {eps!r}")
        if isinstance(weight_offset, bool) or not isinstance(weight_offset, (int, float)):
            raise TypeError(f"weight_offset must be a float, got {type(weight_offset).__name__}")
        if norm == "l2" and (q_weight is not None or k_weight is not None):
            raise ValueError("norm='l2' takes no weight (Llama 4's L2 norm): q_weight and "
                             "k_weight must be None")
        self.config, self.layout = config, config.layout
        self.eps, self.weight_offset = float(eps), float(weight_offset)
        self.order, self.over, self.rounding = order, norm_over, rounding
        self.offset = validate.as_offset(offset)
        head_rows = config.inv_freq.shape[0] if config.per_head else None
        self.infos = [describe(x, n) for x, n in ((q, "q"), (k, "k"))]
        self.b, self.s, self.d = validate.check_rotated(self.infos, ("q", "k"), self.layout,
                                                        config.rotary_dim, head_rows)
        self.device, self.dtype = self.infos[0].device, self.infos[0].dtype
        self.ginfos = None
        if gq is not None:
            self.ginfos = [describe(g, n) for g, n in ((gq, "grad_q"), (gk, "grad_k"))]
            for g, x, n in zip(self.ginfos, self.infos, ("grad_q", "grad_k")):
                validate.check_out(g, x, n)
        self.winfos = [self._weight(w, n, x) for w, n, x in
                       ((q_weight, "q_weight", self.infos[0]), (k_weight, "k_weight",
                                                                self.infos[1]))]
        self.tables = self._tables(tables, positions, offset, seq_offsets)
        self.pos_info, self.seq_info = (None, None) if self.tables else engine.index_infos(
            config, self.device, self.b, self.s, positions, seq_offsets)

    def _weight(self, w, name, x):
        if w is None:
            return None
        info = describe(w, name)
        validate.check_float(info, name)
        h = canon_sizes(x.shape, self.layout)[2]
        want = self.d if self.over == "head" else h * self.d
        if tuple(info.shape) != (want,):
            raise ValueError(f"{name} must have shape ({want},) for norm_over={self.over!r}, "
                             f"got {tuple(info.shape)}")
        validate.check_last_dim(info, name, "the weight")
        if info.kind != x.kind or info.device != x.device:
            raise ValueError(f"{name} must be a {x.kind} array on the device of q and k")
        if self.rounding == "cast_then_weight" and info.dtype != x.dtype:
            raise TypeError(f"{name}: rounding='cast_then_weight' multiplies in the tensors' "
                            f"dtype ({x.dtype}), got a {info.dtype} weight")
        return info

    def _tables(self, tables, positions, offset, seq_offsets):
        """(cos info, sin info, (batch stride, seq stride)) or None."""
        if tables is None:
            return None
        if not isinstance(tables, (tuple, list)) or len(tables) != 2:
            raise TypeError("tables must be a (cos, sin) pair")
        if self.rounding == "exact" or self.order != "norm_then_rope":
            raise ValueError("tables=(cos, sin) reproduce HF's rotation: they take "
                             "order='norm_then_rope' and a model rounding")
        if positions is not None or seq_offsets is not None or self.offset:
            raise ValueError("tables=(cos, sin) give the angles: positions, offset and "
                             "seq_offsets must be left out")
        cinfo, sinfo = describe(tables[0], "cos"), describe(tables[1], "sin")
        validate.check_float(cinfo, "cos")
        if validate.table_rotary_dim(cinfo) != self.config.rotary_dim:
            raise ValueError(f"the tables' last dim ({cinfo.shape[-1]}) must be config's "
                             f"rotary_dim ({self.config.rotary_dim})")
        strides = validate.check_tables(cinfo, sinfo, self.infos[0], self.b, self.s, self.layout)
        return cinfo, sinfo, strides

    def check_outputs(self, out_infos, read=()):
        """No output overlaps a weight, a table or an array in ``read`` (the
        backward's saved q, k)."""
        for o in out_infos or ():
            for t, name in [(w, "a weight") for w in self.winfos if w is not None] + (
                    [(self.tables[0], "cos"), (self.tables[1], "sin")] if self.tables else []) + [
                    (x, "q or k") for x in read]:
                if overlaps(o, t):
                    raise ValueError(f"an output overlaps {name}")

    def zero_weight_grads(self):
        out = []
        for w in self.winfos:
            if w is None:
                out.append(None)
                continue
            z = empty_like(w)
            z[...] = 0
            out.append(wrap_like(w, z))
        return tuple(out)

    # ------------------------------------------------------------ host (NumPy)
    def _host_settings(self):
        cfg = self.config
        kw = dict(rotary_dim=cfg.rotary_dim, interleaved=cfg.interleaved, eps=self.eps,
                  weight_offset=self.weight_offset, over=self.over, order=self.order)
        if self.tables:
            def table(info):
                t = host.to_numpy(info).astype(np.float64)
                return (t[None] if t.ndim == 2 else t)[:, :, None, :]
            kw["angles"] = (table(self.tables[0]), table(self.tables[1]))
        else:
            given = {k: host.to_numpy(v) for k, v in (("positions", self.pos_info),
                                                       ("seq_offsets", self.seq_info)) if v}
            for name, idx in given.items():
                validate.check_positions(idx.astype(np.int64), name)
            pos = reference.token_positions(self.b, self.s, offset=self.offset,
                                            n_streams=cfg.n_streams, **given)
            validate.check_positions(pos)
            kw["angles"] = reference.pair_angles(pos, cfg.inv_freq, cfg.stream_map)
            kw["scale"] = cfg.scale
        return kw

    def _host_weight(self, i):
        w = self.winfos[i]
        return None if w is None else host.to_numpy(w).astype(np.float64)

    def _model_kw(self, kw):
        """The model emulation's keywords: HF's tables travel as ``tables``."""
        if not self.tables:
            return kw
        return {**{k: v for k, v in kw.items() if k != "angles"}, "tables": kw["angles"]}

    def host_forward(self, out_infos):
        """NumPy backend: the float64 reference rounded once, or the model
        modes' emulation of PyTorch's CPU roundings."""
        kw = self._host_settings()
        results = []
        for i, info in enumerate(self.infos):
            x = to_canon(host.to_numpy(info), self.layout)
            w = self._host_weight(i)
            results.append(qref.forward(x, weight=w, **kw) if self.rounding == "exact" else
                           qref.model_forward(x, x.dtype, rounding=self.rounding, weight=w,
                                              **self._model_kw(kw)))
        return host.finish(self.infos, out_infos, results, self.layout)

    def host_backward(self, out_infos):
        kw = self._host_settings()
        dxs, dws = [], []
        for i, (info, ginfo) in enumerate(zip(self.infos, self.ginfos)):
            x = to_canon(host.to_numpy(info), self.layout)
            g = to_canon(host.to_numpy(ginfo), self.layout)
            w = self._host_weight(i)
            dx, dw = (qref.backward(x, g, weight=w, **kw) if self.rounding == "exact" else
                      qref.model_backward(x, g, x.dtype, rounding=self.rounding, weight=w,
                                          **self._model_kw(kw)))
            dxs.append(dx)
            w = self.winfos[i]
            dws.append(None if dw is None else host.from_numpy(
                w, reference.round_to_dtype(dw, host.to_numpy(w).dtype)))
        return host.finish(self.ginfos, out_infos, dxs, self.layout) + tuple(dws)

    # ------------------------------------------------------------ GPU
    def gpu(self, out_infos, stream, backward):
        """Launch qknorm_rows_kernel (the fast path) or qknorm_kernel, and,
        backward with weights, the weight gradients' reduction."""
        ins = self.ginfos if backward else self.infos
        stream_ptr = engine.stream_handle(stream, self.infos[0])
        _, out_infos = engine.outputs(ins, out_infos)
        sms = sm_count(self.device)
        npairs = self.config.rotary_dim // 2
        wlen = [0 if w is None else w.shape[0] for w in self.winfos]
        part_cols = wlen[0] + wlen[1]
        vec = self._fast_vec(ins, out_infos, backward, part_cols)
        warps = min(self.b * self.s, (8 if vec else 4) * _WARPS * sms)
        blocks = max(1, -(-warps // _WARPS))
        smem = _WARPS * npairs * 8
        if vec:
            name = qknorm_rows_kernel_name(self.dtype, self.config.interleaved, backward)
            smem += 8 * self.d + (_fast_rows_bytes(npairs, vec, part_cols) if backward else 0)
            rows = blocks       # one partial row per block
        else:
            name = qknorm_kernel_name(self.dtype, self.config.interleaved, backward)
            rows = blocks * _WARPS  # one per warp
        part = _workspace(self.device, stream_ptr, rows * part_cols) if (
            backward and part_cols) else None
        args = self._pack(ins, out_infos, part, part_cols, wlen)
        fns = MODULES.functions(self.device, "qknorm")
        buf = np.frombuffer(bytearray(args), dtype=np.dtype([("raw", np.uint8, (len(args),))]))

        def launch():
            fns[name]((blocks, 1, 1), (32 * _WARPS, 1, 1), (buf,), shared_mem=smem,
                      stream=Stream(stream_ptr))
        engine.on_device(self.device, launch)
        dws = [None, None]
        if backward:
            dws = self._reduce(fns, part, rows, part_cols, wlen, stream_ptr)
        outs = engine.hand_back(ins, out_infos, stream_ptr)
        return outs + tuple(dws)

    def _fast_vec(self, ins, out_infos, backward, part_cols):
        """The fast path's pack width, or 0 where qknorm_kernel runs: the norm
        per head, R = D, angles computed (no tables), every tensor aligned for
        the widest packs, at most 32 lanes per head, shared memory within
        bounds; not the model modes' backward."""
        npairs = self.config.rotary_dim // 2
        widest = vec_widths(self.dtype)[0]
        if (self.over != "head" or self.config.rotary_dim != self.d or self.tables
                or npairs % widest or npairs // widest > 32
                or (backward and self.rounding != "exact")):
            return 0
        plans = engine.tensor_plans(ins, out_infos, self.layout)
        if backward:
            plans += [TensorPlan(x.ptr, x.ptr, canon_strides(x.strides, self.layout),
                                 canon_strides(x.strides, self.layout), p.heads)
                      for x, p in zip(self.infos, plans)]
        vec = pick_vec(self.dtype, plans, npairs, 0, self.b, self.s, (widest, 1))
        need = _WARPS * npairs * 8 + 8 * self.d + (
            _fast_rows_bytes(npairs, widest, part_cols) if backward else 0)
        return widest if vec == widest and need <= SMEM_LIMIT else 0

    def _reduce(self, fns, part, rows, part_cols, wlen, stream_ptr):
        dws = []
        for i, w in enumerate(self.winfos):
            if w is None:
                dws.append(None)
                continue
            dw = empty_like(w)
            ptr = describe(dw, "dw").ptr
            col0 = 0 if i == 0 else wlen[0]
            vals = [np.int64(v) for v in (part.data.ptr, rows, part_cols, col0, wlen[i], ptr,
                                          W_DTYPE[w.dtype])]
            engine.on_device(self.device, lambda v=vals: fns[QKNORM_DW_KERNEL](
                (-(-wlen[i] // 32), 1, 1), (32, 8, 1), tuple(v), stream=Stream(stream_ptr)))
            dws.append(wrap_like(w, dw))
        if self.infos[0].kind == "jax":
            import cupy
            cupy.cuda.runtime.streamSynchronize(stream_ptr)
        return dws

    def _pack(self, ins, out_infos, part, part_cols, wlen):
        cfg, lay = self.config, self.layout
        pos = engine.position_fields(cfg, self.pos_info) or (0, 0, 0, 0)
        inv_freq, smap = cfg.device_tables(self.device)
        fields = dict(
            in_ptr=[i.ptr for i in ins], out_ptr=[o.ptr for o in out_infos],
            heads=[canon_sizes(i.shape, lay)[2] for i in ins], n_batch=self.b, n_seq=self.s,
            head_dim=self.d, rot_dim=cfg.rotary_dim, inv_freq_ptr=inv_freq.data.ptr,
            freq_sh=cfg.rotary_dim // 2 if cfg.per_head else 0,
            stream_map_ptr=0 if smap is None else smap.data.ptr, scale=cfg.scale, sin_sign=1.0,
            offset=self.offset, pos_is64=pos[0], pos_s_stream=pos[1], pos_sb=pos[2],
            pos_ss=pos[3], pos_ptr=0 if self.pos_info is None else self.pos_info.ptr,
            seq_off_ptr=0 if self.seq_info is None else self.seq_info.ptr,
            seq_off_is64=int(self.seq_info is not None and self.seq_info.dtype == "int64"))
        for side, infos in (("in", ins), ("out", out_infos)):
            st = [canon_strides(i.strides, lay) for i in infos]
            for n, name in enumerate(("sb", "ss", "sh")):
                fields[f"{side}_{name}"] = [st[0][n], st[1][n]]
        if self.tables:
            cinfo, sinfo, (tsb, tss) = self.tables
            fields.update(pos_ptr=cinfo.ptr, seq_off_ptr=sinfo.ptr, pos_sb=tsb, pos_ss=tss,
                          offset=0, inv_freq_ptr=0)
        xst = [canon_strides(i.strides, lay) for i in self.infos]
        w = self.winfos
        extra = ([self.infos[0].ptr, self.infos[1].ptr], [xst[0][0], xst[1][0]],
                 [xst[0][1], xst[1][1]], [xst[0][2], xst[1][2]],
                 [0 if x is None else x.ptr for x in w],
                 [0 if x is None else W_DTYPE[x.dtype] for x in w], [0, wlen[0]],
                 [0 if part is None else part.data.ptr], [part_cols],
                 [int(self.over == "token")], [int(self.order == "rope_then_norm")],
                 [qref.ROUNDINGS.index(self.rounding)], [int(self.tables is not None)])
        flat = [v for group in extra for v in group]
        return pack_args(**fields) + ARGS_EXTRA.pack(*flat, self.eps, self.weight_offset)


_DW_PAD = 4  # floats after each dw row (kernels/qknorm.cuh kDwPad: no bank conflicts)


def _fast_rows_bytes(npairs, vec, part_cols):
    """Shared bytes of the fast backward's dw rows: one per head row of each warp."""
    return _WARPS * (32 // (npairs // vec)) * (part_cols + _DW_PAD) * 4


def _workspace(device, stream_ptr, n):
    """A float32 CuPy buffer of at least n elements for (device, stream),
    kept and reused (no allocation once warm: CUDA-graph capturable)."""
    import cupy
    buf = _WORKSPACE.get((device, stream_ptr))
    if buf is None or buf.size < n:
        with cupy.cuda.Device(device):
            buf = cupy.empty(n, dtype=cupy.float32)
        _WORKSPACE[(device, stream_ptr)] = buf
    return buf
