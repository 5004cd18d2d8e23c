"""cuprope's internal machinery, beneath the public modules: arrays of any
framework (``arrays``, ``layout``), validation (``validate``, ``checks``),
the core call and NumPy backend (``engine``, ``host``), the one launcher and
its parts (``launcher``, ``args``, ``launch``, ``decode``, ``fastpath``,
``driver``, ``loader``, ``ptx``, ``cache``, ``constants``), the kernel
registry (``kernels``; ``rope_kernels``: the records of the core's own
launches), the JAX lowering (``xla``, ``jax_common``, ``jax_sharding``) and the torch routes
(``torch_guard``, ``torch_route``). Imports run one way: ``_core`` imports
only ``_core``, ``cuprope.config`` and ``cuprope.reference``, which import
nothing of ``_core``; the ops, dialects, schemes and adapters import it.
"""
