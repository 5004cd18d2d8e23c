"""Frequency schemes and model configs: what builds a :class:`~cuprope.RopeConfig`.

* ``scaling.py``: every RoPE scheme (default, linear, dynamic NTK, YaRN,
  LongRoPE, Llama 3, proportional, M-RoPE, 2-D vision) as an ``inv_freq``
  table, an optional ``stream_map`` and a ``scale``.
* ``hf_config.py``: a model's HF ``config.json`` read into those tables
  (``rope_config_from_hf``), built on ``scaling.py``.
* ``hf_families.py``: what HF's model classes assume beyond ``config.json``.

The public face is :mod:`cuprope.scaling`, which exports both modules' names.
"""
