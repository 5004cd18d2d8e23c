"""vLLM's ``fused_qk_norm_rope`` op over cuprope's fused QK-norm + RoPE:
``qkv`` ``[T, (Hq + Hk + Hv) * head_dim]`` in place, the q and k heads
RMS-normed per head and rotated by rows of a ``[max_position, R]`` cos/sin
cache, v untouched, no KV-cache write (``cuprope.prologue`` adds the cache
write in the same launch). Re-exported by ``cuprope.torch``."""
from __future__ import annotations

import torch

from ..config import RopeConfig
from .api import rope_qk_norm_forward

__all__ = ["fused_qk_norm_rope"]


def _vllm_qk_norm_rope(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight,
                       k_weight, cos_sin_cache, is_neox, position_ids, rounding):
    t = qkv.shape[0]
    if qkv.dim() != 2 or qkv.shape[1] != (num_heads_q + num_heads_k + num_heads_v) * head_dim:
        raise ValueError(f"qkv must be [T, (Hq + Hk + Hv) * head_dim] = [T, "
                         f"{(num_heads_q + num_heads_k + num_heads_v) * head_dim}], got "
                         f"{list(qkv.shape)}")
    r = cos_sin_cache.shape[-1]
    heads = qkv.view(t, num_heads_q + num_heads_k + num_heads_v, head_dim)
    q, k = heads[:, :num_heads_q], heads[:, num_heads_q:num_heads_q + num_heads_k]
    cos, sin = cos_sin_cache.index_select(0, position_ids.reshape(-1).long()).chunk(2, dim=-1)
    if is_neox:  # HF's tables: (j, j + R/2) share an angle
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    else:        # GPT-J pairs (2j, 2j + 1)
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    cfg = RopeConfig(r, interleaved=not is_neox, layout="thd")
    rope_qk_norm_forward(q, k, cfg, q_weight=q_weight, k_weight=k_weight, eps=eps,
                         rounding=rounding, tables=(cos.to(qkv.dtype).contiguous(),
                                                    sin.to(qkv.dtype).contiguous()),
                         inplace=True)


@torch.library.custom_op("cuprope::fused_qk_norm_rope", mutates_args=("qkv",))
def _fused_qk_norm_rope_op(qkv: torch.Tensor, num_heads_q: int, num_heads_k: int,
                           num_heads_v: int, head_dim: int, eps: float, q_weight: torch.Tensor,
                           k_weight: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                           position_ids: torch.Tensor, rounding: str) -> None:
    _vllm_qk_norm_rope(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight,
                       k_weight, cos_sin_cache, is_neox, position_ids, rounding)


@_fused_qk_norm_rope_op.register_fake
def _(*args):
    return None


def fused_qk_norm_rope(qkv: torch.Tensor, num_heads_q: int, num_heads_k: int, num_heads_v: int,
                       head_dim: int, eps: float, q_weight: torch.Tensor,
                       k_weight: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
                       position_ids: torch.Tensor, forced_token_heads_per_warp: int = -1, *,
                       rounding: str = "cast_then_weight") -> None:
    """vLLM's ``fused_qk_norm_rope`` op, with its schema's arguments
    (``qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight,
    k_weight, cos_sin_cache, is_neox, position_ids,
    forced_token_heads_per_warp=-1``, vLLM's csrc/fused_qknorm_rope_kernel.cu):
    in place on ``qkv`` ``[T, (Hq + Hk + Hv) * head_dim]``, the q and k heads
    RMS-normed over each head with ``q_weight`` / ``k_weight`` ``[head_dim]``
    (qkv's dtype) and ``eps``, then rotated by the rows ``position_ids``
    ``[T]`` of ``cos_sin_cache`` ``[max_position, R]`` (cos half, then sin
    half; float32, float16 or bfloat16 whatever qkv's dtype; R <= head_dim:
    the first R dims of each head turn, the rest keep their normed values),
    NeoX pairs (j, j + R/2) or, ``is_neox=False``, GPT-J pairs (2j, 2j + 1);
    v is not touched, no cache is written. ``forced_token_heads_per_warp``
    picks a launch shape of vLLM's kernel (no effect on the values): taken
    and ignored. Returns None.

    ``rounding="cast_then_weight"`` (default) gives vLLM's native
    composition (``RMSNorm.forward_native``: v·r rounded to the dtype, times
    the weight; then ``RotaryEmbedding.forward_native``: cos/sin cast to the
    dtype, products and sums in it) bit for bit apart from the fp32 sum of
    squares' order; ``"weight_then_cast"`` multiplies the weight in fp32.
    One launch for the norm and rotation (``cuprope.qknorm`` with the
    gathered cos/sin as HF tables) after a small gather of the cos/sin rows.
    Under ``torch.compile`` it is the custom op ``cuprope::fused_qk_norm_rope``."""
    if isinstance(forced_token_heads_per_warp, bool) \
            or not isinstance(forced_token_heads_per_warp, int):
        raise TypeError(f"forced_token_heads_per_warp must be an int, got "
                        f"{forced_token_heads_per_warp!r}")
    args = (qkv, int(num_heads_q), int(num_heads_k), int(num_heads_v), int(head_dim),
            float(eps), q_weight, k_weight, cos_sin_cache, bool(is_neox), position_ids, rounding)
    if torch.compiler.is_compiling():
        _fused_qk_norm_rope_op(*args)
        return
    _vllm_qk_norm_rope(*args)
