"""Tiny random transformers models of every family ``cuprope.torch.patch_hf``
knows, and a way to see each attention layer's q and k (shared by
test_hf_patch and test_gpu_hf_patch). torch and transformers are imported by
the functions, so importing this module needs neither.

Each config: 2 layers, hidden 64, 4 query heads and 2 KV heads of 32, vocab
128, plus what the family needs to build (MoE sizes, the linear-attention
sizes of the hybrid models, whose first layer is Gated DeltaNet and second
attention). Partial rotary where the family has it (Phi-3 0.5, Qwen3-Next /
Qwen3.5 0.25 of the head), Gemma 3 one sliding and one full layer, Llama 4
one RoPE layer (with its L2 qk_norm) and one NoPE layer.
"""
_BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             max_position_embeddings=256, pad_token_id=None, bos_token_id=None,
             eos_token_id=None, tie_word_embeddings=False)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_HYBRID = dict(layer_types=["linear_attention", "full_attention"], linear_key_head_dim=16,
               linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)
_QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1]}

# model_type -> what its config needs beyond _BASE
FAMILIES = {
    "llama": {}, "mistral": {}, "qwen2": {},
    "phi3": dict(partial_rotary_factor=0.5),
    "qwen3": {},
    "qwen3_moe": _MOE,
    "qwen3_next": dict(_HYBRID, **_MOE, shared_expert_intermediate_size=32),
    "qwen3_5_text": dict(_HYBRID, rope_parameters=_QWEN35_ROPE),
    "qwen3_5_moe_text": dict(_HYBRID, **_MOE, shared_expert_intermediate_size=32,
                             rope_parameters=_QWEN35_ROPE),
    "gemma3_text": dict(sliding_window=8, query_pre_attn_scalar=32,
                        layer_types=["sliding_attention", "full_attention"]),
    "olmo2": {},
    "llama4_text": dict(intermediate_size_mlp=128, num_local_experts=2, num_experts_per_tok=1,
                        no_rope_layers=[1, 0], attention_chunk_size=8,
                        interleave_moe_layer_step=1),
}
ROPE_ONLY = ("llama", "mistral", "qwen2", "phi3")
HYBRID = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def tiny_config(model_type, **over):
    import copy
    import warnings

    from transformers import AutoConfig
    kw = copy.deepcopy({**_BASE, **FAMILIES[model_type], **over})  # transformers edits dicts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model(model_type, **kw)


def tiny_model(model_type, dtype, seed=0, device="cpu", attn="sdpa", **over):
    """A tiny model of ``model_type`` built in ``dtype`` (its rotary tables
    stay fp32, as from_pretrained leaves them), every parameter N(0, 0.5²)
    (HF initialises some to ones or zeros), in eval mode; ``over``: config
    fields beyond the family's."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **over), attn_implementation=attn,
                                             dtype=dtype).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model.eval()


_CAPTURED = []


def _capture(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    _CAPTURED.append((module.layer_idx, query.detach().clone(), key.detach().clone()))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def capture_qk(model, run):
    """[(layer_idx, q, k)] as each attention layer hands q and k ``[B, H, S, D]``
    to the attention function while ``run()`` runs (SDPA computes the rest)."""
    from transformers import AttentionInterface
    AttentionInterface.register("cuprope_qk_capture", _capture)
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    saved = {k: c._attn_implementation for k, c in configs.items()}
    _CAPTURED.clear()
    try:
        for c in configs.values():
            c._attn_implementation = "cuprope_qk_capture"
        run()
    finally:
        for k, c in configs.items():
            c._attn_implementation = saved[k]
    return list(_CAPTURED)


def attention_inputs(model, ids):
    """{attention module: the keyword arguments the decoder layer called it
    with} in one forward of ``model`` on ``ids``."""
    import torch

    from cuprope.hfpatch.families import attention_of
    got, hooks = {}, []
    for m in model.modules():
        if attention_of(m) is not None:
            hooks.append(m.register_forward_pre_hook(
                lambda mod, args, kw: got.__setitem__(mod, (args, dict(kw))), with_kwargs=True))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    return got
