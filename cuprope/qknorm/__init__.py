"""The fused QK-norm + RoPE op: ``rope_qk_norm_forward`` /
``rope_qk_norm_backward`` (``api``, the public functions with their torch
guard; shapes, semantics and dtypes in their docstrings), the unguarded call
beneath them (``call``: ``QkNormCall``, validation, the NumPy backend, the
GPU launch) and its fast paths (``fast``), the float64 reference and HF's
roundings (``reference``), the launch specs (``launch``), and the adapters
(``torch``, ``jax``; re-exported by :mod:`cuprope.torch` / :mod:`cuprope.jax`).
"""
from .api import rope_qk_norm_backward, rope_qk_norm_forward
from .call import NORM_OVER, NORMS, ORDERS, QkNormCall
from .fast import fast_signature

__all__ = ["rope_qk_norm_forward", "rope_qk_norm_backward", "QkNormCall"]
