"""The rotation's fast path (``cuprope._core.fastpath``'s machinery): a
repeated core or table call of the same signature on this thread replays
its plan with the new pointers. The arrays of a ticket: xs, then the given
outputs, then the two index arrays (positions and sequence offsets, or cos
and sin).
"""
from __future__ import annotations

from .._core.fastpath import (ADAPTERS, NoFastPath, fast_adapter, get_ident, lookup, remember,
                              span, ticket)
from .._core.validate import MAX_POSITION


def rope_ticket(fw, xs, inverse, idx1, idx2, outs, inplace, pdl=False):
    """The core's ticket (fast_path builds the same key inline)."""
    n = len(xs)
    pairs = ((0, 1),) if inplace and n == 2 else ()
    if outs is not None:
        pairs = tuple((i, n + j) for i in range(n) for j in range(len(outs))) + (
            ((n, n + 1),) if len(outs) == 2 else ())
    arrays = xs + (idx1, idx2) if outs is None else (*xs, *outs, idx1, idx2)
    return ticket(fw, ("rope", get_ident(), inverse, inplace, outs is None, pdl), arrays, pairs)


def fast_key(kind, xs, config, inverse, idx1, idx2, outs, inplace, stream, pdl=False):
    """The fast-path ticket of a core call about to take the general path, or
    None when its framework has no fast path (or stream= was given).
    ``pdl``: enable_pdl, part of the key (a plan launches with it or not)."""
    if stream is not None:
        return None
    fw = fast_adapter(kind)
    if fw is None:
        return None
    return rope_ticket(fw, xs, inverse, idx1, idx2, outs, inplace, pdl)


def remember_rope(owner, tkt, plan, infos, out_infos):
    """Register a core plan that has just launched (engine.run_plan)."""
    if tkt is not None:
        remember(owner._launches.fast, tkt, [span(i) for i in infos] + [span(o) for o in out_infos],
                 plan)


def fast_path(xs, config, inverse, positions, offset, seq_offsets, outs, inplace, stream,
              pdl=False):
    """Result tuple of a core call, or None when the general path must run."""
    fast = config._launches.fast
    if not fast or stream is not None or (inplace and outs is not None):
        return None
    if type(offset) is not int or not -MAX_POSITION <= offset <= MAX_POSITION:
        return None
    fw = ADAPTERS.get(type(xs[0]).__module__)
    if fw is None:
        return None
    key, ptrs = ["rope", get_ident(), inverse, inplace, outs is None, pdl], []
    try:
        fw.collect(xs + (positions, seq_offsets) if outs is None else (*xs, *outs, positions,
                                                                   seq_offsets), key, ptrs)
    except NoFastPath:
        return None
    plan = lookup(fast, tuple(key), ptrs, fw.current_device)
    if plan is None:
        return None
    n = len(xs)
    if outs is not None:
        res = tuple(outs)
        out0, out1 = ptrs[n], ptrs[2 * n - 1]
    elif inplace:
        res = xs
        out0, out1 = ptrs[0], ptrs[n - 1]
    else:
        ptr, alloc = fw.ptr, fw.alloc
        res = tuple([alloc(x) for x in xs])
        out0, out1 = ptr(res[0]), ptr(res[-1])
        if (out0 | out1) % plan.align:
            return None
    plan.run(fw.stream(plan.device), ptrs[0], ptrs[n - 1], out0, out1, ptrs[-2], ptrs[-1], offset)
    return tuple(res)
