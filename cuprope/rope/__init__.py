"""The core op, RoPE by a RopeConfig, and its other front ends: ``api``
(``rope_forward`` and friends, exported by :mod:`cuprope`); ``tables``, the
caller's cos/sin tables (``cuprope.tables``; ``table_call`` runs beneath
it); ``ggml``, ggml's rope op (``cuprope.ggml``); ``positions``, packed and
context-parallel positions (``cuprope.positions``); ``torch`` and ``jax``,
the adapters (re-exported by :mod:`cuprope.torch` / :mod:`cuprope.jax`; the
JAX primitive serves LRPE's rotate-1d too). Beneath them: ``engine`` (the
call), ``launch`` and ``decode`` (the launch as data; few tokens),
``kernels`` (the kernel record) and ``xla`` (the CUDA lowering). Their
float64 reference is :mod:`cuprope.reference`.
"""
