"""cuprope's internal machinery, beneath the ops: arrays of any framework
(``arrays``, ``layout``), validation (``validate``, ``checks``), the NumPy
backend (``host``), what every launch shares (``engine``: outputs, streams,
hand-back; ``launch``: geometry), the one launcher and its parts
(``launcher``, ``args``, ``fastpath``, ``driver``, ``loader``, ``ptx``,
``cache``, ``constants``), the kernel registry (``kernels``), the JAX
lowering machinery (``xla``, ``jax_common``, ``jax_sharding``) and the torch
routes (``torch_guard``, ``torch_route``). Imports run one way: ``_core`` imports
only ``_core``, ``cuprope.config`` and ``cuprope.reference``, which import
nothing of ``_core``; the ops, dialects, schemes and adapters import it.
"""
