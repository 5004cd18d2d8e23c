"""The float64 reference of the decode prologue: the composition of the
QK-norm reference (``cuprope.qknorm.reference``: norm and rotation) and the
KV-append reference (``cuprope.kvcache.reference``: cache rows, rounding,
e4m3 encoding). NumPy only; the tokens are packed ``[T, H, D]``.
"""
from __future__ import annotations

import numpy as np

from ..kvcache import reference as kref
from ..qknorm import reference as qref
from .. import reference

__all__ = ["normed", "prologue"]


def normed(x, weight, config, positions, *, eps=1e-6, weight_offset=0.0,
           order="norm_then_rope", norm_over="head", rounding="exact"):
    """x ``[T, H, D]`` (a NumPy float array; its dtype is the tensors') normed
    and rotated by ``config`` at ``positions`` (``[T]``, or ``[n_streams, T]``)
    as ``cuprope.qknorm.rope_qk_norm_forward`` defines it: float64 ``[T, H,
    D]``, unrounded in the exact mode, in the model modes the values of the
    dtype the model's modules hand on."""
    t = x.shape[0]
    pos = reference.token_positions(1, t, positions=np.asarray(positions, np.int64),
                                    n_streams=config.n_streams)
    kw = dict(angles=reference.pair_angles(pos, config.inv_freq, config.stream_map),
              scale=config.scale, rotary_dim=config.rotary_dim,
              interleaved=config.interleaved, eps=eps, weight_offset=weight_offset,
              over=norm_over, order=order)
    w = None if weight is None else np.asarray(weight, np.float64)
    if rounding == "exact":
        return qref.forward(np.asarray(x, np.float64)[None], weight=w, **kw)[0]
    return qref.model_forward(np.asarray(x)[None], x.dtype, rounding=rounding, weight=w,
                              **kw)[0].astype(np.float64)


def prologue(q, k, v, config, positions, *, n_pages, page_size, q_weight=None, k_weight=None,
             eps=1e-6, weight_offset=0.0, order="norm_then_rope", norm_over="head",
             rounding="exact", slot_mapping=None, batch_indices=None, cache_positions=None,
             kv_indices=None, kv_indptr=None, q_scale=None, k_scale=None, v_scale=None):
    """What the op stores for q, k, v ``[T, H, D]`` (NumPy, one float dtype):
    ``(q_out, valid, page, row, k_rows, v_rows)``: q_out ``[T, Hq, D]`` (the
    dtype's values, or e4m3 bytes as uint8 with ``q_scale``), ``valid``,
    ``page``, ``row`` per token (``cuprope.kvcache.reference.cache_rows``), and the k
    and v rows of the valid tokens ``[n_valid, Hk, D]`` (e4m3 bytes with
    ``k_scale`` / ``v_scale``, per tensor or per head)."""
    dt = q.dtype.name
    norm = dict(eps=eps, weight_offset=weight_offset, order=order, norm_over=norm_over,
                rounding=rounding)
    qn = normed(q, q_weight, config, positions, **norm)
    kn = normed(k, k_weight, config, positions, **norm)
    valid, page, row = kref.cache_rows(n_pages, page_size, slot_mapping=slot_mapping,
                                       batch_indices=batch_indices,
                                       cache_positions=cache_positions, kv_indices=kv_indices,
                                       kv_indptr=kv_indptr)
    return (kref.encode(qn, dt, q_scale), valid, page, row, kref.encode(kn[valid], dt, k_scale),
            kref.encode(np.asarray(v, np.float64)[valid], dt, v_scale))
