"""vLLM's in-place rotation by a cos/sin cache, beneath
``cuprope.kvcache.cos_sin_cache.rotary_embedding`` (the public, guarded
function) and ``cuprope.kvcache.torch`` (its custom op): ``rotate_by_cache``
validates and runs one call, on the NumPy backend or as a launch of the
KV-cache kernel family with the cos_sin_cache angle source. Shapes and
semantics: the docstring of ``cuprope.kvcache.cos_sin_cache``.
"""
from __future__ import annotations

import numpy as np

from . import reference as kref
from .._core import engine, fastpath, validate
from .._core.arrays import describe, overlaps
from .._core import launcher
from .launch import kv_spec, pick_kv_vec
from .._core.loader import KV_COS_SIN_F32, KV_COS_SIN_T
from .arrays import index_info, np_view, to_host
from ..config import LaunchCache

# The fast path's launches (cuprope/_core/fastpath.py), by call signature;
# rotary_embedding's arrays are (positions, query, key, cos_sin_cache), and
# the general path checks query against key for overlap.
_LAUNCHES = LaunchCache()
_PAIRS = ((1, 2),)


def _heads(info, name, t, head_size):
    """(heads, (token stride, head stride)) of ``[T, H·D]`` or ``[T, H, D]``."""
    shp, st = tuple(info.shape), tuple(info.strides)
    validate.check_float(info, name)
    validate.check_last_dim(info, name)
    if len(shp) == 2 and shp[0] == t and shp[1] % head_size == 0:
        return shp[1] // head_size, (st[0], head_size)
    if len(shp) == 3 and shp[0] == t and shp[2] == head_size:
        return shp[1], (st[0], st[1])
    raise ValueError(f"{name} must be [T, H*head_size] or [T, H, head_size] with T = {t}, "
                     f"head_size = {head_size}, got shape {list(shp)}")


def rotate_by_cache(positions, query, key, head_size, cos_sin_cache, is_neox, check, stream):
    """``rotary_embedding`` with no torch guard (``cuprope.kvcache.cos_sin_cache``
    documents it): the fast path, else validation and the NumPy or GPU
    backend. Returns (query, key)."""
    arrays = (positions, query, key, cos_sin_cache)
    fast = not check and stream is None and type(head_size) is int and type(is_neox) is bool
    if fast:
        header = ("cs", fastpath.get_ident(), head_size, is_neox)
        if fastpath.fast_call(_LAUNCHES.fast, fastpath.adapter_of(query), header, arrays):
            return query, key
    if isinstance(head_size, bool) or not isinstance(head_size, (int, np.integer)) \
            or head_size <= 0:
        raise TypeError(f"head_size must be a positive int, got {head_size!r}")
    if not isinstance(is_neox, (bool, np.bool_)):
        raise TypeError(f"is_neox must be a bool, got {type(is_neox).__name__}")
    head_size = int(head_size)
    qi = describe(query, "query")
    pi = describe(positions, "positions")
    if len(pi.shape) != 1:
        raise ValueError(f"positions must be [T], got shape {list(pi.shape)}")
    t = pi.shape[0]
    pos = index_info(positions, "positions", qi.device, [(t,)])
    hq, qst = _heads(qi, "query", t, head_size)
    ki, hk, kst = None, 0, (0, 0)
    if key is not None:
        ki = describe(key, "key")
        validate.check_same_kind(qi, ki, "query", "key")
        hk, kst = _heads(ki, "key", t, head_size)
        if overlaps(qi, ki):
            raise ValueError("query and key overlap")
    ci = describe(cos_sin_cache, "cos_sin_cache")
    if ci.dtype not in ("float32", qi.dtype):
        raise TypeError(f"cos_sin_cache must be float32 or query's dtype ({qi.dtype}), got "
                        f"{ci.dtype}")
    if len(ci.shape) != 2 or ci.shape[1] % 2 or not 0 < ci.shape[1] <= head_size:
        raise ValueError(f"cos_sin_cache must be [max_position, R] with R even and <= head_size "
                         f"({head_size}), got shape {list(ci.shape)}")
    if ci.device != qi.device:
        raise ValueError(f"cos_sin_cache is on device {ci.device} but query is on {qi.device}")
    validate.check_last_dim(ci, "cos_sin_cache")
    for info, name in ((qi, "query"), (ki, "key")):
        if info is not None:
            if info.kind == "jax":
                raise TypeError("JAX arrays are immutable: rotary_embedding works in place")
            validate.check_writable(info, name)
    if check and t:
        p = to_host(pos).astype(np.int64)
        bad = np.flatnonzero((p < 0) | (p >= ci.shape[0]))
        if bad.size:
            raise ValueError(f"positions[{bad[0]}] = {p[bad[0]]} is outside the cos_sin_cache's "
                             f"{ci.shape[0]} rows")
    if t == 0:
        return query, key
    if qi.device < 0:
        _host(pos, qi, ki, ci, head_size, is_neox)
        return query, key
    r = ci.shape[1]
    vec = pick_kv_vec(qi.dtype, [(qi.ptr, qi.itemsize, qst)] + (
        [(ki.ptr, ki.itemsize, kst)] if ki is not None else []), r // 2, 0)
    kp = ki.ptr if ki is not None else 0
    rope = dict(in_ptr=(qi.ptr, kp), out_ptr=(qi.ptr, kp), in_ss=(qst[0], kst[0]),
                in_sh=(qst[1], kst[1]), out_ss=(qst[0], kst[0]), out_sh=(qst[1], kst[1]),
                heads=(hq, hk), n_batch=1, n_seq=t, head_dim=head_size, rot_dim=r,
                pos_ptr=pos.ptr, pos_is64=int(pos.dtype == "int64"), pos_ss=1, scale=1.0,
                sin_sign=1.0)
    kv = dict(cs_ptr=ci.ptr, cs_st=ci.strides[0], cs_rows=ci.shape[0])
    src = KV_COS_SIN_F32 if ci.dtype == "float32" else KV_COS_SIN_T
    calls = [("pos_ptr", 0, 0), ("in_ptr0", 1, 0), ("out_ptr0", 1, 0), ("cs_ptr", 3, 0)]
    if ki is not None:
        calls += [("in_ptr1", 2, 0), ("out_ptr1", 2, 0)]
    plan = launcher.plan(kv_spec(qi.device, dtype=qi.dtype, interleaved=not is_neox, vec=vec,
                                 src=src, fp8=0, rope=rope, kv=kv, calls=calls), qi.device)
    stream_ptr = engine.stream_handle(stream, qi)
    launcher.on_device(qi.device, plan.run, stream_ptr, pi.ptr, qi.ptr, kp, ci.ptr)
    if fast:
        tkt = fastpath.ticket(fastpath.fast_adapter(qi.kind), header, arrays, _PAIRS)
        fastpath.remember(_LAUNCHES.fast, tkt,
                          [None, fastpath.span(qi), fastpath.span(ki), None], plan)
    return query, key


def _host(pos, qi, ki, ci, head_size, is_neox):
    """The NumPy backend: float64, rounded once; tokens outside the table skipped."""
    p = np_view(pos).astype(np.int64)
    table = np_view(ci).astype(np.float64)
    ok = (p >= 0) & (p < table.shape[0])
    for info in (qi, ki):
        if info is None:
            continue
        view = np_view(info)
        if view.ndim == 2:  # [T, H*D] as a [T, H, D] view (never a copy: it is written)
            st = view.strides
            view = np.lib.stride_tricks.as_strided(
                view, (view.shape[0], view.shape[1] // head_size, head_size),
                (st[0], head_size * st[1], st[1]))
        r = table.shape[1]
        y = kref.rotate_cos_sin_cache(view[ok, :, :r], p[ok], table, interleaved=not is_neox)
        view[ok, :, :r] = kref.encode(y, info.dtype)
