"""DeepSeek MLA's decode/prefill prologue in one launch
(``cuprope.mla.rope_append_mla``): rotate the rope slice of every query head
and the token's shared rope key, and append ``[ckv | k_pe]`` to a paged
latent cache (DeepSeek-V2/V3/R1, Kimi K2); its NumPy backend and its launch.
Shapes, caches, fp8 and addressing: :func:`rope_append_mla`.
"""
from __future__ import annotations

import numpy as np

from ..kvcache import reference as kref
from .._core import engine, fastpath, launcher, validate
from .._core.arrays import describe, overlaps
from ..kvcache.kernels import KV_FP8_CACHE, KV_FP8_Q
from .._core.torch_guard import engaged_any
from ..config import RopeConfig
from ..kvcache.arrays import index_info, np_view, to_host
from ..kvcache.caches import (addressing, addressing_fields, check_scales, refuse_jax,
                              scale_info)
from ..kvcache.launch import pick_pack_vec
from .launch import mla_spec
from .reference import rotate_pe

__all__ = ["rope_append_mla"]


def _fp8(info):
    return info.dtype in kref.FP8_DTYPES


def _tensor(x, name, shapes, like=None, out=False):
    """describe(x) checked: rank/shape against ``shapes`` (a predicate on the
    shape), float (or, for outputs, like's dtype / e4m3), contiguous last dim."""
    info = describe(x, name)
    if like is None:
        validate.check_float(info, name)
    elif out:
        if info.dtype != like.dtype and not _fp8(info):
            raise TypeError(f"{name} must have q_pe's dtype ({like.dtype}) or float8_e4m3fn, "
                            f"got {info.dtype}")
    elif info.dtype != like.dtype:
        raise TypeError(f"{name} must have q_pe's dtype ({like.dtype}), got {info.dtype}")
    if like is not None and (info.kind != like.kind or info.device != like.device):
        raise ValueError(f"{name} must be a {like.kind} array on q_pe's device ({like.device}), "
                         f"got {info.kind} on {info.device}")
    want, ok = shapes
    if not ok(tuple(info.shape)):
        raise ValueError(f"{name} must be {want}, got shape {list(info.shape)}")
    validate.check_last_dim(info, name)
    if out:
        validate.check_writable(info, name)
    return info


def _caches(kv_cache, ckv_cache, kpe_cache, qi, dc, r):
    """(infos, ckv (ptr, (page, row) strides), kpe (ptr, strides), pages,
    page_size) of the one vLLM cache or FlashInfer's pair."""
    if (kv_cache is None) == (ckv_cache is None and kpe_cache is None):
        raise ValueError("give kv_cache ([pages, page_size, Dc + R]), or ckv_cache and kpe_cache")
    if kv_cache is None and (ckv_cache is None or kpe_cache is None):
        raise ValueError("ckv_cache and kpe_cache go together")
    if kv_cache is not None:
        parts = [("kv_cache", kv_cache, dc + r)]
    else:
        parts = [("ckv_cache", ckv_cache, dc), ("kpe_cache", kpe_cache, r)]
    infos = []
    for name, x, width in parts:
        i = describe(x, name)
        if i.dtype != qi.dtype and not _fp8(i):
            raise TypeError(f"{name} must have q_pe's dtype ({qi.dtype}) or float8_e4m3fn (uint8 "
                            f"bytes), got {i.dtype}")
        if i.kind != qi.kind or i.device != qi.device:
            raise ValueError(f"{name} must be a {qi.kind} array on q_pe's device ({qi.device})")
        if len(i.shape) != 3 or i.shape[2] != width:
            raise ValueError(f"{name} must be [pages, page_size, {width}], got shape "
                             f"{list(i.shape)}")
        validate.check_last_dim(i, name)
        validate.check_writable(i, name)
        infos.append(i)
    if len(infos) == 2 and (infos[0].shape[:2] != infos[1].shape[:2]
                            or infos[0].dtype != infos[1].dtype):
        raise ValueError("ckv_cache and kpe_cache must share pages, page_size and dtype")
    c = infos[0]
    pages, page_size = c.shape[0], c.shape[1]
    ckv = (c.ptr, tuple(c.strides[:2]))
    k = infos[-1]
    kpe = (k.ptr + (dc * k.itemsize if len(infos) == 1 else 0), tuple(k.strides[:2]))
    return infos, ckv, kpe, pages, page_size


def rope_append_mla(q_pe, k_pe, ckv, config, positions, *, kv_cache=None, ckv_cache=None,
                    kpe_cache=None, slot_mapping=None, kv_indices=None, kv_indptr=None,
                    batch_indices=None, cache_positions=None, kv_last_page_len=None, q_nope=None,
                    q_nope_out=None, q_pe_out=None, q_scale=None, kv_scale=None, check=False,
                    stream=None, enable_pdl=False):
    """Rotate q_pe (into ``q_pe_out``, else in place), copy q_nope into
    ``q_nope_out`` (optional; e4m3 with ``q_scale``), rotate k_pe and write
    ``[ckv | k_pe]`` into the cache rows the addressing names, in one launch.

    T packed tokens, H query heads, R the rope dim (``qk_rope_head_dim``,
    64), Dc = ``kv_lora_rank`` (512), Dn the absorbed q_nope width (512).

    Parameters
    ----------
    q_pe : array ``[T, H, R]``
        float32, float16 or bfloat16; the inputs share one dtype. Any token
        and head strides with a contiguous last dim (slices of one
        projection output work as they are).
    k_pe : array ``[T, R]`` (or ``[T, 1, R]``)
        Not written.
    ckv : array ``[T, Dc]``
    config : RopeConfig
        The rotation, unchanged: ``rope_config_from_hf`` of a DeepSeek
        ``config.json`` gives YaRN's frequencies, its mscale factor (as
        ``config.scale``, multiplied into cos and sin) and the pair layout.
        R must equal ``config.rotary_dim``; per-head tables and stream maps
        are not MLA's (ValueError).
    positions : int32 or int64 array ``[T]``
    kv_cache : array ``[pages, page_size, Dc + R]``, optional
        vLLM's cache: ckv in ``[:Dc]``, the rotated k_pe in ``[Dc:]``.
    ckv_cache, kpe_cache : arrays, optional
        FlashInfer's pair instead: ``[pages, page_size, Dc]`` and
        ``[pages, page_size, R]``, sharing pages, page_size and dtype. A
        cache's dtype: q's, or e4m3 (``float8_e4m3fn``, or its ``uint8``
        bytes) with ``kv_scale``.
    slot_mapping, kv_indices, kv_indptr, batch_indices, cache_positions, kv_last_page_len
        The addressing, as :func:`cuprope.kvcache.rope_append_kv`'s:
        ``slot_mapping`` int64 ``[T]`` (slot = page · page_size + row,
        negative = padding), or FlashInfer's paged indices
        (``kv_last_page_len`` read by ``check=True`` only).
    q_nope : array ``[T, H, Dn]``, optional
        Copied (or, with ``q_scale``, quantised) into ``q_nope_out``; the
        two go together.
    q_nope_out : array ``[T, H, Dn]``, optional
        q's dtype, or e4m3 with ``q_scale`` (FlashInfer's
        ``mla_rope_quantize_fp8`` outputs). Its dtype kind (e4m3 or not)
        must match q_pe's output. For one ``[T, H, Dn + R]`` query buffer
        (FlashMLA's input), pass its two slices ``q_out[..., :Dn]`` and
        ``q_out[..., Dn:]``.
    q_pe_out : array ``[T, H, R]``, optional
        q's dtype, or e4m3 with ``q_scale``. Without it q_pe is rotated in
        place.
    q_scale, kv_scale : arrays, optional
        fp8 scales: one float32 device scalar ``[]``/``[1]`` each, read at
        run time (a captured CUDA graph sees new values); a NumPy scalar on
        the host. Read only for e4m3 outputs (ValueError otherwise).
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
        ``q_pe_out``, or q_pe (rotated in place).

    Notes
    -----
    DeepSeek-V3 sets ``rope_interleave`` (default true): its pairs are
    ``(x[2j], x[2j+1])`` of the 64 rope dims, ``interleaved=True`` here and
    ``is_neox_style=False`` in vLLM. (HF's eager DeepSeek code de-interleaves
    q and k before a half-split rotation, so its output holds the same
    rotated pairs permuted to ``[evens | odds]``; attention scores are
    equal. This op, like vLLM and FlashInfer, keeps the interleaved order.)

    fp8 stores ``e4m3(x · (1/scale))`` (1/scale rounded to fp32, fp32
    product, round to nearest even, saturating to ±448) of the value rounded
    to q's dtype first (the rotated values equal ``cuprope.rope_forward``'s
    bit for bit, whatever the arrays' alignment: every pack width rounds a
    pair alike). Scales divide, as vLLM's ``concat_and_cache_mla`` does
    (FlashInfer's ``quant_scale_*`` multiply: pass their reciprocal). A scale
    must be positive and finite: ``check=True`` raises ValueError for 0, a
    negative, inf or NaN; without it a bad scale stores what 1/scale gives
    (0 saturates to ±448, a negative flips the signs, inf stores zeros, NaN
    stores NaN).

    A token whose indices are padding or out of range writes no cache row
    (its q is still rotated).

    Backends: CUDA (torch or CuPy arrays, one launch on the current or given
    stream; nothing allocated, CUDA-graph capturable), or the NumPy
    reference on the CPU (NumPy / CPU torch arrays: float64 rotation rounded
    once). JAX arrays are not offered (TypeError): a cache write needs
    donated buffers.

    ``enable_pdl=True`` launches as serving engines do under CUDA graphs:
    the kernel may start while the stream's previous kernel (the projection
    GEMM) still runs; it reads positions, the addressing and the scales
    first, then waits for that kernel before its first load of q_pe, k_pe,
    ckv or q_nope and its first store. So positions, the addressing and the
    scales must be complete when the previous kernel starts; the inputs may
    be written by it. Opt-in: cuprope cannot know who wrote the indices, so
    no automatic rule is safe. Same bits; ValueError on a GPU before sm_90,
    RuntimeError with a driver before CUDA 12; no effect on the NumPy
    backend.

    Torch tensors (``cuprope._core.torch_guard``): an inference op, not
    differentiable. With grad mode on, any tensor argument requiring grad is
    a TypeError naming the training path (a leaf written in place, q_pe or a
    cache: RuntimeError, as torch's in-place ops); under ``torch.compile`` the
    call is a graph break. Under ``torch.no_grad()`` nothing changes.

    A repeated call (check=False, no stream=) whose arrays match a previous
    validated call's in dtype, shape, strides, device and alignment reuses
    its launch (cuprope/_core/fastpath.py)."""
    args = (q_pe, k_pe, ckv, config, positions, kv_cache, ckv_cache, kpe_cache, slot_mapping,
            kv_indices, kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_nope,
            q_nope_out, q_pe_out, q_scale, kv_scale, check, stream, enable_pdl)
    if engaged_any(q_pe, k_pe, ckv, q_nope, q_scale, kv_scale, q_pe_out, q_nope_out, kv_cache,
                   ckv_cache, kpe_cache):
        from .._core.torch_route import inference_op
        written = (q_pe if q_pe_out is None else q_pe_out, q_nope_out, kv_cache, ckv_cache,
                   kpe_cache)
        return inference_op("rope_append_mla", (q_pe, k_pe, ckv, q_nope, q_scale, kv_scale),
                            tuple(t for t in written if t is not None),
                            lambda: _append(*args), TRAINING)
    return _append(*args)


# What the TypeError names for training: the differentiable rotation of the
# rope slices (see the docstring of the cuprope.mla package).
TRAINING = ("cuprope.torch.rope_qk(q[..., nope:], k_pe, config, positions=...) on [B, S, H, D] "
            "views for training (this is an inference op: it writes a cache)")


def _append(q_pe, k_pe, ckv, config, positions, kv_cache, ckv_cache, kpe_cache, slot_mapping,
            kv_indices, kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_nope,
            q_nope_out, q_pe_out, q_scale, kv_scale, check, stream, enable_pdl=False):
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    enable_pdl = validate.check_flag(enable_pdl, "enable_pdl")
    arrays = (q_pe, k_pe, ckv, positions, kv_cache, ckv_cache, kpe_cache, slot_mapping, kv_indices,
              kv_indptr, batch_indices, cache_positions, kv_last_page_len, q_nope, q_nope_out,
              q_pe_out, q_scale, kv_scale)
    header = ("mla", fastpath.get_ident(), enable_pdl)
    if not check and stream is None and fastpath.fast_call(
            config._launches.fast, fastpath.adapter_of(q_pe), header, arrays):
        return q_pe if q_pe_out is None else q_pe_out
    if config.per_head or config.stream_map is not None:
        raise ValueError("rope_append_mla takes a shared frequency table (no per-head table, no "
                         "stream map)")
    refuse_jax("rope_append_mla", q_pe, k_pe, ckv, kv_cache, ckv_cache, kpe_cache, q_nope,
               q_nope_out, q_pe_out)
    qi = _tensor(q_pe, "q_pe", ("[T, H, R]", lambda s: len(s) == 3))
    t, h, r = qi.shape
    if r != config.rotary_dim:
        raise ValueError(f"q_pe's last dim ({r}) must equal config.rotary_dim "
                         f"({config.rotary_dim}): MLA rotates the whole rope slice")
    ki = _tensor(k_pe, "k_pe", (f"[T, R] = [{t}, {r}] (or [T, 1, R])",
                                lambda s: s in ((t, r), (t, 1, r))), qi)
    ci = _tensor(ckv, "ckv", (f"[T, Dc] with T = {t}", lambda s: len(s) == 2 and s[0] == t), qi)
    dc = ci.shape[1]
    validate.check_tokens(t, "T")
    qni = qnoi = None
    if (q_nope is None) != (q_nope_out is None):
        raise ValueError("q_nope and q_nope_out go together (q_nope is copied, or quantised, "
                         "into q_nope_out)")
    if q_nope is not None:
        qni = _tensor(q_nope, "q_nope", (f"[T, H, Dn] with T, H = {t}, {h}",
                                         lambda s: len(s) == 3 and s[:2] == (t, h)), qi)
        qnoi = _tensor(q_nope_out, "q_nope_out", (f"q_nope's shape {list(qni.shape)}",
                                                  lambda s: s == tuple(qni.shape)), qi, out=True)
    if q_pe_out is None:
        validate.check_writable(qi, "q_pe")
        qoi = qi
    else:
        qoi = _tensor(q_pe_out, "q_pe_out", (f"q_pe's shape {list(qi.shape)}",
                                             lambda s: s == tuple(qi.shape)), qi, out=True)
        if overlaps(qoi, qi) and not (validate.same_view(qoi, qi) and qoi.dtype == qi.dtype):
            raise ValueError("q_pe_out overlaps q_pe without being exactly q_pe (omit q_pe_out "
                             "to rotate in place)")
    q8 = _fp8(qoi)
    if qnoi is not None and _fp8(qnoi) != q8:
        raise TypeError("q_nope_out and q_pe's output must both be float8_e4m3fn or both q_pe's "
                        "dtype (one q_scale)")
    dev = qi.device
    cinfos, cloc, kloc, pages, page_size = _caches(kv_cache, ckv_cache, kpe_cache, qi, dc, r)
    c8 = _fp8(cinfos[0])
    ins = [x for x in (qi, ki, ci, qni) if x is not None]
    outs = [x for x in (qoi if qoi is not qi else None, qnoi) if x is not None] + cinfos
    for o in outs:
        if any(overlaps(o, x) for x in ins):
            raise ValueError("an output (q_pe_out, q_nope_out or the cache) overlaps an input")
    pos = index_info(positions, "positions", dev, [(t,)])
    addr = addressing(dev, [(t,)], slot_mapping, kv_indices, kv_indptr, batch_indices,
                      cache_positions, kv_last_page_len)
    qs = scale_info(q_scale, "q_scale", dev, [(), (1,)]) if q8 else None
    ks = scale_info(kv_scale, "kv_scale", dev, [(), (1,)]) if c8 else None
    if not q8 and q_scale is not None:
        raise ValueError("q_scale is read only for fp8 (e4m3) q outputs")
    if not c8 and kv_scale is not None:
        raise ValueError("kv_scale is read only for an fp8 (e4m3) cache")
    if check:
        kref.check_indices({n: to_host(i).astype(np.int64).reshape(-1) for n, i in addr.items()},
                           pages, page_size)
        check_scales({"q_scale": qs, "kv_scale": ks})
    if t == 0:
        return qoi.obj
    a = dict(q=qi, k=ki, ckv=ci, q_nope=qni, q_nope_out=qnoi, q_out=qoi, pos=pos,
             cache=(cinfos, cloc, kloc, pages, page_size), addr=addr, q_scale=qs, kv_scale=ks)
    if dev < 0:
        _host_append(config, a)
        return qoi.obj
    one = len(cinfos) == 1
    by_index = (qi, ki, ci, pos, cinfos[0] if one else None, None if one else cinfos[0],
                None if one else cinfos[1], *(addr.get(n) for n in _ADDR), qni, qnoi,
                None if q_pe_out is None else qoi, qs, ks)
    ptrs = [0 if i is None else i.ptr for i in by_index]
    # The launch registered for these signatures (an earlier call validated
    # and planned it), else a new one, registered once it has launched.
    tkt = fastpath.ticket(fastpath.fast_adapter(qi.kind), header, arrays, _PAIRS)
    plan = fastpath.registered(config._launches.fast, tkt)
    fresh = plan is None
    if fresh:
        plan = launcher.plan(_spec(config, a, _calls(by_index, kloc[0] - cinfos[-1].ptr),
                                   enable_pdl), dev)
    stream_ptr = engine.stream_handle(stream, qi)
    launcher.on_device(dev, plan.run, stream_ptr, *ptrs)
    if fresh:
        fastpath.remember(config._launches.fast, tkt, [fastpath.span(i) for i in by_index], plan)
    return engine.hand_back([qi], [qoi], stream_ptr)[0]


# Indices into _append's ``arrays`` (the fast-path key's order and the
# values Plan.run takes: their pointers).
(_QPE, _KPE, _CKV, _POS, _KVC, _CKVC, _KPEC, _SLOT, _IDX, _IPTR, _BI, _CP, _LAST, _QN, _QNO, _QPO,
 _QS, _KVS) = range(18)
_ADDR = ("slot_mapping", "kv_indices", "kv_indptr", "batch_indices", "cache_positions",
         "kv_last_page_len")
# The pairs the general path checks for overlap: every output (q_pe_out,
# q_nope_out, the caches) against every input (q_pe, k_pe, ckv, q_nope).
_PAIRS = tuple((i, o) for o in (_QPO, _QNO, _KVC, _CKVC, _KPEC) for i in (_QPE, _KPE, _CKV, _QN))
# The per-call words: (field, index into ``arrays``) of the pointers the
# launch reads when that array is given.
_CALLS = (("in_ptr0", _QPE), ("in_ptr1", _KPE), ("pos_ptr", _POS), ("v_ptr", _CKV),
          ("slot_ptr", _SLOT), ("indices_ptr", _IDX), ("indptr_ptr", _IPTR), ("batch_ptr", _BI),
          ("cpos_ptr", _CP), ("q_scale", _QS), ("k_scale", _KVS), ("qn_ptr", _QN),
          ("qno_ptr", _QNO))


def _calls(by_index, kpe_offset):
    """LaunchSpec.calls of a call whose arrays' infos are ``by_index`` (None
    where absent): ``kpe_offset`` bytes from the (one) cache's pointer to
    its k_pe part."""
    calls = [(f, i, 0) for f, i in _CALLS if by_index[i] is not None]
    calls.append(("out_ptr0", _QPE if by_index[_QPO] is None else _QPO, 0))
    if by_index[_KVC] is not None:  # vLLM's [pages, page_size, Dc + R]: k_pe after ckv
        calls += [("v_cache", _KVC, 0), ("k_cache", _KVC, kpe_offset)]
    else:
        calls += [("v_cache", _CKVC, 0), ("k_cache", _KPEC, 0)]
    return calls


def _host_append(config, a):
    """The NumPy backend: float64 rotation rounded once to q's dtype, and the
    stores the kernel makes."""
    qi, t = a["q"], a["q"].shape[0]
    p = to_host(a["pos"]).astype(np.int64).reshape(t)
    validate.check_positions(p)
    sc = {n: None if a[n] is None else to_host(a[n]).astype(np.float32).reshape(-1)[0]
          for n in ("q_scale", "kv_scale")}
    kw = dict(scale=config.scale, interleaved=config.interleaved)
    qr = rotate_pe(np_view(qi), p, config.inv_freq, **kw)
    kr = rotate_pe(np_view(a["k"]).reshape(t, -1), p, config.inv_freq, **kw)
    outs = [(a["q_out"], qr)]
    if a["q_nope"] is not None:
        outs.append((a["q_nope_out"], np_view(a["q_nope"]).astype(np.float64)))
    for info, vals in outs:
        view = np_view(info)
        enc = kref.encode(vals, qi.dtype, sc["q_scale"])
        (view.view(np.uint8) if sc["q_scale"] is not None else view)[...] = enc
    cinfos, _, _, pages, page_size = a["cache"]
    h = {n: to_host(i).astype(np.int64).reshape(-1) for n, i in a["addr"].items()}
    valid, page, row = kref.cache_rows(pages, page_size, slot_mapping=h.get("slot_mapping"),
                                       batch_indices=h.get("batch_indices"),
                                       cache_positions=h.get("cache_positions"),
                                       kv_indices=h.get("kv_indices"),
                                       kv_indptr=h.get("kv_indptr"))
    dc = a["ckv"].shape[1]
    rows = np.concatenate([np_view(a["ckv"]).astype(np.float64), kr], axis=-1)[valid]
    enc = kref.encode(rows, qi.dtype, sc["kv_scale"])
    views = [np_view(i) for i in cinfos]
    if sc["kv_scale"] is not None:
        views = [v.view(np.uint8) for v in views]
    if len(views) == 1:
        views[0][page[valid], row[valid]] = enc
    else:
        views[0][page[valid], row[valid]] = enc[:, :dc]
        views[1][page[valid], row[valid]] = enc[:, dc:]


def _spec(config, a, calls=(), pdl=False):
    """The call's launcher.LaunchSpec; ``calls`` the words Plan.run writes
    per call (LaunchSpec.calls), ``pdl`` LaunchSpec's."""
    qi, ki, ci, qni, qnoi, qoi = (a[n] for n in ("q", "k", "ckv", "q_nope", "q_nope_out", "q_out"))
    cinfos, cloc, kloc, pages, page_size = a["cache"]
    t, h, r = qi.shape
    fp8 = (KV_FP8_Q if a["q_scale"] is not None else 0) | (
        KV_FP8_CACHE if a["kv_scale"] is not None else 0)
    cisz = cinfos[0].itemsize
    arrays = [(qi.ptr, qi.itemsize, qi.strides[:2]), (ki.ptr, ki.itemsize, ki.strides[:1]),
              (ci.ptr, ci.itemsize, ci.strides[:1]), (qoi.ptr, qoi.itemsize, qoi.strides[:2]),
              (cloc[0], cisz, cloc[1]), (kloc[0], cisz, kloc[1])]
    widths = [r // 2, ci.shape[1]]
    if qni is not None:
        arrays += [(qni.ptr, qni.itemsize, qni.strides[:2]),
                   (qnoi.ptr, qnoi.itemsize, qnoi.strides[:2])]
        widths.append(qni.shape[2])
    vec = pick_pack_vec(qi.dtype, arrays, widths)
    inv_freq, _ = config.device_tables(qi.device)
    pos = a["pos"]
    rope = dict(in_ptr=(qi.ptr, ki.ptr), out_ptr=(qoi.ptr, 0), in_ss=(qi.strides[0],
                                                                      ki.strides[0]),
                in_sh=(qi.strides[1], 0), out_ss=(qoi.strides[0], 0), out_sh=(qoi.strides[1], 0),
                heads=(h, 1), n_batch=1, n_seq=t, head_dim=r, rot_dim=r, pos_ptr=pos.ptr,
                pos_is64=int(pos.dtype == "int64"), pos_s_stream=t, pos_sb=t, pos_ss=1,
                inv_freq_ptr=inv_freq.data.ptr, scale=config.scale, sin_sign=1.0)
    kv = dict(v_ptr=ci.ptr, v_ss=ci.strides[0], k_cache=kloc[0], v_cache=cloc[0],
              kc_sp=kloc[1][0], kc_sr=kloc[1][1], vc_sp=cloc[1][0], vc_sr=cloc[1][1],
              num_pages=pages, page_size=page_size)
    addr = a["addr"]
    kv.update(addressing_fields(addr))
    if a["q_scale"] is not None:
        kv["q_scale"] = a["q_scale"].ptr
    if a["kv_scale"] is not None:
        kv["k_scale"] = a["kv_scale"].ptr
    mla = dict(ckv_dim=ci.shape[1])
    if qni is not None:
        mla.update(qn_ptr=qni.ptr, qn_st=qni.strides[0], qn_sh=qni.strides[1], qno_ptr=qnoi.ptr,
                   qno_st=qnoi.strides[0], qno_sh=qnoi.strides[1], nope_dim=qni.shape[2])
    return mla_spec(qi.device, dtype=qi.dtype, interleaved=config.interleaved, vec=vec, fp8=fp8,
                    rope=rope, kv=kv, mla=mla, calls=calls, pdl=pdl)
