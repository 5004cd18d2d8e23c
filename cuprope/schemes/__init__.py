"""Frequency schemes and model configs: what builds a :class:`~cuprope.RopeConfig`
(exported as ``cuprope.scaling``, which carries every name below).
``scaling``: every RoPE scheme (default, linear, dynamic NTK, YaRN, LongRoPE,
Llama 3, proportional, M-RoPE, 2-D vision) as an ``inv_freq`` table, an
optional ``stream_map`` and a ``scale``; ``hf_config``: a model's HF
``config.json`` read into those tables (``rope_config_from_hf``);
``hf_families``: what HF's model classes assume beyond ``config.json``.
"""
from .hf_config import hf_rope_parameters, hf_table, layer_types, rope_config_from_hf
from .scaling import (ROPE_TYPE_ALIASES, ROPE_TYPES, default_table, dynamic_ntk_table,
                      interleaved_mrope_config, interleaved_mrope_stream_map, linear_table,
                      llama3_table, longrope_table, mrope_config, mrope_stream_map,
                      proportional_table, vision2d_config, vision2d_tables, yarn_get_mscale,
                      yarn_table)

__all__ = [
    # the schemes (scaling.py)
    "ROPE_TYPES", "ROPE_TYPE_ALIASES", "default_table", "linear_table", "dynamic_ntk_table",
    "yarn_table", "yarn_get_mscale", "longrope_table", "llama3_table", "proportional_table",
    "mrope_stream_map", "interleaved_mrope_stream_map", "mrope_config",
    "interleaved_mrope_config", "vision2d_tables", "vision2d_config",
    # a model's config.json (hf_config.py)
    "rope_config_from_hf", "hf_rope_parameters", "hf_table", "layer_types",
]
