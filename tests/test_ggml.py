"""CPU tests of cuprope.ggml: ggml's rope op as a dialect.

The expectation is a direct float64 transcription of seed 004's C code — the
per-element loop of ``ggml_compute_forward_rope_f32`` with ``rope_yarn``,
``rope_yarn_ramp``, ``ggml_rope_cache_init``, ``ggml_mrope_cache_init`` (plus
the newer ggml's IMROPE branch) and ``ggml_rope_yarn_corr_dims``. It walks the
cache the way the C code does (θ multiplied by theta_scale per pair, resets per
section for vision) and never calls the package's table builder.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from cuprope import ggml
from oracle import assert_matches

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
GGML_NEOX, GGML_MROPE, GGML_VISION, GGML_IMROPE = 2, 8, 24, 40


# --------------------------------------------------------------------------- C transcription

def MAX(a, b):
    return a if a > b else b


def MIN(a, b):
    return a if a < b else b


def c_corr_dim(n_dims, n_ctx_orig, n_rot, base):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (n_dims * np.log(np.float64(n_ctx_orig) / (n_rot * 2 * math.pi))
                / (2 * np.log(np.float64(base))))


def c_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow):
    start = np.floor(c_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base))
    end = np.ceil(c_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base))
    return [MAX(0, float(start)), MIN(n_dims - 1, float(end))]


def c_rope_yarn_ramp(low, high, i0):
    y = (i0 // 2 - low) / MAX(0.001, high - low)
    return 1 - MIN(1, MAX(0, y))


def c_rope_yarn(theta_extrap, freq_scale, corr_dims, i0, ext_factor, mscale):
    theta_interp = freq_scale * theta_extrap
    theta = theta_interp
    if ext_factor != 0.0:
        ramp_mix = c_rope_yarn_ramp(corr_dims[0], corr_dims[1], i0) * ext_factor
        theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    return math.cos(theta) * mscale, math.sin(theta) * mscale


def ff_at(freq_factors, i):
    # ggml reads freq_factors[i0/2] for every cache slot up to ne0; slots past the
    # tensor are never used by the rotation (NaN here would show if they were)
    if freq_factors is None:
        return 1.0
    return float(freq_factors[i]) if i < len(freq_factors) else float("nan")


def c_rope_cache_init(theta_base, freq_scale, freq_factors, corr_dims, ne0, ext_factor, mscale,
                      sin_sign, theta_scale):
    cache = np.empty(ne0 + 1)
    theta = float(theta_base)
    for i0 in range(0, ne0, 2):
        ff = ff_at(freq_factors, i0 // 2)
        c, s = c_rope_yarn(theta / ff, freq_scale, corr_dims, i0, ext_factor, mscale)
        cache[i0], cache[i0 + 1] = c, s * sin_sign
        theta *= theta_scale
    return cache


def c_mrope_cache_init(theta_base_t, theta_base_h, theta_base_w, theta_base_e, sections, is_imrope,
                       indep_sects, freq_scale, freq_factors, corr_dims, ne0, ext_factor, mscale,
                       sin_sign, theta_scale):
    cache = np.empty(ne0 + 1)
    theta_t, theta_h, theta_w, theta_e = (float(v) for v in (theta_base_t, theta_base_h,
                                                              theta_base_w, theta_base_e))
    sect_dims = sections[0] + sections[1] + sections[2] + sections[3]
    sec_w = sections[1] + sections[0]
    sec_e = sections[2] + sec_w
    assert sect_dims <= ne0
    for i0 in range(0, ne0, 2):
        ff = ff_at(freq_factors, i0 // 2)
        sector = (i0 // 2) % sect_dims
        if indep_sects:
            if sector == 0:
                theta_t = float(theta_base_t)
            elif sector == sections[0]:
                theta_h = float(theta_base_h)
            elif sector == sec_w:
                theta_w = float(theta_base_w)
            elif sector == sec_e:
                theta_e = float(theta_base_e)
        theta = theta_t
        if is_imrope:
            if sector % 3 == 1 and sector < 3 * sections[1]:
                theta = theta_h
            elif sector % 3 == 2 and sector < 3 * sections[2]:
                theta = theta_w
            elif sector % 3 == 0 and sector < 3 * sections[0]:
                theta = theta_t
            else:
                theta = theta_e
        else:
            if sector >= sections[0] and sector < sec_w:
                theta = theta_h
            elif sector >= sec_w and sector < sec_w + sections[2]:
                theta = theta_w
            elif sector >= sec_w + sections[2]:
                theta = theta_e
        c, s = c_rope_yarn(theta / ff, freq_scale, corr_dims, i0, ext_factor, mscale)
        cache[i0], cache[i0 + 1] = c, s * sin_sign
        theta_t *= theta_scale
        theta_w *= theta_scale
        theta_h *= theta_scale
        theta_e *= theta_scale
    return cache


def c_rope(src0, pos, freq_factors, *, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
           attn_factor, beta_fast, beta_slow, sections, forward):
    """ggml_compute_forward_rope_f32 in float64. src0 [ne3, ne2, ne1, ne0] = [B, S, N, D]."""
    src = np.asarray(src0, dtype=np.float64)
    ne3, ne2, ne1, ne0 = src.shape
    dst = np.full_like(src, np.nan)
    assert n_dims <= ne0 and n_dims % 2 == 0
    theta_scale = freq_base ** (-2.0 / n_dims)
    corr_dims = c_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    is_neox = bool(mode & GGML_NEOX)
    is_mrope = bool(mode & GGML_MROPE)
    is_imrope = mode == GGML_IMROPE
    is_vision = mode == GGML_VISION
    if is_mrope:
        assert sections[0] > 0 or sections[1] > 0 or sections[2] > 0
    if is_vision:
        assert n_dims == ne0 // 2
    sin_sign = 1.0 if forward else -1.0
    for i3 in range(ne3):
        for i2 in range(ne2):
            if not is_mrope:
                cache = c_rope_cache_init(pos[i2], freq_scale, freq_factors, corr_dims, ne0, ext_factor,
                                          attn_factor, sin_sign, theta_scale)
            else:
                cache = c_mrope_cache_init(pos[i2], pos[i2 + ne2], pos[i2 + ne2 * 2], pos[i2 + ne2 * 3],
                                           sections, is_imrope, is_vision, freq_scale, freq_factors,
                                           corr_dims, ne0, ext_factor, attn_factor, sin_sign,
                                           theta_scale)
            for i1 in range(ne1):
                x = src[i3, i2, i1]
                d = dst[i3, i2, i1]
                if is_neox or is_mrope:
                    off = n_dims if is_vision else n_dims // 2
                    for i0 in range(0, n_dims, 2):
                        ic = i0 // 2
                        cos_theta, sin_theta = cache[i0], cache[i0 + 1]
                        x0, x1 = x[ic], x[ic + off]
                        d[ic] = x0 * cos_theta - x1 * sin_theta
                        d[ic + off] = x0 * sin_theta + x1 * cos_theta
                else:
                    for i0 in range(0, n_dims, 2):
                        cos_theta, sin_theta = cache[i0], cache[i0 + 1]
                        x0, x1 = x[i0], x[i0 + 1]
                        d[i0] = x0 * cos_theta - x1 * sin_theta
                        d[i0 + 1] = x0 * sin_theta + x1 * cos_theta
                if is_vision:
                    for i0 in range(n_dims, ne0, 2):
                        ic = i0 // 2
                        cos_theta, sin_theta = cache[i0], cache[i0 + 1]
                        x0, x1 = x[ic], x[ic + n_dims]
                        d[ic] = x0 * cos_theta - x1 * sin_theta
                        d[ic + n_dims] = x0 * sin_theta + x1 * cos_theta
                else:
                    for i0 in range(n_dims, ne0, 2):
                        d[i0], d[i0 + 1] = x[i0], x[i0 + 1]
    return dst


def c_mscale(attn_factor, freq_scale, ext_factor):
    return attn_factor * (1.0 + 0.1 * math.log(1.0 / freq_scale)) if ext_factor != 0.0 else attn_factor


# --------------------------------------------------------------------------- cases

B, S, N, D = 2, 5, 3, 24

# mode name -> (mode, n_dims full, n_dims partial, sections full, sections partial)
MODES = {
    "normal": (0, 24, 12, None, None),
    "neox": (GGML_NEOX, 24, 12, None, None),
    # 12 (or 6) pairs against sections summing to 8: the pattern repeats (or is cut)
    "mrope": (GGML_MROPE, 24, 12, (2, 3, 3, 0), (2, 3, 3, 0)),
    # sum 7 with a 4th stream; imrope sends sectors outside the three ranges to e
    "imrope": (GGML_IMROPE, 24, 12, (2, 2, 2, 1), (2, 2, 2, 1)),
    # vision: n_dims = D/2 always; sections [y, x] summing to the 12 pairs, or to 9
    "vision": (GGML_VISION, 12, 12, (6, 6, 0, 0), (4, 5, 0, 0)),
}

YARN = dict(n_ctx_orig=256, freq_base=100.0, freq_scale=0.25, ext_factor=1.0, attn_factor=0.9,
            beta_fast=32.0, beta_slow=1.0)


def randn(rng, shape, dtype=np.float32):
    x = rng.standard_normal(shape)
    x[x == 0] = 0.5
    return x.astype(dtype)


def make_pos(rng, mode, s=S):
    n = 4 * s if mode & GGML_MROPE else s
    return rng.integers(-50, 3000, n).astype(np.int32)


def make_ff(rng, mode, n_dims, extra=3):
    n = (n_dims if mode == GGML_VISION else n_dims // 2) + extra
    return rng.uniform(0.5, 4.0, n).astype(np.float32)


def run_both(x, pos, ff, params, forward):
    got = ggml.rope(x, pos, ff, forward=forward, **params)
    ref = c_rope(x, pos, ff, forward=forward, **params)
    return got, ref


def check(got, ref, x, dtype, params):
    assert got.dtype == x.dtype and got.shape == x.shape
    xmax = float(np.abs(x.astype(np.float64)).max())
    scale = c_mscale(params["attn_factor"], params["freq_scale"], params["ext_factor"])
    assert_matches(got.astype(np.float64), ref, xmax, dtype, scale=scale)


@pytest.mark.parametrize("forward", [True, False], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize("mode_name", list(MODES))
def test_matches_c_loop_with_yarn_and_freq_factors(mode_name, partial, dtype, forward, rng):
    mode, nd_full, nd_part, sec_full, sec_part = MODES[mode_name]
    n_dims = nd_part if partial else nd_full
    sections = (sec_part if partial else sec_full) or (0, 0, 0, 0)
    params = dict(YARN, n_dims=n_dims, mode=mode, sections=sections)
    x = randn(rng, (B, S, N, D), DTYPES[dtype])
    pos = make_pos(rng, mode)
    ff = make_ff(rng, mode, n_dims)
    got, ref = run_both(x, pos, ff, params, forward)
    check(got, ref, x, dtype, params)
    if mode != GGML_VISION:
        np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])


PARAM_SETS = {
    "plain": dict(n_ctx_orig=0, freq_base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
                  beta_fast=32.0, beta_slow=1.0),
    "linear+attn": dict(n_ctx_orig=4096, freq_base=500000.0, freq_scale=0.125, ext_factor=0.0,
                        attn_factor=1.3, beta_fast=32.0, beta_slow=1.0),
    "yarn-half-ext": dict(n_ctx_orig=512, freq_base=10000.0, freq_scale=0.1, ext_factor=0.5,
                          attn_factor=1.0, beta_fast=24.0, beta_slow=2.0),
    # n_ctx_orig = 0: corr dims are -inf; the ramp's divisor is clamped to 0.001
    "yarn-ctx0": dict(n_ctx_orig=0, freq_base=10000.0, freq_scale=0.5, ext_factor=1.0,
                      attn_factor=1.0, beta_fast=32.0, beta_slow=1.0),
    # high < low (corr dims cross): ggml's ramp clamps the divisor to 0.001
    "yarn-crossed": dict(n_ctx_orig=100000, freq_base=10.0, freq_scale=0.5, ext_factor=1.0,
                         attn_factor=1.0, beta_fast=1.0, beta_slow=32.0),
}


@pytest.mark.parametrize("use_ff", [False, True], ids=["no-ff", "ff"])
@pytest.mark.parametrize("pset", list(PARAM_SETS))
@pytest.mark.parametrize("mode_name", list(MODES))
def test_parameter_sets_match_c_loop(mode_name, pset, use_ff, rng):
    mode, n_dims, _, sections, _ = MODES[mode_name]
    params = dict(PARAM_SETS[pset], n_dims=n_dims, mode=mode, sections=sections or (0, 0, 0, 0))
    x = randn(rng, (B, S, N, D))
    pos = make_pos(rng, mode)
    ff = make_ff(rng, mode, n_dims, extra=0) if use_ff else None
    for forward in (True, False):
        got, ref = run_both(x, pos, ff, params, forward)
        check(got, ref, x, "float32", params)


def test_crossed_corr_dims_really_cross():
    lo, hi = c_corr_dims(24, 100000, 10.0, 1.0, 32.0)
    assert hi < lo
    assert ggml.yarn_corr_dims(24, 100000, 10.0, 1.0, 32.0) == (lo, hi)
    lo, hi = c_corr_dims(24, 0, 10000.0, 32.0, 1.0)
    assert lo == 0 and hi == -np.inf
    assert ggml.yarn_corr_dims(24, 0, 10000.0, 32.0, 1.0) == (lo, hi)


# (mode, n_dims, sections): mapping edge cases run through the C loop
EDGE = {
    "mrope-sum>pairs": (GGML_MROPE, 8, (3, 3, 3, 0)),
    "mrope-e-stream": (GGML_MROPE, 24, (1, 2, 1, 2)),
    "mrope-only-w": (GGML_MROPE, 16, (0, 0, 5, 0)),
    "imrope-qwen3vl-like": (GGML_IMROPE, 24, (5, 4, 3, 0)),
    "imrope-e-beyond": (GGML_IMROPE, 24, (1, 3, 3, 2)),
    "vision-t-empty": (GGML_VISION, 12, (0, 6, 0, 0)),
    "vision-3-sections": (GGML_VISION, 12, (3, 4, 2, 1)),
    "vision-sum<pairs": (GGML_VISION, 12, (2, 3, 0, 0)),
}


@pytest.mark.parametrize("edge", list(EDGE))
def test_section_edge_cases_match_c_loop(edge, rng):
    mode, n_dims, sections = EDGE[edge]
    params = dict(YARN, n_dims=n_dims, mode=mode, sections=sections)
    x = randn(rng, (1, 4, 2, D))
    pos = make_pos(rng, mode, s=4)
    ff = make_ff(rng, mode, n_dims)
    for forward in (True, False):
        got, ref = run_both(x, pos, ff, params, forward)
        check(got, ref, x, "float32", params)


def test_pair_streams_mrope_repeats_and_cuts():
    st, k = ggml.pair_streams(GGML_MROPE, 12, (2, 3, 3, 0))
    assert st.tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 1, 1]
    assert k.tolist() == list(range(12))  # the frequency index runs on across sections
    st, _ = ggml.pair_streams(GGML_MROPE, 6, (2, 3, 3, 0))
    assert st.tolist() == [0, 0, 1, 1, 1, 2]
    st, _ = ggml.pair_streams(GGML_MROPE, 6, (1, 1, 1, 2))
    assert st.tolist() == [0, 1, 2, 3, 3, 0]


def test_pair_streams_imrope_fourth_stream():
    st, k = ggml.pair_streams(GGML_IMROPE, 8, (2, 2, 2, 1))
    assert st.tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert k.tolist() == list(range(8))
    # Qwen3-VL's [24, 20, 20]: HF uses T for pairs 60..63; ggml sends 61 and 62 to e
    st, _ = ggml.pair_streams(GGML_IMROPE, 64, (24, 20, 20, 0))
    j = np.arange(64)
    hf = np.where((j % 3 == 1) & (j < 60), 1, np.where((j % 3 == 2) & (j < 60), 2, 0))
    diff = np.nonzero(st != hf)[0].tolist()
    assert diff == [61, 62] and st[61] == st[62] == 3


def test_pair_streams_vision_restarts_per_section():
    st, k = ggml.pair_streams(GGML_VISION, 12, (4, 5, 0, 0))
    assert st.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]
    assert k.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2]
    # sections[0] == 0: the else-if chain resets t at sector 0, never h
    st, k = ggml.pair_streams(GGML_VISION, 12, (0, 6, 0, 0))
    assert st.tolist() == [1] * 12
    assert k.tolist() == list(range(12))


def test_vision_config_pairs_over_whole_head():
    cfg = ggml.rope_config(16, n_dims=8, mode=GGML_VISION, sections=(4, 4, 0, 0), freq_base=100.0)
    assert cfg.rotary_dim == 16 and not cfg.interleaved
    want = 100.0 ** (-2.0 * np.array([0, 1, 2, 3, 0, 1, 2, 3]) / 8)
    np.testing.assert_allclose(cfg.inv_freq, want, rtol=1e-15)
    assert cfg.stream_map.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_normal_mode_is_interleaved_and_neox_half_split():
    assert ggml.rope_config(8, n_dims=8, mode=0).interleaved
    assert not ggml.rope_config(8, n_dims=8, mode=2).interleaved
    assert ggml.rope_config(8, n_dims=8, mode=2).stream_map is None


def test_three_dim_src_equals_batch_of_one(rng):
    params = dict(YARN, n_dims=12, mode=GGML_MROPE, sections=(2, 3, 3, 0))
    x = randn(rng, (S, N, D))
    pos = make_pos(rng, GGML_MROPE)
    got3 = ggml.rope(x, pos, **params)
    got4 = ggml.rope(x[None], pos, **params)
    np.testing.assert_array_equal(got3, got4[0])


def test_backward_inverts_forward(rng):
    params = dict(YARN, n_dims=24, mode=GGML_IMROPE, sections=(2, 2, 2, 1))
    x = rng.standard_normal((B, S, N, D)).astype(np.float32)
    pos = make_pos(rng, GGML_IMROPE)
    y = ggml.rope(x, pos, **params)
    back = ggml.rope(y, pos, forward=False, **params)
    m = c_mscale(0.9, 0.25, 1.0)
    np.testing.assert_allclose(back / m ** 2, x, atol=2e-6 * np.abs(x).max())


def test_out_and_inplace(rng):
    x = randn(rng, (B, S, N, D))
    pos = make_pos(rng, 0)
    params = dict(YARN, n_dims=12, mode=0)
    ref = ggml.rope(x, pos, **params)
    out = np.full_like(x, np.nan)
    assert ggml.rope(x, pos, out=out, **params) is out
    np.testing.assert_array_equal(out, ref)
    y = x.copy()
    assert ggml.rope(y, pos, inplace=True, **params) is y
    np.testing.assert_array_equal(y, ref)


def test_freq_factors_are_read_as_float32(rng):
    x = randn(rng, (1, S, 1, 8))
    pos = make_pos(rng, 0)
    ff64 = np.array([1.0, 1.1, 1.3, 2.7])
    a = ggml.rope(x, pos, ff64, n_dims=8, mode=2)
    b = ggml.rope(x, pos, ff64.astype(np.float32), n_dims=8, mode=2)
    np.testing.assert_array_equal(a, b)


def test_config_cache_returns_same_object_and_distinguishes_freq_factors():
    a = ggml.rope_config(16, np.ones(4, np.float32), n_dims=8, mode=2)
    b = ggml.rope_config(16, np.ones(4, np.float32), n_dims=8, mode=2)
    c = ggml.rope_config(16, np.full(4, 2.0, np.float32), n_dims=8, mode=2)
    assert a is b and c is not a
    np.testing.assert_allclose(c.inv_freq * 2, a.inv_freq)


# --------------------------------------------------------------------------- errors

def call(x=None, pos=None, ff=None, **kw):
    rng = np.random.default_rng(1)
    mode = kw.setdefault("mode", 0)
    kw.setdefault("n_dims", 8)
    if x is None:
        x = randn(rng, (1, 3, 2, 16))
    if pos is None:
        pos = make_pos(rng, mode, s=x.shape[-3])
    return ggml.rope(x, pos, ff, **kw)


@pytest.mark.parametrize("n_dims,msg", [(7, "positive even"), (0, "positive even"),
                                        (-2, "positive even"), (18, r"<= the head dim")])
def test_bad_n_dims(n_dims, msg):
    with pytest.raises(ValueError, match=msg):
        call(n_dims=n_dims)


def test_n_dims_must_be_int():
    with pytest.raises(TypeError, match="n_dims must be an int"):
        call(n_dims=8.0)


def test_vision_needs_half_head():
    with pytest.raises(ValueError, match=r"vision mode needs n_dims = D/2"):
        call(mode=GGML_VISION, n_dims=6, sections=(3, 3, 0, 0))
    call(mode=GGML_VISION, n_dims=8, sections=(4, 4, 0, 0))  # D = 16: fine


@pytest.mark.parametrize("mode", [GGML_MROPE, GGML_VISION, GGML_IMROPE])
@pytest.mark.parametrize("sections,err,msg", [
    ((0, 0, 0, 0), ValueError, r"needs sections with sections\[0\], \[1\] or \[2\] > 0"),
    ((0, 0, 0, 4), ValueError, r"needs sections with"),
    ((2, 2, 2), ValueError, "4 entries"),
    ((2, -1, 2, 0), ValueError, ">= 0"),
    ((9, 9, 0, 0), ValueError, r"sum\(sections\) \(18\) must be <= the head dim"),
    ((2.0, 2, 2, 0), TypeError, "int"),
    (None, TypeError, "sections must be 4 ints"),
])
def test_bad_sections(mode, sections, err, msg):
    n_dims = 8
    with pytest.raises(err, match=msg):
        call(mode=mode, n_dims=n_dims, sections=sections)


@pytest.mark.parametrize("mode", [1, 4, 10, 16, 32, 56])
def test_unknown_mode(mode):
    with pytest.raises(ValueError, match=r"unknown mode"):
        call(mode=mode, pos=np.zeros(12, np.int32))


def test_freq_factors_length_and_type():
    with pytest.raises(ValueError, match=r"at least n_dims/2 = 4 entries, got 3"):
        call(n_dims=8, ff=np.ones(3, np.float32))
    call(n_dims=8, ff=np.ones(4, np.float32))
    # vision reads one factor per pair of the whole head (n_dims of them)
    with pytest.raises(ValueError, match=r"at least n_dims .* = 8 entries, got 4"):
        call(mode=GGML_VISION, n_dims=8, sections=(4, 4, 0, 0), ff=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="1-D float array"):
        call(ff=np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="1-D float array"):
        call(ff=np.ones(4, np.int32))
    with pytest.raises(ValueError, match="finite and non-zero"):
        call(ff=np.array([1, 0, 1, 1], np.float32))


def test_pos_dtype_and_length():
    with pytest.raises(TypeError, match="pos must be int32, got int64"):
        call(pos=np.arange(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"pos must be 1-D with S = 3 entries"):
        call(pos=np.arange(4, dtype=np.int32))
    with pytest.raises(ValueError, match=r"pos must be 1-D with S = 3 entries"):
        call(pos=np.zeros(12, np.int32))
    with pytest.raises(ValueError, match=r"4\*S .* = 12 entries"):
        call(mode=GGML_MROPE, sections=(1, 1, 2, 0), pos=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"4\*S"):
        call(mode=GGML_MROPE, sections=(1, 1, 2, 0), pos=np.zeros((4, 3), np.int32))
    with pytest.raises(TypeError, match="pos must be an array"):
        call(pos=[0, 1, 2])


def test_src0_rank_and_dtype():
    with pytest.raises(ValueError, match=r"src0 must be \[B, S, N, D\] or \[S, N, D\]"):
        call(x=np.ones((3, 16), np.float32), pos=np.zeros(3, np.int32))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        call(x=np.ones((1, 3, 2, 16), np.float64))


@pytest.mark.parametrize("kw,msg", [
    (dict(freq_base=0.0), "freq_base must be > 0"),
    (dict(freq_base=-10.0), "freq_base must be > 0"),
    (dict(freq_scale=0.0), "freq_scale must be > 0"),
    (dict(freq_scale=float("nan")), "freq_scale must be finite"),
    (dict(ext_factor=float("inf")), "ext_factor must be finite"),
    (dict(attn_factor=float("nan")), "attn_factor must be finite"),
    (dict(attn_factor=0.0), "attn_factor must be > 0"),
    (dict(attn_factor=-1.0), "attn_factor must be > 0"),
    (dict(beta_fast=-1.0, ext_factor=1.0, n_ctx_orig=100), "non-finite"),
])
def test_bad_float_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        call(**kw)


def test_bad_n_ctx_orig_type():
    with pytest.raises(TypeError, match="n_ctx_orig must be an int"):
        call(n_ctx_orig=4096.0)


@pytest.mark.parametrize("mode", [ggml.MROPE, ggml.VISION, ggml.IMROPE])
def test_multi_modes_with_every_pair_on_the_t_stream_take_batches(mode):
    """Sections that send every rotated pair to stream t leave a one-stream
    config; its positions must still be read per token for B > 1 and 3-D src0
    (the fuzz found [1, S] read as [B, S])."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)
    pos = np.concatenate([np.arange(3, dtype=np.int32) * 5, np.full(9, 77, np.int32)])
    secs = (4, 0, 0, 0) if mode != ggml.VISION else (2, 0, 0, 0)
    n_dims = 8 if mode != ggml.VISION else 4
    got = ggml.rope(x, pos, n_dims=n_dims, mode=mode, sections=secs)
    for b in range(2):  # each sequence alone equals the batched call
        np.testing.assert_array_equal(got[b:b + 1], ggml.rope(x[b:b + 1], pos, n_dims=n_dims,
                                                                mode=mode, sections=secs))
    three_d = ggml.rope(x[0], pos, n_dims=n_dims, mode=mode, sections=secs)
    np.testing.assert_array_equal(three_d, got[0])
