"""How ``cuprope.jax`` calls partition under ``jax.sharding``: each shard runs
the call on its own device with its local shapes.

The batch dim and the head dims of q and k may be sharded (GQA: q's and k's
heads each on their own); everything a rotation reads across is replicated
first: the sequence (implicit positions are the sequence index), the head
dim, position streams, a cos/sin table's R, and the heads of a per-head
frequency table (its rows belong to the heads). The rule is stated as an
einsum-like sharding rule for Shardy and as ``infer_sharding_from_operands``
for GSPMD; ``partition`` lowers the same primitive on the local shards.
"""
from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from ..config import config_by_key

# The CPU backend's calls run jax.pure_callback, which crashes when executed
# inside a custom-partitioned computation (jaxlib 0.10/0.11 CPU): there the
# calls are left to XLA (replicated, correct). Tests switch this on to lower
# and compile the partitioned program on several host devices.
PARTITION_ON_CPU = False


def enabled() -> bool:
    """Whether calls are partitioned (the default backend is a GPU)."""
    return PARTITION_ON_CPU or jax.default_backend() != "cpu"


_X = {"bshd": "b s {h} d", "bhsd": "b {h} s d", "thd": "s {h} d", "bsd": "b s d"}


def factors(call, shapes):
    """(operand factor lists, result factor lists, factors to replicate)."""
    # q's and k's heads: one factor when their counts agree, else two (then
    # Shardy shards only one of them along a mesh axis: k's heads, the
    # fewer under GQA, are gathered)
    same = call.n == 2 and shapes[0] == shapes[1]
    heads = ("h", "h") if same else ("h", "g")
    xs = [_X[call.layout].format(h=heads[i]).split() for i in range(call.n)]
    rest = [len(s) for s in shapes[call.n:]]
    ops, keep = list(xs), {"s", "d"}
    if call.kind == "rope":
        cfg = config_by_key(call.key)
        if call.has_pos:
            r = rest.pop(0)
            streams = ["t"] if cfg.n_streams > 1 else []
            ops.append(streams + (["s"] if r - len(streams) == 1 else ["b", "s"]))
            keep.add("t")
        if call.has_seq:
            ops.append(["b"])
        if cfg.per_head:
            keep.update(heads)
    elif call.kind == "table":
        table = shapes[call.n]
        spec = ["s", "r"] if len(table) == 2 else (["u", "s", "r"] if table[0] == 1
                                                   else ["b", "s", "r"])
        ops += [spec, spec]
        keep.update(("r", "u"))
    else:
        if call.has_x:
            ops.append(xs[0])
        if call.theta and call.theta[0] > 1:
            keep.add("h")
    return ops, xs, keep


def _rule(call, mesh, value_types, result_types):
    from jax._src.lib.mlir import ir
    shapes = [tuple(ir.RankedTensorType(t).shape) for t in value_types]
    ops, outs, keep = factors(call, shapes)
    order = list(dict.fromkeys(f for spec in ops for f in spec))  # factors as numbered
    text = ", ".join(" ".join(s) for s in ops) + " -> " + ", ".join(" ".join(s) for s in outs)
    return text, {"need_replication_factors": tuple(f for f in order if f in keep)}


def _specs(call, mesh, shapes, shardings):
    """Operand and result PartitionSpecs: the operands' own, replicated where
    the rule says, and one mesh axis per factor (the first operand that
    shards it wins)."""
    ops, outs, keep = factors(call, shapes)
    axis_of = {}
    for spec, sh in zip(ops, shardings):
        pspec = getattr(sh, "spec", PartitionSpec())
        for i, f in enumerate(spec):
            ax = pspec[i] if i < len(pspec) else None
            if f not in keep and ax is not None and f not in axis_of \
                    and ax not in axis_of.values():
                axis_of[f] = ax

    def pspec(spec):
        return PartitionSpec(*[axis_of.get(f) for f in spec])
    return [pspec(s) for s in ops], [pspec(s) for s in outs]


def _infer(call, mesh, arg_shapes, result_shape):
    _, outs = _specs(call, mesh, [a.shape for a in arg_shapes],
                     [a.sharding for a in arg_shapes])
    return tuple(NamedSharding(mesh, p) for p in outs)


def _partition(call, mesh, arg_shapes, result_shape):
    from ..jax import rope_p
    ins, outs = _specs(call, mesh, [a.shape for a in arg_shapes],
                       [a.sharding for a in arg_shapes])

    def lower(*local):
        return tuple(rope_p.bind(*local, call=call))
    return (mesh, lower, tuple(NamedSharding(mesh, p) for p in outs),
            tuple(NamedSharding(mesh, p) for p in ins))


@functools.partial(custom_partitioning, static_argnums=(0,))
def partitioned(call, *operands):
    """``rope_p.bind(*operands, call=call)``, partitioned as above."""
    from ..jax import rope_p
    return tuple(rope_p.bind(*operands, call=call))


partitioned.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                          sharding_rule=_rule)
