"""The fused QK-norm + RoPE op, all of it in this package:

* ``api.py``: ``rope_qk_norm_forward`` / ``rope_qk_norm_backward`` (shapes,
  semantics and dtypes in its docstring), the public functions with their
  torch guard;
* ``call.py``: the call beneath them, unguarded (``QkNormCall``: validation,
  the NumPy backend, the GPU launch), which the adapters use;
* ``fast.py``: its fast paths (a repeated forward or backward replays its
  launches);
* ``reference.py``: its float64 NumPy reference (and HF's roundings);
* ``launch.py``: its launch specs for the one launcher (forward, backward,
  weight-gradient reduction) and the JAX lowering's plan;
* ``torch.py``: the PyTorch adapter (autograd, custom ops), re-exported by
  :mod:`cuprope.torch`;
* ``jax.py``: the JAX adapter (primitive, vmap, sharding), re-exported by
  :mod:`cuprope.jax`.
"""
from .api import rope_qk_norm_backward, rope_qk_norm_forward
from .call import NORM_OVER, NORMS, ORDERS, QkNormCall
from .fast import fast_signature

__all__ = ["rope_qk_norm_forward", "rope_qk_norm_backward", "QkNormCall"]
