"""vLLM's in-place rotation by a cos/sin cache, beneath
``cuprope.kvcache.cos_sin_cache.rotary_embedding`` (the public, guarded
function) and ``cuprope.kvcache.torch`` (its custom op): ``rotate_by_cache``
validates and runs one call, on the NumPy backend or as a launch of the
KV-cache kernel family with the cos_sin_cache angle source. Shapes and
semantics: :func:`cuprope.cos_sin_cache.rotary_embedding`.
"""
from __future__ import annotations

import numpy as np

from . import reference as kref
from .._core import engine, fastpath, validate
from .._core.arrays import describe, overlaps
from .._core import launcher
from .launch import kv_spec, pick_pack_vec
from ..rope.kernels import KV_COS_SIN_F32, KV_COS_SIN_T
from . import cache_copy
from .arrays import index_info, np_view, to_host
from ..config import LaunchCache

# The fast path's launches (cuprope/_core/fastpath.py), by call signature;
# rotary_embedding's arrays are (positions, query, key, cos_sin_cache), and
# the general path checks query against key for overlap.
_LAUNCHES = LaunchCache()
_PAIRS = ((1, 2),)
_CACHE_DTYPES = ("float32", "float16", "bfloat16")


def _geometry(info, name, lead, head_size):
    """(heads, (batch, token, head strides)) of query or key for positions of
    shape ``lead``: ``[T]`` takes ``[T, H·D]`` or ``[T, H, D]``, ``[B, S]``
    takes ``[B, S, H·D]`` or ``[B, S, H, D]`` (D = head_size)."""
    shp, st = tuple(info.shape), tuple(info.strides)
    validate.check_float(info, name)
    validate.check_last_dim(info, name)
    n = len(lead)
    rest, rst = shp[n:], st[n:]
    heads = None
    if shp[:n] == lead and len(rest) == 1 and rest[0] % head_size == 0:
        heads, sh = rest[0] // head_size, head_size
    elif shp[:n] == lead and len(rest) == 2 and rest[1] == head_size:
        heads, sh = rest[0], rst[0]
    if heads is None:
        want = ("[T, H*head_size] or [T, H, head_size] with T = {}" if n == 1 else
                "[B, S, H*head_size] or [B, S, H, head_size] with [B, S] = {}")
        raise ValueError(f"{name} must be " + want.format(list(lead) if n > 1 else lead[0])
                         + f" (positions' shape), head_size = {head_size}, got shape "
                         f"{list(shp)}")
    return heads, ((st[0] if n == 2 else 0), st[n - 1], sh)


def _options(head_size, is_neox, rope_dim_offset, inverse):
    """The scalar arguments checked: (head_size, rope_dim_offset) as ints."""
    if isinstance(head_size, bool) or not isinstance(head_size, (int, np.integer)) \
            or head_size <= 0:
        raise TypeError(f"head_size must be a positive int, got {head_size!r}")
    if not isinstance(is_neox, (bool, np.bool_)):
        raise TypeError(f"is_neox must be a bool, got {type(is_neox).__name__}")
    if isinstance(rope_dim_offset, (bool, np.bool_)) \
            or not isinstance(rope_dim_offset, (int, np.integer)):
        raise TypeError(f"rope_dim_offset must be an int, got {rope_dim_offset!r}")
    if rope_dim_offset < 0:
        raise ValueError(f"rope_dim_offset must be >= 0, got {rope_dim_offset}")
    if not isinstance(inverse, (bool, np.bool_)):
        raise TypeError(f"inverse must be a bool, got {type(inverse).__name__}")
    return int(head_size), int(rope_dim_offset)


def rotate_by_cache(positions, query, key, head_size, cos_sin_cache, is_neox, check, stream,
                    rope_dim_offset=0, inverse=False, enable_pdl=False):
    """``rotary_embedding`` with no torch guard (``cuprope.kvcache.cos_sin_cache``
    documents it): the fast path, else validation and the NumPy or GPU
    backend. Returns (query, key)."""
    cos_sin_cache = cache_copy.held(cos_sin_cache)
    arrays = (positions, query, key, cos_sin_cache)
    fast = (not check and stream is None and type(head_size) is int and type(is_neox) is bool
            and type(rope_dim_offset) is int and type(inverse) is bool
            and type(enable_pdl) is bool)
    if fast:
        header = ("cs", fastpath.get_ident(), head_size, is_neox, rope_dim_offset, inverse,
                  enable_pdl)
        if fastpath.fast_call(_LAUNCHES.fast, fastpath.adapter_of(query), header, arrays):
            return query, key
    head_size, off = _options(head_size, is_neox, rope_dim_offset, inverse)
    enable_pdl = validate.check_flag(enable_pdl, "enable_pdl")
    qi = describe(query, "query")
    pi = describe(positions, "positions")
    if len(pi.shape) not in (1, 2):
        raise ValueError(f"positions must be [T] or [B, S], got shape {list(pi.shape)}")
    lead = tuple(pi.shape)
    nb, ns = (1, lead[0]) if len(lead) == 1 else lead
    pos = index_info(positions, "positions", qi.device, [lead])
    hq, qst = _geometry(qi, "query", lead, head_size)
    ki, hk, kst = None, 0, (0, 0, 0)
    if key is not None:
        ki = describe(key, "key")
        validate.check_same_kind(qi, ki, "query", "key")
        hk, kst = _geometry(ki, "key", lead, head_size)
        if overlaps(qi, ki):
            raise ValueError("query and key overlap")
    ci = describe(cos_sin_cache, "cos_sin_cache")
    if ci.dtype not in _CACHE_DTYPES:
        raise TypeError(f"cos_sin_cache must have dtype float32, float16 or bfloat16, got "
                        f"{ci.dtype}")
    if len(ci.shape) != 2 or ci.shape[1] % 2 or not 0 < ci.shape[1] <= head_size - off:
        raise ValueError(f"cos_sin_cache must be [max_position, R] with R even and "
                         f"R + rope_dim_offset <= head_size ({off} + R <= {head_size}), got "
                         f"shape {list(ci.shape)}")
    if ci.device != qi.device:
        raise ValueError(f"cos_sin_cache is on device {ci.device} but query is on {qi.device}")
    validate.check_last_dim(ci, "cos_sin_cache")
    for info, name in ((qi, "query"), (ki, "key")):
        if info is not None:
            if info.kind == "jax":
                raise TypeError("JAX arrays are immutable: rotary_embedding works in place")
            validate.check_writable(info, name)
    if check and pi.size:
        p = to_host(pos).astype(np.int64).reshape(-1)
        bad = np.flatnonzero((p < 0) | (p >= ci.shape[0]))
        if bad.size:
            at = np.unravel_index(bad[0], lead)
            raise ValueError(f"positions[{', '.join(str(int(i)) for i in at)}] = {p[bad[0]]} "
                             f"is outside the cos_sin_cache's {ci.shape[0]} rows")
    if pi.size == 0:
        return query, key
    if qi.device < 0:
        _host(pos, lead, ((qi, hq, qst), (ki, hk, kst)), ci, head_size, off, is_neox, inverse)
        return query, key
    stream_ptr = engine.stream_handle(stream, qi)
    if ci.dtype not in ("float32", qi.dtype):  # a third dtype: read from a float32 copy
        cos_sin_cache = cache_copy.float32_copy(ci, stream_ptr)
        ci = describe(cos_sin_cache, "cos_sin_cache")
        arrays = (positions, query, key, cos_sin_cache)
    r = ci.shape[1]
    qoff = off * qi.itemsize  # the rotated dims start rope_dim_offset elements into each head
    koff = off * ki.itemsize if ki is not None else 0
    vec = pick_pack_vec(qi.dtype, [(qi.ptr + qoff, qi.itemsize, qst)] + (
        [(ki.ptr + koff, ki.itemsize, kst)] if ki is not None else []), (r // 2, 0))
    kp = ki.ptr + koff if ki is not None else 0
    rope = dict(in_ptr=(qi.ptr + qoff, kp), out_ptr=(qi.ptr + qoff, kp),
                in_sb=(qst[0], kst[0]), in_ss=(qst[1], kst[1]), in_sh=(qst[2], kst[2]),
                out_sb=(qst[0], kst[0]), out_ss=(qst[1], kst[1]), out_sh=(qst[2], kst[2]),
                heads=(hq, hk), n_batch=nb, n_seq=ns, head_dim=head_size - off, rot_dim=r,
                pos_ptr=pos.ptr, pos_is64=int(pos.dtype == "int64"), pos_sb=ns, pos_ss=1,
                scale=1.0, sin_sign=-1.0 if inverse else 1.0)
    kv = dict(cs_ptr=ci.ptr, cs_st=ci.strides[0], cs_rows=ci.shape[0])
    src = KV_COS_SIN_F32 if ci.dtype == "float32" else KV_COS_SIN_T
    calls = [("pos_ptr", 0, 0), ("in_ptr0", 1, qoff), ("out_ptr0", 1, qoff), ("cs_ptr", 3, 0)]
    if ki is not None:
        calls += [("in_ptr1", 2, koff), ("out_ptr1", 2, koff)]
    plan = launcher.plan(kv_spec(qi.device, dtype=qi.dtype, interleaved=not is_neox, vec=vec,
                                 src=src, fp8=0, rope=rope, kv=kv, calls=calls,
                                 pdl=enable_pdl), qi.device)
    launcher.on_device(qi.device, plan.run, stream_ptr, pi.ptr, qi.ptr,
                       0 if ki is None else ki.ptr, ci.ptr)
    if fast:
        tkt = fastpath.ticket(fastpath.fast_adapter(qi.kind), header, arrays, _PAIRS)
        fastpath.remember(_LAUNCHES.fast, tkt,
                          [None, fastpath.span(qi), fastpath.span(ki), None], plan)
    return query, key


def _host(pos, lead, tensors, ci, head_size, off, is_neox, inverse):
    """The NumPy backend: float64, rounded once; tokens outside the table
    skipped. ``tensors``: (info, heads, (batch, token, head strides)) of
    query and key (info None: no key)."""
    p = np_view(pos).astype(np.int64).reshape(lead)
    ok = (p >= 0) & (p < ci.shape[0])
    rows = np_view(ci)[p[ok]].astype(np.float64)  # the cache rows the tokens read
    r = rows.shape[1]
    if inverse:
        rows[:, r // 2:] *= -1.0
    nb, ns = (1, lead[0]) if len(lead) == 1 else lead
    for info, heads, (sb, ss, sh) in tensors:
        if info is None:
            continue
        view = np_view(info)
        # [B, S, H, D] view of the same memory (never a copy: it is written)
        item = view.itemsize
        view = np.lib.stride_tricks.as_strided(view, (nb, ns, heads, head_size),
                                               (sb * item, ss * item, sh * item, item))
        okv = ok.reshape(nb, ns)
        y = kref.rotate_cos_sin_cache(view[okv][:, :, off:off + r], np.arange(rows.shape[0]),
                                      rows, interleaved=not is_neox)
        view[okv, :, off:off + r] = kref.encode(y, info.dtype)
