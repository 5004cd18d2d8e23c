"""CPU tests of cuprope.scaling: every frequency scheme's table and scale.

Expectations are computed here, element by element with ``math``, from the
published formulas (HF transformers' ``modeling_rope_utils``, Qwen2-VL /
Qwen3-VL modelling, ANCHORS.md); the multimodal schemes are checked end to end
against HF's way of building cos/sin (split + recompose, then rotate_half).
Model configs are the fields of the models' ``config.json`` files.
"""
import math

import numpy as np
import pytest

import cuprope
from cuprope import RopeConfig, rope_backward, rope_forward, scaling
from oracle import assert_matches, expected

REL = 1e-12


def close(a, b, rel=REL):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=rel, atol=0)


# --------------------------------------------------------------------------- published formulas

def f_default(dim, base):
    return [1.0 / base ** (i / dim) for i in range(0, dim, 2)]


def f_linear(dim, base, factor):
    return [t / factor for t in f_default(dim, base)]


def f_dynamic(dim, base, factor, max_pos, seq_len):
    seq_len = seq_len if seq_len is not None and seq_len > max_pos else max_pos
    base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return f_default(dim, base)


def f_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def f_yarn(dim, base, factor, orig, *, max_pos=None, beta_fast=32, beta_slow=1, mscale=None,
           mscale_all_dim=None, attention_factor=None, truncate=True):
    if factor is None:
        factor = max_pos / orig
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = f_mscale(factor, mscale) / f_mscale(factor, mscale_all_dim)
        else:
            attention_factor = f_mscale(factor)

    def corr(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for j in range(dim // 2):
        pos_freq = base ** (2 * j / dim)
        ramp = min(max((j - low) / (high - low), 0.0), 1.0)
        extrapolation_weight = 1 - ramp
        out.append(1 / (factor * pos_freq) * (1 - extrapolation_weight)
                   + 1 / pos_freq * extrapolation_weight)
    return out, attention_factor


def f_longrope(dim, base, short, long, orig, *, max_pos=None, factor=None, attention_factor=None,
               seq_len=None):
    if factor is None and max_pos is not None:
        factor = max_pos / orig
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = long if (seq_len and seq_len > orig) else short
    return [1.0 / (ext[i // 2] * base ** (i / dim)) for i in range(0, dim, 2)], attention_factor


def f_llama3(dim, base, factor, low_ff, high_ff, orig):
    out = []
    for f in f_default(dim, base):
        wavelen = 2 * math.pi / f
        if wavelen < orig / high_ff:
            out.append(f)
        elif wavelen > orig / low_ff:
            out.append(f / factor)
        else:
            s = (orig / wavelen - low_ff) / (high_ff - low_ff)
            out.append((1 - s) * f / factor + s * f)
    return out


def f_proportional(head_dim, base, prf, factor=1.0):
    n = int(prf * head_dim // 2)
    rot = [1.0 / base ** (i / head_dim) for i in range(0, 2 * n, 2)]
    return [v / factor for v in rot + [0.0] * (head_dim // 2 - n)]


# --------------------------------------------------------------------------- per-scheme tables

@pytest.mark.parametrize("dim,base", [(128, 10000.0), (64, 500000.0), (96, 1e6), (2, 10.0)])
def test_default_and_linear(dim, base):
    inv, s = scaling.default_table(dim, base)
    close(inv, f_default(dim, base))
    assert s == 1.0
    close(inv, cuprope.default_inv_freq(dim, base))
    inv, s = scaling.linear_table(dim, base, 4.0)
    close(inv, f_linear(dim, base, 4.0))
    assert s == 1.0


@pytest.mark.parametrize("seq_len", [None, 100, 4095, 4096, 4097, 9000, 131072])
@pytest.mark.parametrize("factor", [2.0, 1.3, 8.0])
def test_dynamic_ntk_on_both_sides_of_the_original_context(seq_len, factor):
    inv, s = scaling.dynamic_ntk_table(128, 10000.0, factor, 4096, seq_len)
    close(inv, f_dynamic(128, 10000.0, factor, 4096, seq_len))
    assert s == 1.0
    default = np.array(f_default(128, 10000.0))
    if seq_len is None or seq_len <= 4096:
        close(inv, default, rel=1e-14)  # the base is unchanged up to the original context
    else:
        assert np.all(inv[1:] < default[1:])  # a larger base: every pair but the first slows down
        assert inv[0] == 1.0


YARN_CASES = {
    # Qwen2.5-7B-Instruct's documented yarn block
    "qwen2.5": dict(dim=128, base=1e6, factor=4.0, orig=32768),
    # DeepSeek-V3: mscale == mscale_all_dim → attention factor 1
    "deepseek-v3": dict(dim=64, base=10000.0, factor=40.0, orig=4096, mscale=1.0, mscale_all_dim=1.0),
    "mscale-ratio": dict(dim=64, base=10000.0, factor=40.0, orig=4096, mscale=0.707, mscale_all_dim=1.0),
    # gpt-oss style: truncate False, large base
    "no-truncate": dict(dim=64, base=150000.0, factor=32.0, orig=4096, truncate=False),
    # low == high (beta_fast == beta_slow, not truncated): HF's +0.001
    "low==high": dict(dim=128, base=10000.0, factor=8.0, orig=4096, beta_fast=4.0, beta_slow=4.0,
                      truncate=False),
    # both ends clamped to 0 (a tiny original context): high < low after clamping
    "clamped": dict(dim=32, base=10000.0, factor=2.0, orig=8, beta_fast=32, beta_slow=16),
    "factor-from-max-pos": dict(dim=128, base=1e6, factor=None, orig=32768, max_pos=131072),
    "explicit-attention": dict(dim=128, base=1e6, factor=4.0, orig=32768, attention_factor=0.75),
    "factor<=1": dict(dim=64, base=10000.0, factor=1.0, orig=4096),
    "betas": dict(dim=96, base=10000.0, factor=16.0, orig=2048, beta_fast=16.0, beta_slow=2.0),
    # corr(beta_slow) past dim - 1: high is clamped to dim - 1
    "high-clamped": dict(dim=32, base=10.0, factor=4.0, orig=1_000_000, beta_fast=40000.0),
    # mscale without mscale_all_dim: HF falls back to 0.1·ln(factor) + 1
    "mscale-only": dict(dim=64, base=10000.0, factor=40.0, orig=4096, mscale=0.707),
}


@pytest.mark.parametrize("case", list(YARN_CASES))
def test_yarn(case):
    c = dict(YARN_CASES[case])
    dim, base, factor, orig = c.pop("dim"), c.pop("base"), c.pop("factor"), c.pop("orig")
    max_pos = c.pop("max_pos", None)
    want, want_s = f_yarn(dim, base, factor, orig, max_pos=max_pos, **c)
    inv, s = scaling.yarn_table(dim, base, factor, original_max_position_embeddings=orig,
                                max_position_embeddings=max_pos, **c)
    close(inv, want)
    assert s == pytest.approx(want_s, rel=1e-15)
    if case == "deepseek-v3":
        assert s == 1.0
    if case == "qwen2.5":
        assert s == pytest.approx(0.1 * math.log(4) + 1)
        # the first pairs keep their frequency, the last ones are divided by the factor
        theta = np.array(f_default(dim, base))
        assert inv[0] == theta[0]
        close(inv[-1], theta[-1] / 4.0)
    if case == "factor<=1":
        assert s == 1.0


def test_yarn_low_equal_high_really_is_degenerate():
    dim, base, orig = 128, 10000.0, 4096
    corr = dim * math.log(orig / (4.0 * 2 * math.pi)) / (2 * math.log(base))
    inv, _ = scaling.yarn_table(dim, base, 8.0, original_max_position_embeddings=orig,
                                beta_fast=4.0, beta_slow=4.0, truncate=False)
    theta = np.array(f_default(dim, base))
    j = np.arange(dim // 2)
    # a step of width 0.001 at the correction dim: extrapolation below, interpolation above
    close(inv[j < corr], theta[j < corr])
    close(inv[j > corr + 0.001], theta[j > corr + 0.001] / 8.0)


def test_yarn_truncate_changes_the_table():
    a, _ = scaling.yarn_table(64, 150000.0, 32.0, original_max_position_embeddings=4096)
    b, _ = scaling.yarn_table(64, 150000.0, 32.0, original_max_position_embeddings=4096,
                              truncate=False)
    assert not np.allclose(a, b)


PHI3_RNG = np.random.default_rng(3)
PHI3_SHORT = list(PHI3_RNG.uniform(1.0, 3.0, 48))
PHI3_LONG = list(PHI3_RNG.uniform(1.0, 60.0, 48))


@pytest.mark.parametrize("seq_len", [None, 1, 4096, 4097, 131072])
@pytest.mark.parametrize("kind", ["phi3", "factor<=1", "explicit-factor", "explicit-attention"])
def test_longrope_picks_factors_by_sequence_length(kind, seq_len):
    kw = {"phi3": dict(max_pos=131072), "factor<=1": dict(max_pos=4096),
          "explicit-factor": dict(factor=8.0), "explicit-attention": dict(attention_factor=1.5)}[kind]
    want, want_s = f_longrope(96, 10000.0, PHI3_SHORT, PHI3_LONG, 4096, **kw, seq_len=seq_len)
    api_kw = {{"max_pos": "max_position_embeddings"}.get(k, k): v for k, v in kw.items()}
    inv, s = scaling.longrope_table(96, 10000.0, PHI3_SHORT, PHI3_LONG,
                                    original_max_position_embeddings=4096, seq_len=seq_len, **api_kw)
    close(inv, want)
    assert s == pytest.approx(want_s, rel=1e-15)
    if kind == "factor<=1":
        assert s == 1.0
    if kind == "phi3":
        assert s == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    used = PHI3_LONG if (seq_len or 0) > 4096 else PHI3_SHORT
    close(inv * np.array(used), f_default(96, 10000.0))


@pytest.mark.parametrize("case", ["llama3.1", "llama3.2", "low==high", "wide-band"])
def test_llama3(case):
    dim, base, factor, lf, hf, orig = {
        "llama3.1": (128, 500000.0, 8.0, 1.0, 4.0, 8192),
        "llama3.2": (64, 500000.0, 32.0, 1.0, 4.0, 8192),
        "low==high": (128, 500000.0, 8.0, 2.0, 2.0, 8192),
        "wide-band": (128, 10000.0, 4.0, 0.5, 64.0, 2048),
    }[case]
    inv, s = scaling.llama3_table(dim, base, factor, lf, hf, orig)
    assert s == 1.0
    assert np.all(np.isfinite(inv))
    close(inv, f_llama3(dim, base, factor, lf, hf, orig))
    theta = np.array(f_default(dim, base))
    wavelen = 2 * np.pi / theta
    kept, divided = wavelen < orig / hf, wavelen > orig / lf
    close(inv[kept], theta[kept])
    close(inv[divided], theta[divided] / factor)
    if case == "llama3.1":
        band = ~kept & ~divided
        assert band.sum() > 0 and kept.sum() > 0 and divided.sum() > 0
        r = inv[band] / theta[band]
        assert np.all((r > 1 / factor) & (r < 1)) and np.all(np.diff(r) < 0)
    if case == "low==high":
        assert not np.any(~kept & ~divided)  # no smooth band


@pytest.mark.parametrize("prf,factor", [(0.25, 1.0), (0.5, 2.0), (1.0, 1.0), (0.0, 1.0)])
def test_proportional(prf, factor):
    inv, s = scaling.proportional_table(256, 1e6, prf, factor)
    close(inv, f_proportional(256, 1e6, prf, factor))
    assert s == 1.0 and inv.shape == (128,)


# --------------------------------------------------------------------------- HF configs

LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN25_7B_YARN = {
    "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}
PHI3_MINI_128K = {
    "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_attention_heads": 16,
    "qk_rope_head_dim": 64, "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
}
GPT_OSS = {
    "model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "head_dim": 64,
    "max_position_embeddings": 131072, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
}
PHI2 = {"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
        "partial_rotary_factor": 0.4, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "rope_scaling": None}
GPT_NEOX_20B = {"model_type": "gpt_neox", "hidden_size": 6144, "num_attention_heads": 64,
                "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048}
GPT_J = {"model_type": "gptj", "n_embd": 4096, "hidden_size": 4096, "num_attention_heads": 16,
         "rotary_dim": 64, "max_position_embeddings": 2048}
LLAMA2_LINEAR = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
                 "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}}
DYNAMIC = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 4096,
           "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
HF5_ROPE_PARAMETERS = {"hidden_size": 2048, "num_attention_heads": 16, "head_dim": 128,
                       "max_position_embeddings": 40960,
                       "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                           "original_max_position_embeddings": 10240,
                                           "partial_rotary_factor": 0.5}}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8,
          "head_dim": 256, "max_position_embeddings": 131072,
          "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                 "rope_theta": 1000000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
QWEN2_VL_7B = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
               "max_position_embeddings": 32768, "rope_theta": 1000000.0,
               "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
               "vision_config": {"embed_dim": 1280, "num_heads": 16}}
QWEN3_VL_8B = {"model_type": "qwen3_vl",
               "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096,
                               "num_attention_heads": 32, "head_dim": 128,
                               "max_position_embeddings": 262144, "rope_theta": 5000000,
                               "rope_scaling": {"mrope_interleaved": True,
                                                "mrope_section": [24, 20, 20],
                                                "rope_type": "default"}},
               "vision_config": {"hidden_size": 1152, "num_heads": 16}}


def test_llama31_8b():
    cfg = scaling.rope_config_from_hf(LLAMA31_8B)
    assert cfg.rotary_dim == 128 and cfg.scale == 1.0 and not cfg.interleaved
    close(cfg.inv_freq, f_llama3(128, 500000.0, 8.0, 1.0, 4.0, 8192))


def test_qwen25_yarn_and_legacy_type_key():
    cfg = scaling.rope_config_from_hf(QWEN25_7B_YARN)
    want, s = f_yarn(128, 1e6, 4.0, 32768)
    close(cfg.inv_freq, want)
    assert cfg.scale == pytest.approx(s, rel=1e-15)
    renamed = dict(QWEN25_7B_YARN, rope_scaling={**QWEN25_7B_YARN["rope_scaling"], "rope_type": "yarn"})
    del renamed["rope_scaling"]["type"]
    np.testing.assert_array_equal(scaling.rope_config_from_hf(renamed).inv_freq, cfg.inv_freq)


@pytest.mark.parametrize("seq_len", [None, 4096, 4097, 131072])
def test_phi3_longrope_from_config(seq_len):
    cfg = scaling.rope_config_from_hf(PHI3_MINI_128K, seq_len=seq_len)
    want, s = f_longrope(96, 10000.0, PHI3_SHORT, PHI3_LONG, 4096, max_pos=131072, seq_len=seq_len)
    close(cfg.inv_freq, want)
    assert cfg.scale == pytest.approx(s, rel=1e-15) and cfg.rotary_dim == 96


def test_phi3_su_alias():
    cfg = dict(PHI3_MINI_128K, rope_scaling={**PHI3_MINI_128K["rope_scaling"], "type": "su"})
    np.testing.assert_array_equal(scaling.rope_config_from_hf(cfg).inv_freq,
                                  scaling.rope_config_from_hf(PHI3_MINI_128K).inv_freq)


@pytest.mark.parametrize("conf,kw", [(DEEPSEEK_V3, dict(mscale=1.0, mscale_all_dim=1.0)),
                                     (DEEPSEEK_V2_LITE, dict(mscale=0.707, mscale_all_dim=1.0))])
def test_deepseek_yarn_uses_the_rope_head_dim_and_mscale(conf, kw):
    cfg = scaling.rope_config_from_hf(conf)
    want, s = f_yarn(64, 10000.0, 40.0, 4096, **kw)
    assert cfg.rotary_dim == 64
    close(cfg.inv_freq, want)
    assert cfg.scale == pytest.approx(s, rel=1e-15)
    if kw["mscale"] == 1.0:
        assert cfg.scale == 1.0
    else:
        assert cfg.scale == pytest.approx((0.1 * 0.707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))


def test_gpt_oss_yarn_without_truncation():
    cfg = scaling.rope_config_from_hf(GPT_OSS)
    want, s = f_yarn(64, 150000.0, 32.0, 4096, truncate=False)
    close(cfg.inv_freq, want)
    assert cfg.scale == pytest.approx(s, rel=1e-15)


@pytest.mark.parametrize("conf,dim,base", [(PHI2, 32, 10000.0), (GPT_NEOX_20B, 24, 10000.0),
                                           (GPT_J, 64, 10000.0)])
def test_partial_rotary(conf, dim, base):
    cfg = scaling.rope_config_from_hf(conf)
    assert cfg.rotary_dim == dim
    close(cfg.inv_freq, f_default(dim, base))


def test_linear_and_dynamic_from_config():
    close(scaling.rope_config_from_hf(LLAMA2_LINEAR).inv_freq, f_linear(128, 10000.0, 4.0))
    for seq_len in (None, 4096, 16384):
        close(scaling.rope_config_from_hf(DYNAMIC, seq_len=seq_len).inv_freq,
              f_dynamic(128, 10000.0, 2.0, 4096, seq_len))


def test_hf5_rope_parameters_with_theta_and_partial_inside():
    cfg = scaling.rope_config_from_hf(HF5_ROPE_PARAMETERS)
    want, s = f_yarn(64, 1e6, 4.0, 10240)
    assert cfg.rotary_dim == 64
    close(cfg.inv_freq, want)
    assert cfg.scale == pytest.approx(s)


def test_per_layer_type_parameters():
    full = scaling.rope_config_from_hf(GEMMA3, layer_type="full_attention")
    local = scaling.rope_config_from_hf(GEMMA3, layer_type="sliding_attention")
    close(full.inv_freq, f_linear(256, 1e6, 8.0))
    close(local.inv_freq, f_default(256, 10000.0))
    with pytest.raises(ValueError, match="per layer type .* pass layer_type="):
        scaling.rope_config_from_hf(GEMMA3)
    with pytest.raises(ValueError, match="layer_type 'chunked' has no RoPE parameters"):
        scaling.rope_config_from_hf(GEMMA3, layer_type="chunked")


def test_gemma4_style_proportional():
    conf = {"hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional",
                                                   "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1000000.0}}}
    cfg = scaling.rope_config_from_hf(conf, layer_type="full_attention", head_dim=512)
    assert cfg.rotary_dim == 512
    close(cfg.inv_freq, f_proportional(512, 1e6, 0.25))


def test_bare_rope_dict_and_config_objects():
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    cfg = scaling.rope_config_from_hf(rope, head_dim=128)
    np.testing.assert_array_equal(cfg.inv_freq, scaling.rope_config_from_hf(LLAMA31_8B).inv_freq)
    with pytest.raises(ValueError, match="pass head_dim="):
        scaling.rope_config_from_hf(rope)

    class Obj:  # a transformers-like config object
        def to_dict(self):
            return dict(QWEN25_7B_YARN)

    np.testing.assert_array_equal(scaling.rope_config_from_hf(Obj()).inv_freq,
                                  scaling.rope_config_from_hf(QWEN25_7B_YARN).inv_freq)


def test_layout_interleaved_and_head_dim_override_pass_through():
    cfg = scaling.rope_config_from_hf(LLAMA31_8B, layout="thd", interleaved=True, head_dim=64)
    assert cfg.layout == "thd" and cfg.interleaved and cfg.rotary_dim == 64
    close(cfg.inv_freq, f_llama3(64, 500000.0, 8.0, 1.0, 4.0, 8192))


def test_hf_config_errors():
    with pytest.raises(ValueError, match="unknown rope_type 'weird'"):
        scaling.rope_config_from_hf(dict(LLAMA2_LINEAR, rope_scaling={"type": "weird", "factor": 2.0}))
    with pytest.raises(ValueError, match="cannot tell the head dim"):
        scaling.rope_config_from_hf({"rope_theta": 10000.0})
    with pytest.raises(ValueError, match=r"int\(80 \* 0.45\) = 36|must be a positive even"):
        scaling.rope_config_from_hf(dict(PHI2, partial_rotary_factor=0.4125))
    with pytest.raises(ValueError, match="linear RoPE needs 'factor'"):
        scaling.rope_config_from_hf(dict(LLAMA2_LINEAR, rope_scaling={"type": "linear"}))
    with pytest.raises(ValueError, match="llama3 RoPE needs 'low_freq_factor'"):
        scaling.rope_config_from_hf(dict(LLAMA31_8B, rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ValueError, match="dynamic RoPE needs max_position_embeddings"):
        scaling.rope_config_from_hf({"rope_type": "dynamic", "factor": 2.0}, head_dim=64)
    with pytest.raises(TypeError, match="config must be a dict"):
        scaling.rope_config_from_hf(42)


def test_scheme_argument_errors():
    with pytest.raises(ValueError, match="positive even"):
        scaling.default_table(7)
    with pytest.raises(TypeError, match="dim must be an int"):
        scaling.default_table(8.0)
    with pytest.raises(ValueError, match="base must be a positive finite"):
        scaling.default_table(8, 0.0)
    with pytest.raises(ValueError, match="factor must be a positive finite"):
        scaling.linear_table(8, 10000.0, 0.0)
    with pytest.raises(ValueError, match="dim > 2"):
        scaling.dynamic_ntk_table(2, 10000.0, 2.0, 4096, 9000)
    with pytest.raises(ValueError, match="base must not be 1"):
        scaling.yarn_table(8, 1.0, 2.0, original_max_position_embeddings=4096)
    with pytest.raises(ValueError, match="give factor, or max_position_embeddings"):
        scaling.yarn_table(8, 10000.0, None, original_max_position_embeddings=4096)
    with pytest.raises(ValueError, match=r"short_factor must have dim/2 = 4 entries"):
        scaling.longrope_table(8, 10000.0, [1.0] * 3, [1.0] * 4, original_max_position_embeddings=16,
                               factor=2.0)
    with pytest.raises(ValueError, match=r"long_factor entries must be positive"):
        scaling.longrope_table(8, 10000.0, [1.0] * 4, [1.0, 0.0, 1.0, 1.0],
                               original_max_position_embeddings=16, factor=2.0, seq_len=17)
    with pytest.raises(ValueError, match="high_freq_factor .* must be >= low_freq_factor"):
        scaling.llama3_table(8, 10000.0, 8.0, 4.0, 1.0, 8192)
    with pytest.raises(ValueError, match=r"partial_rotary_factor must be in \[0, 1\]"):
        scaling.proportional_table(8, 10000.0, 1.5)


# --------------------------------------------------------------------------- multimodal

def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def hf_qwen2vl(x, pos3, inv_freq, section, scale=1.0):
    """Qwen2VLRotaryEmbedding + apply_rotary_pos_emb. x [S, H, D], pos3 [3, S]."""
    freqs = pos3[:, :, None].astype(np.float64) * inv_freq[None, None, :]     # [3, S, D/2]
    bounds = np.cumsum(section)[:-1]
    pieces = np.split(freqs, bounds, axis=-1)
    freq = np.concatenate([m[i % 3] for i, m in enumerate(pieces)], axis=-1)  # [S, D/2]
    emb = np.concatenate([freq, freq], axis=-1)[:, None, :]
    return x * np.cos(emb) * scale + rotate_half(x) * np.sin(emb) * scale


def hf_qwen3vl(x, pos3, inv_freq, section, scale=1.0):
    """Qwen3VLTextRotaryEmbedding.recomposition_frequencies + apply_rotary_pos_emb."""
    freqs = pos3[:, :, None].astype(np.float64) * inv_freq[None, None, :]
    freqs_thw = freqs[0].copy()
    for dim, offset in enumerate((1, 2), start=1):
        length = section[dim] * 3
        idx = slice(offset, length, 3)
        freqs_thw[..., idx] = freqs[dim, ..., idx]
    emb = np.concatenate([freqs_thw, freqs_thw], axis=-1)[:, None, :]
    return x * np.cos(emb) * scale + rotate_half(x) * np.sin(emb) * scale


def hf_vision(x, hw, head_dim, base=10000.0):
    """Qwen2-VL vision: VisionRotaryEmbedding(D/2), rot_pos_emb, apply_rotary_pos_emb_vision."""
    dim = head_dim // 2
    inv = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)       # [D/4]
    rot = np.concatenate([hw[0][:, None] * inv, hw[1][:, None] * inv], -1)   # [T, D/2]
    emb = np.concatenate([rot, rot], -1)[:, None, :]
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def rand_pos3(rng, s):
    return rng.integers(0, 20000, (3, s)).astype(np.int64)


@pytest.mark.parametrize("with_yarn", [False, True], ids=["default", "yarn"])
def test_qwen2_vl_mrope_matches_hf_recomposition(with_yarn, rng):
    section = [16, 24, 24]
    inv, s = (scaling.yarn_table(128, 1e6, 4.0, original_max_position_embeddings=32768) if with_yarn
              else scaling.default_table(128, 1e6))
    cfg = scaling.mrope_config(section, inv, scale=s, layout="thd")
    assert cfg.n_streams == 3 and cfg.rotary_dim == 128
    x = rng.standard_normal((9, 2, 128))
    pos = rand_pos3(rng, 9)
    want = hf_qwen2vl(x, pos, inv, section, s)
    got = expected(x, cfg, positions=pos)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11)
    # and through the public API on float32 arrays, forward and backward
    x32 = x.astype(np.float32)
    xmax = float(np.abs(x32).max())
    assert_matches(rope_forward(x32, cfg, positions=pos), hf_qwen2vl(x32.astype(np.float64), pos, inv,
                                                                     section, s), xmax, "float32", s)
    back = rope_backward(rope_forward(x32, cfg, positions=pos.astype(np.int32)), cfg,
                         positions=pos.astype(np.int32))
    np.testing.assert_allclose(back / s ** 2, x32, atol=3e-6 * xmax)


def test_qwen2_vl_from_config(rng):
    cfg = scaling.rope_config_from_hf(QWEN2_VL_7B, layout="thd")
    assert cfg.stream_map.tolist() == [0] * 16 + [1] * 24 + [2] * 24
    close(cfg.inv_freq, f_default(128, 1e6))  # frequency index continues across sections
    x = rng.standard_normal((5, 1, 128))
    pos = rand_pos3(rng, 5)
    np.testing.assert_allclose(expected(x, cfg, positions=pos),
                               hf_qwen2vl(x, pos, cfg.inv_freq, [16, 24, 24]), atol=1e-11, rtol=0)


def test_mrope_equal_positions_reduce_to_1d_rope(rng):
    cfg = scaling.mrope_config([16, 24, 24], layout="thd")
    plain = RopeConfig(128, layout="thd")
    x = rng.standard_normal((6, 2, 128))
    p = rng.integers(0, 5000, 6)
    np.testing.assert_allclose(expected(x, cfg, positions=np.stack([p, p, p])),
                               expected(x, plain, positions=p), atol=1e-12, rtol=0)


@pytest.mark.parametrize("section", [[24, 20, 20], [16, 24, 24], [2, 1, 1], [10, 11, 11]])
def test_qwen3_vl_interleaved_mrope_matches_hf(section, rng):
    n = sum(section)
    cfg = scaling.interleaved_mrope_config(section, base=5e6, layout="thd")
    inv = np.array(f_default(2 * n, 5e6))
    close(cfg.inv_freq, inv)
    x = rng.standard_normal((7, 2, 2 * n))
    pos = rand_pos3(rng, 7)
    np.testing.assert_allclose(expected(x, cfg, positions=pos), hf_qwen3vl(x, pos, inv, section),
                               atol=1e-11, rtol=0)
    smap = cfg.stream_map
    j = np.arange(n)
    assert np.all(smap[(j % 3 == 1) & (j < 3 * section[1])] == 1)
    assert np.all(smap[(j % 3 == 2) & (j < 3 * section[2])] == 2)
    # HF's slices stop at the pair count, so a section larger than n/3 gets fewer pairs
    assert (smap == 1).sum() == len(range(1, min(3 * section[1], n), 3))
    assert (smap == 2).sum() == len(range(2, min(3 * section[2], n), 3))


def test_qwen3_vl_from_config_uses_text_config(rng):
    cfg = scaling.rope_config_from_hf(QWEN3_VL_8B, layout="thd")
    assert cfg.rotary_dim == 128 and cfg.n_streams == 3
    close(cfg.inv_freq, f_default(128, 5e6))
    x = rng.standard_normal((5, 1, 128))
    pos = rand_pos3(rng, 5)
    np.testing.assert_allclose(expected(x, cfg, positions=pos),
                               hf_qwen3vl(x, pos, cfg.inv_freq, [24, 20, 20]), atol=1e-11, rtol=0)
    # HF's Qwen3-VL interleaves even when the key is absent
    conf = {"model_type": "qwen3_vl", "text_config": {**QWEN3_VL_8B["text_config"],
                                                      "rope_scaling": {"mrope_section": [24, 20, 20]}}}
    np.testing.assert_array_equal(scaling.rope_config_from_hf(conf).stream_map, cfg.stream_map)


@pytest.mark.parametrize("head_dim", [80, 64, 16])
def test_qwen2_vl_vision_2d_matches_hf(head_dim, rng):
    cfg = scaling.vision2d_config(head_dim, layout="thd")
    assert cfg.rotary_dim == head_dim and cfg.n_streams == 2
    q = head_dim // 4
    close(cfg.inv_freq[:q], cfg.inv_freq[q:])  # the frequency index restarts at the second half
    assert cfg.stream_map.tolist() == [0] * q + [1] * q
    x = rng.standard_normal((11, 3, head_dim))
    hw = rng.integers(0, 64, (2, 11))
    np.testing.assert_allclose(expected(x, cfg, positions=hw), hf_vision(x, hw, head_dim),
                               atol=1e-12, rtol=0)


def test_multimodal_errors():
    with pytest.raises(ValueError, match=r"sum\(mrope_section\) = 64 entries"):
        scaling.mrope_config([16, 24, 24], np.ones(60))
    with pytest.raises(ValueError, match="non-negative ints"):
        scaling.mrope_config([16, -1, 24])
    with pytest.raises(ValueError, match="3 non-negative"):
        scaling.interleaved_mrope_config([16, 24])
    with pytest.raises(TypeError, match="sequence of 3 ints"):
        scaling.mrope_config(64)
    with pytest.raises(ValueError, match="divisible by 4"):
        scaling.vision2d_config(18)
    with pytest.raises(ValueError, match=r"sum\(mrope_section\) = 64"):
        scaling.rope_config_from_hf(dict(QWEN2_VL_7B, hidden_size=28 * 96))


# --------------------------------------------------------------------------- scale in forward/backward

@pytest.mark.parametrize("name,conf", [("qwen2.5-yarn", QWEN25_7B_YARN), ("phi3", PHI3_MINI_128K)])
def test_scale_multiplies_forward_and_backward(name, conf, rng):
    cfg = scaling.rope_config_from_hf(conf, seq_len=10000)
    assert cfg.scale != 1.0
    d = cfg.rotary_dim + 8
    x = rng.standard_normal((2, 6, 3, d)).astype(np.float32)
    pos = rng.integers(0, 10000, 6).astype(np.int32)
    xmax = float(np.abs(x).max())
    ang = pos[:, None].astype(np.float64) * cfg.inv_freq[None, :]   # [S, R/2]
    c, s = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    h = cfg.rotary_dim // 2
    x64 = x.astype(np.float64)
    for fn, sign in ((rope_forward, 1.0), (rope_backward, -1.0)):
        want = x64.copy()
        x1, x2 = x64[..., :h], x64[..., h:2 * h]
        want[..., :h] = (x1 * c - sign * x2 * s) * cfg.scale
        want[..., h:2 * h] = (x2 * c + sign * x1 * s) * cfg.scale
        assert_matches(fn(x, cfg, positions=pos), want, xmax, "float32", cfg.scale)


# --------------------------------------------------------------------------- HF itself, when installed

def test_against_installed_transformers():
    pytest.importorskip("torch", reason="needs torch: pip install torch")
    tr = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cases = [(tr.LlamaConfig, LLAMA31_8B, None), (tr.Qwen2Config, QWEN25_7B_YARN, None),
             (tr.DeepseekV3Config, DEEPSEEK_V3, None), (tr.Phi3Config, PHI3_MINI_128K, 4096),
             (tr.Phi3Config, PHI3_MINI_128K, 4097), (tr.LlamaConfig, DYNAMIC, 9000),
             (tr.LlamaConfig, LLAMA2_LINEAR, None)]
    for cls, conf, seq_len in cases:
        hf = cls(**{k: v for k, v in conf.items() if k not in ("architectures", "model_type")})
        rope_type = hf.rope_parameters["rope_type"]
        inv, att = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu", seq_len=seq_len)
        mine, s = scaling.hf_table(conf, seq_len=seq_len)
        np.testing.assert_allclose(mine, inv.double().numpy(), rtol=1e-6)  # HF computes in fp32
        assert s == pytest.approx(att, rel=1e-6), (cls.__name__, rope_type)


def test_the_public_face_carries_every_scheme_and_the_config_reader():
    from cuprope.schemes import hf_config
    from cuprope.schemes import scaling as schemes
    assert scaling is cuprope.schemes
    for mod in (schemes, hf_config):
        for name in mod.__all__:
            if name in ("ROPE_PARAMETER_KEYS", "OTHER_ROPE_KEYS"):  # hf_config's own tables
                continue
            assert getattr(scaling, name) is getattr(mod, name), name
            assert name in scaling.__all__, name
