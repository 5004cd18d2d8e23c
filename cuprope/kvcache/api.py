"""Fused RoPE + KV-cache append (``cuprope.kvcache.rope_append_kv``): rotate
q, rotate k, and write the rotated k and v into a paged KV cache, in one
launch, for decode and prefill alike; its NumPy backend and its launch.
Shapes, caches, addressing and fp8: :func:`rope_append_kv`.
"""
from __future__ import annotations

import numpy as np

from . import reference as kref
from .._core import engine, fastpath, validate
from .._core.arrays import describe, overlaps
from .._core import launcher
from .launch import angle_table, copy_packs, kv_spec, pick_pack_vec
from ..rope.kernels import KV_ANGLES
from .kernels import KV_FP8_CACHE, KV_FP8_Q
from .._core.torch_guard import engaged_any
from ..config import RopeConfig
from .arrays import index_info, np_view, to_host, token_geometry
from .caches import (KV_LAYOUTS, addressing, addressing_fields, cache_args, cache_views,
                     check_scales, is_fp8, q_out_info, refuse_jax, scale_info)

__all__ = ["rope_append_kv", "KV_LAYOUTS", "token_geometry", "index_info", "to_host",
           "np_view"]

def rope_append_kv(q, k, v, config, positions, *, k_cache=None, v_cache=None, kv_cache=None,
                   kv_layout="NHD", slot_mapping=None, kv_indices=None, kv_indptr=None,
                   batch_indices=None, cache_positions=None, kv_last_page_len=None, q_out=None,
                   q_scale=None, k_scale=None, v_scale=None, check=False, stream=None,
                   enable_pdl=False):
    """Rotate q (into ``q_out``, else in place) and k by ``config`` at
    ``positions``, and write the rotated k and v into the cache rows the
    addressing names, in one launch.

    Parameters
    ----------
    q : array
        ``[T, Hq, D]`` (packed tokens, the serving layout) or
        ``[B, S, Hq, D]`` (token t = b·S + s); float32, float16 or bfloat16;
        any stride for the token and head dims, the last dim contiguous.
        ``config.layout`` is not read (the layout is q's rank).
    k, v : arrays
        ``[T, Hk, D]`` (or ``[B, S, Hk, D]``), q's dtype and strides rules.
    config : RopeConfig
        Every scheme: shared or per-head tables (per-head: Hq = Hk = table
        rows), stream maps, scale, either pairing.
    positions : int32 or int64 array
        ``[T]`` (or ``[B, S]``), with a leading stream axis
        ``[n_streams, T]`` under a stream map (MRoPE); contiguous. Token t
        turns by positions[t] · inv_freq, exactly as
        :func:`cuprope.rope_forward` with ``positions=`` does (same cos/sin,
        same arithmetic: the rotated values equal the core's bit for bit).
    k_cache, v_cache : arrays, optional
        The pages, by ``kv_layout``: ``"NHD"`` ``[num_pages, page_size, Hk,
        D]`` or ``"HND"`` ``[num_pages, Hk, page_size, D]``; same shape,
        dtype and strides. dtype: q's, or fp8 e4m3 (``float8_e4m3fn``, or
        its bytes as ``uint8``) with ``k_scale``/``v_scale``.
    kv_cache : array, optional
        Instead of the two: one ``[num_pages, 2, ...]`` array (k at index 0,
        v at 1).
    kv_layout : {"NHD", "HND"}
    slot_mapping : int64 array ``[T]``, optional
        Addressing by slot: slot = page·page_size + row; a negative slot is
        padding (not written).
    kv_indices, kv_indptr, batch_indices, cache_positions : int arrays, optional
        FlashInfer's paged addressing, instead of ``slot_mapping``:
        ``kv_indices`` holds the pages of all sequences (int32/int64),
        ``kv_indptr`` ``[B + 1]`` (sequence b owns
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``), and per token
        ``batch_indices`` and ``cache_positions`` ``[T]``: the token of
        sequence b at position p goes to page
        ``kv_indices[kv_indptr[b] + p // page_size]``, row ``p % page_size``.
        A negative batch index or position is padding.
    kv_last_page_len : int array ``[B]``, optional
        Read only by ``check=True``.
    q_out : array, optional
        q's shape; q's dtype or e4m3 (with ``q_scale``). Without it q is
        rotated in place.
    q_scale, k_scale, v_scale : arrays, optional
        fp8 scales: float32 device scalars ``[]`` or ``[1]``, or per head
        ``[Hk]`` (k_scale and v_scale both), read by the kernel at run time
        (a captured CUDA graph sees new values); on the host a NumPy scalar
        (``np.float32(0.05)``) is taken as ``[]``.
    check : bool
        Read the indices and scales on the host first (a device sync) and
        raise ValueError naming the first bad one.
    stream : optional
        The CUDA stream; default the caller's current one.
    enable_pdl : bool
        A programmatic dependent launch (CUDA, compute capability 9.0+; see
        Notes).

    Returns
    -------
    array
        ``q_out``, or q (rotated in place).

    Raises
    ------
    TypeError
        JAX arrays (a cache write needs donated buffers); torch tensors
        that require grad (see Notes).
    ValueError
        Bad shapes; with ``check=True``, a bad index or scale;
        ``enable_pdl`` on a GPU before sm_90.
    RuntimeError
        ``enable_pdl`` with a driver before CUDA 12.

    Notes
    -----
    Indices out of range (a slot past the cache, a batch index >= B, a
    position past the sequence's pages, a page id outside [0, num_pages))
    are never written: the kernel skips those tokens' k and v (q is still
    rotated). Two tokens with one slot: which one lands is unspecified.

    fp8 (cache dtype e4m3): the rotated k (rounded to q's dtype, i.e. the
    core's output) and v are stored as e4m3 of ``x · (1/scale)`` (fp32
    product, 1/scale rounded to fp32, round to nearest even, saturating to
    ±448; NaN stores 0x7f). ``cuprope.kvcache.reference.dequantize`` reads a
    cache back. A scale must be positive and finite: ``check=True`` reads
    them (with the indices) and raises ValueError otherwise; without it they
    are not checked, and a bad one stores what 1/scale gives: 0 saturates
    every non-zero value to ±448 (a 0 stores NaN), a negative scale flips
    the signs, inf stores zeros and NaN stores NaN (0x7f).

    ``enable_pdl=True`` launches as serving engines do under CUDA graphs:
    the kernel may start while the stream's previous kernel (the QKV GEMM)
    still runs; it reads positions, the addressing (slots, batch indices,
    cache positions, kv_indptr, kv_indices), q_scale and cuprope's angle
    table first, then waits for that kernel before its first load of q, k or
    v and its first store. So positions, the addressing and the scales must
    be complete when the previous kernel starts; q, k and v may be written
    by it. Opt-in: cuprope cannot know who wrote the indices, so no
    automatic rule is safe. Same bits; no effect on the NumPy backend.

    A repeated call (check=False, no stream=) whose arrays match a previous
    validated call's in dtype, shape, strides, device and alignment reuses
    its packed launch (cuprope/_core/fastpath.py).

    Torch tensors (``cuprope._core.torch_guard``): an inference op, not
    differentiable. With grad mode on, any tensor argument requiring grad (q,
    k, v, a scale, q_out or a cache) is a TypeError (a leaf written in place:
    RuntimeError, as torch's in-place ops); under ``torch.compile`` the call
    is a graph break."""
    args = (q, k, v, config, positions, k_cache, v_cache, kv_cache, kv_layout, slot_mapping,
            kv_indices, kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_out,
            q_scale, k_scale, v_scale, check, stream, enable_pdl)
    written = (q if q_out is None else q_out, k_cache, v_cache, kv_cache)
    if engaged_any(q, k, v, q_scale, k_scale, v_scale, *written):
        from .._core.torch_route import inference_op
        read = (q, k, v, q_scale, k_scale, v_scale)
        return inference_op("rope_append_kv", tuple(t for t in read if t is not None),
                            tuple(t for t in written if t is not None),
                            lambda: _append(*args))
    return _append(*args)


def _append(q, k, v, config, positions, k_cache, v_cache, kv_cache, kv_layout, slot_mapping,
            kv_indices, kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_out,
            q_scale, k_scale, v_scale, check, stream, enable_pdl=False):
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    arrays = (q, k, v, positions, k_cache, v_cache, kv_cache, slot_mapping, kv_indices, kv_indptr,
              batch_indices, cache_positions, kv_last_page_len, q_out, q_scale, k_scale, v_scale)
    fast = (not check and stream is None and type(kv_layout) is str
            and type(enable_pdl) is bool)
    if fast:
        header = ("kv", fastpath.get_ident(), kv_layout, enable_pdl)
        if fastpath.fast_call(config._launches.fast, fastpath.adapter_of(q), header, arrays):
            return q if q_out is None else q_out
    refuse_jax("rope_append_kv", q, k, v, k_cache, v_cache, kv_cache, q_out)
    enable_pdl = validate.check_flag(enable_pdl, "enable_pdl")
    qi, ki, vi = describe(q, "q"), describe(k, "k"), describe(v, "v")
    geo = {}
    for info, name in ((qi, "q"), (ki, "k"), (vi, "v")):
        validate.check_float(info, name)
        validate.check_last_dim(info, name)
        geo[name] = token_geometry(info, name)
    validate.check_same_kind(qi, ki, "q", "k")
    validate.check_same_kind(qi, vi, "q", "v")
    b, s, hq, d, _ = geo["q"]
    hk = geo["k"][2]
    for name in ("k", "v"):
        if geo[name][:2] != (b, s) or geo[name][3] != d or geo[name][2] != hk:
            raise ValueError(f"{name} must have q's tokens and head dim and k's heads: q "
                             f"{list(qi.shape)}, k {list(ki.shape)}, v {list(vi.shape)}")
    if config.rotary_dim > d:
        raise ValueError(f"rotary_dim ({config.rotary_dim}) must be <= the head dim ({d})")
    if config.per_head and not config.inv_freq.shape[0] == hq == hk:
        raise ValueError(f"a per-head table needs Hq = Hk = its rows ({config.inv_freq.shape[0]}),"
                         f" got Hq {hq}, Hk {hk}")
    t = b * s
    validate.check_tokens(t, "T")
    dev = qi.device
    kc, vc, kloc, vloc, pages, page_size = cache_args(k_cache, v_cache, kv_cache, kv_layout, qi, hk, d)
    fp8_cache = is_fp8(kc)
    for c in (kc, vc):
        if c is not None and any(overlaps(c, x) for x in (qi, ki, vi)):
            raise ValueError("the cache overlaps q, k or v")
    tshapes = [(t,), (b, s)] if len(qi.shape) == 4 else [(t,)]
    ns = config.n_streams
    pos = index_info(positions, "positions", dev, [(ns,) + x if ns > 1 else x for x in tshapes])
    addr = addressing(dev, tshapes, slot_mapping, kv_indices, kv_indptr, batch_indices,
                       cache_positions, kv_last_page_len)
    qo = q_out_info(q_out, qi, (ki, vi, kc, vc))
    q8 = is_fp8(qo)
    scales = {"q": scale_info(q_scale, "q_scale", dev, [(), (1,)]) if q8 else None}
    for name, x in (("k", k_scale), ("v", v_scale)):
        scales[name] = scale_info(x, f"{name}_scale", dev, [(), (1,), (hk,)]) if fp8_cache else None
    if not fp8_cache and (k_scale is not None or v_scale is not None):
        raise ValueError("k_scale and v_scale are read only for an fp8 (e4m3) cache")
    if not q8 and q_scale is not None:
        raise ValueError("q_scale is read only for an fp8 (e4m3) q_out")
    if fp8_cache and scales["k"].size != scales["v"].size:
        raise ValueError("k_scale and v_scale must both be per tensor or both per head")
    if check:
        kref.check_indices({n: to_host(i).astype(np.int64).reshape(-1) for n, i in addr.items()},
                           pages, page_size)
        check_scales({f"{n}_scale": i for n, i in scales.items()})
    if t == 0:
        return qo.obj
    if dev < 0:
        _host_append(config, qi, ki, vi, qo, pos, kc, vc, kv_layout, pages, page_size, addr,
                     scales)
        return qo.obj
    stream_ptr = engine.stream_handle(stream, qi)
    plan, spans = _gpu_append(config, qi, ki, vi, qo, pos, (geo, kc, vc, kloc, vloc, pages,
                                                            page_size), addr, scales, enable_pdl)
    ptrs = [0 if a is None else i.ptr for a, i in zip(arrays, _by_index(
        qi, ki, vi, pos, kc, vc, kv_cache is not None, addr, qo if q_out is not None else None,
        scales))]
    launcher.on_device(dev, plan.run, stream_ptr, *ptrs)
    if fast:
        tkt = fastpath.ticket(fastpath.fast_adapter(qi.kind), header, arrays, _PAIRS)
        fastpath.remember(config._launches.fast, tkt, spans, plan)
    return engine.hand_back([qi], [qo], stream_ptr)[0]


# Indices into rope_append_kv's ``arrays``; the pairs the general path checks
# for overlap (the caches against q, k, v; q_out against all of them).
_Q, _K, _V, _POS, _KC, _VC, _KV, _SLOT, _IDX, _IPTR, _BI, _CP, _LAST, _QO, _QS, _KS, _VS = \
    range(17)
_PAIRS = tuple((x, c) for c in (_KC, _VC, _KV) for x in (_Q, _K, _V)) + tuple(
    (x, _QO) for x in (_Q, _K, _V, _KC, _VC, _KV))


def _by_index(qi, ki, vi, pos, kc, vc, combined, addr, qo, scales):
    """The infos in the order of rope_append_kv's ``arrays`` (None where absent)."""
    return (qi, ki, vi, pos, None if combined else kc, vc, kc if combined else None,
            addr.get("slot_mapping"), addr.get("kv_indices"), addr.get("kv_indptr"),
            addr.get("batch_indices"), addr.get("cache_positions"),
            addr.get("kv_last_page_len"), qo, scales["q"], scales["k"], scales["v"])


def _host_append(config, qi, ki, vi, qo, pos, kc, vc, kv_layout, pages, page_size, addr, scales):
    """The NumPy backend: float64 rotation rounded once to q's dtype (the core's
    reference), then the same stores the kernel makes."""
    t = qi.size // (qi.shape[-1] * qi.shape[-2])
    x = {n: np_view(i).astype(np.float64).reshape(t, i.shape[-2], i.shape[-1])
         for n, i in (("q", qi), ("k", ki), ("v", vi))}
    p = to_host(pos).astype(np.int64).reshape((config.n_streams, t) if config.n_streams > 1
                                              else (t,))
    validate.check_positions(p)
    sc = {n: None if i is None else to_host(i).astype(np.float32).reshape(-1)
          for n, i in scales.items()}
    qr = kref.rotate_config(x["q"], p, config)
    kr = kref.rotate_config(x["k"], p, config)
    h = {n: to_host(i).astype(np.int64).reshape(-1) for n, i in addr.items()}
    valid, page, row = kref.cache_rows(pages, page_size, slot_mapping=h.get("slot_mapping"),
                                       batch_indices=h.get("batch_indices"),
                                       cache_positions=h.get("cache_positions"),
                                       kv_indices=h.get("kv_indices"),
                                       kv_indptr=h.get("kv_indptr"))
    enc_q = kref.encode(qr, qi.dtype, sc["q"])
    enc_k = kref.encode(kr[valid], qi.dtype, sc["k"])
    enc_v = kref.encode(x["v"][valid], qi.dtype, sc["v"])
    out_q = np_view(qo)
    (out_q.view(np.uint8) if sc["q"] is not None else out_q)[...] = enc_q.reshape(out_q.shape)
    kview, vview = cache_views(kc, vc, kv_layout, sc["k"] is not None)
    kview[page[valid], row[valid]] = enc_k
    vview[page[valid], row[valid]] = enc_v


def cache_fields(vi, vst, kloc, vloc, pages, page_size, addr, scales):
    """KvArgs fields by name of v (``vst``: its batch, token, head strides),
    the caches (``kloc``, ``vloc``: pointer and page, row, head strides), the
    addressing infos and the fp8 scale infos (shared with cuprope.prologue)."""
    kv = dict(v_ptr=vi.ptr, v_sb=vst[0], v_ss=vst[1], v_sh=vst[2], k_cache=kloc[0],
              v_cache=vloc[0], kc_sp=kloc[1][0], kc_sr=kloc[1][1], kc_sh=kloc[1][2],
              vc_sp=vloc[1][0], vc_sr=vloc[1][1], vc_sh=vloc[1][2], num_pages=pages,
              page_size=page_size)
    kv.update(addressing_fields(addr))
    for n in ("q", "k", "v"):
        if scales[n] is not None:
            kv[f"{n}_scale"] = scales[n].ptr
    kv["kv_scale_sh"] = int(scales["k"] is not None and scales["k"].size > 1)
    return kv


def _gpu_append(config, qi, ki, vi, qo, pos, cache, addr, scales, pdl=False):
    """The launch (a launcher.Plan whose per-call words ``run`` fills from
    the pointers of rope_append_kv's ``arrays``) and the spans of those
    arrays (fastpath.span)."""
    geo, kc, vc, kloc, vloc, pages, page_size = cache
    b, s, hq, d, qst = geo["q"]
    hk, kst, vst = geo["k"][2], geo["k"][4], geo["v"][4]
    qost = token_geometry(qo, "q_out")[4]
    r = config.rotary_dim
    fp8 = (KV_FP8_Q if scales["q"] is not None else 0) | (
        KV_FP8_CACHE if scales["k"] is not None else 0)
    cache_isz = 1 if fp8 & KV_FP8_CACHE else qi.itemsize
    vec = pick_pack_vec(qi.dtype, [(qi.ptr, qi.itemsize, qst), (ki.ptr, ki.itemsize, kst),
                                   (vi.ptr, vi.itemsize, vst), (qo.ptr, qo.itemsize, qost),
                                   (kloc[0], cache_isz, kloc[1]), (vloc[0], cache_isz, vloc[1])],
                        (r // 2, d - r))
    inv_freq, smap = config.device_tables(qi.device)
    rope = dict(in_ptr=(qi.ptr, ki.ptr), out_ptr=(qo.ptr, 0), in_sb=(qst[0], kst[0]),
                in_ss=(qst[1], kst[1]), in_sh=(qst[2], kst[2]), out_sb=(qost[0], 0),
                out_ss=(qost[1], 0), out_sh=(qost[2], 0), heads=(hq, hk), n_batch=b, n_seq=s,
                head_dim=d, rot_dim=r, copy_rest=copy_packs(d - r, vec, True), pos_ptr=pos.ptr,
                pos_is64=int(pos.dtype == "int64"), pos_s_stream=b * s, pos_sb=s, pos_ss=1,
                inv_freq_ptr=inv_freq.data.ptr, freq_sh=r // 2 if config.per_head else 0,
                stream_map_ptr=0 if smap is None else smap.data.ptr, scale=config.scale,
                sin_sign=1.0)
    kv = cache_fields(vi, vst, kloc, vloc, pages, page_size, addr, scales)
    kv["write_rest"] = int(not validate.same_view(qo, qi))
    table = angle_table(config, qi.device)
    if table is not None:  # RopeConfig.cache_angles
        kv.update(cs_ptr=table.data.ptr, cs_st=table.shape[1], cs_rows=table.shape[0])
    combined = vc is None
    by_index = _by_index(qi, ki, vi, pos, kc, vc, combined, addr, qo if qo is not qi else None,
                         scales)
    calls = [("in_ptr0", _Q, 0), ("in_ptr1", _K, 0), ("out_ptr0", _Q if qo is qi else _QO, 0),
               ("pos_ptr", _POS, 0), ("v_ptr", _V, 0)]
    if combined:
        calls += [("k_cache", _KV, 0), ("v_cache", _KV, vloc[0] - kloc[0])]
    else:
        calls += [("k_cache", _KC, 0), ("v_cache", _VC, 0)]
    fields = {"slot_ptr": _SLOT, "batch_ptr": _BI, "cpos_ptr": _CP, "indices_ptr": _IDX,
              "indptr_ptr": _IPTR, "q_scale": _QS, "k_scale": _KS, "v_scale": _VS}
    calls += [(f, i, 0) for f, i in fields.items() if by_index[i] is not None]
    plan = launcher.plan(kv_spec(qi.device, dtype=qi.dtype, interleaved=config.interleaved,
                                 vec=vec, src=KV_ANGLES, fp8=fp8, rope=rope, kv=kv, calls=calls,
                                 pdl=pdl), qi.device)
    return plan, [fastpath.span(i) for i in by_index]
