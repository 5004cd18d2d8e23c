"""RoPE frequency schemes and model configs, the public face of
:mod:`cuprope.schemes`: every scheme as an ``inv_freq`` table
(:mod:`cuprope.schemes.scaling`, whose docstring gives the formulas) and a
model's ``config.json`` read the way HF transformers reads it
(:mod:`cuprope.schemes.hf_config`)."""
from .schemes import scaling as _schemes
from .schemes.hf_config import hf_rope_parameters, hf_table, layer_types, rope_config_from_hf
from .schemes.scaling import (ROPE_TYPE_ALIASES, ROPE_TYPES, default_table, dynamic_ntk_table,
                              interleaved_mrope_config, interleaved_mrope_stream_map,
                              linear_table, llama3_table, longrope_table, mrope_config,
                              mrope_stream_map, proportional_table, vision2d_config,
                              vision2d_tables, yarn_get_mscale, yarn_table)

# the schemes' names, and the three that read a model's config.json
__all__ = [*_schemes.__all__, "hf_rope_parameters", "hf_table", "rope_config_from_hf"]
