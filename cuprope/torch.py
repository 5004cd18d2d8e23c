"""PyTorch adapters, the public framework module: every op's autograd and
``torch.compile`` adapter, gathered from its own package. ``rope_qk``,
``rope``, ``rotate``, ``table_rotate``, ``RopeQKFunction`` and HF's drop-in
``apply_rotary_pos_emb``: :mod:`cuprope.rope.torch`; ``rope_qk_norm``,
``RopeQKNormFunction``: :mod:`cuprope.qknorm.torch`; vLLM's
``rotary_embedding``: :mod:`cuprope.kvcache.torch`; vLLM's
``fused_qk_norm_rope``: :mod:`cuprope.qknorm.vllm`; ``patch_hf`` /
``unpatch_hf``: :mod:`cuprope.hfpatch`. Each docstring gives shapes and gradients.
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
