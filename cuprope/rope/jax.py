"""JAX adapter of the rotation family (RoPE, cos/sin tables; LRPE's
rotate-1d from :mod:`cuprope.lrpe.jax`) as one XLA primitive, inside
``jax.jit``, ``jax.grad``, ``jax.vmap`` and sharding (re-exported by
:mod:`cuprope.jax`). What every function shares (differentiation, vmap,
sharding, static arguments, the lowering) is in :func:`rope`'s docstring.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from . import api, tables, xla
from .._core import jax_sharding
from .._core.jax_common import (NOT_MAPPED, batch_size_and_front, host_lowering, map_each,
                                static_offset, zero_cotangent)
from ..config import RopeConfig, config_by_key

__all__ = ["rope", "rope_qk", "rope_table", "rope_qk_table", "Call", "apply", "HOST_CALLS"]


@dataclasses.dataclass(frozen=True)
class Call:
    """Everything static about one launch (hashable: a primitive parameter).

    kind: "rope" (``key`` names the RopeConfig), "table" (cos/sin tables) or
    "lrpe" (``theta``: (rows, bytes of its float64 [rows, E] table)). The
    primitive's operands: the rotated tensors (``n``), then positions and
    seq_offsets when ``has_pos`` / ``has_seq`` (rope), cos and sin (table),
    or x beside dO (the LRPE backward of an activation, ``has_x``)."""

    kind: str
    n: int
    inverse: bool = False
    layout: str = "bshd"
    key: int = 0
    offset: int = 0
    has_pos: bool = False
    has_seq: bool = False
    interleaved: bool = False
    theta: tuple = ()
    act: str = "none"
    dim: int | None = None
    has_x: bool = False

    def backward(self) -> "Call":
        """The call computing this one's gradient."""
        has_x = self.kind == "lrpe" and self.act != "none"
        return dataclasses.replace(self, inverse=not self.inverse, has_x=has_x)


# ---------------------------------------------------------------- the primitive

rope_p = Primitive("cuprope_rope")
rope_p.multiple_results = True
# the results keep their operands' avals (under shard_map: their varying
# mesh axes, so jax.vjp accepts cotangents that vary over the mesh)
rope_p.def_abstract_eval(lambda *args, call: [a.update(weak_type=False) for a in args[:call.n]])
rope_p.def_impl(lambda *args, call: jax.jit(functools.partial(rope_p.bind, call=call))(*args))


# The NumPy backends of the kinds other front ends bind the primitive with
# (kind -> fn(call, rotated tensors, other operands)): "lrpe", registered by
# cuprope.lrpe.jax.
HOST_CALLS: dict = {}


def _host_call(call: Call, *args):
    """The call on NumPy arrays: cuprope's NumPy backend (CPU lowering)."""
    xs, rest = list(args[:call.n]), list(args[call.n:])
    if call.kind == "rope":
        pos = rest.pop(0) if call.has_pos else None
        seq = rest.pop(0) if call.has_seq else None
        fn = (api.rope_qk_backward if call.inverse else api.rope_qk_forward) if call.n == 2 \
            else (api.rope_backward if call.inverse else api.rope_forward)
        res = fn(*xs, config_by_key(call.key), positions=pos, offset=call.offset,
                 seq_offsets=seq)
    elif call.kind == "table":
        fn = (tables.rope_qk_table_backward if call.inverse else tables.rope_qk_table_forward) \
            if call.n == 2 else (tables.rope_table_backward if call.inverse
                                 else tables.rope_table_forward)
        res = fn(*xs, rest[0], rest[1], layout=call.layout, interleaved=call.interleaved)
    else:
        res = HOST_CALLS[call.kind](call, xs, rest)
    return tuple(np.asarray(r) for r in (res if isinstance(res, tuple) else (res,)))


# CPU: the NumPy backend through jax.pure_callback (bfloat16 too). CUDA:
# jaxlib's GPU kernel call (the custom call jax-triton launches PTX through)
# with cuprope's own PTX, compiled by NVRTC at trace time, so the kernel,
# grid and arguments are fixed in the compiled program.
mlir.register_lowering(rope_p, host_lowering(_host_call), platform="cpu")
mlir.register_lowering(rope_p, xla.lower_cuda, platform="cuda")


# ---------------------------------------------------------------- vmap

def _foldable(call, args, dims):
    """True when a batch axis of the rotated tensors can join their batch dim:
    every rotated tensor (and LRPE's x) batched, nothing else, and nothing
    that is laid out per batch (positions ``[B, S]``, seq_offsets, per-batch
    tables)."""
    mapped = [d is not NOT_MAPPED for d in dims]
    n = call.n + (1 if call.has_x else 0)
    if not all(mapped[:n]) or any(mapped[n:]) or call.layout == "thd":
        return False
    if call.kind == "rope":
        rest = args[call.n:]
        return not call.has_seq and (not call.has_pos or rest[0].ndim == 1
                                     or (config_by_key(call.key).n_streams > 1
                                         and rest[0].ndim == 2))
    if call.kind == "table":
        return args[call.n].ndim == 2 or args[call.n].shape[0] == 1
    return True


def _batch(args, dims, *, call):
    size, args = batch_size_and_front(args, dims)
    if _foldable(call, args, dims):
        n = call.n + (1 if call.has_x else 0)
        folded = [a.reshape((-1,) + a.shape[2:]) for a in args[:n]] + list(args[n:])
        out = rope_p.bind(*folded, call=call)
        return [o.reshape((size, -1) + o.shape[1:]) for o in out], [0] * call.n
    return map_each(functools.partial(rope_p.bind, call=call), args, dims), [0] * call.n


batching.primitive_batchers[rope_p] = _batch

def sharding_rule(call, shapes) -> jax_sharding.Rule:
    """The sharding rule of a call of the primitive (rope, table or lrpe)."""
    xs, heads = jax_sharding.tensor_factors(call.layout, call.n,
                                            call.n == 2 and shapes[0] == shapes[1])
    rest = [len(s) for s in shapes[call.n:]]
    ops, keep = list(xs), {"s", "d", "t", "r", "u"}
    if call.kind == "rope":
        cfg = config_by_key(call.key)
        if call.has_pos:
            ops.append(jax_sharding.position_factors(cfg, rest.pop(0)))
        if call.has_seq:
            ops.append(["b"])
        if cfg.per_head:
            keep.update(heads)
    elif call.kind == "table":
        ops += [jax_sharding.table_factors(shapes[call.n])] * 2
    else:
        if call.has_x:
            ops.append(xs[0])
        if call.theta and call.theta[0] > 1:
            keep.add("h")
    return jax_sharding.Rule(ops, xs, frozenset(keep))


# under jax.sharding (a GPU backend): the call on each shard's local operands
_PARTITIONED = jax_sharding.Partitioned(lambda call, *ops: tuple(rope_p.bind(*ops, call=call)),
                                        sharding_rule)


# ---------------------------------------------------------------- autodiff

def _bind(call, xs, extras):
    operands = tuple(xs) + tuple(extras)
    xla.check_avals(call, [jax.typeof(a) for a in operands])
    if any(hasattr(a, "batch_dim") for a in operands) or not jax_sharding.enabled():
        # under vmap (custom_partitioning has no batching rule; the
        # primitive's own rule applies), or on the CPU backend: not partitioned
        return tuple(rope_p.bind(*operands, call=call))
    return _PARTITIONED(call, *operands)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def apply(call, xs, extras):
    """The primitive on ``xs`` (the rotated tensors) and ``extras`` (the
    other operands) for the static ``call``, differentiable in ``xs``."""
    return _bind(call, xs, extras)


def _apply_fwd(call, xs, extras):
    saved = xs[0] if call.kind == "lrpe" and call.act != "none" else None
    return _bind(call, xs, extras), (extras, saved)


def _apply_bwd(call, res, grads):
    extras, saved = res
    back = call.backward()
    more = (saved,) if back.has_x else ()
    dxs = _bind(back, tuple(grads), tuple(extras) + more)
    return dxs, tuple(zero_cotangent(e) for e in extras)


apply.defvjp(_apply_fwd, _apply_bwd)


# ---------------------------------------------------------------- public

def _rope_call(config, xs, positions, offset, seq_offsets):
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    call = Call("rope", len(xs), layout=config.layout, key=config.key, offset=static_offset(offset),
                has_pos=positions is not None, has_seq=seq_offsets is not None)
    extras = tuple(e for e in (positions, seq_offsets) if e is not None)
    return apply(call, tuple(xs), extras)


def rope(x, config: RopeConfig, *, positions=None, offset: int = 0, seq_offsets=None):
    """Differentiable, jit-able single-tensor RoPE on JAX arrays.

    Parameters
    ----------
    x : jax.Array
        Shape by ``config.layout``: ``[B, S, H, D]``, ``[B, H, S, D]`` or
        ``[T, H, D]``; float32, float16 or bfloat16 (as
        :func:`cuprope.rope_forward`).
    config : RopeConfig
        Static.
    positions : jax.Array, optional
        int32/int64, ``[S]``, ``[B, S]`` or ``[T]`` (a leading stream axis
        under a stream map). Pass positions that change from step to step
        here, not as ``offset``.
    offset : int
        Static (a Python int; a new value retraces).
    seq_offsets : jax.Array, optional
        int32/int64 ``[B]``.

    Returns
    -------
    jax.Array
        The rotated array.

    Notes
    -----
    Every function of this module is differentiable (``jax.custom_vjp``:
    cuprope's backward through the same kernels), batches under
    ``jax.vmap`` (a leading axis of the rotated tensors folds into their
    batch dim where the layout has one and the other operands are not
    batched; otherwise the call runs once per element) and partitions under
    ``jax.sharding`` over the batch and head dims (each shard runs the kernel
    on its own device; the sequence and head dim are replicated first;
    ``cuprope/_core/jax_sharding.py``). ``config``, ``offset``, ``layout``,
    ``interleaved``, ``theta``, ``act`` and ``dim`` are static (a new value
    retraces).

    On a GPU the call lowers to jaxlib's GPU kernel call with cuprope's own
    PTX, compiled by NVRTC at trace time: the kernel, grid and arguments are
    fixed in the compiled program and nothing in Python runs when it
    executes. On the CPU backend it runs cuprope's NumPy backend through
    ``jax.pure_callback`` (bfloat16 too). Results under ``jit`` equal the
    eager call's bit for bit. ``enable_pdl`` is not offered (jaxlib's kernel
    call takes no launch attributes).
    """
    return _rope_call(config, (x,), positions, offset, seq_offsets)[0]


def rope_qk(q, k, config: RopeConfig, *, positions=None, offset: int = 0, seq_offsets=None):
    """Differentiable, jit-able fused q/k RoPE on JAX arrays.

    Parameters
    ----------
    q, k : jax.Array
        Shapes by ``config.layout`` as :func:`cuprope.rope_qk_forward`
        (``"bshd"``: q ``[B, S, Hq, D]``, k ``[B, S, Hk, D]``); one dtype.
    config, positions, offset, seq_offsets
        As :func:`rope`.

    Returns
    -------
    tuple of jax.Array
        ``(q_rot, k_rot)``. Gradients, vmap, sharding and lowering as
        :func:`rope`.
    """
    return _rope_call(config, (q, k), positions, offset, seq_offsets)


def _table_call(xs, cos, sin, layout, interleaved):
    call = Call("table", len(xs), layout=layout, interleaved=bool(interleaved))
    return apply(call, tuple(xs), (cos, sin))


def rope_table(x, cos, sin, *, layout: str = "bshd", interleaved: bool = False):
    """``x * cos + rotate_half(x) * sin`` with the caller's tables, HF's
    formula with PyTorch's roundings (as :func:`cuprope.tables.rope_table_forward`).

    Parameters
    ----------
    x : jax.Array
        ``[B, S, H, D]`` (``"bshd"``), ``[B, H, S, D]`` (``"bhsd"``) or
        ``[T, H, D]`` (``"thd"``); float32, float16 or bfloat16.
    cos, sin : jax.Array
        ``[B, S, R]``, ``[1, S, R]`` or ``[S, R]`` (``[T, R]`` for
        ``"thd"``) in x's dtype; R even, R <= D. Constants to ``grad``
        (their cotangent is zero).
    layout : {"bshd", "bhsd", "thd"}
        Static.
    interleaved : bool
        Static. Pairs (2j, 2j+1) when True, halves (j, j + R/2) when False.

    Returns
    -------
    jax.Array
        The rotated array. Gradients, vmap, sharding and lowering as
        :func:`rope`.
    """
    return _table_call((x,), cos, sin, layout, interleaved)[0]


def rope_qk_table(q, k, cos, sin, *, layout: str = "bshd", interleaved: bool = False):
    """q and k by the caller's cos/sin tables, in one launch.

    Parameters
    ----------
    q, k : jax.Array
        As x of :func:`rope_table`; their head counts may differ.
    cos, sin, layout, interleaved
        As :func:`rope_table`.

    Returns
    -------
    tuple of jax.Array
        ``(q_rot, k_rot)``.
    """
    return _table_call((q, k), cos, sin, layout, interleaved)
