"""The table rotation itself, beneath ``cuprope.rope.tables`` (its public,
guarded functions) and ``cuprope.rope.torch`` (their differentiable twins):
``table_call`` validates and runs one call on the NumPy backend or the GPU
(each layout and pairing owns its launch cache). Shapes and semantics:
:func:`cuprope.tables.rope_table_forward`.
"""
from __future__ import annotations

import threading

from .. import reference
from .._core import engine, host, validate
from .._core.arrays import describe, overlaps
from .._core import launcher
from .._core.launch import sm_count
from .._core.layout import to_canon
from ..config import LAYOUTS, LaunchCache
from . import fast
from .engine import run_plan
from .launch import rope_spec


class _TableSource:
    """The owner of table calls' launches (one per layout and pairing),
    where core calls keep theirs on the RopeConfig."""

    def __init__(self, layout, interleaved):
        self.layout, self.interleaved = layout, interleaved
        self._launches = LaunchCache()


_SOURCES = {(lay, il): _TableSource(lay, il) for lay in LAYOUTS for il in (False, True)}


def clear_launches():
    """Forget every table source's plans (after a change of the tuning that
    plans read, as the tests make)."""
    for src in _SOURCES.values():
        src._launches.clear()


def table_call(xs, names, cos, sin, layout, interleaved, inverse, outs, inplace, stream):
    """The table rotation of ``xs`` (x, or q and k; their argument ``names``)
    by ``cos``/``sin`` as ``cuprope.rope.tables`` documents it, with no torch
    guard: the fast path for new outputs, else validation and the NumPy or
    GPU backend. Returns a tuple like ``xs``."""
    src = _SOURCES.get((layout, bool(interleaved)))
    if src is None:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if outs is None and not inplace:  # the fast path: new outputs only (nothing can overlap)
        res = fast.fast_path(xs, src, inverse, cos, 0, sin, None, False, stream)
        if res is not None:
            return res
    cinfo, sinfo = describe(cos, "cos"), describe(sin, "sin")
    validate.check_float(cinfo, "cos")
    r = validate.table_rotary_dim(cinfo)
    infos, out_infos, (b, s, d) = validate.validate_call(xs, names, layout, r, outs, inplace)
    tstrides = validate.check_tables(cinfo, sinfo, infos[0], b, s, layout)
    for o in out_infos or ():
        for t, name in ((cinfo, "cos"), (sinfo, "sin")):
            if overlaps(o, t):
                raise ValueError(f"an output overlaps {name}")
    if all(i.size == 0 for i in infos):
        return engine.empty_result(infos, out_infos)
    if infos[0].device < 0:
        return _numpy_backend(infos, out_infos, cinfo, sinfo, layout, interleaved, inverse)
    key = (fast.fast_key(infos[0].kind, xs, src, inverse, cos, sin, None, False, stream)
           if outs is None and not inplace else None)
    return _gpu_backend(src, infos, out_infos, cinfo, sinfo, tstrides, r, inverse, (b, s, d),
                        stream, key)


def _numpy_backend(infos, out_infos, cinfo, sinfo, layout, interleaved, inverse):
    """HF's formula in float64 with PyTorch's roundings (reference.rotate_with_tables)."""
    def table(info):
        t = host.to_numpy(info)
        t = t[None] if t.ndim == 2 else t   # [S, R] / [T, R] -> [1, S, R]
        return t[:, :, None, :]             # [B or 1, S, 1, R]

    cos, sin = table(cinfo), table(sinfo)
    results = []
    for info in infos:
        x = host.to_numpy(info)
        results.append(reference.rotate_with_tables(to_canon(x, layout), cos, sin,
                                                    interleaved=interleaved, inverse=inverse,
                                                    dtype=x.dtype))
    return host.finish(infos, out_infos, results, layout)


def _gpu_backend(src, infos, out_infos, cinfo, sinfo, tstrides, r, inverse, bsd, stream,
                 cache_key):
    b, s, d = bsd
    device = infos[0].device
    stream_ptr = engine.stream_handle(stream, infos[0])
    copy_rest, out_infos = engine.outputs(infos, out_infos)
    gkey = ("T", threading.get_ident(), inverse, copy_rest, device, tuple(cinfo.shape), tstrides,
            cinfo.ptr % 16, sinfo.ptr % 16,
            tuple((i.dtype, tuple(i.shape), i.strides, i.ptr % 16) for i in infos),
            tuple((o.strides, o.ptr % 16) for o in out_infos))
    plan = launcher.cached_plan(src._launches, gkey, lambda: rope_spec(
        sms=sm_count(device), dtype=infos[0].dtype, interleaved=src.interleaved,
        plans=engine.tensor_plans(infos, out_infos, src.layout), n_batch=b, n_seq=s,
        head_dim=d, rot_dim=r, copy_rest=copy_rest, pos=None, seq_off=None, inv_freq_ptr=0,
        freq_sh=0, stream_map_ptr=0, scale=1.0, sin_sign=-1.0 if inverse else 1.0,
        table=(cinfo.ptr, sinfo.ptr) + tstrides, decode_tables=True), device)
    return run_plan(plan, src, infos, out_infos, stream_ptr, cinfo.ptr, sinfo.ptr, 0, cache_key)
