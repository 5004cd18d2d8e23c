"""The fused QK-norm + RoPE call itself, beneath ``cuprope.qknorm.api`` (the
public, guarded functions) and ``cuprope.qknorm.torch`` (their custom ops):
``forward_call`` / ``backward_call`` run one call with no torch guard (the
fast path, else ``QkNormCall``: validation, the NumPy backend or the GPU
launch through ``cuprope.qknorm.launch``). Shapes, semantics and dtypes:
:func:`cuprope.qknorm.rope_qk_norm_forward`.
"""
from __future__ import annotations

import numpy as np

from . import reference as qref
from .. import reference
from .._core import engine, fastpath, host, launcher, validate
from . import launch as qknorm_launch
from .fast import (INPLACE_PAIRS, BackwardLaunch, fast_backward, fast_forward, fast_settings,
                   fast_signature)
from .._core.arrays import describe, empty_like, overlaps, wrap_like
from .._core.launch import sm_count
from .._core.layout import canon_sizes, to_canon
from ..config import RopeConfig

NORMS = ("rms", "l2")
ORDERS = ("norm_then_rope", "rope_then_norm")
NORM_OVER = ("head", "token")


def forward_call(q, k, config, out, inplace, stream, *, q_weight, k_weight, eps, norm,
             weight_offset, order, norm_over, rounding, tables, positions, offset, seq_offsets):
    """``rope_qk_norm_forward`` with no torch guard (``cuprope.qknorm.api``
    documents it): the fast path, else ``QkNormCall`` on the host or GPU."""
    fast = out is None and fast_settings(config, tables, positions, seq_offsets, offset, stream)
    tkt = None
    if fast:
        header, arrays = fast_signature(q, k, q_weight, k_weight, eps, norm, weight_offset,
                                        order, norm_over, rounding, tables, positions,
                                        seq_offsets, inplace)
        if config._launches.fast:
            res = fast_forward(config, header, arrays, offset, inplace)
            if res is not None:
                return res
    c = QkNormCall.of(q, k, None, None, config, q_weight, k_weight, eps, norm, weight_offset,
                      order, norm_over, rounding, tables, positions, offset, seq_offsets)
    out_infos = validate.output_infos(c.infos, ("q", "k"), validate.pair(out), inplace)
    c.check_outputs(out_infos)
    if all(i.size == 0 for i in c.infos):
        return engine.empty_result(c.infos, out_infos)
    if c.device < 0:
        return c.host_forward(out_infos)
    if fast:
        tkt = fastpath.ticket(fastpath.fast_adapter(c.infos[0].kind), header, arrays,
                              INPLACE_PAIRS if inplace else ())
    return c.gpu(out_infos, stream, backward=False, ticket=tkt)[:2]


def backward_call(q, k, grad_q, grad_k, config, out, stream, *, q_weight, k_weight, eps, norm,
              weight_offset, order, norm_over, rounding, tables, positions, offset, seq_offsets):
    """``rope_qk_norm_backward`` with no torch guard (``cuprope.qknorm.api``):
    the fast path, else ``QkNormCall`` on the host or GPU."""
    fast = out is None and fast_settings(config, tables, positions, seq_offsets, offset, stream)
    if fast:
        header, arrays = fast_signature(q, k, q_weight, k_weight, eps, norm, weight_offset,
                                        order, norm_over, rounding, tables, positions,
                                        seq_offsets, False)
        header, arrays = ("qknb",) + header[1:], arrays[:2] + (grad_q, grad_k) + arrays[2:]
        if config._launches.fast:
            res = fast_backward(config, header, arrays, offset)
            if res is not None:
                return res
    c = QkNormCall.of(q, k, grad_q, grad_k, config, q_weight, k_weight, eps, norm,
                      weight_offset, order, norm_over, rounding, tables, positions, offset,
                      seq_offsets)
    out_infos = validate.output_infos(c.ginfos, ("grad_q", "grad_k"), validate.pair(out), False,
                                      any_input=True)
    c.check_outputs(out_infos, c.infos)
    if all(i.size == 0 for i in c.infos):
        dq, dk = engine.empty_result(c.ginfos, out_infos)
        return (dq, dk) + c.zero_weight_grads()
    if c.device < 0:
        return c.host_backward(out_infos)
    tkt = fastpath.ticket(fastpath.fast_adapter(c.infos[0].kind), header, arrays) if fast \
        else None
    return c.gpu(out_infos, stream, backward=True, ticket=tkt)


def _choice(value, name, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _maybe(obj, name):
    return None if obj is None else describe(obj, name)


class QkNormCall:
    """One validated call: the tensors' infos (``cuprope._core.arrays.ArrayInfo``,
    or anything with its fields, such as the JAX lowering's avals) and the
    norm's settings. ``QkNormCall.of`` describes arrays first; the
    constructor takes infos: q, k, grad_q, grad_k (None forward), the weights
    (None where absent), ``tables`` a (cos, sin) pair of infos or None, and
    the positions and seq_offsets infos or None."""

    @classmethod
    def of(cls, q, k, gq, gk, config, q_weight, k_weight, eps, norm, weight_offset, order,
           norm_over, rounding, tables, positions, offset, seq_offsets):
        """The call on arrays of any supported framework."""
        if tables is not None and (not isinstance(tables, (tuple, list)) or len(tables) != 2):
            raise TypeError("tables must be a (cos, sin) pair")
        return cls(describe(q, "q"), describe(k, "k"), _maybe(gq, "grad_q"),
                   _maybe(gk, "grad_k"), config, _maybe(q_weight, "q_weight"),
                   _maybe(k_weight, "k_weight"), eps, norm, weight_offset, order, norm_over,
                   rounding, None if tables is None else (describe(tables[0], "cos"),
                                                          describe(tables[1], "sin")),
                   _maybe(positions, "positions"), offset, _maybe(seq_offsets, "seq_offsets"))

    def __init__(self, q, k, gq, gk, config, q_weight, k_weight, eps, norm, weight_offset,
                 order, norm_over, rounding, tables, positions, offset, seq_offsets):
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
        self.infos = [q, k]
        self.b, self.s, self.d = validate.check_rotated(self.infos, ("q", "k"), self.layout,
                                                        config.rotary_dim, head_rows)
        self.device, self.dtype = self.infos[0].device, self.infos[0].dtype
        self.ginfos = None
        if gq is not None:
            self.ginfos = [gq, gk]
            for g, x, n in zip(self.ginfos, self.infos, ("grad_q", "grad_k")):
                validate.check_like(g, x, n)
        self.winfos = [self._weight(w, n, x) for w, n, x in
                       ((q_weight, "q_weight", self.infos[0]), (k_weight, "k_weight",
                                                                self.infos[1]))]
        self.tables = self._tables(tables, positions, seq_offsets)
        self.pos_info, self.seq_info = (None, None) if self.tables else (positions, seq_offsets)
        if not self.tables:
            validate.check_indices(config, self.device, self.b, self.s, positions, seq_offsets,
                                   q.shape)

    def _weight(self, info, name, x):
        if info is None:
            return None
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

    def _tables(self, tables, positions, seq_offsets):
        """(cos info, sin info, (batch stride, seq stride)) or None."""
        if tables is None:
            return None
        if self.rounding == "exact" or self.order != "norm_then_rope":
            raise ValueError("tables=(cos, sin) reproduce HF's rotation: they take "
                             "order='norm_then_rope' and a model rounding")
        if positions is not None or seq_offsets is not None or self.offset:
            raise ValueError("tables=(cos, sin) give the angles: positions, offset and "
                             "seq_offsets must be left out")
        cinfo, sinfo = tables
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

    def host_backward(self, out_infos, dw_dtype=None):
        """NumPy backend of the backward; the weight gradients rounded to
        ``dw_dtype`` (default: the weights' dtype)."""
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
                w, reference.round_to_dtype(dw, dw_dtype or host.to_numpy(w).dtype)))
        return host.finish(self.ginfos, out_infos, dxs, self.layout) + tuple(dws)

    # ------------------------------------------------------------ GPU
    def gpu(self, out_infos, stream, backward, ticket=None):
        """Launch qknorm_rows_kernel (the fast path) or qknorm_kernel, and,
        backward with weights, the weight gradients' reduction, through the
        launcher (``cuprope.qknorm.launch`` states the launches);
        register the kernel's plan for the fast path under ``ticket``."""
        ql = qknorm_launch
        ins = self.ginfos if backward else self.infos
        stream_ptr = engine.stream_handle(stream, self.infos[0])
        _, out_infos = engine.outputs(ins, out_infos)
        geo = ql.geometry(self, ins, out_infos, backward, sm_count(self.device))
        part = ql.workspace(self.device, stream_ptr, geo.part_rows * geo.part_cols) if (
            geo.part_cols) else None
        part_ptr = 0 if part is None else part.data.ptr
        inv_freq, smap = self.config.device_tables(self.device)
        plan = launcher.plan(ql.spec(self, ins, out_infos, geo, inv_freq_ptr=inv_freq.data.ptr,
                                     stream_map_ptr=0 if smap is None else smap.data.ptr,
                                     part_ptr=part_ptr), self.device)
        idx = ((self.tables[0].ptr, self.tables[1].ptr) if self.tables else
               tuple(0 if i is None else i.ptr for i in (self.pos_info, self.seq_info)))
        values = (ins[0].ptr, ins[1].ptr, out_infos[0].ptr, out_infos[1].ptr,
                  *(0 if w is None else w.ptr for w in self.winfos), *idx, self.offset,
                  self.infos[0].ptr, self.infos[1].ptr, part_ptr)
        launcher.on_device(self.device, plan.run, stream_ptr, *values)
        dws, dw_plans = self._reduce(part_ptr, geo, stream_ptr) if backward else ([None] * 2, ())
        if ticket is not None and not backward:
            spans = [fastpath.span(i) for i in (*self.infos, *self.winfos)] + (
                [fastpath.span(t) for t in self.tables[:2]] if self.tables else
                [fastpath.span(self.pos_info), fastpath.span(self.seq_info)])
            fastpath.remember(self.config._launches.fast, ticket, spans, plan)
        elif ticket is not None:  # (new outputs: no pair of arrays to check for overlap)
            fastpath.remember(self.config._launches.fast, ticket, (),
                              BackwardLaunch(plan, dw_plans, geo.part_rows * geo.part_cols
                                             if geo.part_cols else 0))
        outs = engine.hand_back(ins, out_infos, stream_ptr)
        return outs + tuple(dws)

    def _reduce(self, part_ptr, geo, stream_ptr):
        """The weight gradients (None where no weight) and their reductions'
        (index, plan) pairs, launched."""
        dws, plans = [None, None], []
        outs = [None if w is None else empty_like(w) for w in self.winfos]
        ptrs = [0 if o is None else describe(o, "dw").ptr for o in outs]
        for i, spec in qknorm_launch.dw_specs(self, geo, part_ptr=part_ptr, out_ptrs=ptrs):
            p = launcher.plan(spec, self.device)
            launcher.on_device(self.device, p.run, stream_ptr, ptrs[i], part_ptr)
            plans.append((i, p))
            dws[i] = wrap_like(self.winfos[i], outs[i])
        if self.infos[0].kind == "jax":
            import cupy
            cupy.cuda.runtime.streamSynchronize(stream_ptr)
        return dws, plans
