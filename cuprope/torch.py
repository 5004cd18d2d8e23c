"""PyTorch adapters, the public framework module: every op's autograd and
``torch.compile`` adapter, gathered from the op's own package.

* ``rope_qk(q, k, config, ...)`` / ``rope(x, config, ...)``,
  ``apply_rotary_pos_emb(q, k, cos, sin, ...)`` (HF's drop-in), ``rotate``,
  ``table_rotate``, ``RopeQKFunction``: :mod:`cuprope.rope.torch`;
* ``rope_qk_norm(q, k, config, ...)`` / ``RopeQKNormFunction``, the fused
  QK-norm + RoPE: :mod:`cuprope.qknorm.torch`;
* ``rotary_embedding(positions, query, key, head_size, cos_sin_cache,
  is_neox=True, rope_dim_offset=0, inverse=False, *, enable_pdl=False)``,
  vLLM's in-place op (its schema's arguments; positions ``[T]`` or
  ``[B, S]``, any float cache dtype): :mod:`cuprope.kvcache.torch`;
* ``fused_qk_norm_rope(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim,
  eps, q_weight, k_weight, cos_sin_cache, is_neox, position_ids,
  forced_token_heads_per_warp=-1)``, vLLM's op of that name (in place on qkv,
  no cache write): :mod:`cuprope.qknorm.vllm`.
  The one-launch decode prologue with the cache write is ``cuprope.prologue``
  (its custom op: ``cuprope.prologue.torch``);
* ``patch_hf(model)`` / ``unpatch_hf(model)``: those ops inside a Hugging Face
  transformers model's attention (every family cuprope knows), one call:
  :mod:`cuprope.hfpatch`.

Each docstring there gives shapes, gradients and the custom ops.
"""
from .hfpatch import patch_hf, unpatch_hf
from .kvcache.torch import rotary_embedding
from .qknorm.torch import RopeQKNormFunction, rope_qk_norm
from .qknorm.vllm import fused_qk_norm_rope
from .rope.torch import (RopeQKFunction, apply_rotary_pos_emb, rope, rope_qk, rotate,
                         table_rotate)

__all__ = ["rope_qk", "rope", "rotate", "table_rotate", "RopeQKFunction",
           "apply_rotary_pos_emb", "rotary_embedding", "rope_qk_norm", "RopeQKNormFunction",
           "fused_qk_norm_rope", "patch_hf", "unpatch_hf"]
