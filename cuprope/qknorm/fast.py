"""The fast paths of the fused QK-norm + RoPE (cuprope/_core/fastpath.py's
machinery): a repeated forward or backward whose arrays and settings match a
validated call's replays its launches, reading only the arrays' pointers.
Forward: the QK-norm kernel's Plan (``fast_forward``); backward:
``BackwardLaunch``, the kernel's Plan and the weight gradients' reductions,
on the partial-sum workspace of the current stream (``fast_backward``).
``cuprope.qknorm.call`` takes these first and registers the entries after a
general-path launch.
"""
from __future__ import annotations

from .._core import fastpath, validate
from ..config import RopeConfig
from . import launch as qknorm_launch


def fast_settings(config, tables, positions, seq_offsets, offset, stream):
    """Whether a call may take (and register) a fast path: no stream=, a
    RopeConfig, and tables only alone (the key covers the tables, not
    positions, seq_offsets or an offset beside them)."""
    return (stream is None and isinstance(config, RopeConfig)
            and (tables is None or (isinstance(tables, (tuple, list)) and len(tables) == 2
                                    and positions is None and seq_offsets is None
                                    and type(offset) is int and offset == 0)))


# The arrays a fast-path key covers: q, k, the weights, positions and
# seq_offsets (or cos and sin); in place, q and k are written while all of
# them are read (the general path checks those overlaps).
INPLACE_PAIRS = tuple((i, j) for i in (0, 1) for j in range(i + 1, 6))


def fast_signature(q, k, q_weight, k_weight, eps, norm, weight_offset, order, norm_over,
                   rounding, tables, positions, seq_offsets, inplace):
    """(header, arrays) of a forward's fast-path key: the settings (types too,
    so True never passes for 1) and the arrays it covers."""
    header = ("qkn", fastpath.get_ident(), type(eps), eps, norm, type(weight_offset),
              weight_offset, order, norm_over, rounding, tables is None, bool(inplace))
    return header, (q, k, q_weight, k_weight) + (
        (positions, seq_offsets) if tables is None else tuple(tables))


def _fast_entry(config, header, arrays, offset):
    """(adapter, registered entry, pointers) of a call whose launch was
    registered before, or None (the general path runs and says what is
    wrong, if anything)."""
    if type(offset) is not int or not -validate.MAX_POSITION <= offset <= validate.MAX_POSITION:
        return None
    fw = fastpath.adapter_of(arrays[0])
    if fw is None:
        return None
    tkt = fastpath.ticket(fw, header, arrays)
    if tkt is None:
        return None
    try:
        hit = fastpath.lookup(config._launches.fast, tkt.key, tkt.ptrs, fw.current_device)
    except TypeError:  # an unhashable setting
        return None
    return None if hit is None else (fw, hit, tkt.ptrs)


def fast_forward(config, header, arrays, offset, inplace):
    """(q_out, k_out) of a forward whose launch was registered before, or None."""
    found = _fast_entry(config, header, arrays, offset)
    if found is None:
        return None
    fw, plan, p = found
    if inplace:
        res = arrays[:2]
        o0, o1 = p[0], p[1]
    else:
        res = (fw.alloc(arrays[0]), fw.alloc(arrays[1]))
        o0, o1 = fw.ptr(res[0]), fw.ptr(res[1])
        if (o0 | o1) % plan.align:
            return None
    plan.run(fw.stream(plan.device), p[0], p[1], o0, o1, p[2], p[3], p[4], p[5], offset)
    return res


class BackwardLaunch:
    """What a repeated backward replays (its fast-path entry): the QK-norm
    kernel's plan (``rows``), the weight gradients' reductions ((index, plan)
    each, Plan.run(stream, out, part)) and the floats of its partial-sum
    workspace (``part_n``, 0 without weights)."""

    __slots__ = ("device", "align", "rows", "dws", "part_n")

    def __init__(self, rows, dws, part_n):
        self.device, self.align, self.rows = rows.device, rows.align, rows
        self.dws, self.part_n = tuple(dws), part_n


def fast_backward(config, header, arrays, offset):
    """(dq, dk, dq_weight, dk_weight) of a backward whose launches were
    registered before (arrays: q, k, grad_q, grad_k, the weights, then
    positions and seq_offsets or the tables), or None."""
    found = _fast_entry(config, header, arrays, offset)
    if found is None:
        return None
    fw, hit, p = found
    dq, dk = fw.alloc(arrays[2]), fw.alloc(arrays[3])
    o0, o1 = fw.ptr(dq), fw.ptr(dk)
    if (o0 | o1) % hit.align:
        return None
    stream = fw.stream(hit.device)
    part = qknorm_launch.workspace(hit.device, stream, hit.part_n).data.ptr if hit.part_n else 0
    hit.rows.run(stream, p[2], p[3], o0, o1, p[4], p[5], p[6], p[7], offset, p[0], p[1], part)
    dws = [None, None]
    for i, plan in hit.dws:
        dws[i] = fw.alloc(arrays[4 + i])
        plan.run(stream, fw.ptr(dws[i]), part)
    return dq, dk, dws[0], dws[1]
