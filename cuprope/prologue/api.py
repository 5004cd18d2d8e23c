"""The decode prologue in one launch (``cuprope.prologue.qk_norm_rope_append_kv``):
QK-norm + RoPE of q and k (as ``cuprope.qknorm.rope_qk_norm_forward``), q
into ``q_out`` (its dtype or fp8 e4m3), and the normed, rotated k and the raw
v written into a paged KV cache (as ``cuprope.kvcache.rope_append_kv``), for
Qwen3, Gemma 3, OLMo 2 and Llama 4 layers, every step; its NumPy backend and
launch. Arguments and results: :func:`qk_norm_rope_append_kv`.
"""
from __future__ import annotations

import numpy as np

from ..kvcache import caches
from ..kvcache import reference as kref
from ..kvcache.api import cache_fields
from .. import reference as rref
from .._core import engine, fastpath, launcher, validate
from .._core.arrays import describe, overlaps
from .._core.loader import vec_widths
from ..kvcache.kernels import KV_FP8_CACHE, KV_FP8_Q
from .._core.torch_guard import engaged_any
from ..config import RopeConfig
from ..kvcache.arrays import np_view, to_host, token_geometry
from ..qknorm.call import QkNormCall
from . import launch, reference

__all__ = ["qk_norm_rope_append_kv"]

_LAYOUT_RANK = {"thd": 3, "bshd": 4}


def qk_norm_rope_append_kv(q, k, v, config, positions, *, q_weight=None, k_weight=None,
                           eps=1e-6, norm="rms", weight_offset=0.0, order="norm_then_rope",
                           norm_over="head", rounding="exact", k_cache=None, v_cache=None,
                           kv_cache=None, kv_layout="NHD", slot_mapping=None, kv_indices=None,
                           kv_indptr=None, batch_indices=None, cache_positions=None,
                           kv_last_page_len=None, q_out=None, q_scale=None, k_scale=None,
                           v_scale=None, check=False, stream=None, enable_pdl=False):
    """Norm and rotate q and k, store q (into ``q_out``, else in place) and
    write k and v into the cache rows the addressing names, in one launch.

    Parameters
    ----------
    q : array
        ``[T, Hq, D]`` with ``config.layout == "thd"``, or ``[B, S, Hq, D]``
        with ``"bshd"``; float32, float16 or bfloat16; any token and head
        strides, a contiguous last dim. Written in place unless ``q_out``
        is given.
    k, v : arrays
        ``[T, Hk, D]`` or ``[B, S, Hk, D]`` alike, q's dtype; only read.
    config : RopeConfig
    positions : int32 or int64 array
        Required: ``[T]`` (thd), ``[S]`` or ``[B, S]`` (bshd), with a
        leading stream axis under a stream map.
    q_weight, k_weight, eps, norm, weight_offset, order, norm_over, rounding
        The norm, as :func:`cuprope.qknorm.rope_qk_norm_forward`'s, with
        computed angles (no HF ``tables``).
    k_cache, v_cache, kv_cache, kv_layout
        The cache, as :func:`cuprope.kvcache.rope_append_kv`'s: separate
        ``k_cache``/``v_cache`` or one ``kv_cache``; ``kv_layout`` "NHD" or
        "HND".
    slot_mapping, kv_indices, kv_indptr, batch_indices, cache_positions,
    kv_last_page_len
        The addressing, as :func:`cuprope.kvcache.rope_append_kv`'s,
        skipping what it skips (padding, indices out of range).
    q_out : array, optional
        q's shape; q's dtype or fp8 e4m3 (with ``q_scale``).
    q_scale, k_scale, v_scale : arrays, optional
        fp8 scales: float32 device scalars (k and v per head too); positive
        and finite: ``check=True`` raises ValueError for 0, a negative, inf
        or NaN scale, which without it stores what 1/scale gives.
    check : bool
        As :func:`cuprope.kvcache.rope_append_kv`'s.
    stream : optional
        The CUDA stream; default the caller's current one.
    enable_pdl : bool
        A programmatic dependent launch (CUDA, compute capability 9.0+; see
        Notes).

    Returns
    -------
    array
        ``q_out``, or q.

    Notes
    -----
    Results: the bits of ``rope_qk_norm_forward(q, k, config, ...)`` followed
    by ``rope_append_kv`` of its q and k (with a rotation by angle 0), up to
    the sign of zero: q_out holds the normed, rotated q rounded to the dtype
    (e4m3 of it times 1/q_scale for an fp8 q_out); the cache rows hold k
    likewise and v (e4m3 of v times 1/v_scale for an fp8 cache). Every other
    byte of q_out and the caches is untouched. (The two calls' angle-0
    rotation computes x1 - x2·0 and x2 + x1·0 from the rounded values: where
    a value is -0.0 it may give +0.0, an e4m3 byte 0x00 for 0x80, as the
    sign of its pair partner decides, and beside an infinity NaN; this
    launch stores the values as they are.) JAX arrays are not offered
    (TypeError): a cache write needs donated buffers.

    ``enable_pdl=True`` launches as serving engines do under CUDA graphs:
    the kernel may start while the stream's previous kernel (the QKV GEMM)
    still runs; it may read the weights, scales, positions and addressing
    before it waits for that kernel (it reads the norm weights and q_scale
    there), and loads q, k and v and stores only after. So the weights, the
    scales, positions and the addressing must be complete when the previous
    kernel starts; q, k and v may be written by it. Opt-in: cuprope cannot
    know who wrote those arrays, so no automatic rule is safe. Same bits;
    ValueError on a GPU before sm_90, RuntimeError with a driver before
    CUDA 12; no effect on the NumPy backend.

    Torch tensors (``cuprope._core.torch_guard``): an inference op, not
    differentiable. With grad mode on, any tensor argument requiring grad (q,
    k, v, a weight, a scale, q_out or a cache) is a TypeError naming
    ``cuprope.torch.rope_qk_norm`` for training (a leaf written in place:
    RuntimeError, as torch's in-place ops); under ``torch.compile`` the call
    is a graph break (``cuprope.prologue.torch`` has the custom op). Under
    ``torch.no_grad()`` nothing changes.

    A repeated call (check=False, no stream=) whose arrays match a previous
    validated call's in dtype, shape, strides, device and alignment, with
    the same settings, reuses its launch (cuprope/_core/fastpath.py)."""
    args = (q, k, v, config, positions, q_weight, k_weight, eps, norm, weight_offset, order,
            norm_over, rounding, k_cache, v_cache, kv_cache, kv_layout, slot_mapping, kv_indices,
            kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_out, q_scale, k_scale,
            v_scale, check, stream, enable_pdl)
    if engaged_any(q, k, v, q_weight, k_weight, q_scale, k_scale, v_scale, q_out, k_cache,
                   v_cache, kv_cache):
        from .._core.torch_route import inference_op
        read, written = grad_tensors(q, k, v, q_weight, k_weight, q_scale, k_scale, v_scale,
                                     q_out, k_cache, v_cache, kv_cache)
        return inference_op("qk_norm_rope_append_kv", read, written, lambda: _prologue(*args),
                            TRAINING)
    return _prologue(*args)


# What the TypeError names for training.
TRAINING = ("cuprope.torch.rope_qk_norm(q, k, config, ...) for training (this is an inference "
            "op: it writes a cache)")


def grad_tensors(q, k, v, q_weight, k_weight, q_scale, k_scale, v_scale, q_out, k_cache,
                 v_cache, kv_cache):
    """(the arrays the prologue reads that autograd could differentiate, the
    arrays it writes), None left out: the torch guard's arguments."""
    read = (q, k, v, q_weight, k_weight, q_scale, k_scale, v_scale)
    written = (q if q_out is None else q_out, k_cache, v_cache, kv_cache)
    return (tuple(t for t in read if t is not None), tuple(t for t in written if t is not None))


def _prologue(q, k, v, config, positions, q_weight, k_weight, eps, norm, weight_offset, order,
              norm_over, rounding, k_cache, v_cache, kv_cache, kv_layout, slot_mapping, kv_indices,
              kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_out, q_scale, k_scale,
              v_scale, check, stream, enable_pdl=False):
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    enable_pdl = validate.check_flag(enable_pdl, "enable_pdl")
    arrays = (q, k, v, positions, q_weight, k_weight, k_cache, v_cache, kv_cache, slot_mapping,
              kv_indices, kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_out,
              q_scale, k_scale, v_scale)
    header = ("pro", fastpath.get_ident(), enable_pdl, kv_layout, type(eps), eps, norm,
              type(weight_offset), weight_offset, order, norm_over, rounding)
    if not check and stream is None and fastpath.fast_call(
            config._launches.fast, fastpath.adapter_of(q), header, arrays):
        return q if q_out is None else q_out
    if positions is None:
        raise ValueError("positions are required (the tokens' positions in their sequences)")
    caches.refuse_jax("qk_norm_rope_append_kv", q, k, v, k_cache, v_cache, kv_cache, q_out)
    qi, ki, vi = describe(q, "q"), describe(k, "k"), describe(v, "v")
    rank = _LAYOUT_RANK.get(config.layout)
    if rank is None or len(qi.shape) != rank:
        raise ValueError(f"q must be [T, H, D] with config.layout 'thd' or [B, S, H, D] with "
                         f"'bshd'; got shape {list(qi.shape)} and layout {config.layout!r}")
    call = QkNormCall(qi, ki, None, None, config, _maybe(q_weight, "q_weight"),
                      _maybe(k_weight, "k_weight"), eps, norm, weight_offset, order, norm_over,
                      rounding, None, describe(positions, "positions"), 0, None)
    validate.check_float(vi, "v")
    validate.check_last_dim(vi, "v")
    validate.check_same_kind(qi, vi, "q", "v")
    gq, gk, gv = (token_geometry(i, n) for i, n in ((qi, "q"), (ki, "k"), (vi, "v")))
    if gv[:4] != gk[:4] or vi.dtype != qi.dtype:
        raise ValueError(f"v must have k's shape and q's dtype: k {list(ki.shape)}, v "
                         f"{list(vi.shape)} {vi.dtype}")
    b, s, hq, d = gq[:4]
    hk, t, dev = gk[2], b * s, qi.device
    kc, vc, kloc, vloc, pages, page_size = caches.cache_args(k_cache, v_cache, kv_cache,
                                                                kv_layout, qi, hk, d)
    fp8_cache = caches.is_fp8(kc)
    for c in (kc, vc):
        if c is not None and any(overlaps(c, x) for x in (qi, ki, vi)):
            raise ValueError("the cache overlaps q, k or v")
        if c is not None and any(w is not None and overlaps(c, w) for w in call.winfos):
            raise ValueError("the cache overlaps a weight")
    tshapes = [(t,), (b, s)] if rank == 4 else [(t,)]
    addr = caches.addressing(dev, tshapes, slot_mapping, kv_indices, kv_indptr,
                                    batch_indices, cache_positions, kv_last_page_len)
    qo = caches.q_out_info(q_out, qi, (ki, vi, kc, vc))
    for w in call.winfos:
        if w is not None and overlaps(qo, w):
            raise ValueError("q_out overlaps a weight")
    scales = _scales(qo, fp8_cache, dev, hk, q_scale, k_scale, v_scale)
    if check:
        kref.check_indices({n: to_host(i).astype(np.int64).reshape(-1) for n, i in addr.items()},
                           pages, page_size)
        caches.check_scales({f"{n}_scale": i for n, i in scales.items()})
    if t == 0:
        return qo.obj
    if dev < 0:
        _host(call, qi, ki, vi, qo, kc, vc, kv_layout, pages, page_size, addr, scales)
        return qo.obj
    by_index = (qi, ki, vi, call.pos_info, *call.winfos, None if vc is None else kc, vc,
                kc if vc is None else None, *(addr.get(n) for n in _ADDR),
                None if q_out is None else qo, scales["q"], scales["k"], scales["v"])
    ptrs = [0 if i is None else i.ptr for i in by_index]
    # The launch registered for these signatures (an earlier call validated
    # and planned it), else a new one, registered once it has launched.
    tkt = fastpath.ticket(fastpath.fast_adapter(qi.kind), header, arrays, _PAIRS)
    plan = fastpath.registered(config._launches.fast, tkt)
    fresh = plan is None
    if fresh:
        plan = launcher.plan(_spec(call, qi, ki, vi, qo, gv, (kc, vc, kloc, vloc, pages,
                                                              page_size), addr, scales, by_index,
                                   enable_pdl), dev)
    stream_ptr = engine.stream_handle(stream, qi)
    launcher.on_device(dev, plan.run, stream_ptr, *ptrs)
    if fresh:
        fastpath.remember(config._launches.fast, tkt, [fastpath.span(i) for i in by_index], plan)
    return engine.hand_back([qi], [qo], stream_ptr)[0]


# Indices into _prologue's ``arrays`` (the fast-path key's order and the
# values Plan.run takes: their pointers).
(_Q, _K, _V, _POS, _QW, _KW, _KC, _VC, _KV, _SLOT, _IDX, _IPTR, _BI, _CP, _LAST, _QO, _QS, _KS,
 _VS) = range(19)
_ADDR = ("slot_mapping", "kv_indices", "kv_indptr", "batch_indices", "cache_positions",
         "kv_last_page_len")
# The pairs the general path checks for overlap: the caches against q, k, v
# and the weights; q's output (q itself when in place) against the weights;
# q_out against q, k, v and the caches.
_PAIRS = (tuple((x, c) for c in (_KC, _VC, _KV) for x in (_Q, _K, _V, _QW, _KW))
          + tuple((w, o) for o in (_Q, _QO) for w in (_QW, _KW))
          + tuple((x, _QO) for x in (_Q, _K, _V, _KC, _VC, _KV)))
# The per-call words: (field, index into ``arrays``) of the pointers the
# launch reads when that array is given.
_CALLS = (("in_ptr0", _Q), ("in_ptr1", _K), ("pos_ptr", _POS), ("w_ptr0", _QW),
          ("w_ptr1", _KW), ("v_ptr", _V), ("slot_ptr", _SLOT), ("indices_ptr", _IDX),
          ("indptr_ptr", _IPTR), ("batch_ptr", _BI), ("cpos_ptr", _CP), ("q_scale", _QS),
          ("k_scale", _KS), ("v_scale", _VS))


def _spec(call, qi, ki, vi, qo, gv, cache, addr, scales, by_index, pdl=False):
    """The call's launcher.LaunchSpec, whose per-call words Plan.run fills
    from the pointers of ``arrays`` (``by_index``: their infos, None where
    absent); ``pdl`` LaunchSpec's."""
    kc, vc, kloc, vloc, pages, page_size = cache
    dev = qi.device
    kv = cache_fields(vi, gv[4], kloc, vloc, pages, page_size, addr, scales)
    fp8 = (KV_FP8_Q if scales["q"] is not None else 0) | (
        KV_FP8_CACHE if caches.is_fp8(kc) else 0)
    packs = _packs(call, qi, ki, vi, qo, gv, kloc, vloc, caches.is_fp8(kc), dev)
    inv_freq, smap = call.config.device_tables(dev)
    calls = [(f, i, 0) for f, i in _CALLS if by_index[i] is not None]
    calls.append(("out_ptr0", _Q if by_index[_QO] is None else _QO, 0))
    if vc is None:  # one kv_cache: k at index 0, v at index 1 of its second dim
        calls += [("k_cache", _KV, 0), ("v_cache", _KV, vloc[0] - kloc[0])]
    else:
        calls += [("k_cache", _KC, 0), ("v_cache", _VC, 0)]
    return launch.spec(call, qi, qo, ki, dev, kv=kv, fp8=fp8, packs=packs, tokens=call.b * call.s,
                       inv_freq_ptr=inv_freq.data.ptr,
                       stream_map_ptr=0 if smap is None else smap.data.ptr, calls=calls,
                       pdl=pdl)


def _maybe(x, name):
    return None if x is None else describe(x, name)


def _scales(qo, fp8_cache, dev, hk, q_scale, k_scale, v_scale):
    """{"q", "k", "v": scale info or None}, as rope_append_kv checks them."""
    q8 = caches.is_fp8(qo)
    if not fp8_cache and (k_scale is not None or v_scale is not None):
        raise ValueError("k_scale and v_scale are read only for an fp8 (e4m3) cache")
    if not q8 and q_scale is not None:
        raise ValueError("q_scale is read only for an fp8 (e4m3) q_out")
    out = {"q": caches.scale_info(q_scale, "q_scale", dev, [(), (1,)]) if q8 else None}
    for name, x in (("k", k_scale), ("v", v_scale)):
        out[name] = (caches.scale_info(x, f"{name}_scale", dev, [(), (1,), (hk,)])
                     if fp8_cache else None)
    if fp8_cache and out["k"].size != out["v"].size:
        raise ValueError("k_scale and v_scale must both be per tensor or both per head")
    return out


def _packs(call, qi, ki, vi, qo, gv, kloc, vloc, fp8_cache, dev):
    """PrologueArgs.packs: which targets take whole packs (aligned for them)."""
    vec = launch.vec_of(call, qi, ki, dev)
    cisz = 1 if fp8_cache else qi.itemsize
    packs = 0
    if vec and launch.pack_ok(vec, [(qo.ptr, qo.itemsize, token_geometry(qo, "q_out")[4])]):
        packs |= launch.PACK_Q
    if vec and launch.pack_ok(vec, [(kloc[0], cisz, kloc[1])]):
        packs |= launch.PACK_K
    w = vec_widths(qi.dtype)[0]
    if call.d % w == 0 and launch.pack_ok(w, [(vi.ptr, vi.itemsize, gv[4]),
                                              (vloc[0], cisz, vloc[1])]):
        packs |= launch.PACK_V
    return packs


def _host(call, qi, ki, vi, qo, kc, vc, kv_layout, pages, page_size, addr, scales):
    """The NumPy backend: the float64 reference (cuprope.prologue.reference)
    and the stores the kernel makes."""
    t = qi.size // (qi.shape[-1] * qi.shape[-2])
    x = {n: np_view(i).reshape(t, i.shape[-2], i.shape[-1]) for n, i in
         (("q", qi), ("k", ki), ("v", vi))}
    ns = call.config.n_streams
    pos = to_host(call.pos_info).astype(np.int64)
    validate.check_positions(pos)
    pos = rref.token_positions(call.b, call.s, positions=pos, n_streams=ns).reshape(ns, t)
    pos = pos if ns > 1 else pos[0]
    h = {n: to_host(i).astype(np.int64).reshape(-1) for n, i in addr.items()}
    sc = {n: None if i is None else to_host(i).astype(np.float32).reshape(-1)
          for n, i in scales.items()}
    w = [None if i is None else to_host(i) for i in call.winfos]
    enc_q, valid, page, row, enc_k, enc_v = reference.prologue(
        x["q"], x["k"], x["v"], call.config, pos, n_pages=pages, page_size=page_size,
        q_weight=w[0], k_weight=w[1], eps=call.eps, weight_offset=call.weight_offset,
        order=call.order, norm_over=call.over, rounding=call.rounding,
        slot_mapping=h.get("slot_mapping"), batch_indices=h.get("batch_indices"),
        cache_positions=h.get("cache_positions"), kv_indices=h.get("kv_indices"),
        kv_indptr=h.get("kv_indptr"), q_scale=sc["q"], k_scale=sc["k"], v_scale=sc["v"])
    out_q = np_view(qo)
    (out_q.view(np.uint8) if sc["q"] is not None else out_q)[...] = enc_q.reshape(out_q.shape)
    kview, vview = caches.cache_views(kc, vc, kv_layout, sc["k"] is not None)
    kview[page[valid], row[valid]] = enc_k
    vview[page[valid], row[valid]] = enc_v
