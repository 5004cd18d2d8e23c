"""cuprope's internal machinery, beneath the public modules.

The public modules (``api``, ``tables``, ``lrpe``, ``ggml``, ``scaling``, the
adapters) import from here; nothing here imports them back, except the
engine's use of ``cuprope.config.RopeConfig`` and the host backend's of
``cuprope.reference``.

* ``arrays``: what cuprope needs to know about an array from any framework
* ``layout``: the public layouts in canonical ``[B, S, H, D]`` terms
* ``validate``: the one validation layer every front end calls
* ``engine``: the core call, GPU launch plans, streams and launch helpers
* ``host``: the NumPy backend's plumbing (host arrays in and out)
* ``fastpath``: repeated torch/CuPy calls skip validation and planning
* ``cache``: a bounded LRU of the configs dialects build on the fly
* ``checks``: small scalar-argument checks for the dialects
* ``loader``: the kernel sources, their instantiation names, NVRTC modules
* ``launch``: the launch-argument struct, vector width, grid and launch
* ``driver``: launches through the CUDA driver once a plan has run through CuPy
* ``ptx``: PTX of single instantiations, for launchers that load PTX themselves
* ``xla``: the CUDA lowering of ``cuprope.jax`` (jaxlib's GPU kernel call)
"""
