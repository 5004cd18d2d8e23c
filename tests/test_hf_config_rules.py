"""The rules of cuprope.schemes.hf_config that are not a single table comparison: which
layer (layer_type / layer_idx), NoPE layers, the pair layout from the config or
the caller, family defaults and the refusal to guess for unknown families.

The NoPE and layer_types checks compare with transformers where it is
installed (Llama 4's attention module decides use_rope per layer index).
"""
import math

import numpy as np
import pytest

from cuprope import scaling
from cuprope.schemes import hf_config
from hf_configs import CONFIGS

GEMMA3_4B = CONFIGS["gemma-3-4b-it"]
GEMMA4 = CONFIGS["gemma-4-31B-it"]
SCOUT = CONFIGS["Llama-4-Scout-17B-16E"]
DSV3 = CONFIGS["DeepSeek-V3"]


def theta(dim, base):
    return 1.0 / base ** (np.arange(0, dim, 2) / dim)


# --------------------------------------------------------------------------- which layer

def test_gemma3_published_config_needs_a_layer_and_splits_by_type():
    with pytest.raises(ValueError, match="per layer type .* pass layer_type= or layer_idx="):
        hf_config.rope_config_from_hf(GEMMA3_4B)
    full = hf_config.rope_config_from_hf(GEMMA3_4B, layer_type="full_attention")
    local = hf_config.rope_config_from_hf(GEMMA3_4B, layer_type="sliding_attention")
    # family defaults: head_dim 256 (not 2560 // 8 = 320), rope_theta 1e6, local base 1e4
    np.testing.assert_allclose(full.inv_freq, theta(256, 1e6) / 8.0, rtol=1e-15)
    np.testing.assert_allclose(local.inv_freq, theta(256, 1e4), rtol=1e-15)
    # a stated local base is read
    conf = {**GEMMA3_4B, "text_config": {**GEMMA3_4B["text_config"], "rope_local_base_freq": 5e4}}
    np.testing.assert_allclose(hf_config.rope_config_from_hf(conf, layer_idx=0).inv_freq,
                               theta(256, 5e4), rtol=1e-15)


def test_layer_idx_picks_the_layer_type():
    types = hf_config.layer_types(GEMMA3_4B)
    assert len(types) == 34 and types[5] == "full_attention" and types[4] == "sliding_attention"
    for i in (0, 5, 33):
        by_idx = hf_config.rope_config_from_hf(GEMMA3_4B, layer_idx=i)
        by_type = hf_config.rope_config_from_hf(GEMMA3_4B, layer_type=types[i])
        np.testing.assert_array_equal(by_idx.inv_freq, by_type.inv_freq)
    with pytest.raises(ValueError, match=r"contradicts layer_types\[5\] = 'full_attention'"):
        hf_config.rope_config_from_hf(GEMMA3_4B, layer_idx=5, layer_type="sliding_attention")
    with pytest.raises(ValueError, match="layer_idx 34 is out of range for 34 layers"):
        hf_config.rope_config_from_hf(GEMMA3_4B, layer_idx=34)
    with pytest.raises(TypeError, match="layer_idx must be an int"):
        hf_config.rope_config_from_hf(GEMMA3_4B, layer_idx=1.0)


def test_gemma4_global_head_dim_for_full_attention():
    full = hf_config.rope_config_from_hf(GEMMA4, layer_idx=5)
    local = hf_config.rope_config_from_hf(GEMMA4, layer_idx=0)
    assert full.rotary_dim == 512 and local.rotary_dim == 256
    want = np.concatenate([theta(512, 1e6)[:64], np.zeros(192)])  # 25 % of the pairs turn
    np.testing.assert_allclose(full.inv_freq, want, rtol=1e-15, atol=0)
    # without global_head_dim the family default (512) applies; an explicit head_dim wins
    conf = {**GEMMA4, "text_config": {k: v for k, v in GEMMA4["text_config"].items()
                                      if k != "global_head_dim"}}
    assert hf_config.rope_config_from_hf(conf, layer_type="full_attention").rotary_dim == 512
    assert hf_config.rope_config_from_hf(GEMMA4, layer_idx=5, head_dim=256).rotary_dim == 256


def test_null_layer_type_entry_is_a_layer_without_rope():
    conf = {"model_type": "gemma4_text", "hidden_size": 1024, "num_attention_heads": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                "full_attention": None}}
    assert hf_config.rope_config_from_hf(conf, layer_idx=1) is None
    assert hf_config.hf_table(conf, layer_type="full_attention") is None
    assert hf_config.hf_rope_parameters(conf, layer_type="full_attention") is None
    assert hf_config.rope_config_from_hf(conf, layer_idx=0).rotary_dim == 256


# --------------------------------------------------------------------------- NoPE (Llama 4)

def test_llama4_nope_layers_from_the_published_default():
    # "no_rope_layers": [] → every 4th layer has no RoPE (no_rope_layer_interval 4)
    got = [hf_config.rope_config_from_hf(SCOUT, layer_idx=i) is None for i in range(48)]
    assert got == [(i + 1) % 4 == 0 for i in range(48)]
    cfg = hf_config.rope_config_from_hf(SCOUT, layer_idx=0)
    assert cfg.interleaved and cfg.rotary_dim == 128
    # by type: RoPE layers are chunked attention, the NoPE ones full attention
    assert hf_config.rope_config_from_hf(SCOUT, layer_type="full_attention") is None
    np.testing.assert_array_equal(
        hf_config.rope_config_from_hf(SCOUT, layer_type="chunked_attention").inv_freq, cfg.inv_freq)
    # an explicit list: 1 = RoPE, 0 = NoPE; a layer type that mixes both needs layer_idx
    conf = {**SCOUT, "text_config": {**SCOUT["text_config"], "num_hidden_layers": 3,
                                     "no_rope_layers": [1, 0, 1],
                                     "layer_types": ["full_attention"] * 3}}
    assert [hf_config.rope_config_from_hf(conf, layer_idx=i) is None for i in range(3)] == \
        [False, True, False]
    with pytest.raises(ValueError, match="differ in whether they use RoPE; pass layer_idx="):
        hf_config.rope_config_from_hf(conf, layer_type="full_attention")
    # no layer named at all: the RoPE layers' config
    np.testing.assert_array_equal(hf_config.rope_config_from_hf(SCOUT).inv_freq, cfg.inv_freq)


def test_llama4_nope_and_layer_types_match_transformers():
    pytest.importorskip("torch", reason="needs torch: pip install torch")
    tr = pytest.importorskip("transformers", reason="transformers is a test-only dependency")
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention
    small = {"model_type": "llama4_text", "hidden_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 9,
             "rope_theta": 500000.0, "no_rope_layer_interval": 3}
    for no_rope in ([], [1, 1, 0, 0, 1, 1, 1, 0, 1]):
        conf = {**small, "no_rope_layers": no_rope}
        hf = tr.Llama4TextConfig(**{k: v for k, v in conf.items() if k != "model_type"})
        use_rope = [bool(Llama4TextAttention(hf, i).use_rope) for i in range(9)]
        assert [hf_config.rope_config_from_hf(conf, layer_idx=i) is not None
                for i in range(9)] == use_rope
        assert hf_config.layer_types(conf) == hf.layer_types
    scout = tr.Llama4Config(**{k: v for k, v in SCOUT.items() if k != "model_type"})
    assert hf_config.layer_types(SCOUT) == scout.get_text_config().layer_types


@pytest.mark.parametrize("name", ["gemma-3-4b-it", "gemma-3-1b-it", "gemma-4-31B-it"])
def test_derived_layer_types_match_transformers(name):
    pytest.importorskip("transformers", reason="transformers is a test-only dependency")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    conf = CONFIGS[name]
    hf = CONFIG_MAPPING[conf["model_type"]](**{k: v for k, v in conf.items() if k != "model_type"})
    assert hf_config.layer_types(conf) == hf.get_text_config().layer_types


@pytest.mark.parametrize("model_type,text_type", [
    ("qwen3_next", "qwen3_next"), ("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text")])
@pytest.mark.parametrize("interval", [None, 3])
def test_hybrid_linear_attention_layers_have_no_rope(model_type, text_type, interval):
    """Qwen3-Next / Qwen3.5: layer_types derived from full_attention_interval as the
    config class derives them; the Gated DeltaNet layers get None, the attention
    layers partial rotary (R = 64 of 256) with the family's defaults."""
    pytest.importorskip("torch", reason="needs torch: pip install torch")
    pytest.importorskip("transformers", reason="transformers is a test-only dependency")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    text = {"model_type": text_type, "hidden_size": 512, "num_attention_heads": 8,
            "num_key_value_heads": 2, "num_hidden_layers": 7}
    if interval:
        text["full_attention_interval"] = interval
    conf = text if model_type == text_type else {"model_type": model_type, "text_config": text}
    kw = {k: v for k, v in text.items() if k != "model_type"}
    hf = CONFIG_MAPPING[text_type](**kw)
    assert hf_config.layer_types(conf) == hf.layer_types
    for i, kind in enumerate(hf.layer_types):
        cfg = hf_config.rope_config_from_hf(conf, layer_idx=i)
        assert (cfg is None) == (kind == "linear_attention")
        if cfg is not None:
            assert cfg.rotary_dim == 64 and not cfg.interleaved
            np.testing.assert_allclose(cfg.inv_freq, theta(64, 1e4), rtol=1e-15)
            assert cfg.n_streams == (1 if model_type == "qwen3_next" else 3)
    assert hf_config.rope_config_from_hf(conf, layer_type="linear_attention") is None


# --------------------------------------------------------------------------- pair layout

def test_pair_layout_comes_from_the_config_and_an_explicit_value_wins():
    assert hf_config.rope_config_from_hf(DSV3).interleaved  # DeepseekV3Config: rope_interleave True
    off = {**DSV3, "rope_interleave": False}
    assert not hf_config.rope_config_from_hf(off).interleaved
    assert hf_config.rope_config_from_hf(CONFIGS["glm-4-9b-chat-hf"]).interleaved
    assert not hf_config.rope_config_from_hf(CONFIGS["Llama-3.1-8B"]).interleaved
    # the caller states the layout of its own q/k (e.g. weights permuted at load): it wins
    assert not hf_config.rope_config_from_hf(DSV3, interleaved=False).interleaved
    assert hf_config.rope_config_from_hf(CONFIGS["Llama-3.1-8B"], interleaved=True).interleaved
    # the same tables either way
    np.testing.assert_array_equal(hf_config.rope_config_from_hf(DSV3, interleaved=False).inv_freq,
                                  hf_config.rope_config_from_hf(DSV3).inv_freq)


# --------------------------------------------------------------------------- family defaults

def test_unknown_family_refuses_to_guess():
    conf = {"model_type": "internlm2", "hidden_size": 4096, "num_attention_heads": 32,
            "max_position_embeddings": 32768}
    with pytest.raises(ValueError, match=r"'internlm2' is not in cuprope's family table.*"
                                         r"rope_theta, partial_rotary_factor, head_dim"):
        hf_config.rope_config_from_hf(conf)
    stated = {**conf, "rope_theta": 1e6, "head_dim": 128, "partial_rotary_factor": 1.0}
    inv, scale = hf_config.hf_table(stated)  # the table needs no layout
    np.testing.assert_allclose(inv, theta(128, 1e6), rtol=1e-15)
    with pytest.raises(ValueError, match="pair layout is unknown: pass interleaved="):
        hf_config.rope_config_from_hf(stated)
    assert not hf_config.rope_config_from_hf(stated, interleaved=False).interleaved
    # head_dim= from the caller fills the missing field
    part = {**conf, "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    assert hf_config.rope_config_from_hf(part, head_dim=128, interleaved=True).rotary_dim == 64


def test_no_model_type_gets_transformers_generic_defaults():
    cfg = hf_config.rope_config_from_hf({"hidden_size": 4096, "num_attention_heads": 32})
    assert cfg.rotary_dim == 128 and not cfg.interleaved and cfg.scale == 1.0
    np.testing.assert_allclose(cfg.inv_freq, theta(128, 1e4), rtol=1e-15)


@pytest.mark.parametrize("model_type,head_dim,base,prf", [
    ("qwen3", 128, 1e4, 1.0),        # Qwen3Config.head_dim = 128, not hidden // heads
    ("gemma2", 256, 1e4, 1.0),
    ("mixtral", 64, 1e6, 1.0),       # MixtralConfig.default_theta
    ("phi", 64, 1e4, 0.5),           # PhiConfig: partial_rotary_factor 0.5
    ("stablelm", 64, 1e4, 0.25),
    ("llama4_text", 128, 5e5, 1.0),
    ("gpt_oss", 64, 1.5e5, 1.0),
])
def test_family_defaults_fill_what_the_config_leaves_out(model_type, head_dim, base, prf):
    conf = {"model_type": model_type, "hidden_size": 1024, "num_attention_heads": 16}
    p = hf_config.hf_rope_parameters(conf)
    assert (p["head_dim"], p["rope_theta"], p["partial_rotary_factor"]) == (head_dim, base, prf)
    assert p["dim"] == int(head_dim * prf)


# --------------------------------------------------------------------------- LongRoPE mscales

@pytest.mark.parametrize("seq_len", [None, 4096, 4097])
def test_longrope_mscale_follows_the_factors(seq_len):
    rs = dict(CONFIGS["Phi-3.5-MoE-instruct"]["rope_scaling"], short_mscale=1.1, long_mscale=1.3)
    conf = dict(CONFIGS["Phi-3.5-MoE-instruct"], rope_scaling=rs)
    cfg = hf_config.rope_config_from_hf(conf, seq_len=seq_len)
    long = (seq_len or 0) > 4096
    assert cfg.scale == (1.3 if long else 1.1)
    ext = np.array(rs["long_factor" if long else "short_factor"])
    np.testing.assert_allclose(cfg.inv_freq, theta(128, 1e4) / ext, rtol=1e-14)
    # without mscales: the LongRoPE attention factor sqrt(1 + ln 32 / ln 4096)
    plain = dict(conf, rope_scaling={k: v for k, v in rs.items() if "mscale" not in k})
    assert hf_config.rope_config_from_hf(plain, seq_len=seq_len).scale == pytest.approx(
        math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-15)


def test_scaling_module_reexports_the_reader():
    assert scaling.rope_config_from_hf is hf_config.rope_config_from_hf
    assert scaling.hf_table is hf_config.hf_table
    assert scaling.hf_rope_parameters is hf_config.hf_rope_parameters
    with pytest.raises(AttributeError):
        scaling.no_such_name  # noqa: B018
