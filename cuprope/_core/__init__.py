"""cuprope's internal machinery, beneath the public modules.

The public modules (``api``, ``tables``, ``lrpe``, ``ggml``, ``qknorm``,
``kvcache``, ``cos_sin_cache``, the adapters) import from here; nothing here
imports them back, except the engine's use of ``cuprope.config.RopeConfig``
and the host backend's of ``cuprope.reference``.

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
* ``launcher``: the one launcher (LaunchSpec, Plan, LaunchCache, flat_call)
* ``launch``: the rope family's spec: vector width, grid, RopeArgs
* ``kvlaunch``: the KV-cache dialect's spec, the angle table
* ``qknorm_launch``: the QK-norm kernels' geometry and specs
* ``fastpath``: repeated torch/CuPy calls skip validation and planning
* ``driver``: launches through the CUDA driver (ctypes)
* ``cache``: a bounded LRU of the configs dialects build on the fly
* ``checks``: small scalar-argument checks for the dialects
* ``loader``: the kernel sources, their instantiation names, NVRTC modules
* ``ptx``: PTX of single instantiations, for launchers that load PTX themselves
* ``xla``: the CUDA lowering of ``cuprope.jax`` (jaxlib's GPU kernel call)
"""
