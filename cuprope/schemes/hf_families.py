"""What HF transformers' model classes assume when a ``config.json`` says
nothing. A published ``config.json`` leaves out every field whose value
equals the default of the model family's config class; the family's
modelling code also fixes things no config states, such as the pair layout
of the rotation. :data:`FAMILIES` holds those facts per ``model_type``
(:class:`Family` lists them); a ``model_type`` missing there is an unknown
family, whose fields cuprope refuses to guess (:mod:`cuprope.schemes.hf_config`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Family", "FAMILIES", "GENERIC", "family_of"]


@dataclass(frozen=True)
class Family:
    """One model family's facts, each taken from the transformers 5.23 file
    named in ``source`` (``configuration_*.py`` for defaults,
    ``modeling_*.py`` for the layout):

    * ``rope_theta``: the config class's ``default_theta``.
    * ``head_dim``: the class default (int), or None where the class derives
      it as ``hidden_size // num_attention_heads``. ``head_dim_key`` names
      the field that is the rotary head dim (DeepSeek: ``qk_rope_head_dim``).
    * ``partial_rotary_factor``: the class default; ``mrope_section``: the
      default of the Qwen-VL rotary modules.
    * ``interleaved``: True where the modelling code rotates pairs (2i, 2i+1)
      (``x[..., 0::2]`` / complex views / ``repeat_interleave``), False for
      the half split of ``rotate_half``; a ``(field, default)`` tuple where a
      config field chooses (DeepSeek-V3's ``rope_interleave``).
    * per-layer facts: Gemma 3 / OLMo 3 apply ``rope_scaling`` to full
      attention only (sliding layers: default RoPE with the local base),
      Gemma 4's global head dim, default parameters (Gemma 4 per layer type,
      gpt-oss), the sliding-window pattern that derives ``layer_types``,
      Llama 4's NoPE interval, the layer types that have no RoPE
      (Qwen3-Next / Qwen3.5's ``linear_attention``: Gated DeltaNet) and the
      ``full_attention_interval`` that derives their ``layer_types``.
    """

    source: str
    rope_theta: float = 10000.0
    head_dim: int | None = None
    head_dim_key: str = "head_dim"
    partial_rotary_factor: float = 1.0
    interleaved: bool | tuple = False
    mrope_interleaved: bool = False
    mrope_section: tuple | None = None         # the rotary module's default when absent
    local_rope_theta: float | None = None      # set: rope_scaling is for full attention only,
    local_theta_key: str | None = None         # sliding layers get default RoPE with this base
    global_head_dim: int | None = None         # Gemma 4: global_head_dim's default
    default_rope_parameters: dict | None = None  # used when the config has none
    sliding_window_pattern: int | None = None  # derives layer_types when absent ...
    pattern_key: str | None = None             # ... read from this config field when set
    last_layer_full: bool = False              # Gemma 4 forces the last layer to full attention
    num_hidden_layers: int | None = None       # the class default, for derived layer lists
    nope_interval: int | None = None           # Llama 4: no_rope_layer_interval's default
    original_max_position_embeddings: int | None = None  # Phi-3: a top-level class default
    rope_free_types: tuple = ()                # layer types without RoPE (linear attention)
    full_attention_interval: int | None = None  # derives linear/full layer_types when absent
    notes: tuple = field(default=())


# HF's generic behaviour (RotaryEmbeddingConfigMixin.default_theta, head_dim = hidden //
# heads, rotate_half): used only for a dict without any model_type.
GENERIC = Family("transformers modeling_rope_utils.RotaryEmbeddingConfigMixin (no model_type)")

_HALF = "rotate_half, half split"
_GEMMA4_ROPE = {  # Gemma4TextConfig.__post_init__ default_rope_params
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                       "rope_theta": 1000000.0},
}
# Qwen3-Next / Qwen3.5: every full_attention_interval-th layer is attention, the rest
# Gated DeltaNet (no RoPE)
_HYBRID = dict(rope_free_types=("linear_attention",), full_attention_interval=4)


def _f(cfg, modeling=None, **kw):
    src = f"configuration_{cfg}.py" + (f"; modeling_{modeling}" if modeling else "")
    return Family(src, **kw)


FAMILIES: dict[str, Family] = {
    "llama": _f("llama", f"llama.py {_HALF}"),
    "llama4_text": _f("llama4 (Llama4TextConfig)",
                      "llama4.py apply_rotary_emb: complex view of (2i, 2i+1)",
                      rope_theta=500000.0, head_dim=128, interleaved=True, nope_interval=4,
                      num_hidden_layers=48),
    "mistral": _f("mistral", f"mistral.py {_HALF}"),
    "mixtral": _f("mixtral", f"mixtral.py {_HALF}", rope_theta=1000000.0),
    "qwen2": _f("qwen2", f"qwen2.py {_HALF}"),
    "qwen2_moe": _f("qwen2_moe", f"qwen2_moe.py {_HALF}"),
    "qwen3": _f("qwen3", f"qwen3.py {_HALF}", head_dim=128),
    "qwen3_moe": _f("qwen3_moe", f"qwen3_moe.py {_HALF}"),
    "qwen2_vl_text": _f("qwen2_vl (Qwen2VLTextConfig)", f"qwen2_vl.py {_HALF}",
                        rope_theta=1000000.0, mrope_section=(16, 24, 24)),
    "qwen2_5_vl_text": _f("qwen2_5_vl (Qwen2_5_VLTextConfig)", f"qwen2_5_vl.py {_HALF}",
                          rope_theta=1000000.0, mrope_section=(16, 24, 24)),
    # hybrid: Gated DeltaNet layers (linear_attention) and gated full attention, partial rotary
    "qwen3_next": _f("qwen3_next", f"qwen3_next.py {_HALF} on x[..., :R]", head_dim=256,
                     partial_rotary_factor=0.25, **_HYBRID, num_hidden_layers=48),
    "qwen3_5_text": _f("qwen3_5 (Qwen3_5TextConfig)",
                       f"qwen3_5.py {_HALF} on x[..., :R]; interleaved MRoPE always",
                       head_dim=256, partial_rotary_factor=0.25, mrope_interleaved=True,
                       mrope_section=(11, 11, 10), **_HYBRID, num_hidden_layers=32),
    "qwen3_5_moe_text": _f("qwen3_5_moe (Qwen3_5MoeTextConfig)",
                           f"qwen3_5_moe.py {_HALF} on x[..., :R]; interleaved MRoPE always",
                           head_dim=256, partial_rotary_factor=0.25, mrope_interleaved=True,
                           mrope_section=(11, 11, 10), **_HYBRID, num_hidden_layers=40),
    "qwen3_vl_text": _f("qwen3_vl (Qwen3VLTextConfig)",
                        f"qwen3_vl.py {_HALF}; interleaved MRoPE always",
                        rope_theta=500000.0, head_dim=128, mrope_interleaved=True,
                        mrope_section=(24, 20, 20)),
    "deepseek_v2": _f("deepseek_v2", "deepseek_v2.py apply_rotary_emb: complex view",
                      head_dim=64, head_dim_key="qk_rope_head_dim", interleaved=True),
    "deepseek_v3": _f("deepseek_v3", "deepseek_v3.py apply_rotary_pos_emb_interleave "
                      "when rope_interleave", head_dim=64, head_dim_key="qk_rope_head_dim",
                      interleaved=("rope_interleave", True)),
    "gpt_oss": _f("gpt_oss", "gpt_oss.py _apply_rotary_emb: chunk halves",
                  rope_theta=150000.0, head_dim=64, default_rope_parameters={
                      "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": 4096}),
    "phi": _f("phi", f"phi.py {_HALF}", partial_rotary_factor=0.5),
    "phi3": _f("phi3", f"phi3.py {_HALF}", original_max_position_embeddings=4096),
    "phimoe": _f("phimoe", f"phimoe.py {_HALF}; short_mscale/long_mscale scale cos, sin",
                 rope_theta=1000000.0),
    "gemma": _f("gemma", f"gemma.py {_HALF}", head_dim=256),
    "gemma2": _f("gemma2", f"gemma2.py {_HALF}", head_dim=256),
    "gemma3_text": _f("gemma3 (Gemma3TextConfig)", f"gemma3.py {_HALF}",
                      rope_theta=1000000.0, head_dim=256, local_rope_theta=10000.0,
                      local_theta_key="rope_local_base_freq", sliding_window_pattern=6,
                      pattern_key="sliding_window_pattern", num_hidden_layers=26),
    "gemma4_text": _f("gemma4 (Gemma4TextConfig)", f"gemma4.py {_HALF}", head_dim=256,
                      global_head_dim=512, default_rope_parameters=_GEMMA4_ROPE,
                      sliding_window_pattern=6, last_layer_full=True, num_hidden_layers=30),
    "glm": _f("glm", "glm.py rotate_half on x[..., 0::2], x[..., 1::2]", head_dim=128,
              partial_rotary_factor=0.5, interleaved=True),
    "glm4": _f("glm4", "glm4.py rotate_half on x[..., 0::2], x[..., 1::2]", head_dim=128,
               partial_rotary_factor=0.5, interleaved=True),
    "glm4_moe": _f("glm4_moe", f"glm4_moe.py {_HALF}", partial_rotary_factor=0.5),
    "stablelm": _f("stablelm", f"stablelm.py {_HALF}", partial_rotary_factor=0.25),
    "olmo": _f("olmo", f"olmo.py {_HALF}"),
    "olmo2": _f("olmo2", f"olmo2.py {_HALF}"),
    # Olmo3Config.convert_rope_params_to_dict: the sliding layers' base is default_theta
    # whatever rope_theta says (rope_theta is popped once, for full attention)
    "olmo3": _f("olmo3", f"olmo3.py {_HALF}", rope_theta=500000.0, local_rope_theta=500000.0,
                sliding_window_pattern=4, num_hidden_layers=32),
    "cohere": _f("cohere", "cohere.py repeat_interleave + rotate_half on ::2",
                 rope_theta=500000.0, interleaved=True),
    "cohere2": _f("cohere2", "cohere2.py repeat_interleave + rotate_half on ::2",
                  interleaved=True),
    "gpt_neox": _f("gpt_neox", f"gpt_neox.py {_HALF}", partial_rotary_factor=0.25),
    "gptj": _f("gptj", "gptj.py rotate_every_two", interleaved=True),
    "falcon": _f("falcon", f"falcon.py {_HALF}"),
    "starcoder2": _f("starcoder2", f"starcoder2.py {_HALF}"),
    "granite": _f("granite", f"granite.py {_HALF}"),
    "helium": _f("helium", "helium.py rotate_half on x[..., 0::2]", rope_theta=100000.0,
                 head_dim=128, interleaved=True),
    "ernie4_5": _f("ernie4_5", "ernie4_5.py rotate_half on x[..., 0::2]", rope_theta=500000.0,
                   head_dim=128, interleaved=True),
}
# composite configs name the wrapper; the text model's family holds the facts
_WRAPPERS = {"llama4": "llama4_text", "qwen2_vl": "qwen2_vl_text", "qwen2_5_vl": "qwen2_5_vl_text",
             "qwen3_vl": "qwen3_vl_text", "gemma3": "gemma3_text", "gemma4": "gemma4_text",
             "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


def family_of(model_type) -> Family | None:
    """The :class:`Family` of ``model_type``: :data:`GENERIC` for None, None when unknown."""
    if model_type is None:
        return GENERIC
    model_type = str(model_type)
    return FAMILIES.get(_WRAPPERS.get(model_type, model_type))
