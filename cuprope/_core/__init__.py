"""cuprope's internal machinery, beneath the public modules.

The op packages (``cuprope.rope``, ``qknorm``, ``kvcache``, ``lrpe``), ggml's
dialect, the schemes and the adapters import from here; nothing here imports
them back. ``_core`` imports only ``_core``, ``cuprope.config`` (RopeConfig,
the public layouts, the ``LaunchCache`` an owner holds) and the float64
formulas of ``cuprope.reference`` that the NumPy backend evaluates; neither
of those two imports anything of ``_core``.

One launch path: an op states its launch as data, a ``launcher.LaunchSpec``
(the kernel of the loader's catalogue, grid, block, shared memory, and its
argument structs from ``args``' named, ordered field lists), and
``launcher`` plans it, caches it (``LaunchCache``: plans, fast-path entries),
runs it through the driver on the caller's stream, replays it from
``fastpath`` and turns it into a flat kernel call for ``xla`` (jax.jit).

* ``arrays``: what cuprope needs to know about an array from any framework
* ``layout``: the public layouts in canonical ``[B, S, H, D]`` terms
* ``validate``: the one validation layer every front end calls
* ``engine``: the core call, outputs, streams, the rope launches' run
* ``host``: the NumPy backend's plumbing (host arrays in and out)
* ``args``: the argument structs' field lists (ArgStruct) and the flat
  entries' generated parameter lists
* ``launcher``: the one launcher (LaunchSpec, Plan, cached_plan, flat_call)
* ``launch``: the rope family's spec: vector width, grid, RopeArgs (the
  KV-cache and QK-norm specs live in their packages' ``launch.py``)
* ``decode``: launches of few tokens (the decode rows) and the angle table
  they read
* ``fastpath``: repeated torch/CuPy calls skip validation and planning
* ``driver``: launches through the CUDA driver (ctypes)
* ``cache``: a bounded LRU of the configs dialects build on the fly
* ``checks``: small scalar-argument checks for the dialects
* ``loader``: the kernel sources, their instantiation names, NVRTC modules
* ``ptx``: PTX of single instantiations, for launchers that load PTX themselves
* ``xla``: the CUDA lowering of the JAX adapters (jaxlib's GPU kernel call)
* ``torch_guard``, ``torch_route``: where a core call on torch tensors goes
  under autograd and ``torch.compile`` (the guard's test, then the route)
"""
