"""How cuprope's JAX primitives partition under ``jax.sharding``: each shard
runs the call on its own device with its local shapes. :class:`Partitioned`
wraps a primitive's bind in ``custom_partitioning``; each adapter hands it
its bind and a sharding rule (:class:`Rule`), built from the factors of
its operands (``tensor_factors``, ``position_factors``, ``table_factors``).
"""
from __future__ import annotations

import dataclasses

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec


# The CPU backend's calls run jax.pure_callback, which crashes when executed
# inside a custom-partitioned computation (jaxlib 0.10/0.11 CPU): there the
# calls are left to XLA (replicated, correct). Tests switch this on to lower
# and compile the partitioned program on several host devices.
PARTITION_ON_CPU = False


def enabled() -> bool:
    """Whether calls are partitioned (the default backend is a GPU)."""
    return PARTITION_ON_CPU or jax.default_backend() != "cpu"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A call's sharding rule: a factor list per operand and per result (one
    name per dim, one letter each), the factors kept replicated, and ``sums``:
    (result index, factors) for results that sum over those factors."""

    operands: list
    results: list
    keep: frozenset
    sums: tuple = ()


_X = {"bshd": "b s {h} d", "bhsd": "b {h} s d", "thd": "s {h} d", "bsd": "b s d"}


def tensor_factors(layout, n, same):
    """Factor lists of ``n`` rotated tensors in ``layout`` and their head
    factors: one head factor when q's and k's shapes agree, else two (then
    Shardy shards only one of them along a mesh axis: k's heads, the fewer
    under GQA, are gathered)."""
    heads = ("h", "h") if same else ("h", "g")
    return [_X[layout].format(h=heads[i]).split() for i in range(n)], heads[:n]


def position_factors(cfg, ndim):
    """Factors of a positions operand of ``ndim`` dims (``[S]``, ``[B, S]``,
    with a leading stream dim where ``cfg`` has several streams)."""
    streams = ["t"] if cfg.n_streams > 1 else []
    return streams + (["s"] if ndim - len(streams) == 1 else ["b", "s"])


def table_factors(shape):
    """Factors of a cos/sin table ``[S, R]``, ``[1, S, R]`` or ``[B, S, R]``."""
    return ["s", "r"] if len(shape) == 2 else (["u", "s", "r"] if shape[0] == 1
                                               else ["b", "s", "r"])


def _shapes(value_types):
    from jax._src.lib.mlir import ir
    return [tuple(ir.RankedTensorType(t).shape) for t in value_types]


def _axes(ax):
    """A PartitionSpec entry as a tuple of mesh axis names."""
    return () if ax is None else (tuple(ax) if isinstance(ax, (tuple, list)) else (ax,))


def _specs(rule, shardings):
    """(operand specs, result specs, mesh axes by factor): the operands' own
    shardings, replicated where the rule says, one mesh axis per factor (the
    first operand that shards it wins)."""
    axis_of, used = {}, set()
    for spec, sh in zip(rule.operands, shardings):
        pspec = getattr(sh, "spec", PartitionSpec())
        for i, f in enumerate(spec):
            ax = pspec[i] if i < len(pspec) else None
            if f not in rule.keep and ax is not None and f not in axis_of \
                    and not used.intersection(_axes(ax)):
                axis_of[f] = ax
                used.update(_axes(ax))

    def pspec(spec):
        return PartitionSpec(*[axis_of.get(f) for f in spec])
    return [pspec(s) for s in rule.operands], [pspec(s) for s in rule.results], axis_of


class Partitioned:
    """``bind(call, *operands)`` (a tuple of results) partitioned by
    ``rule(call, operand shapes) -> Rule``. ``local(call, sums, *operands)``
    runs one shard where the rule has sums (``sums``: {result index: mesh
    axes it reduces over}, possibly empty); by default ``bind``.

    The rule names a factor per dim of every operand and result
    (einsum-like). The batch dim and the head dims of q and k may be sharded
    (GQA: q's and k's heads each on their own); every factor a call reads
    across is in the rule's ``keep`` and replicated first: the sequence
    (implicit positions are the sequence index), the head dim, position
    streams, a cos/sin table's R, weights, and the heads where the call
    mixes them (a per-head frequency table, a norm over the whole token). A
    result that sums over sharded factors (a weight gradient) is a per-shard
    partial: ``local`` gets, per such result, the mesh axes to reduce it
    over. The rule is stated as an einsum-like sharding rule for Shardy and
    as ``infer_sharding_from_operands`` for GSPMD; ``partition`` lowers the
    primitive on the local shards."""

    def __init__(self, bind, rule, local=None):
        self.bind, self.rule = bind, rule
        self.local = local or (lambda call, sums, *ops: bind(call, *ops))

        def fn(call, *operands):
            return bind(call, *operands)
        self._fn = custom_partitioning(fn, static_argnums=(0,))
        self._fn.def_partition(partition=self._partition, infer_sharding_from_operands=self._infer,
                               sharding_rule=self._sdy_rule)

    def __call__(self, call, *operands):
        return self._fn(call, *operands)

    def _sdy_rule(self, call, mesh, value_types, result_types):
        rule = self.rule(call, _shapes(value_types))
        order = list(dict.fromkeys(f for spec in rule.operands for f in spec))
        text = (", ".join(" ".join(s) for s in rule.operands) + " -> "
                + ", ".join(" ".join(s) for s in rule.results))
        return text, {"need_replication_factors": tuple(f for f in order if f in rule.keep)}

    def _infer(self, call, mesh, arg_shapes, result_shape):
        rule = self.rule(call, [a.shape for a in arg_shapes])
        _, outs, _ = _specs(rule, [a.sharding for a in arg_shapes])
        return tuple(NamedSharding(mesh, p) for p in outs)

    def _partition(self, call, mesh, arg_shapes, result_shape):
        rule = self.rule(call, [a.shape for a in arg_shapes])
        ins, outs, axis_of = _specs(rule, [a.sharding for a in arg_shapes])
        sums = {i: tuple(dict.fromkeys(a for f in factors for a in _axes(axis_of.get(f))))
                for i, factors in rule.sums}

        def lower(*local):
            return tuple(self.local(call, sums, *local))
        return (mesh, lower, tuple(NamedSharding(mesh, p) for p in outs),
                tuple(NamedSharding(mesh, p) for p in ins))
