"""LRPE rotate-1d (RoPE after an activation, per-head θ and an offset):
``rotate_1d_forward`` / ``rotate_1d_backward`` and ``normalize_theta``
(``api``; shapes and semantics in their docstrings) and the float64
reference (``reference``). Its JAX adapter (``jax``: ``cuprope.jax.rotate_1d``)
binds the rotation primitive of :mod:`cuprope.rope.jax`; torch tensors that
require grad raise a TypeError (it has no autograd adapter).
"""
from .api import (ACTS, DIMS, activation, backward_reference, forward_reference,
                  normalize_theta, rotate, rotate_1d_backward, rotate_1d_forward)

__all__ = ["rotate_1d_forward", "rotate_1d_backward", "normalize_theta", "activation",
           "rotate", "forward_reference", "backward_reference", "ACTS"]
