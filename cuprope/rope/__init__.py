"""The core op, RoPE by a RopeConfig, and its other front ends:

* ``api.py``: ``rope_forward`` / ``rope_backward`` / ``rope_qk_forward`` /
  ``rope_qk_backward`` (exported by :mod:`cuprope`);
* ``tables.py``: rotation by the caller's cos/sin tables, HF's formula
  (exported as ``cuprope.tables``; ``table_call.py`` is the call beneath it);
* ``ggml.py``: ggml's rope op, its arguments turned into a RopeConfig
  (exported as ``cuprope.ggml``);
* ``positions.py``: position arrays for packed and context-parallel batches
  (exported as ``cuprope.positions``);
* ``torch.py``: the PyTorch adapter of the rotation and the tables
  (autograd, custom ops, HF's ``apply_rotary_pos_emb`` drop-in), re-exported
  by :mod:`cuprope.torch`;
* ``jax.py``: the JAX adapter, one XLA primitive for the rotation family
  (RoPE, tables, and LRPE's rotate-1d, which share its launch), re-exported
  by :mod:`cuprope.jax`.

Their float64 reference is :mod:`cuprope.reference`, shared by every op.
"""
