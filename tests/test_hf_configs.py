"""Published model configs (tests/hf_configs.py) against transformers' own code.

For every config and every layer type the family has: build the family's
config class from the dict, instantiate the family's RotaryEmbedding module,
and compare with ``rope_config_from_hf``:

* ``inv_freq`` to float32 rounding (HF computes the table in float32),
* the attention scale (read off HF's cos at position 0) to 1e-6,
* cuprope's rotated q, k (NumPy backend, float32 inputs) against a float64
  truth: HF's apply function run in float64 on cos/sin from cuprope's float64
  table (the cos/sin layout is checked against HF's module first),
* HF's apply function on HF's own float32 cos/sin against cuprope's output,
  within float32 angle error — a wrong pair layout fails here by O(1).

Positions reach 1e5. transformers and torch are test-only dependencies; the
module skips without them.
"""
import importlib
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
transformers = pytest.importorskip(
    "transformers", reason="transformers is a test-only dependency (pip install .[test])")

from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

import cuprope  # noqa: E402
from cuprope.schemes import hf_config  # noqa: E402
from hf_configs import CONFIGS  # noqa: E402
from oracle import assert_matches  # noqa: E402

EPS32 = 2.0 ** -24


@dataclass(frozen=True)
class Fam:
    """How transformers' modelling file of a family builds and applies RoPE."""
    module: str                  # RotaryEmbedding class in modeling_<pkg>.py
    apply: str = "apply_rotary_pos_emb"
    cos_sin: str = "cat"         # cat(freqs, freqs) | half (freqs) | repeat | complex | mrope
    layout: str = "bhsd"         # how the apply function takes q: [B, H, S, D] or [B, S, H, D]
    per_type: bool = False       # forward(x, position_ids, layer_type)
    single: bool = False         # apply(x, cos, sin) on one tensor (Gemma 4)
    rot_part_only: bool = False  # the attention passes only x[..., :R] to apply (Phi, StableLM)
    deinterleaves: bool = False  # the apply returns the pairs de-interleaved (DeepSeek-V3)


FAMS = {
    "llama": Fam("LlamaRotaryEmbedding"),
    "llama4_text": Fam("Llama4TextRotaryEmbedding", "apply_rotary_emb", "complex", "bshd"),
    "qwen2": Fam("Qwen2RotaryEmbedding"),
    "qwen3": Fam("Qwen3RotaryEmbedding"),
    "qwen2_vl_text": Fam("Qwen2VLRotaryEmbedding", cos_sin="mrope"),
    "qwen3_vl_text": Fam("Qwen3VLTextRotaryEmbedding", cos_sin="mrope"),
    "deepseek_v3": Fam("DeepseekV3RotaryEmbedding", "apply_rotary_pos_emb_interleave",
                       deinterleaves=True),
    "deepseek_v2": Fam("DeepseekV2RotaryEmbedding", "apply_rotary_emb", "complex"),
    "gpt_oss": Fam("GptOssRotaryEmbedding", cos_sin="half"),
    "phi3": Fam("Phi3RotaryEmbedding"),
    "phimoe": Fam("PhimoeRotaryEmbedding"),
    "phi": Fam("PhiRotaryEmbedding", rot_part_only=True),
    "gemma2": Fam("Gemma2RotaryEmbedding"),
    "gemma3_text": Fam("Gemma3RotaryEmbedding", per_type=True),
    "gemma4_text": Fam("Gemma4TextRotaryEmbedding", per_type=True, single=True),
    "glm": Fam("GlmRotaryEmbedding"),
    "glm4": Fam("Glm4RotaryEmbedding"),
    "mistral": Fam("MistralRotaryEmbedding"),
    "mixtral": Fam("MixtralRotaryEmbedding"),
    "stablelm": Fam("StableLmRotaryEmbedding", rot_part_only=True),
    "olmo2": Fam("Olmo2RotaryEmbedding"),
    "cohere": Fam("CohereRotaryEmbedding", cos_sin="repeat"),
}
FAMS.update({  # families of cuprope.schemes.hf_families without a published config above
    "qwen2_moe": Fam("Qwen2MoeRotaryEmbedding"), "qwen3_moe": Fam("Qwen3MoeRotaryEmbedding"),
    "qwen2_5_vl_text": Fam("Qwen2_5_VLRotaryEmbedding", cos_sin="mrope"),
    "gemma": Fam("GemmaRotaryEmbedding"), "olmo": Fam("OlmoRotaryEmbedding"),
    "olmo3": Fam("Olmo3RotaryEmbedding", per_type=True),
    "cohere2": Fam("Cohere2RotaryEmbedding", cos_sin="repeat"),
    "gpt_neox": Fam("GPTNeoXRotaryEmbedding"), "falcon": Fam("FalconRotaryEmbedding"),
    "starcoder2": Fam("Starcoder2RotaryEmbedding"), "granite": Fam("GraniteRotaryEmbedding"),
    "helium": Fam("HeliumRotaryEmbedding"), "ernie4_5": Fam("Ernie4_5RotaryEmbedding"),
    "glm4_moe": Fam("Glm4MoeRotaryEmbedding"),
    "qwen3_next": Fam("Qwen3NextRotaryEmbedding"),
    "qwen3_5_text": Fam("Qwen3_5TextRotaryEmbedding", cos_sin="mrope"),
    "qwen3_5_moe_text": Fam("Qwen3_5MoeTextRotaryEmbedding", cos_sin="mrope"),
})
FAMS["qwen2_vl"] = FAMS["qwen2_vl_text"]  # Qwen2-VL's published config is flat
_PKG = {"llama4_text": "llama4", "qwen2_vl_text": "qwen2_vl", "qwen3_vl_text": "qwen3_vl",
        "gemma3_text": "gemma3", "gemma4_text": "gemma4", "qwen2_5_vl_text": "qwen2_5_vl",
        "qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
# Every family of cuprope.schemes.hf_families (but GPT-J, which has no rotary module) from a config
# that states almost nothing: the family defaults decide. "+linear" also states rope_theta
# and a linear rope_scaling (Gemma 3, OLMo 3: full-attention layers only).
_PROBE = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8,
          "num_hidden_layers": 12}
PROBES = {f"probe:{t}": {"model_type": t, **_PROBE} for t in FAMS if t not in ("qwen2_vl",)}
PROBES.update({f"{k}+linear": {**v, "rope_theta": 20000.0,
                               "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
               for k, v in list(PROBES.items())
               # Phi-3 and PhiMoE classes take longrope only; Gemma 4 fails in HF with rope_scaling
               if k not in ("probe:phimoe", "probe:phi3", "probe:gemma4_text")})
ALL = {**CONFIGS, **PROBES}

# configs whose table depends on the sequence length: both sides of the original context
SEQ_DEPENDENT = {"Phi-3.5-mini-instruct", "Phi-3.5-MoE-instruct"}
# transformers 5.23 PhimoeRotaryEmbedding.forward recomputes inv_freq with rope_init_fn(config),
# without seq_len: short_factor at every length (with long_mscale past the original context);
# the long_factor table its dynamic update puts in the inv_freq buffer goes unused. cuprope
# follows LongRoPE there (long_factor, as HF's Phi-3 module, vLLM and transformers 4.x phimoe).
HF_PHIMOE_SHORT_ONLY = {("Phi-3.5-MoE-instruct", "long")}


def text_type(conf):
    return (conf.get("text_config") or conf)["model_type"]


def modeling(conf):
    t = text_type(conf)
    pkg = _PKG.get(t, t)
    return importlib.import_module(f"transformers.models.{pkg}.modeling_{pkg}")


def hf_text_config(conf):
    kw = {k: v for k, v in conf.items() if k != "model_type"}
    return CONFIG_MAPPING[conf["model_type"]](**kw).get_text_config()


def hf_layer_types(conf):
    types = getattr(hf_text_config(conf), "layer_types", None)
    return sorted(set(types)) if FAMS[text_type(conf)].per_type else [None]


def cases():
    out = []
    for name, conf in ALL.items():
        for lt in hf_layer_types(conf):
            for regime in (("short", "long") if name in SEQ_DEPENDENT else ("long",)):
                out.append(pytest.param(name, lt, regime, id=f"{name}-{lt or 'all'}-{regime}"))
    return out


def positions(conf, regime, rng, n=48):
    """Positions [S] (or [3, S] for MRoPE), including 0; 'long' reaches 99999."""
    top = 4000 if regime == "short" else 99_999
    p = np.concatenate([[0, 1, 2, 7], rng.integers(0, top, n - 5), [top]]).astype(np.int64)
    if FAMS[text_type(conf)].cos_sin == "mrope":
        p = np.stack([p, rng.integers(0, top, p.size), rng.integers(0, top, p.size)])
        p[:, 0] = 0
    return p


def cos_sin(fam, module, pos, inv, scale, dtype):
    """The module's cos/sin (or complex freqs) format, built from ``inv`` in ``dtype``."""
    pos_t = torch.as_tensor(pos)[..., None, :].to(dtype)          # [1, S] or [3, 1, S]
    freqs = pos_t[..., None] * torch.tensor(np.array(inv), dtype=dtype)  # [..., S, R/2]
    if fam.cos_sin == "complex":
        return (torch.polar(torch.ones_like(freqs), freqs) * scale,)
    if fam.cos_sin == "mrope":
        c, s = freqs.cos() * scale, freqs.sin() * scale
        return module.recomposition_frequencies(c), module.recomposition_frequencies(s)
    emb = {"cat": lambda f: torch.cat((f, f), -1), "half": lambda f: f,
           "repeat": lambda f: torch.repeat_interleave(f, 2, -1)}[fam.cos_sin](freqs)
    return emb.cos() * scale, emb.sin() * scale


def hf_apply(fam, apply, q, k, tables, rot_dim):
    """HF's apply function on torch q, k in the family's layout."""
    if fam.rot_part_only:
        (qr, kr), rest = hf_apply(Fam(fam.module), apply, q[..., :rot_dim], k[..., :rot_dim],
                                  tables, rot_dim), (q[..., rot_dim:], k[..., rot_dim:])
        return torch.cat([qr, rest[0]], -1), torch.cat([kr, rest[1]], -1)
    if fam.single:
        return apply(q, *tables), apply(k, *tables)
    return apply(q, k, *tables)


def hf_module_output(fam, module, pos, layer_type):
    x = torch.zeros(1, dtype=torch.float32)
    pos_t = torch.as_tensor(pos)[..., None, :]
    out = module(x, pos_t, layer_type) if fam.per_type else module(x, pos_t)
    return out if isinstance(out, tuple) else (out,)


def hf_inv_freq(module, layer_type):
    name = "inv_freq" if layer_type is None else f"{layer_type}_inv_freq"
    return getattr(module, name).double().numpy()


def as_np(t):
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.detach().double().numpy()


def same_format(mine, hf_out):
    for a, b in zip(mine, hf_out, strict=True):
        np.testing.assert_allclose(as_np(a), as_np(b), atol=2e-6, rtol=0, err_msg="cos/sin format")


@pytest.mark.parametrize("name,layer_type,regime", cases())
def test_config_matches_transformers(name, layer_type, regime, rng):
    conf = ALL[name]
    fam = FAMS[text_type(conf)]
    mod = modeling(conf)
    module = getattr(mod, fam.module)(hf_text_config(conf))
    apply = getattr(mod, fam.apply)
    pos = positions(conf, regime, rng)
    seq_len = int(pos.max()) + 1
    cfg = hf_config.rope_config_from_hf(conf, layer_type=layer_type, seq_len=seq_len,
                                        layout=fam.layout)
    hf_out = hf_module_output(fam, module, pos, layer_type)  # runs HF's dynamic update

    # the table, to float32 rounding
    inv_hf = hf_inv_freq(module, layer_type)
    np.testing.assert_allclose(cfg.inv_freq, inv_hf, rtol=1e-6, atol=0, err_msg="inv_freq")
    # the scale: HF's cos at position 0 is the scale, rounded to float32
    first = hf_out[0][..., 0, 0] if fam.cos_sin != "complex" else hf_out[0].real[..., 0, 0]
    assert abs(cfg.scale - float(first.flatten()[0])) <= 1e-6 * cfg.scale, (cfg.scale, first)
    # our reading of the module's cos/sin format reproduces it from its own table
    used = inv_hf
    if (name, regime) in HF_PHIMOE_SHORT_ONLY:
        used = module.original_inv_freq.double().numpy()  # the short_factor table
        assert not np.allclose(used, inv_hf, rtol=1e-3)
    same_format(cos_sin(fam, module, pos, used, float(first.flatten()[0]), torch.float32), hf_out)

    d = cfg.rotary_dim
    head = int(hf_config.hf_rope_parameters(conf, layer_type=layer_type)["head_dim"])
    s = pos.shape[-1]
    shape = (1, 2, s, head) if fam.layout == "bhsd" else (1, s, 2, head)
    q = rng.standard_normal(shape).astype(np.float32)
    k = rng.standard_normal(shape).astype(np.float32)
    xmax = float(max(np.abs(q).max(), np.abs(k).max()))
    oq, ok = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    oq, ok = np.asarray(oq, np.float64), np.asarray(ok, np.float64)

    # float64 truth: HF's apply on cos/sin from cuprope's float64 table
    tables64 = cos_sin(fam, module, pos, cfg.inv_freq, cfg.scale, torch.float64)
    tq, tk = hf_apply(fam, apply, torch.as_tensor(q, dtype=torch.float64),
                      torch.as_tensor(k, dtype=torch.float64), tables64, d)
    perm = np.arange(head)
    if fam.deinterleaves:  # HF returns (x0', x2', …, x1', x3', …): the same q·k
        perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2), np.arange(d, head)])
    assert_matches(oq[..., perm], as_np(tq), xmax, "float32", cfg.scale)
    assert_matches(ok[..., perm], as_np(tk), xmax, "float32", cfg.scale)

    if (name, regime) in HF_PHIMOE_SHORT_ONLY:
        return  # HF's module rotates with its short table here (see HF_PHIMOE_SHORT_ONLY)
    # HF end to end in float32 (its own cos/sin): agrees within float32 angle error
    hq, hk = hf_apply(fam, apply, torch.as_tensor(q), torch.as_tensor(k), hf_out, d)
    p_axis = pos if pos.ndim == 1 else pos.max(0)
    span = (1.0 + p_axis * float(np.max(cfg.inv_freq))) * EPS32 * 16 + 1e-6
    bound = span[:, None] if fam.layout == "bhsd" else span[:, None, None]
    for ours, theirs in ((oq[..., perm], hq), (ok[..., perm], hk)):
        err = np.abs(ours - as_np(theirs))
        assert np.all(err <= bound * xmax * max(1.0, cfg.scale)), float(err.max())


@pytest.mark.parametrize("seq_len", [None, 4096, 4097, 100_000])
def test_phimoe_long_factor_and_mscale_match_hf_init_function(seq_len):
    """Where HF's Phi-3.5-MoE module does not use its long table, its init function
    (ROPE_INIT_FUNCTIONS["longrope"], which the module's dynamic update calls) is the
    reference for the table, and the module's long_mscale / short_mscale for the scale."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    conf = CONFIGS["Phi-3.5-MoE-instruct"]
    hf = hf_text_config(conf)
    inv, att = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=seq_len)
    cfg = hf_config.rope_config_from_hf(conf, seq_len=seq_len)
    np.testing.assert_allclose(cfg.inv_freq, inv.double().numpy(), rtol=1e-6, atol=0)
    # the computed attention factor is sqrt(1 + ln 32 / ln 4096); the mscales replace it
    assert att == pytest.approx(np.sqrt(1 + np.log(32) / np.log(4096)))
    assert cfg.scale == conf["rope_scaling"]["short_mscale"] != pytest.approx(att, rel=1e-3)
    module = modeling(conf).PhimoeRotaryEmbedding(hf)
    pos = torch.arange(seq_len or 8)[None]
    cos, _ = module(torch.zeros(1), pos)
    assert float(cos[0, 0, 0]) == pytest.approx(cfg.scale, rel=1e-7)
