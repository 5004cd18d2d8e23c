"""Pieces every op's JAX adapter shares:
static arguments, cotangents of non-differentiable operands, vmap's marker
of an unbatched operand, and the batching rule's moving and looping."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import batching

from . import validate

NOT_MAPPED = getattr(batching, "not_mapped", None)  # an unbatched operand's dim under vmap


def static_offset(offset) -> int:
    """``offset`` as a static Python int (a new value retraces), checked for range."""
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError("offset must be a Python int under jax (static); pass positions= for "
                        "positions that change from call to call")
    return validate.as_offset(offset)


def zero_cotangent(a):
    """The cotangent of an operand that ``grad`` treats as a constant: float0
    zeros for integer operands (positions), zeros of its dtype otherwise."""
    if jnp.issubdtype(a.dtype, jnp.integer):
        return np.zeros(a.shape, dtype=jax.dtypes.float0)
    return jnp.zeros_like(a)


def batch_size_and_front(args, dims):
    """(the vmapped size, the operands with their mapped axis moved to 0)."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not NOT_MAPPED)
    return size, [a if d is NOT_MAPPED else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]


def map_each(bind, args, dims):
    """``bind(*operands)`` once per element of the mapped operands (``args``
    with their mapped axis in front), by ``lax.map``; results stacked on axis 0."""
    mapped = [i for i, d in enumerate(dims) if d is not NOT_MAPPED]

    def one(elems):
        full = list(args)
        for i, e in zip(mapped, elems):
            full[i] = e
        return tuple(bind(*full))
    return list(jax.lax.map(one, tuple(args[i] for i in mapped)))


def host_lowering(host_call):
    """A lowering rule for the CPU backend: ``host_call(call, *arrays)`` (the
    NumPy backend on NumPy arrays, returning a tuple shaped like the
    primitive's results) through ``jax.pure_callback``."""
    import functools

    from jax.interpreters import mlir

    def rule(ctx, *args, call):
        shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]

        def run(*a):
            return jax.pure_callback(functools.partial(host_call, call), shapes, *a)
        return mlir.lower_fun(run, multiple_results=True)(ctx, *args)
    return rule


def varying_axes(aval) -> frozenset:
    """The mesh axes an aval varies over under ``shard_map`` (empty elsewhere;
    JAX 0.10+ ``manual_axis_type.varying``, earlier ``vma``)."""
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def with_varying(aval, axes, **changes):
    """``aval.update(**changes)`` varying over the mesh axes ``axes``."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return aval.update(manual_axis_type=mat.update(varying=frozenset(axes)), **changes)
    if hasattr(aval, "vma"):
        return aval.update(vma=frozenset(axes), **changes)
    return aval.update(**changes)


def reduce_to(ct, primal, dtype=None):
    """The cotangent ``ct`` summed over the mesh axes it varies over and
    ``primal`` does not (the transpose of using an unvarying operand in a
    varying call under ``shard_map``), then cast to ``dtype`` (default: its own)."""
    axes = tuple(sorted(varying_axes(jax.typeof(ct)) - varying_axes(jax.typeof(primal))))
    if axes:
        ct = jax.lax.psum(ct, axes)
    return ct if dtype is None else ct.astype(dtype)
