"""GPU kernel vs the float64 reference for every frequency scheme and every ggml
mode (skipped with a reason where there is no GPU).

Each case runs forward and backward into outputs poisoned with NaN (``out=``),
so an element the kernel fails to write fails the comparison. The tables come
from ``cuprope.scaling`` / ``cuprope.ggml`` (checked on the CPU against the
published formulas and ggml's C loop in test_scaling.py / test_ggml.py); here
the question is whether the kernel applies them — stream maps, zero
frequencies, scales, partial and whole-head pairings — exactly.
"""
import numpy as np
import pytest

import cuprope
from conftest import GPU_TESTS
from cuprope import ggml, scaling
from oracle import assert_matches, expected

pytestmark = GPU_TESTS

DTYPES = ["float32", "float16", "bfloat16"]
B, S, H = 2, 37, 3

_RNG = np.random.default_rng(11)
PHI3 = {"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": list(_RNG.uniform(1, 3, 48)),
                         "long_factor": list(_RNG.uniform(1, 60, 48))}}

# name -> (builder returning a RopeConfig, head dim, n_streams, max position)
SCHEMES = {
    "default-phi2-partial": (lambda: scaling.rope_config_from_hf(
        {"hidden_size": 2560, "num_attention_heads": 32, "partial_rotary_factor": 0.4,
         "rope_theta": 10000.0}), 80, 1, 2048),
    "linear-interleaved": (lambda: scaling.rope_config_from_hf(
        {"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 10000.0,
         "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}},
        interleaved=True), 128, 1, 16384),
    "dynamic-past-context": (lambda: scaling.rope_config_from_hf(
        {"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 10000.0,
         "max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
        seq_len=9000), 128, 1, 9000),
    "yarn-qwen2.5": (lambda: scaling.rope_config_from_hf(
        {"hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1e6,
         "max_position_embeddings": 32768,
         "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}),
        128, 1, 131072),
    "yarn-mscale-partial": (lambda: scaling.rope_config_from_hf(
        {"hidden_size": 2048, "num_attention_heads": 16, "qk_rope_head_dim": 64,
         "rope_theta": 10000, "max_position_embeddings": 163840,
         "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 1.0,
                          "original_max_position_embeddings": 4096}}), 192, 1, 163840),
    "yarn-no-truncate": (lambda: scaling.rope_config_from_hf(
        {"hidden_size": 2880, "num_attention_heads": 64, "head_dim": 64, "rope_theta": 150000,
         "max_position_embeddings": 131072,
         "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "truncate": False,
                          "original_max_position_embeddings": 4096}}), 64, 1, 131072),
    "longrope-short": (lambda: scaling.rope_config_from_hf(PHI3, seq_len=4096), 96, 1, 4096),
    "longrope-long": (lambda: scaling.rope_config_from_hf(PHI3, seq_len=131072), 96, 1, 131072),
    "llama3.1": (lambda: scaling.rope_config_from_hf(
        {"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
         "max_position_embeddings": 131072,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
        128, 1, 131072),
    "proportional": (lambda: scaling.rope_config_from_hf(
        {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        head_dim=256), 256, 1, 131072),
    "mrope-qwen2vl": (lambda: scaling.mrope_config([16, 24, 24], base=1e6), 128, 3, 32768),
    "mrope-yarn-bhsd": (lambda: scaling.mrope_config(
        [8, 12, 12], scaling.yarn_table(64, 1e6, 4.0, original_max_position_embeddings=8192)[0],
        scale=scaling.yarn_table(64, 1e6, 4.0, original_max_position_embeddings=8192)[1],
        layout="bhsd"), 96, 3, 32768),
    "imrope-qwen3vl": (lambda: scaling.interleaved_mrope_config([24, 20, 20], base=5e6), 128, 3,
                       262144),
    "vision2d-thd": (lambda: scaling.vision2d_config(80, layout="thd"), 80, 2, 64),
}


def tdt(dtype):
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def rand(shape, dtype, rng):
    import torch
    a = rng.standard_normal(shape).astype(np.float32)
    a[a == 0] = 0.5
    return torch.from_numpy(a).to(device="cuda", dtype=tdt(dtype))


def host(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def shape_for(layout, d):
    return {"bshd": (B, S, H, d), "bhsd": (B, H, S, d), "thd": (B * S, H, d)}[layout]


def run_both(fn_kw, x, cfg, ref_kw, dtype):
    """forward and backward into NaN-poisoned outputs, each against the reference."""
    import torch
    xmax = float(np.abs(host(x)).max())
    for inverse, fn in ((False, cuprope.rope_forward), (True, cuprope.rope_backward)):
        out = torch.full_like(x, float("nan"))
        res = fn(x, cfg, out=out, **fn_kw)
        assert res is out
        ref = expected(host(x), cfg, inverse=inverse, **ref_kw)
        assert_matches(host(out), ref, xmax, dtype, scale=cfg.scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_scheme_forward_and_backward_match_reference(scheme, dtype, rng):
    import torch
    build, d, n_streams, max_pos = SCHEMES[scheme]
    cfg = build()
    assert cfg.rotary_dim <= d
    x = rand(shape_for(cfg.layout, d), dtype, rng)
    t = B * S if cfg.layout == "thd" else S
    if n_streams == 1:
        pos = rng.integers(0, max_pos, (B, S) if cfg.layout != "thd" else t)
    else:
        pos = rng.integers(0, max_pos, (n_streams, B, S) if cfg.layout != "thd" else (n_streams, t))
    pos_dtype = torch.int32 if scheme.endswith(("thd", "qwen2vl", "partial")) else torch.int64
    pos_t = torch.tensor(pos, dtype=pos_dtype, device="cuda")
    run_both({"positions": pos_t}, x, cfg, {"positions": pos}, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mrope_qk_gqa_one_launch(dtype, rng):
    import torch
    cfg = scaling.interleaved_mrope_config([24, 20, 20], base=5e6, scale=0.8)
    q = rand((B, S, 8, 128), dtype, rng)
    k = rand((B, S, 2, 128), dtype, rng)
    pos = rng.integers(0, 100000, (3, S))
    pos_t = torch.tensor(pos, dtype=torch.int32, device="cuda")
    xmax = max(float(np.abs(host(q)).max()), float(np.abs(host(k)).max()))
    for inverse, fn in ((False, cuprope.rope_qk_forward), (True, cuprope.rope_qk_backward)):
        oq, ok = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
        fn(q, k, cfg, positions=pos_t, out=(oq, ok))
        for got, x in ((oq, q), (ok, k)):
            ref = expected(host(x), cfg, inverse=inverse, positions=pos)
            assert_matches(host(got), ref, xmax, dtype, scale=cfg.scale)


# --------------------------------------------------------------------------- ggml dialect

GGML_D = 64
# name -> (mode, n_dims full, n_dims partial, sections full, sections partial)
GGML_MODES = {
    "normal": (ggml.NORMAL, 64, 40, None, None),
    "neox": (ggml.NEOX, 64, 40, None, None),
    "mrope": (ggml.MROPE, 64, 40, (8, 12, 12, 0), (4, 6, 6, 0)),
    "imrope": (ggml.IMROPE, 64, 40, (11, 11, 10, 0), (3, 3, 3, 2)),
    # vision: n_dims = D/2 always; the "partial" variant's sections do not sum to the pairs
    "vision": (ggml.VISION, 32, 32, (16, 16, 0, 0), (10, 12, 0, 0)),
}
GGML_YARN = dict(n_ctx_orig=4096, freq_base=10000.0, freq_scale=0.25, ext_factor=1.0,
                 attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)


@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode_name", list(GGML_MODES))
def test_ggml_mode_forward_and_backward_match_reference(mode_name, dtype, partial, rng):
    import torch
    mode, nd_full, nd_part, sec_full, sec_part = GGML_MODES[mode_name]
    n_dims = nd_part if partial else nd_full
    sections = (sec_part if partial else sec_full) or (0, 0, 0, 0)
    params = dict(GGML_YARN, n_dims=n_dims, mode=mode, sections=sections)
    multi = bool(mode & ggml.MROPE)
    pos = rng.integers(-100, 200000, 4 * S if multi else S).astype(np.int32)
    n_ff = n_dims if mode == ggml.VISION else n_dims // 2
    ff = rng.uniform(0.5, 4.0, n_ff).astype(np.float32)
    x = rand((B, S, H, GGML_D), dtype, rng)
    pos_t = torch.from_numpy(pos).cuda()
    ff_t = torch.from_numpy(ff).cuda()
    cfg = ggml.rope_config(GGML_D, ff, **params)
    pos_ref = pos.reshape(4, S)[: cfg.n_streams] if multi else pos
    xmax = float(np.abs(host(x)).max())
    for forward in (True, False):
        out = torch.full_like(x, float("nan"))
        res = ggml.rope(x, pos_t, ff_t, forward=forward, out=out, **params)
        assert res is out
        ref = expected(host(x), cfg, inverse=not forward, positions=pos_ref)
        assert_matches(host(out), ref, xmax, dtype, scale=cfg.scale)
        if mode != ggml.VISION:
            assert torch.equal(out[..., n_dims:], x[..., n_dims:])
