"""The KV-cache arguments of ``rope_append_kv`` (``cuprope.kvcache.api``
documents them): the caches and their layout (``KV_LAYOUTS``: NHD
``[num_pages, page_size, Hk, D]``, HND ``[num_pages, Hk, page_size, D]``,
separate k/v caches or one combined ``[num_pages, 2, ...]``), fp8 scales,
the addressing arrays (slot_mapping, or FlashInfer's paged indices) and
``q_out``: each checked, as infos the launch and the NumPy backend read.
"""
from __future__ import annotations

import numpy as np

from . import reference as kref
from .._core import validate
from .._core.arrays import describe, framework, overlaps
from .arrays import index_info, np_view, to_host

KV_LAYOUTS = ("NHD", "HND")


def refuse_jax(op, *arrays):
    """TypeError when any of ``arrays`` (None skipped) is a JAX array: ``op``
    writes a cache in place, which JAX's immutable arrays do not allow."""
    if any(a is not None and framework(a) == "jax" for a in arrays):
        raise TypeError(f"{op} is not offered for JAX arrays (immutable: a cache write needs "
                        f"donated buffers)")


def is_fp8(info):
    """Whether the array is fp8 e4m3 (or its uint8 bytes)."""
    return info.dtype in kref.FP8_DTYPES


def cache_args(k_cache, v_cache, kv_cache, kv_layout, q, hk, d):
    """(k info, v info or None, k/v (ptr, strides (page, row, head)), pages,
    page_size); separate caches or one combined kv_cache."""
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    if (kv_cache is None) == (k_cache is None and v_cache is None):
        raise ValueError("give k_cache and v_cache, or one kv_cache")
    if kv_cache is None and (k_cache is None or v_cache is None):
        raise ValueError("k_cache and v_cache go together")
    infos = ([describe(kv_cache, "kv_cache")] if kv_cache is not None
             else [describe(k_cache, "k_cache"), describe(v_cache, "v_cache")])
    rank = 5 if kv_cache is not None else 4
    for i, name in zip(infos, ("kv_cache",) if kv_cache is not None else ("k_cache", "v_cache")):
        if i.dtype != q.dtype and not is_fp8(i):
            raise TypeError(f"{name} must have q's dtype ({q.dtype}) or float8_e4m3fn (uint8 "
                            f"bytes), got {i.dtype}")
        if i.device != q.device:
            raise ValueError(f"{name} is on device {i.device} but q is on {q.device}")
        if len(i.shape) != rank or (rank == 5 and i.shape[1] != 2):
            lead = "[num_pages, 2, " if rank == 5 else "[num_pages, "
            dims = "page_size, Hk, D]" if kv_layout == "NHD" else "Hk, page_size, D]"
            raise ValueError(f"{name} must be {lead}{dims} ({kv_layout}), got shape "
                             f"{list(i.shape)}")
        validate.check_last_dim(i, name)
        validate.check_writable(i, name)
    if len(infos) == 2 and (infos[0].shape != infos[1].shape or infos[0].dtype != infos[1].dtype
                            or infos[0].strides != infos[1].strides):
        raise ValueError("k_cache and v_cache must share shape, dtype and strides")
    c = infos[0]
    pages, a, b, dd = c.shape[0], *c.shape[-3:]
    heads, page_size = (b, a) if kv_layout == "NHD" else (a, b)
    if heads != hk or dd != d:
        raise ValueError(_heads_mismatch(c.shape, kv_layout, hk, d))
    st = c.strides
    sa, sb = st[-3], st[-2]
    strides = (st[0], sa, sb) if kv_layout == "NHD" else (st[0], sb, sa)
    if len(infos) == 2:
        return infos[0], infos[1], (c.ptr, strides), (infos[1].ptr, strides), pages, page_size
    return c, None, (c.ptr, strides), (c.ptr + st[1] * c.itemsize, strides), pages, page_size


def _heads_mismatch(shape, kv_layout, hk, d):
    """The message for a cache whose heads or head dim are not k's: it names
    ``kv_layout`` and the other value when the shape would fit it."""
    a, b, dd = shape[-3:]
    heads = b if kv_layout == "NHD" else a
    dims = {"NHD": "[num_pages, page_size, Hk, D]", "HND": "[num_pages, Hk, page_size, D]"}
    other = "HND" if kv_layout == "NHD" else "NHD"
    msg = (f"the cache holds {heads} heads of {dd} dims as kv_layout={kv_layout!r} "
           f"({dims[kv_layout]}) but k and v have {hk} heads of {d} dims")
    if dd == d and (a if kv_layout == "NHD" else b) == hk:
        msg += (f"; its shape {list(shape)} fits kv_layout={other!r} ({dims[other]}): pass "
                f"kv_layout={other!r}")
    return msg


def scale_info(x, name, device, sizes):
    """The info of an fp8 scale ``x`` (float32, one of ``sizes``, on ``device``).
    A NumPy scalar (``np.float32(0.05)``) is taken as a 0-d host array on the
    host; with GPU tensors the error says to wrap it as a device scalar."""
    if x is None:
        raise ValueError(f"{name} is needed: an fp8 target is stored as e4m3 of x * (1/{name})")
    if isinstance(x, np.generic):
        if device >= 0:
            raise ValueError(f"{name} is a NumPy scalar (host memory) but the tensors are on "
                             f"cuda:{device}: wrap it as a float32 device scalar, e.g. "
                             f"torch.tensor({float(x):.6g}, device='cuda')")
        x = np.asarray(x)
    info = describe(x, name)
    if info.dtype != "float32":
        raise TypeError(f"{name} must be a float32 array, got {info.dtype}")
    if info.device != device:
        raise ValueError(f"{name} is on device {info.device}, not with the tensors ({device})")
    if tuple(info.shape) not in sizes or (info.size > 1 and info.strides[0] != 1):
        raise ValueError(f"{name} must have shape " + " or ".join(str(list(s)) for s in sizes)
                         + f" (contiguous), got {list(info.shape)}")
    return info


def check_scales(scales):
    """``check=True``'s look at the fp8 scales (``{name: info or None}``, read
    on the host: a device sync): each value positive and finite, else a
    ValueError naming the scale."""
    for name, info in scales.items():
        if info is None:
            continue
        vals = to_host(info).astype(np.float32).reshape(-1)
        bad = vals[~(np.isfinite(vals) & (vals > 0))]
        if bad.size:
            raise ValueError(f"{name} must be positive and finite (x is stored as e4m3 of "
                             f"x * (1/{name})), got {bad[0]}")


def addressing(dev, tshapes, slot_mapping, kv_indices, kv_indptr, batch_indices,
                cache_positions, kv_last_page_len):
    """{name: info} of the addressing arrays (slot_mapping, or the paged ones)."""
    paged = {"kv_indices": kv_indices, "kv_indptr": kv_indptr, "batch_indices": batch_indices,
             "cache_positions": cache_positions}
    if slot_mapping is not None:
        if any(x is not None for x in paged.values()) or kv_last_page_len is not None:
            raise ValueError("give slot_mapping or the paged indices (kv_indices, kv_indptr, "
                             "batch_indices, cache_positions), not both")
        return {"slot_mapping": index_info(slot_mapping, "slot_mapping", dev, tshapes,
                                           ("int64",))}
    missing = [n for n, x in paged.items() if x is None]
    if missing:
        raise ValueError(f"give slot_mapping, or all of the paged indices (missing: "
                         f"{', '.join(missing)})")
    out = {n: index_info(paged[n], n, dev, tshapes) for n in ("batch_indices", "cache_positions")}
    kvi = describe(kv_indices, "kv_indices")
    out["kv_indices"] = index_info(kv_indices, "kv_indices", dev, [tuple(kvi.shape[:1])])
    if len(kvi.shape) != 1:
        raise ValueError(f"kv_indices must be 1-D, got shape {list(kvi.shape)}")
    ipi = describe(kv_indptr, "kv_indptr")
    if len(ipi.shape) != 1 or ipi.shape[0] < 1:
        raise ValueError(f"kv_indptr must be 1-D [B + 1], got shape {list(ipi.shape)}")
    out["kv_indptr"] = index_info(kv_indptr, "kv_indptr", dev, [tuple(ipi.shape)])
    if kv_last_page_len is not None:
        out["kv_last_page_len"] = index_info(kv_last_page_len, "kv_last_page_len", dev,
                                             [(ipi.shape[0] - 1,)])
    return out


def q_out_info(q_out, qi, others):
    """The info of what q is rotated into: ``q_out``'s (checked against q and
    ``others``, the infos it must not overlap), or q's own (in place)."""
    if q_out is None:
        if qi.kind == "jax":
            raise TypeError("JAX arrays are immutable: give q_out= (q is rotated in place)")
        validate.check_writable(qi, "q")
        return qi
    qo = describe(q_out, "q_out")
    if qo.kind != qi.kind or qo.device != qi.device or tuple(qo.shape) != tuple(qi.shape):
        raise ValueError(f"q_out must be a {qi.kind} array of q's shape {list(qi.shape)} on its "
                         f"device, got {qo.kind} {list(qo.shape)} on {qo.device}")
    if qo.dtype != qi.dtype and not is_fp8(qo):
        raise TypeError(f"q_out must have q's dtype ({qi.dtype}) or float8_e4m3fn, got {qo.dtype}")
    if qo.kind == "jax":
        raise TypeError("JAX arrays are immutable: q_out cannot be one")
    validate.check_last_dim(qo, "q_out")
    validate.check_writable(qo, "q_out")
    if overlaps(qo, qi) and not (validate.same_view(qo, qi) and qo.dtype == qi.dtype):
        raise ValueError("q_out overlaps q without being exactly q (omit q_out to rotate in place)")
    if any(o is not None and overlaps(qo, o) for o in others):
        raise ValueError("q_out overlaps k, v or the cache")
    return qo


def cache_views(kc, vc, kv_layout, fp8):
    """NumPy views of host k and v caches as ``[pages, page_size, Hk, D]``
    (uint8 bytes for fp8)."""
    if vc is None:
        whole = np_view(kc)
        kview, vview = whole[:, 0], whole[:, 1]
    else:
        kview, vview = np_view(kc), np_view(vc)
    if kv_layout == "HND":
        kview, vview = kview.transpose(0, 2, 1, 3), vview.transpose(0, 2, 1, 3)
    if fp8:
        kview, vview = kview.view(np.uint8), vview.view(np.uint8)
    return kview, vview


def addressing_fields(addr) -> dict:
    """The KvArgs fields of the addressing infos ``addr`` (``addressing``'s
    result): the slot mapping's pointer, or the paged indices' pointers,
    sizes and which of them are int64."""
    if "slot_mapping" in addr:
        return {"slot_ptr": addr["slot_mapping"].ptr}
    names = ("batch_indices", "cache_positions", "kv_indices", "kv_indptr")
    return dict(batch_ptr=addr[names[0]].ptr, cpos_ptr=addr[names[1]].ptr,
                indices_ptr=addr[names[2]].ptr, indptr_ptr=addr[names[3]].ptr,
                n_indices=addr["kv_indices"].shape[0], n_seqs=addr["kv_indptr"].shape[0] - 1,
                index_is64=sum(1 << i for i, n in enumerate(names) if addr[n].dtype == "int64"))
