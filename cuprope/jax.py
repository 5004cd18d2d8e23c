"""JAX adapters, the public framework module: every op inside ``jax.jit``,
``jax.grad``, ``jax.vmap`` and sharding, gathered from the op's own package.

* ``rope``, ``rope_qk``, ``rope_table``, ``rope_qk_table``: one rotation
  primitive, :mod:`cuprope.rope.jax`; LRPE's ``rotate_1d`` binds it too
  (:mod:`cuprope.lrpe.jax`);
* ``rope_qk_norm``, the fused QK-norm + RoPE: :mod:`cuprope.qknorm.jax`.

Each docstring there gives shapes, static arguments and the lowering.
"""
from .qknorm.jax import rope_qk_norm
from .lrpe.jax import rotate_1d
from .rope.jax import rope, rope_qk, rope_qk_table, rope_table

__all__ = ["rope", "rope_qk", "rope_table", "rope_qk_table", "rotate_1d", "rope_qk_norm"]
