"""DeepSeek MLA on the CPU: the float64 reference against an independent
rotation (cuprope.reference), the NumPy backend through the GPU tests' case
functions (every dtype, both cache layouts, both addressings, fp8), the
training-side views, the kernel catalogue and the errors."""
import numpy as np
import pytest

import cuprope
from cuprope.kvcache import reference as kref
from cuprope import reference
from cuprope.mla import kernels as mla_kernels
from cuprope.mla import rope_append_mla
from cuprope.mla.reference import expected_cache_rows, mla_reference, rotate_pe
from hf_configs import CONFIGS as HF

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")
import test_gpu_mla as g  # noqa: E402  (the case functions; their module marks stay there)


def test_deepseek_v3_config_drives_the_rotation():
    """rope_config_from_hf of DeepSeek-V3's config.json: 64 rope dims, its
    interleaved pairs, YaRN frequencies; rotate_pe equals cuprope.reference's
    rotation with those values, and each pair (2j, 2j+1) turns by
    positions * inv_freq[j] (checked one pair at a time from the formula)."""
    cfg = cuprope.scaling.rope_config_from_hf(HF["DeepSeek-V3"])
    assert cfg.rotary_dim == 64 and cfg.interleaved
    yarn = cuprope.scaling.yarn_table(64, 10000, 40, original_max_position_embeddings=4096,
                                      beta_fast=32, beta_slow=1)[0]
    np.testing.assert_allclose(cfg.inv_freq, yarn, rtol=0, atol=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 64))
    pos = np.array([0, 1, 4095, 163839, 2 ** 31 - 2])
    out = rotate_pe(x, pos, cfg.inv_freq, scale=cfg.scale, interleaved=True)
    ang = reference.pair_angles(reference.token_positions(1, 5, positions=pos), cfg.inv_freq)
    ref = reference.rotate(x[None], ang, rotary_dim=64, interleaved=True, scale=cfg.scale)[0]
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    j, t = 7, 3
    th = pos[t] * cfg.inv_freq[j]
    z = complex(x[t, 1, 2 * j], x[t, 1, 2 * j + 1]) * complex(np.cos(th), np.sin(th)) * cfg.scale
    assert np.isclose(out[t, 1, 2 * j], z.real, atol=1e-12)
    assert np.isclose(out[t, 1, 2 * j + 1], z.imag, atol=1e-12)


def test_half_split_pairs_and_identity_at_zero():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 1, 8))
    inv = np.array([1.0, 0.5, 0.25, 0.125])
    out = rotate_pe(x, np.array([0, 3]), inv, interleaved=False)
    np.testing.assert_array_equal(out[0], x[0])
    th = 3 * inv
    np.testing.assert_allclose(out[1, 0, :4], x[1, 0, :4] * np.cos(th) - x[1, 0, 4:] * np.sin(th))
    np.testing.assert_allclose(out[1, 0, 4:], x[1, 0, 4:] * np.cos(th) + x[1, 0, :4] * np.sin(th))


def test_expected_cache_rows_orders_ckv_then_kpe():
    ckv, k = np.full((2, 4), 1.5), np.full((2, 2), -2.0)
    rows = expected_cache_rows(ckv, k, "float32")
    np.testing.assert_array_equal(rows, [[1.5] * 4 + [-2.0] * 2] * 2)
    b = expected_cache_rows(ckv, k, "bfloat16", scale=np.float32(0.5))
    np.testing.assert_array_equal(b, kref.scaled_e4m3(rows.astype(np.float32), np.float32(0.5)))


@pytest.mark.parametrize("dtype,cache,q8,layout,addr", g.CASES,
                         ids=[g.case_id(*c) for c in g.CASES])
def test_numpy_backend(dtype, cache, q8, layout, addr):
    import zlib
    g.mla_case(zlib.crc32(g.case_id(dtype, cache, q8, layout, addr).encode()), dtype,
               cache=cache, q8=q8, layout=layout, addr=addr, device="cpu", t=11, h=3, pages=9,
               ps=4)


@pytest.mark.parametrize("scheme", sorted(g.SCHEMES))
def test_numpy_backend_schemes_strided(scheme):
    g.mla_case(3, "bfloat16", scheme=scheme, device="cpu", t=6, h=2, strided=True,
               layout="flashinfer", addr="paged", pages=9, ps=4)
    g.mla_case(4, "float16", scheme=scheme, device="cpu", t=6, h=2, nope=False, pages=9, ps=4)
    with pytest.raises(ValueError, match="is past the cache"):  # the case has a slot past it
        g.mla_case(4, "float16", scheme=scheme, device="cpu", t=6, h=2, pages=9, ps=4,
                   check=True)


def test_training_side_views_forward_backward_cpu():
    g.training_case("cpu")


def test_kernel_catalogue_and_args():
    names = mla_kernels.mla_kernel_names()
    assert len(names) == 48
    assert mla_kernels.mla_kernel_name("bfloat16", True, 8, 3) in names
    assert mla_kernels.MLA_ARGS.n_words == 8
    from test_launch import c_struct_fields
    assert tuple(c_struct_fields("mla.cuh", "MlaArgs")) == mla_kernels.MLA_ARGS.fields


def _inputs(t=4, h=2, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((t, h, 64)).astype(dtype),
            rng.standard_normal((t, 64)).astype(dtype),
            rng.standard_normal((t, 512)).astype(dtype), np.arange(t, dtype=np.int64))


def test_errors():
    cfg = g.deepseek_v3()
    q, k, c, pos = _inputs()
    cache = np.zeros((2, 4, 576), np.float32)
    slots = np.arange(4, dtype=np.int64)
    ok = dict(kv_cache=cache, slot_mapping=slots)
    with pytest.raises(ValueError, match="rotary_dim"):
        rope_append_mla(q[..., :32], k, c, cfg, pos, **ok)
    with pytest.raises(ValueError, match="k_pe must be"):
        rope_append_mla(q, k[:3], c, cfg, pos, **ok)
    with pytest.raises(ValueError, match="give kv_cache"):
        rope_append_mla(q, k, c, cfg, pos, slot_mapping=slots)
    with pytest.raises(ValueError, match="go together"):
        rope_append_mla(q, k, c, cfg, pos, ckv_cache=cache[..., :512], slot_mapping=slots)
    with pytest.raises(ValueError, match=r"\[pages, page_size, 576\]"):
        rope_append_mla(q, k, c, cfg, pos, kv_cache=cache[..., :570], slot_mapping=slots)
    with pytest.raises(ValueError, match="q_nope and q_nope_out"):
        rope_append_mla(q, k, c, cfg, pos, q_nope=np.zeros((4, 2, 512), np.float32), **ok)
    with pytest.raises(TypeError, match="q_pe's dtype"):
        rope_append_mla(q, k.astype(np.float16), c, cfg, pos, **ok)
    with pytest.raises(ValueError, match="per-head"):
        rope_append_mla(q, k, c, cuprope.RopeConfig(64, inv_freq=np.ones((2, 32))), pos, **ok)
    with pytest.raises(ValueError, match="kv_scale is read only"):
        rope_append_mla(q, k, c, cfg, pos, kv_scale=np.ones((), np.float32), **ok)
    with pytest.raises(ValueError, match="give slot_mapping"):
        rope_append_mla(q, k, c, cfg, pos, kv_cache=cache, kv_indices=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="slot_mapping\\[1\\]"):
        rope_append_mla(q, k, c, cfg, pos, kv_cache=cache, check=True,
                        slot_mapping=np.array([0, 8, 1, 2]))
    with pytest.raises(ValueError, match="overlaps"):
        rope_append_mla(q, k, c, cfg, pos, kv_cache=cache, slot_mapping=slots,
                        q_pe_out=q[:, ::-1])
    # nothing was written by the failed calls
    assert not cache.any()


def test_fp8_needs_its_scale_and_q_outputs_agree():
    ml = pytest.importorskip("ml_dtypes")
    cfg = g.deepseek_v3()
    q, k, c, pos = _inputs()
    cache8 = np.zeros((2, 4, 576), np.uint8)
    slots = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="kv_scale is needed"):
        rope_append_mla(q, k, c, cfg, pos, kv_cache=cache8, slot_mapping=slots)
    qn = np.ones((4, 2, 512), np.float32)
    with pytest.raises(TypeError, match="both be float8_e4m3fn"):
        rope_append_mla(q, k, c, cfg, pos, kv_cache=cache8, slot_mapping=slots,
                        kv_scale=np.ones((), np.float32), q_nope=qn,
                        q_nope_out=np.zeros((4, 2, 512), ml.float8_e4m3fn))


def test_empty_and_mla_reference():
    cfg = g.deepseek_v3()
    q, k, c, pos = _inputs(t=0)
    cache = np.zeros((2, 4, 576), np.float32)
    assert rope_append_mla(q, k, c, cfg, pos, kv_cache=cache, slot_mapping=pos) is q
    q, k, c, pos = _inputs()
    qr, kr = mla_reference(q, k, pos, cfg)
    np.testing.assert_allclose(qr, rotate_pe(q, pos, cfg.inv_freq, scale=cfg.scale), atol=0)
    assert kr.shape == (4, 64)
