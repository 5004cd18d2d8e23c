"""JAX adapter of the fused QK-norm + RoPE (``cuprope.qknorm``), re-exported by
``cuprope.jax``: :func:`rope_qk_norm` as a primitive with its VJP, vmap rule,
sharding rule and lowerings (jaxlib's GPU kernel call with the flat entries
of kernels/qknorm_flat.cuh; the NumPy backend on the CPU).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from . import api as qknorm
from .._core import jax_sharding, launcher, xla
from . import launch as ql
from .._core.jax_common import (NOT_MAPPED, batch_size_and_front, host_lowering, map_each,
                               reduce_to, static_offset, varying_axes, with_varying,
                               zero_cotangent)
from ..config import RopeConfig, config_by_key

__all__ = ["rope_qk_norm", "QkNormStatic", "launch_plan"]


@dataclasses.dataclass(frozen=True)
class QkNormStatic:
    """Everything static about one call (hashable: a primitive parameter).

    The primitive's operands: q, k, then (backward) grad_q, grad_k, then cos
    and sin (``has_tables``) or positions / seq_offsets (``has_pos`` /
    ``has_seq``), then the weights present (``has_qw``, ``has_kw``). Results:
    q_out, k_out, or dq, dk and the present weights' gradients (float32
    with ``dw_f32``: partials to be summed across shards)."""

    key: int
    backward: bool = False
    eps: float = 1e-6
    norm: str = "rms"
    weight_offset: float = 0.0
    order: str = "norm_then_rope"
    norm_over: str = "head"
    rounding: str = "exact"
    offset: int = 0
    has_tables: bool = False
    has_pos: bool = False
    has_seq: bool = False
    has_qw: bool = False
    has_kw: bool = False
    dw_f32: bool = False

    def split(self, operands):
        """The operands by name (None where absent)."""
        it = iter(operands)
        out = dict(q=next(it), k=next(it))
        if self.backward:
            out.update(gq=next(it), gk=next(it))
        if self.has_tables:
            out.update(cos=next(it), sin=next(it))
        out["pos"] = next(it) if self.has_pos else None
        out["seq"] = next(it) if self.has_seq else None
        out["qw"] = next(it) if self.has_qw else None
        out["kw"] = next(it) if self.has_kw else None
        return out

    def library_call(self, operands) -> qknorm.QkNormCall:
        """The library's validated call on ``operands`` (arrays, or
        ``cuprope._core.xla.AvalInfo`` at trace time: the eager checks,
        raised when the call is traced)."""
        a = self.split(operands)
        tables = (a["cos"], a["sin"]) if self.has_tables else None
        return qknorm.QkNormCall(a["q"], a["k"], a.get("gq"), a.get("gk"),
                                 config_by_key(self.key), a["qw"], a["kw"], self.eps, self.norm,
                                 self.weight_offset, self.order, self.norm_over, self.rounding,
                                 tables, a["pos"], self.offset, a["seq"])

    def keywords(self, a):
        """The library functions' keyword arguments from split operands."""
        return dict(q_weight=a["qw"], k_weight=a["kw"], eps=self.eps, norm=self.norm,
                    weight_offset=self.weight_offset, order=self.order, norm_over=self.norm_over,
                    rounding=self.rounding,
                    tables=(a["cos"], a["sin"]) if self.has_tables else None,
                    positions=a["pos"], offset=self.offset, seq_offsets=a["seq"])


# ---------------------------------------------------------------- the primitive

def _abstract(*avals, call):
    """Results shaped like q and k (like the weights for their gradients),
    varying over every mesh axis an operand varies over (``shard_map``)."""
    axes = frozenset().union(*(varying_axes(a) for a in avals))
    out = [with_varying(a, axes, weak_type=False) for a in avals[:2]]
    if call.backward:
        a = call.split(avals)
        out += [with_varying(w, axes, weak_type=False,
                             dtype=np.dtype(np.float32) if call.dw_f32 else w.dtype)
                for w in (a["qw"], a["kw"]) if w is not None]
    return out


qknorm_p = Primitive("cuprope_rope_qk_norm")
qknorm_p.multiple_results = True
qknorm_p.def_abstract_eval(_abstract)
qknorm_p.def_impl(lambda *args, call: jax.jit(functools.partial(qknorm_p.bind, call=call))(*args))


def _host_call(call, *arrays):
    """The call on NumPy arrays: cuprope's NumPy backend (CPU lowering)."""
    a = call.split(arrays)
    cfg = config_by_key(call.key)
    if call.backward:
        kw = call.keywords(a)
        c = qknorm.QkNormCall.of(a["q"], a["k"], a["gq"], a["gk"], cfg, kw["q_weight"],
                                 kw["k_weight"], call.eps, call.norm, call.weight_offset,
                                 call.order, call.norm_over, call.rounding, kw["tables"],
                                 kw["positions"], call.offset, kw["seq_offsets"])
        res = c.host_backward(None, dw_dtype=np.float32 if call.dw_f32 else None)
        res = [r for r in res if r is not None]
    else:
        res = qknorm.rope_qk_norm_forward(a["q"], a["k"], cfg, **call.keywords(a))
    return tuple(np.asarray(r) for r in res)


# ---------------------------------------------------------------- GPU lowering

def launch_plan(call: QkNormStatic, avals, sms: int) -> list[launcher.FlatCall]:
    """The kernel calls that run ``call`` on operands of ``avals`` on a GPU
    of ``sms`` multiprocessors, the eager path's LaunchSpecs
    (``cuprope.qknorm.launch``) as flat calls: the QK-norm kernel's
    flat entry (results: the two outputs, then, backward with a weight, the
    float32 partial rows), then one ``qknorm_dw_kernel`` per weight. No
    jaxlib involved: tests build it on the CPU."""
    infos = [xla.AvalInfo(a) for a in avals]
    c = call.library_call(infos)
    a = call.split(range(len(avals)))  # operand indices by name
    ins = c.ginfos if call.backward else c.infos
    geo = ql.geometry(c, ins, ins, call.backward, sms)
    cfg = config_by_key(call.key)
    sources = {"in_ptr0": a["gq" if call.backward else "q"],
               "in_ptr1": a["gk" if call.backward else "k"],
               "x_ptr0": a["q"] if call.backward else None,
               "x_ptr1": a["k"] if call.backward else None,
               "pos_ptr": a["cos"] if call.has_tables else a["pos"],
               "seq_off_ptr": a["sin"] if call.has_tables else a["seq"],
               "w_ptr0": a["qw"], "w_ptr1": a["kw"]}
    sources = {r: ("operand", i) for r, i in sources.items() if i is not None}
    if not call.has_tables:
        sources["inv_freq_ptr"] = ("constant", cfg.inv_freq)
    if cfg.stream_map is not None:
        sources["stream_map_ptr"] = ("constant", cfg.stream_map)
    outputs = ("out_ptr0", "out_ptr1") + (("part_ptr",) if geo.part_cols else ())
    sources.update({r: "out" for r in outputs})
    vector = {"in_ptr0", "in_ptr1", "x_ptr0", "x_ptr1", "out_ptr0", "out_ptr1"}
    align = {r: geo.vec * np.dtype(avals[0].dtype).itemsize if r in vector else
             8 if r == "inv_freq_ptr" else 0 for r in sources}
    results = [(tuple(x.shape), np.dtype(x.dtype)) for x in avals[:2]]
    if geo.part_cols:
        results.append(((geo.part_rows * geo.part_cols,), np.dtype(np.float32)))
    spec = ql.spec(c, ins, ins, geo, inv_freq_ptr=0, stream_map_ptr=0, part_ptr=0)
    plan = [launcher.flat_call(spec, sources, align, results=results)]
    dw_dtype = "float32" if call.dw_f32 else None
    for i, dw in (ql.dw_specs(c, geo, out_dtype=dw_dtype) if call.backward else ()):
        w = avals[a["qw" if i == 0 else "kw"]]
        plan.append(launcher.flat_call(dw, {"part_ptr": ("part",), "out_ptr": "out"},
                                       results=[(tuple(w.shape),
                                                 np.dtype(dw_dtype or w.dtype))]))
    return plan


def _lower_cuda(ctx, *ins, call):
    plan = launch_plan(call, ctx.avals_in, xla.sm_count())
    part, results = None, []
    for fc in plan:
        out = xla.emit(ctx, ins, fc, part)
        if part is None and len(fc.results) == 3:
            part = out[2]
            out = out[:2]
        results += list(out)
    return results


mlir.register_lowering(qknorm_p, host_lowering(_host_call), platform="cpu")
mlir.register_lowering(qknorm_p, _lower_cuda, platform="cuda")


# ---------------------------------------------------------------- vmap

def _foldable(call, args, dims):
    """True when the batch axis of the rotated tensors (q, k and, backward,
    their gradients) can join their batch dim: all of them batched, nothing
    else; no per-batch positions, seq_offsets or tables; not ``thd``; not a
    backward with a weight (its gradient would sum over the vmapped axis)."""
    mapped = [d is not NOT_MAPPED for d in dims]
    n = 4 if call.backward else 2
    if not all(mapped[:n]) or any(mapped[n:]) or config_by_key(call.key).layout == "thd":
        return False
    if call.backward and (call.has_qw or call.has_kw):
        return False
    a = call.split(args)
    if call.has_tables:
        return a["cos"].ndim == 2 or a["cos"].shape[0] == 1
    pos = a["pos"]
    return not call.has_seq and (pos is None or pos.ndim == 1 or (
        config_by_key(call.key).n_streams > 1 and pos.ndim == 2))


def _batch(args, dims, *, call):
    size, args = batch_size_and_front(args, dims)
    n_out = 2 + (int(call.has_qw) + int(call.has_kw) if call.backward else 0)
    if _foldable(call, args, dims):
        n = 4 if call.backward else 2
        folded = [x.reshape((-1,) + x.shape[2:]) for x in args[:n]] + list(args[n:])
        out = qknorm_p.bind(*folded, call=call)
        return [o.reshape((size, -1) + o.shape[1:]) for o in out], [0] * n_out
    return map_each(functools.partial(qknorm_p.bind, call=call), args, dims), [0] * n_out


batching.primitive_batchers[qknorm_p] = _batch


# ---------------------------------------------------------------- sharding

def sharding_rule(call, shapes) -> jax_sharding.Rule:
    """The call's factors (``cuprope._core.jax_sharding``): q, k (and their
    gradients) by layout, positions / seq_offsets / tables as for rope_qk,
    weights ``w`` (q's) and ``v`` (k's) replicated; the heads kept whole for
    a norm over the token or per-head frequencies. Backward: each weight's
    gradient sums over its tensor's factors."""
    cfg = config_by_key(call.key)
    xs, heads = jax_sharding.tensor_factors(cfg.layout, 2, shapes[0] == shapes[1])
    ops = xs + (xs if call.backward else [])
    i = len(ops)
    if call.has_tables:
        ops += [jax_sharding.table_factors(shapes[i])] * 2
    if call.has_pos:
        ops.append(jax_sharding.position_factors(cfg, len(shapes[len(ops)])))
    if call.has_seq:
        ops.append(["b"])
    wf = [f for f, has in (("w", call.has_qw), ("v", call.has_kw)) if has]
    ops += [[f] for f in wf]
    keep = {"s", "d", "t", "r", "u", "w", "v"}
    if call.norm_over == "token" or cfg.per_head:
        keep.update(heads)
    results, sums = list(xs), ()
    if call.backward:
        results += [[f] for f in wf]
        sums = tuple((2 + j, xs[0 if f == "w" else 1]) for j, f in enumerate(wf))
    return jax_sharding.Rule(ops, results, frozenset(keep), sums)


def local_call(call, sums, *operands):
    """One shard's call: where a weight gradient sums over sharded axes, its
    float32 partial is summed across them, then cast to the weight's dtype."""
    if not any(sums.values()):
        return tuple(qknorm_p.bind(*operands, call=call))
    out = qknorm_p.bind(*operands, call=dataclasses.replace(call, dw_f32=True))
    a = call.split(operands)
    ws = [w for w in (a["qw"], a["kw"]) if w is not None]
    dws = [jax.lax.psum(dw, sums[2 + j]) if sums.get(2 + j) else dw
           for j, dw in enumerate(out[2:])]
    return tuple(out[:2]) + tuple(dw.astype(w.dtype) for dw, w in zip(dws, ws))


_PARTITIONED = jax_sharding.Partitioned(
    lambda call, *ops: tuple(qknorm_p.bind(*ops, call=call)), sharding_rule, local_call)


# ---------------------------------------------------------------- autodiff

def _bind(call, operands):
    avals_in = [jax.typeof(x) for x in operands]
    call.library_call([xla.AvalInfo(a) for a in avals_in])
    avals = _abstract(*avals_in, call=call)
    if all(int(np.prod(x.shape)) == 0 for x in avals[:2]):  # nothing to launch
        return tuple(jnp.zeros(x.shape, x.dtype) for x in avals)
    if (any(hasattr(x, "batch_dim") for x in operands) or not jax_sharding.enabled()
            or any(varying_axes(a) for a in avals_in)):
        # under vmap (custom_partitioning has no batching rule), on the CPU
        # backend, or under shard_map (the operands are already local)
        return tuple(qknorm_p.bind(*operands, call=call))
    return _PARTITIONED(call, *operands)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _apply(call, xs, weights, extras):
    return _bind(call, tuple(xs) + tuple(extras) + tuple(weights))


def _apply_fwd(call, xs, weights, extras):
    return _bind(call, tuple(xs) + tuple(extras) + tuple(weights)), (xs, weights, extras)


def _apply_bwd(call, res, grads):
    xs, weights, extras = res
    operands = tuple(xs) + tuple(grads) + tuple(extras) + tuple(weights)
    # under shard_map: a weight that varies over fewer mesh axes than the
    # call gets its gradient summed over the others (float32 partials)
    axes = frozenset().union(*(varying_axes(jax.typeof(x)) for x in operands))
    partial = any(axes - varying_axes(jax.typeof(w)) for w in weights)
    back = dataclasses.replace(call, backward=True, dw_f32=partial)
    out = _bind(back, operands)
    dxs = tuple(reduce_to(d, x) for d, x in zip(out[:2], xs))
    dws = tuple(reduce_to(d, w, w.dtype) for d, w in zip(out[2:], weights))
    return dxs, dws, tuple(zero_cotangent(e) for e in extras)


_apply.defvjp(_apply_fwd, _apply_bwd)


# ---------------------------------------------------------------- public

def _static_float(value, name):
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be a Python float under jax (static): a new value "
                        f"retraces")
    return value


def rope_qk_norm(q, k, config: RopeConfig, *, q_weight=None, k_weight=None, eps: float = 1e-6,
                 norm: str = "rms", weight_offset: float = 0.0, order: str = "norm_then_rope",
                 norm_over: str = "head", rounding: str = "exact", tables=None, positions=None,
                 offset: int = 0, seq_offsets=None):
    """Differentiable, jit-able fused QK-norm + RoPE on JAX arrays.

    Parameters
    ----------
    q, k : jax.Array
    config : RopeConfig
    q_weight, k_weight, eps, norm, weight_offset, order, norm_over, rounding,
    tables, positions, offset, seq_offsets
        :func:`cuprope.qknorm.rope_qk_norm_forward`'s arguments, shapes,
        dtypes and semantics (no ``out``, ``inplace`` or ``stream``).
        ``config``, ``eps``, ``norm``, ``weight_offset``, ``order``,
        ``norm_over``, ``rounding`` and ``offset`` are static (a new value
        retraces); positions, seq_offsets, the weights and the tables are
        traced. ``tables=(cos, sin)`` and positions are constants to
        ``grad``.

    Returns
    -------
    tuple of jax.Array
        ``(q_out, k_out)``; gradients reach q, k, q_weight and k_weight.

    Notes
    -----
    Differentiable through ``jax.custom_vjp`` (the backward is cuprope's,
    from the saved q, k and weights), jit-able, and batches under
    ``jax.vmap``: a leading axis of q and k folds into their batch dim where
    the layout has one and nothing else is batched, positions per batch,
    seq_offsets and per-batch tables aside, and never for the backward with
    a weight, whose gradient sums over the batch; otherwise the call runs
    once per element (``lax.map``).

    On a GPU the call lowers to jaxlib's GPU kernel call with the flat
    entries of kernels/qknorm_flat.cuh (PTX from NVRTC at trace time): the
    same kernel, grid, shared memory and struct words as the eager call
    (``cuprope.qknorm.launch`` computes them for both), so results equal the
    eager call's bit for bit. The backward with weights is two or three
    custom calls: the kernel, which also writes the float32 partial rows of
    the weight gradient as a scratch result, then ``qknorm_dw_kernel`` per
    weight. On the CPU backend it runs the NumPy backend through
    ``jax.pure_callback``.

    Under ``jax.sharding`` (a GPU backend) it partitions like ``rope_qk``:
    batch and heads stay sharded (``norm_over="token"`` or per-head
    frequencies keep the heads whole), weights are replicated, each shard
    runs the kernels on its local shapes, and a weight's gradient is the
    float32 sum of the shards' partials, cast once. Under ``shard_map``
    results vary over every mesh axis an operand varies over; a replicated
    weight's gradient is summed the same way.
    """
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    if tables is not None and (not isinstance(tables, (tuple, list)) or len(tables) != 2):
        raise TypeError("tables must be a (cos, sin) pair")
    call = QkNormStatic(config.key, eps=_static_float(eps, "eps"), norm=norm,
                        weight_offset=_static_float(weight_offset, "weight_offset"), order=order,
                        norm_over=norm_over, rounding=rounding, offset=static_offset(offset),
                        has_tables=tables is not None, has_pos=positions is not None,
                        has_seq=seq_offsets is not None, has_qw=q_weight is not None,
                        has_kw=k_weight is not None)
    extras = tuple(tables) if tables is not None else tuple(
        e for e in (positions, seq_offsets) if e is not None)
    weights = tuple(w for w in (q_weight, k_weight) if w is not None)
    return _apply(call, (q, k), weights, extras)
