"""The core op, RoPE by a RopeConfig, and its by-table twin:

* ``api.py``: ``rope_forward`` / ``rope_backward`` / ``rope_qk_forward`` /
  ``rope_qk_backward`` (exported by :mod:`cuprope`);
* ``tables.py``: rotation by the caller's cos/sin tables, HF's formula
  (public path :mod:`cuprope.tables`);
* ``torch.py``: the PyTorch adapter of both (autograd, custom ops, HF's
  ``apply_rotary_pos_emb`` drop-in), re-exported by :mod:`cuprope.torch`;
* ``jax.py``: the JAX adapter, one XLA primitive for the rotation family
  (RoPE, tables, and LRPE's rotate-1d, which share its launch), re-exported
  by :mod:`cuprope.jax`.

Their float64 reference is :mod:`cuprope.reference`, shared by every op.
"""
