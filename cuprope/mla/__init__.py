"""DeepSeek MLA (multi-head latent attention) ops: :func:`rope_append_mla`
(``api``) rotates the rope slice of the queries and the shared rope key and
appends ``[ckv | k_pe]`` to a paged latent cache in one launch; its float64
reference (``reference``) and launch spec (``launch``). Training-side MLA
needs no op of its own: ``cuprope.rope_qk_forward`` on ``q[..., nope:]``
and a k_pe broadcast over heads, through strided views (tests/test_mla.py
shows forward and backward).
"""
from .api import rope_append_mla
from .reference import mla_reference, rotate_pe

__all__ = ["rope_append_mla", "mla_reference", "rotate_pe"]
