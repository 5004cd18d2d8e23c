"""The decode prologue in one launch: QK-norm + RoPE + (fp8) + KV-cache
append (``qk_norm_rope_append_kv``; its docstring in ``api`` says what it
takes and stores). ``reference``: its float64 NumPy reference; ``launch``:
its LaunchSpec (kernels/prologue.cuh); ``torch``: its custom op.
"""
from .api import qk_norm_rope_append_kv

__all__ = ["qk_norm_rope_append_kv"]
