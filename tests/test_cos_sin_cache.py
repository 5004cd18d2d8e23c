"""build_cos_sin_cache: the serving engines' [max_position, R] cos/sin cache
from a RopeConfig, against a float64 reference written from the formula

    cache[p, j] = cos(p·θ_j)·scale,   cache[p, R/2 + j] = sin(p·θ_j)·scale

(vLLM's layout: cos half, then sin half). CPU tests run the NumPy build; the
GPU variants (skipped with a reason without a GPU) check the kernels' float32
table and the drop-in rotation against rope_qk_forward.
"""
import numpy as np
import pytest

import cuprope
from conftest import HAS_GPU, HAS_TORCH
from cuprope import reference, scaling
from cuprope.kvcache import reference as kref
from cuprope.kvcache.cos_sin_cache import build_cos_sin_cache, rotary_embedding

NEEDS_TORCH = pytest.mark.skipif(not HAS_TORCH, reason="needs torch: pip install torch")


def formula(inv_freq, scale, rows):
    """float64 [rows, R]: written from the formula above, not from the builder."""
    out = np.empty((rows, 2 * len(inv_freq)))
    for p in range(rows):
        for j, th in enumerate(inv_freq):
            a = float(p) * float(th)
            out[p, j] = np.cos(a) * scale
            out[p, len(inv_freq) + j] = np.sin(a) * scale
    return out


def _yarn_mscale(factor):
    return 0.1 * np.log(factor) + 1.0


SCHEMES = {
    "default": lambda: cuprope.RopeConfig(64, base=500000.0),
    "linear": lambda: cuprope.RopeConfig(64, inv_freq=scaling.linear_table(64, 1e4, 4.0)[0]),
    "dynamic": lambda: cuprope.RopeConfig(
        64, inv_freq=scaling.dynamic_ntk_table(64, 1e4, 2.0, 4096, seq_len=9000)[0]),
    "yarn": lambda: cuprope.RopeConfig(64, inv_freq=scaling.yarn_table(
        64, 1e6, 4.0, original_max_position_embeddings=32768)[0],
        scale=scaling.yarn_table(64, 1e6, 4.0, original_max_position_embeddings=32768)[1]),
    "llama3": lambda: cuprope.RopeConfig(64, inv_freq=scaling.llama3_table(
        64, 500000.0, 8.0, 1.0, 4.0, 8192)[0]),
    "proportional": lambda: cuprope.RopeConfig(
        32, inv_freq=scaling.proportional_table(32, 1e6, 0.25)[0]),
    "partial-hf": lambda: scaling.rope_config_from_hf(
        {"hidden_size": 640, "num_attention_heads": 8, "partial_rotary_factor": 0.4}),
}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_host_cache_is_the_formula_rounded_once(scheme, dtype):
    cfg = SCHEMES[scheme]()
    rows = 300
    got = build_cos_sin_cache(cfg, rows, dtype=dtype)
    assert isinstance(got, np.ndarray)
    assert got.shape == (rows, cfg.rotary_dim) and got.dtype.name == dtype
    want = reference.round_to_dtype(formula(cfg.inv_freq, cfg.scale, rows),
                                    kref.np_dtype(dtype))
    # correctly rounded: equal bits, save NumPy's libm landing on the other side
    # of a rounding boundary (then one unit in the last place, and rarely)
    diff = got.astype(np.float64) != want.astype(np.float64)
    assert diff.mean() < 1e-3, f"{diff.sum()} of {diff.size} values differ"
    ulp = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    if dtype != "float32":
        ulp = np.abs(want.astype(np.float64)) * 2.0 ** -(10 if dtype == "float16" else 7) + 1e-7
    assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= ulp)


def test_yarn_attention_factor_is_folded_into_cos_and_sin():
    inv, s = scaling.yarn_table(64, 1e6, 4.0, original_max_position_embeddings=32768)
    assert s == pytest.approx(_yarn_mscale(4.0), rel=1e-12)       # 0.1·ln(4) + 1
    got = build_cos_sin_cache(cuprope.RopeConfig(64, inv_freq=inv, scale=s), 50)
    np.testing.assert_allclose(got[0, :32], _yarn_mscale(4.0), rtol=1e-7)   # cos 0 · mscale
    np.testing.assert_array_equal(got[0, 32:], 0.0)
    np.testing.assert_allclose(got[:, :32] ** 2 + got[:, 32:] ** 2, _yarn_mscale(4.0) ** 2,
                               rtol=1e-6)


def test_from_a_model_config_json_longrope_mscale():
    conf = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48,
                             "long_factor": [float(1 + i % 7) for i in range(48)]}}
    cfg = scaling.rope_config_from_hf(conf, seq_len=8192)
    assert cfg.scale != 1.0
    got = build_cos_sin_cache(cfg, 64)
    want = formula(cfg.inv_freq, cfg.scale, 64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1.2e-7 * cfg.scale)


def test_stream_map_keeps_every_pair_at_each_position():
    cfg = scaling.mrope_config([4, 6, 6], base=1e6)
    got = build_cos_sin_cache(cfg, 40)
    np.testing.assert_allclose(got, formula(cfg.inv_freq, 1.0, 40), rtol=0, atol=1.2e-7)


def test_interleaved_config_gives_the_same_table():
    a = build_cos_sin_cache(cuprope.RopeConfig(32, interleaved=True), 20)
    b = build_cos_sin_cache(cuprope.RopeConfig(32), 20)
    np.testing.assert_array_equal(a, b)


def test_large_tables_are_built_in_blocks_and_stay_exact():
    cfg = cuprope.RopeConfig(8, base=10.0)
    rows = (1 << 15) * 2 + 7                      # three host blocks
    got = build_cos_sin_cache(cfg, rows)
    for p in (0, 1, (1 << 15) - 1, 1 << 15, rows - 1):
        np.testing.assert_allclose(got[p], formula(cfg.inv_freq, 1.0, p + 1)[p], rtol=0,
                                   atol=6e-8)


@pytest.mark.parametrize("neox", [True, False])
def test_drop_in_with_the_built_cache_equals_rope_qk_forward(neox):
    rng = np.random.default_rng(5)
    cfg = cuprope.RopeConfig(48, base=1e4, interleaved=not neox, layout="thd",
                             scale=1.25)
    t, hq, hk, d = 17, 4, 2, 64
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    k = rng.standard_normal((t, hk, d)).astype(np.float32)
    pos = rng.integers(0, 500, t).astype(np.int64)
    want_q, want_k = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    cache = build_cos_sin_cache(cfg, 500)
    qr, kr = q.copy(), k.copy()
    rotary_embedding(pos, qr, kr, d, cache, is_neox=neox)
    np.testing.assert_allclose(qr, want_q, rtol=0, atol=4e-7 * np.abs(q).max())
    np.testing.assert_allclose(kr, want_k, rtol=0, atol=4e-7 * np.abs(k).max())
    assert not np.allclose(qr[:, :, :48], q[:, :, :48])              # it did rotate
    np.testing.assert_array_equal(qr[:, :, 48:], q[:, :, 48:])       # dims >= R untouched


@NEEDS_TORCH
def test_like_a_cpu_tensor_returns_a_tensor():
    import torch
    cfg = cuprope.RopeConfig(16)
    t = build_cos_sin_cache(cfg, 9, like=torch.zeros(2))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (9, 16)
    b = build_cos_sin_cache(cfg, 9, like=torch.zeros(2), dtype=torch.bfloat16)
    assert b.dtype == torch.bfloat16
    want = reference.round_to_dtype(formula(cfg.inv_freq, 1.0, 9), kref.np_dtype("bfloat16"))
    np.testing.assert_array_equal(b.float().numpy(), want.astype(np.float32))


@pytest.mark.parametrize("bad, err, match", [
    (dict(max_position=-1), ValueError, "max_position"),
    (dict(max_position=2.0), TypeError, "max_position must be an int"),
    (dict(dtype="float64"), TypeError, "dtype must be one of"),
    (dict(device=-1), TypeError, "device must be a GPU ordinal"),
    (dict(device=0, like=np.zeros(1)), ValueError, "not both"),
    (dict(like=[1, 2]), TypeError, "like must be an array"),
])
def test_bad_arguments_raise(bad, err, match):
    kw = dict(max_position=8)
    kw.update(bad)
    with pytest.raises(err, match=match):
        build_cos_sin_cache(cuprope.RopeConfig(8), **kw)


def test_per_head_tables_and_non_configs_raise():
    with pytest.raises(ValueError, match="per-head"):
        build_cos_sin_cache(cuprope.RopeConfig(8, inv_freq=np.ones((2, 4))), 8)
    with pytest.raises(TypeError, match="RopeConfig"):
        build_cos_sin_cache(128, 8)


def test_empty_cache():
    assert build_cos_sin_cache(cuprope.RopeConfig(8), 0).shape == (0, 8)


# --------------------------------------------------------------------- GPU


@pytest.mark.parametrize("scheme", ["default", "yarn", "llama3"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU visible (CuPy absent or no device)")
@NEEDS_TORCH
def test_gpu_drop_in_with_built_cache_is_rope_qk_forward_bit_for_bit(scheme, neox, dtype):
    import torch
    base = SCHEMES[scheme]()
    cfg = cuprope.RopeConfig(base.rotary_dim, inv_freq=base.inv_freq, scale=base.scale,
                             interleaved=not neox, layout="thd")
    t, hq, hk, d = 70, 8, 2, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    tdt = getattr(torch, dtype)
    q = torch.randn(t, hq, d, device="cuda", generator=g).to(tdt)
    k = torch.randn(t, hk, d, device="cuda", generator=g).to(tdt)
    pos = torch.randint(0, 100000, (t,), device="cuda", generator=g)
    want_q, want_k = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    cache = build_cos_sin_cache(cfg, 100000, like=q)
    assert cache.device == q.device and cache.dtype == torch.float32
    assert cache.shape == (100000, cfg.rotary_dim)
    qr, kr = q.clone(), k.clone()
    import cuprope.torch as ctorch
    ctorch.rotary_embedding(pos, qr, kr, d, cache, neox)
    torch.cuda.synchronize()
    assert torch.equal(qr, want_q) and torch.equal(kr, want_k)
    assert not torch.equal(qr, q)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU visible (CuPy absent or no device)")
@NEEDS_TORCH
def test_gpu_cache_values_against_the_formula(dtype):
    import torch
    cfg = SCHEMES["yarn"]()
    rows = 4096
    got = build_cos_sin_cache(cfg, rows, like=torch.zeros(1, device="cuda"), dtype=dtype)
    assert got.is_cuda and str(got.dtype) == f"torch.{dtype}"
    want = formula(cfg.inv_freq, cfg.scale, rows)
    if dtype == "float32":   # the kernels' own cos/sin (1e-7), times the scale in fp32
        np.testing.assert_allclose(got.double().cpu().numpy(), want, rtol=0,
                                   atol=2.5e-7 * cfg.scale)
    else:                    # built on the host, correctly rounded, moved
        host = build_cos_sin_cache(cfg, rows, dtype=dtype)
        assert np.array_equal(got.cpu().float().numpy(), host.astype(np.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU visible (CuPy absent or no device)")
def test_gpu_device_argument_returns_cupy():
    import cupy
    cfg = cuprope.RopeConfig(64)
    got = build_cos_sin_cache(cfg, 256, device=0)
    assert isinstance(got, cupy.ndarray) and got.device.id == 0 and got.dtype == cupy.float32
    np.testing.assert_allclose(cupy.asnumpy(got), formula(cfg.inv_freq, 1.0, 256), rtol=0,
                               atol=1.5e-7)


@NEEDS_TORCH
def test_torch_compile_traces_rotary_embedding_as_its_custom_op():
    """cuprope.torch.rotary_embedding under torch.compile(fullgraph=True) is
    the custom op cuprope::rotary_embedding in the graph (no graph break),
    and rotates in place exactly as the eager call (CPU tensors: the NumPy
    backend behind the op)."""
    import torch

    import cuprope.torch as ctorch
    g = torch.Generator().manual_seed(5)
    t, d = 9, 32
    q, k = torch.randn(t, 4 * d, generator=g), torch.randn(t, 2 * d, generator=g)
    pos = torch.randint(0, 64, (t,), generator=g)
    ang = torch.arange(64, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(d // 2, dtype=torch.float64) / (d // 2))
    table = torch.cat((ang.cos(), ang.sin()), 1).float()
    q0 = q.clone()
    want_q, want_k = q.clone(), k.clone()
    ctorch.rotary_embedding(pos, want_q, want_k, d, table, True)
    assert not torch.equal(want_q, q0)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def step(p, a, b, c):
        ctorch.rotary_embedding(p, a, b, d, c, True)
        return a + 0, b + 0

    got_q, got_k = torch.compile(step, backend=backend, fullgraph=True)(pos, q, k, table)
    assert any("cuprope.rotary_embedding" in s for s in seen), seen
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(q, want_q)  # in place
