"""Model configs as published (``config.json`` on the Hugging Face Hub), cut to
the fields RoPE reads plus those the transformers config class needs.

Keys and values are copied from the published files; nothing is filled in that
the file leaves out (that is the point: the reader must apply the model class's
defaults). Where a value could not be checked against the published file it is
said next to it.
"""

# Phi-3.5-mini-instruct: rope_scaling.short_factor / long_factor (48 each), as published
PHI35_MINI_LONG = [
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
    1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661,
    3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432,
    7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945,
    24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
    50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305,
    58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203,
    62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094,
    63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
    64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062,
]
PHI35_MINI_SHORT = [
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
    1.0699999332427979, 1.0999999046325684, 1.1099998950958252, 1.1599998474121094,
    1.1599998474121094, 1.1699998378753662, 1.2899998426437378, 1.339999794960022,
    1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788,
    1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756,
    2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
    2.729999542236328, 2.749999523162842, 2.8399994373321533,
]
# Phi-3.5-MoE-instruct: the first 8 of the 64 factors are the published ones; the other 56
# could not be read from a copy of the file here and are a smooth stand-in (same range:
# short about 1 -> 2.9, long about 1 -> 65). The mscales and every scalar are as published.
_MOE_LONG8 = [1.0199999809265137, 1.0299999713897705, 1.0399999618530273, 1.0499999523162842,
              1.0499999523162842, 1.0499999523162842, 1.059999942779541, 1.059999942779541]
_MOE_SHORT8 = [1.0, 1.0399999618530273, 1.0399999618530273, 1.0399999618530273,
               1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842]
PHI35_MOE_LONG = _MOE_LONG8 + [1.06 * (64.0 / 1.06) ** (i / 55) for i in range(56)]
PHI35_MOE_SHORT = _MOE_SHORT8 + [1.05 + 1.85 * i / 55 for i in range(56)]

_GEMMA4_31B_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 10

CONFIGS = {
    "Llama-2-7b-hf": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 4096,
        "rope_scaling": None, "rope_theta": 10000.0},
    "Llama-3.1-8B": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
    "Llama-3.2-1B": {
        "model_type": "llama", "head_dim": 64, "hidden_size": 2048, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 16, "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
    # text_config from a transcription of the published file (a copy on the unsloth mirror)
    "Llama-4-Scout-17B-16E": {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128,
            "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 8,
            "num_hidden_layers": 48, "max_position_embeddings": 262144, "no_rope_layers": [],
            "interleave_moe_layer_step": 1, "use_qk_norm": True, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"}}},
    "Qwen2.5-7B-Instruct": {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rope_scaling": None, "sliding_window": 131072,
        "use_sliding_window": False},
    # the model card's block for contexts past 32k, added to the published config
    "Qwen2.5-7B-Instruct+YaRN": {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}},
    "Qwen2.5-7B-Instruct-1M": {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "max_position_embeddings": 1010000,
        "rope_theta": 10000000.0, "rope_scaling": None, "sliding_window": 32768,
        "use_sliding_window": False},
    "Qwen3-8B": {
        "model_type": "qwen3", "head_dim": 128, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 36, "max_position_embeddings": 40960,
        "rope_theta": 1000000, "rope_scaling": None},
    "Qwen2-VL-7B-Instruct": {
        "model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
    "Qwen3-VL-8B-Instruct": {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text", "head_dim": 128, "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 36,
            "max_position_embeddings": 262144, "rope_theta": 5000000,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                             "rope_type": "default"}}},
    "DeepSeek-V3": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
        "num_key_value_heads": 128, "num_hidden_layers": 61, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                         "type": "yarn"}},
    "DeepSeek-V2-Lite": {
        "model_type": "deepseek_v2", "hidden_size": 2048, "num_attention_heads": 16,
        "num_key_value_heads": 16, "num_hidden_layers": 27, "q_lora_rank": None,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                         "type": "yarn"}},
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "head_dim": 64, "hidden_size": 2880, "num_attention_heads": 64,
        "num_key_value_heads": 8, "num_hidden_layers": 24, "max_position_embeddings": 131072,
        "rope_theta": 150000,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": False}},
    "Phi-3-mini-4k-instruct": {
        "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": None},
    "Phi-3.5-mini-instruct": {
        "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": {"long_factor": PHI35_MINI_LONG, "short_factor": PHI35_MINI_SHORT,
                         "type": "longrope"}},
    "Phi-3.5-MoE-instruct": {
        "model_type": "phimoe", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": {"long_factor": PHI35_MOE_LONG, "long_mscale": 1.243163121016122,
                         "original_max_position_embeddings": 4096,
                         "short_factor": PHI35_MOE_SHORT, "short_mscale": 1.243163121016122,
                         "type": "longrope"}},
    "phi-2": {
        "model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 2048,
        "partial_rotary_factor": 0.4, "rope_theta": 10000.0, "rope_scaling": None},
    "gemma-2-9b": {
        "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584, "num_attention_heads": 16,
        "num_key_value_heads": 8, "num_hidden_layers": 42, "max_position_embeddings": 8192,
        "rope_theta": 10000.0},
    "gemma-3-1b-it": {
        "model_type": "gemma3_text", "head_dim": 256, "hidden_size": 1152,
        "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 26,
        "max_position_embeddings": 32768, "rope_theta": 1000000, "rope_local_base_freq": 10000,
        "rope_scaling": None, "sliding_window": 512, "sliding_window_pattern": 6},
    # text_config as published: no head_dim, rope_theta, heads or rope_local_base_freq
    "gemma-3-4b-it": {
        "model_type": "gemma3",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                        "intermediate_size": 10240, "num_hidden_layers": 34,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024}},
    # not read from the file itself: the values (and the nested rope_parameters form) agree across
    # the model card and several third-party copies; layer_types follows the 5:1 pattern they list
    "gemma-4-31B-it": {
        "model_type": "gemma4",
        "text_config": {
            "model_type": "gemma4_text", "hidden_size": 5376, "num_attention_heads": 32,
            "num_key_value_heads": 16, "num_global_key_value_heads": 4, "head_dim": 256,
            "global_head_dim": 512, "num_hidden_layers": 60, "layer_types": _GEMMA4_31B_TYPES,
            "max_position_embeddings": 262144, "sliding_window": 1024, "attention_k_eq_v": True,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                   "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}},
    "glm-4-9b-chat-hf": {
        "model_type": "glm", "head_dim": 128, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 2, "num_hidden_layers": 40, "max_position_embeddings": 131072,
        "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
    "GLM-4-9B-0414": {
        "model_type": "glm4", "head_dim": 128, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 2, "num_hidden_layers": 40, "max_position_embeddings": 32768,
        "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
    "Mistral-7B-Instruct-v0.3": {
        "model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "sliding_window": None},
    "Mixtral-8x7B-v0.1": {
        "model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0},
    "stablelm-2-1_6b": {
        "model_type": "stablelm", "hidden_size": 2048, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 24, "max_position_embeddings": 4096,
        "partial_rotary_factor": 0.25, "rope_theta": 10000},
    "OLMo-2-1124-7B": {
        "model_type": "olmo2", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 4096,
        "rope_theta": 500000, "rope_scaling": None},
    "c4ai-command-r-v01": {
        "model_type": "cohere", "hidden_size": 8192, "num_attention_heads": 64,
        "num_key_value_heads": 64, "num_hidden_layers": 40, "max_position_embeddings": 8192,
        "rope_theta": 8000000.0},
}
