"""PyTorch custom op of the decode prologue: ``cuprope::qk_norm_rope_append_kv``
(mutating q or q_out and the caches, returning nothing), with a fake
implementation, so ``torch.compile(fullgraph=True)`` traces through it and
``torch.library.opcheck`` passes; CUDA graphs capture the eager call (warm
it up once first). ``qk_norm_rope_append_kv`` here takes the arguments of
``cuprope.prologue.qk_norm_rope_append_kv`` and returns q_out (or q).
"""
from __future__ import annotations

from typing import Optional

import torch

from .._core import torch_route
from .._core.validate import check_flag
from ..config import RopeConfig, config_by_key
from .api import TRAINING, grad_tensors, qk_norm_rope_append_kv as _eager

__all__ = ["qk_norm_rope_append_kv"]

_MUTATED = ("q", "q_out", "k_cache", "v_cache", "kv_cache")


@torch.library.custom_op("cuprope::qk_norm_rope_append_kv", mutates_args=_MUTATED)
def _op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config_key: int,
        positions: torch.Tensor, q_weight: Optional[torch.Tensor],
        k_weight: Optional[torch.Tensor], eps: float, norm: str, weight_offset: float,
        order: str, norm_over: str, rounding: str, k_cache: Optional[torch.Tensor],
        v_cache: Optional[torch.Tensor], kv_cache: Optional[torch.Tensor], kv_layout: str,
        slot_mapping: Optional[torch.Tensor], kv_indices: Optional[torch.Tensor],
        kv_indptr: Optional[torch.Tensor], batch_indices: Optional[torch.Tensor],
        cache_positions: Optional[torch.Tensor], q_out: Optional[torch.Tensor],
        q_scale: Optional[torch.Tensor], k_scale: Optional[torch.Tensor],
        v_scale: Optional[torch.Tensor], enable_pdl: bool = False) -> None:
    _eager(q, k, v, config_by_key(config_key), positions, q_weight=q_weight, k_weight=k_weight,
           eps=eps, norm=norm, weight_offset=weight_offset, order=order, norm_over=norm_over,
           rounding=rounding, k_cache=k_cache, v_cache=v_cache, kv_cache=kv_cache,
           kv_layout=kv_layout, slot_mapping=slot_mapping, kv_indices=kv_indices,
           kv_indptr=kv_indptr, batch_indices=batch_indices, cache_positions=cache_positions,
           q_out=q_out, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
           enable_pdl=enable_pdl)


@_op.register_fake
def _(*args):
    return None


def qk_norm_rope_append_kv(q, k, v, config: RopeConfig, positions, *, q_weight=None,
                           k_weight=None, eps=1e-6, norm="rms", weight_offset=0.0,
                           order="norm_then_rope", norm_over="head", rounding="exact",
                           k_cache=None, v_cache=None, kv_cache=None, kv_layout="NHD",
                           slot_mapping=None, kv_indices=None, kv_indptr=None,
                           batch_indices=None, cache_positions=None, q_out=None, q_scale=None,
                           k_scale=None, v_scale=None, enable_pdl=False):
    """``cuprope.prologue.qk_norm_rope_append_kv`` as the custom op (no
    ``check``, ``kv_last_page_len`` or ``stream``: the op runs on the current
    stream; ``enable_pdl`` as there). Returns q_out (or q). Not
    differentiable: with grad mode on, a tensor argument requiring grad
    raises as the eager call does."""
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    torch_route.check_inference("qk_norm_rope_append_kv",
                                *grad_tensors(q, k, v, q_weight, k_weight, q_scale, k_scale,
                                              v_scale, q_out, k_cache, v_cache, kv_cache),
                                instead=TRAINING)
    _op(q, k, v, config.key, positions, q_weight, k_weight, float(eps), norm,
        float(weight_offset), order, norm_over, rounding, k_cache, v_cache, kv_cache, kv_layout,
        slot_mapping, kv_indices, kv_indptr, batch_indices, cache_positions, q_out, q_scale,
        k_scale, v_scale, check_flag(enable_pdl, "enable_pdl"))
    return q if q_out is None else q_out
