"""CPU tests of the float64 reference and of the public API on NumPy arrays.

Every expectation here is built from an INDEPENDENT formulation written from
the seed documents (never from ``reference.rotate``):

  (a) RoFormer's block-diagonal D×D matrix R_m (interleaved pairs), applied by
      matmul; and its LLaMA half-split counterpart (seed 001 "llama实现");
  (b) the complex form: a pair is a complex number, rotated by q·e^{imθ};
  (c) the HF / ChatGLM ``rotate_half`` form: x·cos + cat([−x2, x1])·sin, with
      partial rotary (x_rope, x_pass);
  (d) the seed-001 element-wise interleaved form: x·cos + [−x1, x0, −x3, x2…]·sin.

θ_i comes from the seed formula ``1 / base**(arange(0, R, 2) / R)``.
Float64 results are compared at 1e-12 (relative to the input's magnitude);
low-precision API outputs must equal the float64 expectation rounded to the
output dtype.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuprope
from cuprope import RopeConfig, reference

TOL = 1e-12
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# --------------------------------------------------------------------------- independent formulations

def seed_theta(rotary_dim, base=10000.0):
    """Seed 002/003: theta = 1.0 / (base ** (arange(0, d, 2) / d))."""
    return 1.0 / (base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))


def roformer_matrix(pair_angles, head_dim):
    """Seed 001/002 R^d_{m,Θ}: 2×2 blocks [[cos, −sin], [sin, cos]] on the diagonal
    for pairs (2j, 2j+1); identity on dims ≥ R (partial rotary)."""
    r = np.eye(head_dim)
    for j, a in enumerate(pair_angles):
        c, s = np.cos(a), np.sin(a)
        r[2 * j, 2 * j], r[2 * j, 2 * j + 1] = c, -s
        r[2 * j + 1, 2 * j], r[2 * j + 1, 2 * j + 1] = s, c
    return r


def llama_matrix(pair_angles, head_dim):
    """Seed 001 "llama实现": cos on the diagonal of both halves, −sin at
    (j, j + R/2), sin at (j + R/2, j); identity on dims ≥ R."""
    r = np.eye(head_dim)
    h = len(pair_angles)
    for j, a in enumerate(pair_angles):
        c, s = np.cos(a), np.sin(a)
        r[j, j], r[j, j + h] = c, -s
        r[j + h, j], r[j + h, j + h] = s, c
    return r


def matrix_form(x, ang, rotary_dim, interleaved, scale=1.0, inverse=False):
    """x [B, S, H, D], ang [B, S, H or 1, R/2]: y = R_m x per token and head by
    matmul (R_m^T for the inverse, seed 000's W_t(−Θ) = W_t^T)."""
    b_, s_, h_, d = x.shape
    ang = np.broadcast_to(ang, (b_, s_, h_, rotary_dim // 2))
    build = roformer_matrix if interleaved else llama_matrix
    y = np.empty_like(x)
    for b in range(b_):
        for s in range(s_):
            for h in range(h_):
                r = build(ang[b, s, h], d)
                r[:rotary_dim, :rotary_dim] *= scale
                if inverse:
                    r = r.T
                y[b, s, h] = r @ x[b, s, h]
    return y


def complex_form(x, ang, rotary_dim, interleaved, scale=1.0, inverse=False):
    """Seed 003: a pair (x1, x2) is x1 + i·x2 and becomes (x1 + i·x2)·e^{imθ}."""
    h = rotary_dim // 2
    if interleaved:
        re_idx, im_idx = np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2)
    else:
        re_idx, im_idx = np.arange(h), np.arange(h, rotary_dim)
    z = x[..., re_idx] + 1j * x[..., im_idx]
    z = z * (scale * np.exp((-1j if inverse else 1j) * ang))
    y = x.copy()
    y[..., re_idx] = z.real
    y[..., im_idx] = z.imag
    return y


def rotate_half(x):
    """Seed 002 (ChatGLM / HF)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return np.concatenate((-x2, x1), axis=-1)


def rotate_half_form(x, ang, rotary_dim, scale=1.0, inverse=False):
    """Seed 002: x_rope, x_pass = x[..., :d], x[..., d:];
    x_rope = x_rope·cos_cached + rotate_half(x_rope)·sin_cached, with
    cos_cached = cos(cat([mθ, mθ]))."""
    ang = -ang if inverse else ang
    x_rope, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    idx_theta2 = np.concatenate([ang, ang], axis=-1)
    cos_cached, sin_cached = np.cos(idx_theta2) * scale, np.sin(idx_theta2) * scale
    x_rope = x_rope * cos_cached + rotate_half(x_rope) * sin_cached
    return np.concatenate([x_rope, np.broadcast_to(x_pass, x_rope.shape[:-1] + x_pass.shape[-1:])],
                          axis=-1)


def interleaved_elementwise_form(x, ang, rotary_dim, scale=1.0, inverse=False):
    """Seed 001 "原始论文等价": x ⊗ [cos mθ0, cos mθ0, …] + [−x1, x0, −x3, x2, …] ⊗ [sin mθ0, sin mθ0, …]."""
    ang = -ang if inverse else ang
    x_rope, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    swapped = np.empty_like(x_rope)
    swapped[..., 0::2] = -x_rope[..., 1::2]
    swapped[..., 1::2] = x_rope[..., 0::2]
    cos_rep = np.repeat(np.cos(ang), 2, axis=-1) * scale
    sin_rep = np.repeat(np.sin(ang), 2, axis=-1) * scale
    x_rope = x_rope * cos_rep + swapped * sin_rep
    return np.concatenate([x_rope, np.broadcast_to(x_pass, x_rope.shape[:-1] + x_pass.shape[-1:])],
                          axis=-1)


def seed_form(x, ang, rotary_dim, interleaved, scale=1.0, inverse=False):
    """The element-wise seed form for the layout: (d) interleaved, (c) half split."""
    if interleaved:
        return interleaved_elementwise_form(x, ang, rotary_dim, scale, inverse)
    return rotate_half_form(x, ang, rotary_dim, scale, inverse)


def pair_permutation(rotary_dim, head_dim):
    """perm with x_interleaved = x_half[..., perm]: interleaved dim 2j is half
    dim j, 2j+1 is j + R/2; dims ≥ R stay in place."""
    h = rotary_dim // 2
    perm = np.arange(head_dim)
    perm[0:rotary_dim:2] = np.arange(h)
    perm[1:rotary_dim:2] = np.arange(h, rotary_dim)
    return perm


# layout handling, written here (not taken from the package)
def to_bshd(a, layout):
    return {"bshd": lambda t: t, "bhsd": lambda t: t.transpose(0, 2, 1, 3),
            "thd": lambda t: t[None]}[layout](a)


def from_bshd(a, layout):
    return {"bshd": lambda t: t, "bhsd": lambda t: t.transpose(0, 2, 1, 3),
            "thd": lambda t: t[0]}[layout](a)


def shape_for(layout, b, s, h, d):
    return {"bshd": (b, s, h, d), "bhsd": (b, h, s, d), "thd": (s, h, d)}[layout]


def expect_api(x, layout, rotary_dim, interleaved, token_pos, theta, *, scale=1.0,
               inverse=False, form=seed_form):
    """float64 expectation for a public-API call.

    token_pos: per-token position ``[B, S]`` (canonical) or per-pair ``[B, S, R/2]``;
    theta: ``[R/2]`` shared or ``[H, R/2]`` per head."""
    xc = to_bshd(np.asarray(x).astype(np.float64), layout)
    p = np.asarray(token_pos, dtype=np.float64)
    if p.ndim == 2:
        p = p[..., None]
    theta = np.asarray(theta, dtype=np.float64)
    theta = theta if theta.ndim == 2 else theta[None]
    ang = p[:, :, None, :] * theta[None, None, :, :]          # [B, S, H or 1, P]
    ang = np.broadcast_to(ang, xc.shape[:3] + (rotary_dim // 2,))
    if form is seed_form:
        y = seed_form(xc, ang, rotary_dim, interleaved, scale, inverse)
    else:
        y = form(xc, ang, rotary_dim, interleaved, scale, inverse)
    return from_bshd(y, layout)


def assert_close64(actual, expected, scale_of):
    actual = np.asarray(actual)
    assert actual.dtype == np.float64
    assert actual.shape == expected.shape
    atol = TOL * max(1.0, float(np.max(np.abs(scale_of))))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)


def assert_rounded(out, ref64, dtype, xmax):
    """``out`` (dtype) must be ``ref64`` rounded to ``dtype``. A window of
    ±1e-12·max|x| around ref64 absorbs float64 differences between
    formulations; rounding is monotone, so the rounded window is usually a
    single value."""
    np_dtype = DTYPES[dtype]
    assert out.dtype == np.dtype(np_dtype), (out.dtype, dtype)
    assert out.shape == ref64.shape
    tol = TOL * max(1.0, xmax)
    lo = (ref64 - tol).astype(np_dtype).astype(np.float64)
    hi = (ref64 + tol).astype(np_dtype).astype(np.float64)
    o = out.astype(np.float64)
    bad = ~((o >= lo) & (o <= hi))
    if bad.any():
        i = np.unravel_index(np.argmax(bad), bad.shape)
        raise AssertionError(f"{bad.sum()} of {bad.size} elements are not the rounded float64 "
                             f"expectation; first at {i}: out={o[i]!r} expected={ref64[i]!r}")


def randn(rng, shape, dtype="float64"):
    x = rng.standard_normal(shape)
    x[x == 0] = 0.5  # never zeros
    return x.astype(DTYPES.get(dtype, np.float64))


def rand_angles(rng, b, s, h, pairs, rotary_dim, max_pos=1000):
    pos = rng.integers(0, max_pos, size=(b, s))
    theta = seed_theta(rotary_dim)
    return pos, np.broadcast_to(pos[:, :, None, None] * theta, (b, s, h, pairs)).copy()


# --------------------------------------------------------------------------- reference.rotate vs the seeds

@pytest.mark.parametrize("rotary_dim,head_dim", [(16, 16), (8, 14), (2, 6)])
@pytest.mark.parametrize("inverse", [False, True])
def test_reference_interleaved_equals_roformer_block_diagonal_matmul(rng, rotary_dim, head_dim, inverse):
    x = randn(rng, (2, 5, 3, head_dim))
    _, ang = rand_angles(rng, 2, 5, 3, rotary_dim // 2, rotary_dim)
    got = reference.rotate(x, ang, rotary_dim=rotary_dim, interleaved=True, inverse=inverse)
    assert_close64(got, matrix_form(x, ang, rotary_dim, True, inverse=inverse), x)


@pytest.mark.parametrize("rotary_dim,head_dim", [(16, 16), (8, 14), (2, 6)])
@pytest.mark.parametrize("inverse", [False, True])
def test_reference_half_split_equals_llama_matrix_matmul(rng, rotary_dim, head_dim, inverse):
    x = randn(rng, (2, 5, 3, head_dim))
    _, ang = rand_angles(rng, 2, 5, 3, rotary_dim // 2, rotary_dim)
    got = reference.rotate(x, ang, rotary_dim=rotary_dim, interleaved=False, inverse=inverse)
    assert_close64(got, matrix_form(x, ang, rotary_dim, False, inverse=inverse), x)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("scale", [1.0, 0.7])
@pytest.mark.parametrize("inverse", [False, True])
def test_reference_equals_complex_multiplication_by_e_i_m_theta(rng, interleaved, scale, inverse):
    x = randn(rng, (3, 7, 2, 24))
    _, ang = rand_angles(rng, 3, 7, 2, 8, 16)
    got = reference.rotate(x, ang, rotary_dim=16, interleaved=interleaved, scale=scale,
                           inverse=inverse)
    assert_close64(got, complex_form(x, ang, 16, interleaved, scale, inverse), x)


@pytest.mark.parametrize("rotary_dim,head_dim", [(32, 32), (16, 48), (4, 10)])
@pytest.mark.parametrize("scale", [1.0, 1.3])
def test_reference_half_split_equals_chatglm_rotate_half_with_partial_rotary(rng, rotary_dim,
                                                                             head_dim, scale):
    x = randn(rng, (2, 6, 4, head_dim))
    _, ang = rand_angles(rng, 2, 6, 1, rotary_dim // 2, rotary_dim)  # shared by heads: H axis 1
    got = reference.rotate(x, ang, rotary_dim=rotary_dim, interleaved=False, scale=scale)
    want = rotate_half_form(x, ang, rotary_dim, scale)
    assert_close64(got, want, x)
    # x_pass is concatenated back untouched
    assert np.array_equal(got[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("rotary_dim,head_dim", [(32, 32), (16, 48), (4, 10)])
def test_reference_interleaved_equals_seed001_elementwise_swap_form(rng, rotary_dim, head_dim):
    x = randn(rng, (2, 6, 4, head_dim))
    _, ang = rand_angles(rng, 2, 6, 4, rotary_dim // 2, rotary_dim)
    for inverse in (False, True):
        got = reference.rotate(x, ang, rotary_dim=rotary_dim, interleaved=True, inverse=inverse)
        assert_close64(got, interleaved_elementwise_form(x, ang, rotary_dim, inverse=inverse), x)
    assert np.array_equal(got[..., rotary_dim:], x[..., rotary_dim:])


@settings(max_examples=40, deadline=None, database=None)
@given(pairs=st.integers(1, 8), extra=st.integers(0, 5), interleaved=st.booleans(),
       pos=st.integers(-5000, 5000), seed=st.integers(0, 2 ** 32 - 1))
def test_reference_matches_explicit_matrix_for_any_shape_and_position(pairs, extra, interleaved,
                                                                      pos, seed):
    rng = np.random.default_rng(seed)
    r = 2 * pairs
    d = r + extra
    x = randn(rng, (1, 1, 1, d))
    ang = (pos * seed_theta(r)).reshape(1, 1, 1, pairs)
    got = reference.rotate(x, ang, rotary_dim=r, interleaved=interleaved)
    assert_close64(got, matrix_form(x, ang, r, interleaved), x)


# --------------------------------------------------------------------------- algebraic properties

def _rot64(v, m, rotary_dim, interleaved, theta=None):
    theta = seed_theta(rotary_dim) if theta is None else theta
    ang = (m * theta).reshape(1, 1, 1, -1)
    return reference.rotate(v.reshape(1, 1, 1, -1), ang, rotary_dim=rotary_dim,
                            interleaved=interleaved)[0, 0, 0]


@pytest.mark.parametrize("interleaved", [True, False])
def test_reference_relative_position_property_dot_depends_only_on_n_minus_m(rng, interleaved):
    d = r = 64
    q, k = randn(rng, d), randn(rng, d)
    for m, n in [(0, 0), (3, 11), (11, 3), (100, 37), (1000, 1500), (2047, 0)]:
        lhs = _rot64(q, m, r, interleaved) @ _rot64(k, n, r, interleaved)
        rhs = q @ _rot64(k, n - m, r, interleaved)
        assert abs(lhs - rhs) <= TOL * np.linalg.norm(q) * np.linalg.norm(k), (m, n, lhs, rhs)
    # and it really depends on the distance: shifting only n changes the score
    assert abs(q @ _rot64(k, 5, r, interleaved) - q @ _rot64(k, 6, r, interleaved)) > 1e-6


@pytest.mark.parametrize("interleaved", [True, False])
def test_reference_rotation_preserves_norm_of_every_token_and_scales_with_scale(rng, interleaved):
    x = randn(rng, (2, 9, 3, 40))
    _, ang = rand_angles(rng, 2, 9, 3, 16, 32, max_pos=100000)
    y = reference.rotate(x, ang, rotary_dim=32, interleaved=interleaved)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=TOL, atol=0)
    # each pair keeps its own length (a rotation inside the pair, not a mix of pairs)
    idx = (np.arange(0, 32, 2), np.arange(1, 32, 2)) if interleaved else (np.arange(16),
                                                                           np.arange(16, 32))
    np.testing.assert_allclose(np.hypot(y[..., idx[0]], y[..., idx[1]]),
                               np.hypot(x[..., idx[0]], x[..., idx[1]]), rtol=TOL, atol=0)
    ys = reference.rotate(x, ang, rotary_dim=32, interleaved=interleaved, scale=0.5)
    np.testing.assert_allclose(np.linalg.norm(ys[..., :32], axis=-1),
                               0.5 * np.linalg.norm(x[..., :32], axis=-1), rtol=TOL, atol=0)


@pytest.mark.parametrize("interleaved", [True, False])
def test_reference_inverse_undoes_forward_and_is_its_transpose(rng, interleaved):
    x, g = randn(rng, (2, 8, 3, 20)), randn(rng, (2, 8, 3, 20))
    _, ang = rand_angles(rng, 2, 8, 3, 8, 16)
    kw = dict(rotary_dim=16, interleaved=interleaved)
    fwd = reference.rotate(x, ang, **kw)
    assert_close64(reference.rotate(fwd, ang, inverse=True, **kw), x, x)
    assert_close64(reference.rotate(reference.rotate(x, ang, inverse=True, **kw), ang, **kw), x, x)
    # backward is the adjoint (hence the gradient) of the linear forward map: <R x, g> = <x, R^T g>
    lhs = np.sum(fwd * g)
    rhs = np.sum(x * reference.rotate(g, ang, inverse=True, **kw))
    assert abs(lhs - rhs) <= TOL * np.linalg.norm(x) * np.linalg.norm(g)
    # and is not the identity: forward really moved x
    assert np.max(np.abs(fwd - x)) > 0.1


@pytest.mark.parametrize("rotary_dim,head_dim", [(16, 16), (8, 12)])
def test_reference_interleaved_equals_half_split_under_pair_permutation(rng, rotary_dim, head_dim):
    x_half = randn(rng, (2, 5, 3, head_dim))
    _, ang = rand_angles(rng, 2, 5, 3, rotary_dim // 2, rotary_dim)
    perm = pair_permutation(rotary_dim, head_dim)
    y_half = reference.rotate(x_half, ang, rotary_dim=rotary_dim, interleaved=False)
    y_int = reference.rotate(x_half[..., perm], ang, rotary_dim=rotary_dim, interleaved=True)
    assert_close64(y_int, y_half[..., perm], x_half)
    # the permutation is not the identity, so the two layouts do differ on the same input
    assert np.max(np.abs(reference.rotate(x_half, ang, rotary_dim=rotary_dim, interleaved=True)
                         - y_half)) > 1e-3


# --------------------------------------------------------------------------- tables and positions

@pytest.mark.parametrize("rotary_dim", [2, 8, 64, 128, 256])
@pytest.mark.parametrize("base", [10000.0, 500000.0, 10.0, 1e6])
def test_default_inv_freq_is_base_to_minus_2i_over_R(rotary_dim, base):
    got = reference.default_inv_freq(rotary_dim, base)
    want = np.array([base ** (-2.0 * i / rotary_dim) for i in range(rotary_dim // 2)])
    assert got.dtype == np.float64 and got.shape == (rotary_dim // 2,)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
    np.testing.assert_allclose(got, seed_theta(rotary_dim, base), rtol=1e-14, atol=0)
    assert got[0] == 1.0
    np.testing.assert_allclose(cuprope.default_inv_freq(rotary_dim, base), want, rtol=1e-14)
    np.testing.assert_allclose(RopeConfig(rotary_dim, base=base).inv_freq, want, rtol=1e-14)


def test_rope_config_defaults_to_base_10000_and_copies_a_given_table():
    np.testing.assert_allclose(RopeConfig(32).inv_freq, seed_theta(32, 10000.0), rtol=1e-14)
    table = np.linspace(0.1, 1.0, 4)
    cfg = RopeConfig(8, inv_freq=table)
    table[:] = 99.0
    np.testing.assert_array_equal(cfg.inv_freq, np.linspace(0.1, 1.0, 4))
    assert cfg.inv_freq.dtype == np.float64


def test_token_positions_implicit_are_0_to_S_minus_1_for_every_sequence():
    p = reference.token_positions(3, 5)
    assert p.dtype == np.int64 and p.shape == (1, 3, 5)
    np.testing.assert_array_equal(p, np.tile(np.arange(5), (1, 3, 1)))


def test_token_positions_add_offset_and_per_sequence_seq_offsets():
    p = reference.token_positions(3, 4, offset=10, seq_offsets=np.array([0, 5, -2], np.int32))
    want = np.arange(4)[None, :] + 10 + np.array([0, 5, -2])[:, None]
    np.testing.assert_array_equal(p[0], want)
    assert p.dtype == np.int64


def test_token_positions_S_shaped_positions_broadcast_over_batch_and_add_offsets():
    pos = np.array([7, 3, 100, 0], np.int32)
    p = reference.token_positions(2, 4, positions=pos, offset=-1, seq_offsets=np.array([0, 1000]))
    np.testing.assert_array_equal(p[0], np.stack([pos - 1, pos - 1 + 1000]))


def test_token_positions_BS_shaped_positions_are_per_sequence():
    pos = np.array([[1, 2, 3], [40, 50, 60]], np.int64)
    p = reference.token_positions(2, 3, positions=pos, offset=2)
    assert p.shape == (1, 2, 3)
    np.testing.assert_array_equal(p[0], pos + 2)


def test_token_positions_widen_int32_before_adding_offset():
    big = np.int32(2 ** 31 - 1)
    p = reference.token_positions(1, 2, positions=np.array([big, 0], np.int32), offset=100)
    np.testing.assert_array_equal(p[0, 0], [2 ** 31 - 1 + 100, 100])


def test_token_positions_multi_stream_with_and_without_batch_axis():
    ps = np.array([[0, 1, 2], [10, 11, 12], [20, 21, 22]])
    p = reference.token_positions(2, 3, positions=ps, n_streams=3, offset=1)
    assert p.shape == (3, 2, 3)
    np.testing.assert_array_equal(p, np.broadcast_to(ps[:, None, :] + 1, (3, 2, 3)))
    pbs = np.arange(18).reshape(3, 2, 3)
    p = reference.token_positions(2, 3, positions=pbs, n_streams=3, seq_offsets=np.array([5, 7]))
    np.testing.assert_array_equal(p, pbs + np.array([5, 7])[None, :, None])
    p = reference.token_positions(2, 3, n_streams=2)
    np.testing.assert_array_equal(p, np.broadcast_to(np.arange(3), (2, 2, 3)))


def test_pair_angles_shared_table_is_position_times_theta():
    theta = seed_theta(8)
    pos = reference.token_positions(2, 3, positions=np.array([[0, 5, 9], [1, 2, 1000]]))
    a = reference.pair_angles(pos, theta)
    assert a.shape == (2, 3, 1, 4) and a.dtype == np.float64
    want = np.array([[0, 5, 9], [1, 2, 1000]], np.float64)[:, :, None, None] * theta
    np.testing.assert_array_equal(a, want)


def test_pair_angles_per_head_table_gives_each_head_its_own_theta(rng):
    table = rng.uniform(0.01, 1.0, size=(3, 4))
    pos = reference.token_positions(2, 5)
    a = reference.pair_angles(pos, table)
    assert a.shape == (2, 5, 3, 4)
    for h in range(3):
        np.testing.assert_array_equal(a[:, :, h, :],
                                      np.broadcast_to(np.arange(5.0)[:, None] * table[h], (2, 5, 4)))


def test_pair_angles_stream_map_takes_each_pairs_position_from_its_stream():
    theta = seed_theta(8)
    smap = np.array([0, 2, 1, 2])
    ps = np.array([[0, 1, 2], [100, 200, 300], [-7, 8, 9]])
    pos = reference.token_positions(1, 3, positions=ps, n_streams=3)
    a = reference.pair_angles(pos, theta, smap)
    assert a.shape == (1, 3, 1, 4)
    for j in range(4):
        np.testing.assert_array_equal(a[0, :, 0, j], ps[smap[j]] * theta[j])


# --------------------------------------------------------------------------- public API on NumPy arrays

B, S, H, D = 2, 6, 3, 24


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rope_forward_matches_seed_form_rounded_to_dtype(rng, layout, interleaved, dtype):
    r = 16  # partial rotary: dims 16…23 pass through
    b = 1 if layout == "thd" else B
    x = randn(rng, shape_for(layout, b, S, H, D), dtype)
    cfg = RopeConfig(r, interleaved=interleaved, layout=layout)
    pos_shape = (S,) if layout == "thd" else (b, S)
    positions = rng.integers(0, 900, size=pos_shape).astype(np.int32)
    y = cuprope.rope_forward(x, cfg, positions=positions, offset=5)
    assert isinstance(y, np.ndarray)
    tok = np.broadcast_to(positions, (b, S)) + 5
    ref = expect_api(x, layout, r, interleaved, tok, seed_theta(r))
    assert_rounded(y, ref, dtype, 5.0)
    assert np.array_equal(y[..., r:].view(np.uint8), x[..., r:].view(np.uint8))


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_backward_matches_complex_form_with_conjugate_rotation(rng, layout, interleaved, dtype):
    r = 8
    b = 1 if layout == "thd" else B
    g = randn(rng, shape_for(layout, b, S, H, 12), dtype)
    cfg = RopeConfig(r, interleaved=interleaved, layout=layout, base=500000.0)
    seq_off = np.array([7], np.int64) if layout == "thd" else np.array([3, 40], np.int64)
    y = cuprope.rope_backward(g, cfg, offset=2, seq_offsets=seq_off)
    tok = np.arange(S)[None, :] + 2 + seq_off[:, None]
    tok = np.broadcast_to(tok, (b, S))
    ref = expect_api(g, layout, r, interleaved, tok, seed_theta(r, 500000.0), inverse=True,
                     form=complex_form)
    assert_rounded(y, ref, dtype, 5.0)


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_qk_forward_and_backward_rotate_gqa_q_and_k_with_shared_positions(rng, layout,
                                                                              interleaved):
    r, d = 32, 32
    b = 1 if layout == "thd" else B
    q = randn(rng, shape_for(layout, b, S, 4, d), "float32")
    k = randn(rng, shape_for(layout, b, S, 2, d), "float32")
    cfg = RopeConfig(r, interleaved=interleaved, layout=layout)
    pos_shape = (S,) if layout == "thd" else (b, S)
    positions = rng.integers(0, 500, size=pos_shape)
    tok = np.broadcast_to(positions, (b, S))
    qr, kr = cuprope.rope_qk_forward(q, k, cfg, positions=positions)
    assert_rounded(qr, expect_api(q, layout, r, interleaved, tok, seed_theta(r),
                                  form=matrix_form), "float32", 5.0)
    assert_rounded(kr, expect_api(k, layout, r, interleaved, tok, seed_theta(r),
                                  form=matrix_form), "float32", 5.0)
    gq, gk = cuprope.rope_qk_backward(q, k, cfg, positions=positions)
    assert_rounded(gq, expect_api(q, layout, r, interleaved, tok, seed_theta(r), inverse=True),
                   "float32", 5.0)
    assert_rounded(gk, expect_api(k, layout, r, interleaved, tok, seed_theta(r), inverse=True),
                   "float32", 5.0)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_backward_is_the_adjoint_of_rope_forward(rng, interleaved):
    cfg = RopeConfig(16, interleaved=interleaved)
    x = randn(rng, (B, S, H, D), "float32")
    g = randn(rng, (B, S, H, D), "float32")
    pos = rng.integers(0, 4000, size=(B, S))
    lhs = np.sum(cuprope.rope_forward(x, cfg, positions=pos).astype(np.float64) * g)
    rhs = np.sum(x.astype(np.float64) * cuprope.rope_backward(g, cfg, positions=pos))
    assert abs(lhs - rhs) <= 1e-6 * np.linalg.norm(x) * np.linalg.norm(g)
    # backward ∘ forward = identity, up to one float32 rounding per step
    back = cuprope.rope_backward(cuprope.rope_forward(x, cfg, positions=pos), cfg, positions=pos)
    np.testing.assert_allclose(back, x, rtol=0, atol=1e-6 * np.abs(x).max())


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_forward_relative_position_property_through_public_api(rng, interleaved):
    d = 64
    cfg = RopeConfig(d, interleaved=interleaved, layout="thd")
    q, k = randn(rng, d), randn(rng, d)
    t = 48
    pos = np.arange(t) * 7
    qs = cuprope.rope_forward(np.tile(q, (t, 1, 1)).astype(np.float32), cfg, positions=pos)
    ks = cuprope.rope_forward(np.tile(k, (t, 1, 1)).astype(np.float32), cfg, positions=pos)
    scores = qs[:, 0].astype(np.float64) @ ks[:, 0].astype(np.float64).T   # [m, n]
    # <R_m q, R_n k> = <q, R_{n-m} k>: compare against rotating k alone by n - m
    rel = np.subtract.outer(pos, pos).T                                      # rel[m, n] = n - m
    kr = cuprope.rope_forward(np.tile(k, (t * t, 1, 1)).astype(np.float32), cfg,
                              positions=rel.ravel())[:, 0].astype(np.float64).reshape(t, t, d)
    want = np.einsum("d,mnd->mn", q.astype(np.float32).astype(np.float64), kr)
    bound = 2e-6 * np.linalg.norm(q) * np.linalg.norm(k)
    assert np.max(np.abs(scores - want)) <= bound
    assert np.ptp(scores) > 1.0  # scores do vary with the distance


def test_rope_forward_keeps_float64_angle_accuracy_at_large_positions(rng):
    r = 64
    cfg = RopeConfig(r, layout="thd")
    x = randn(rng, (64, 2, r), "float32")
    positions = rng.integers(10 ** 6, 10 ** 7, size=64)
    y = cuprope.rope_forward(x, cfg, positions=positions).astype(np.float64)
    # angles from the config's own table, multiplied in float64
    ref = expect_api(x, "thd", r, False, positions[None, :], cfg.inv_freq, form=complex_form)
    ulp32 = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(y - ref) <= ulp32 + 1e-9)


def test_rope_forward_scale_multiplies_cos_and_sin(rng):
    cfg = RopeConfig(8, scale=0.25)
    x = randn(rng, (B, S, H, 10), "float32")
    y = cuprope.rope_forward(x, cfg)
    tok = np.broadcast_to(np.arange(S), (B, S))
    ref = expect_api(x, "bshd", 8, False, tok, seed_theta(8), scale=0.25, form=matrix_form)
    assert_rounded(y, ref, "float32", 5.0)
    assert np.array_equal(y[..., 8:], x[..., 8:])


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
def test_rope_forward_out_receives_result_and_input_is_untouched(rng, layout):
    b = 1 if layout == "thd" else B
    x = randn(rng, shape_for(layout, b, S, H, D), "float16")
    x0 = x.copy()
    out = np.full_like(x, 7.0)
    cfg = RopeConfig(16, layout=layout, interleaved=True)
    y = cuprope.rope_forward(x, cfg, out=out, positions=np.arange(S))
    assert y is out
    np.testing.assert_array_equal(x, x0)
    tok = np.broadcast_to(np.arange(S), (b, S))
    assert_rounded(out, expect_api(x, layout, 16, True, tok, seed_theta(16)), "float16", 5.0)
    assert np.array_equal(out[..., 16:], x[..., 16:])  # dims ≥ R copied into out


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_forward_inplace_rotates_x_itself_and_leaves_dims_past_R(rng, layout, interleaved):
    b = 1 if layout == "thd" else B
    x = randn(rng, shape_for(layout, b, S, H, D), "bfloat16")
    x0 = x.copy()
    cfg = RopeConfig(8, layout=layout, interleaved=interleaved)
    y = cuprope.rope_forward(x, cfg, inplace=True, offset=100, positions=np.arange(S))
    assert y is x
    tok = np.broadcast_to(np.arange(S) + 100, (b, S))
    assert_rounded(x, expect_api(x0, layout, 8, interleaved, tok, seed_theta(8)), "bfloat16", 5.0)
    assert np.array_equal(x[..., 8:].view(np.uint16), x0[..., 8:].view(np.uint16))


def test_rope_forward_out_equal_to_input_is_in_place(rng):
    x = randn(rng, (B, S, H, D), "float32")
    x0 = x.copy()
    cfg = RopeConfig(24)
    y = cuprope.rope_forward(x, cfg, out=x)
    assert y is x
    tok = np.broadcast_to(np.arange(S), (B, S))
    assert_rounded(x, expect_api(x0, "bshd", 24, False, tok, seed_theta(24)), "float32", 5.0)


def test_rope_qk_out_and_inplace_write_both_tensors(rng):
    q = randn(rng, (B, S, 4, D), "float32")
    k = randn(rng, (B, S, 1, D), "float32")
    cfg = RopeConfig(12, interleaved=True)
    qo, ko = np.zeros_like(q) + 3, np.zeros_like(k) + 3
    rq, rk = cuprope.rope_qk_forward(q, k, cfg, out=(qo, ko))
    assert rq is qo and rk is ko
    tok = np.broadcast_to(np.arange(S), (B, S))
    assert_rounded(qo, expect_api(q, "bshd", 12, True, tok, seed_theta(12)), "float32", 5.0)
    assert_rounded(ko, expect_api(k, "bshd", 12, True, tok, seed_theta(12)), "float32", 5.0)
    q0, k0 = q.copy(), k.copy()
    rq, rk = cuprope.rope_qk_backward(q, k, cfg, inplace=True)
    assert rq is q and rk is k
    assert_rounded(q, expect_api(q0, "bshd", 12, True, tok, seed_theta(12), inverse=True),
                   "float32", 5.0)
    assert_rounded(k, expect_api(k0, "bshd", 12, True, tok, seed_theta(12), inverse=True),
                   "float32", 5.0)


def test_rope_forward_accepts_strided_batch_seq_and_head_views(rng):
    big = randn(rng, (B, 2 * S, 2 * H, D), "float32")
    x = big[:, ::2, ::2, :]                       # strided S and H, last dim contiguous
    assert not x.flags.c_contiguous
    cfg = RopeConfig(16)
    positions = rng.integers(0, 300, size=(B, S))
    y = cuprope.rope_forward(x, cfg, positions=positions)
    assert_rounded(y, expect_api(x, "bshd", 16, False, positions, seed_theta(16)), "float32", 5.0)
    # a bhsd tensor that is a transposed view of a bshd buffer
    xt = big[:, :S, :H, :].transpose(0, 2, 1, 3)
    yt = cuprope.rope_forward(xt, RopeConfig(16, layout="bhsd"), positions=positions)
    assert_rounded(yt, expect_api(xt, "bhsd", 16, False, positions, seed_theta(16)), "float32", 5.0)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_rope_forward_seq_offsets_and_offset_shift_each_sequence(rng, layout):
    x = randn(rng, shape_for(layout, 3, S, H, 8), "float32")
    cfg = RopeConfig(8, layout=layout, interleaved=True)
    seq_off = np.array([0, 17, 250], np.int32)
    pos = np.array([5, 1, 0, 9, 2, 2], np.int64)        # [S], shared by the batch
    y = cuprope.rope_forward(x, cfg, positions=pos, offset=-3, seq_offsets=seq_off)
    tok = pos[None, :] - 3 + seq_off[:, None]
    assert_rounded(y, expect_api(x, layout, 8, True, tok, seed_theta(8)), "float32", 5.0)
    # a sequence offset is the same as shifting that sequence's positions
    y2 = cuprope.rope_forward(x, cfg, positions=np.ascontiguousarray(tok))
    np.testing.assert_array_equal(y, y2)


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
def test_rope_forward_per_head_inv_freq_rotates_each_head_with_its_row(rng, layout):
    r, h = 8, 3
    b = 1 if layout == "thd" else B
    table = rng.uniform(0.001, 1.0, size=(h, r // 2))
    x = randn(rng, shape_for(layout, b, S, h, 10), "float32")
    cfg = RopeConfig(r, inv_freq=table, layout=layout)
    assert cfg.per_head
    y = cuprope.rope_forward(x, cfg, positions=np.arange(S))
    tok = np.broadcast_to(np.arange(S), (b, S))
    assert_rounded(y, expect_api(x, layout, r, False, tok, table, form=complex_form), "float32", 5.0)
    # heads given the same input vector differ in output only through their table rows
    x_same = np.broadcast_to(x[..., :1, :] if layout != "bhsd" else x[:, :1], x.shape).copy()
    ys = cuprope.rope_forward(x_same, cfg, positions=np.arange(S))
    hs = (lambda a, i: a[:, i]) if layout == "bhsd" else (lambda a, i: a[..., i, :])
    assert np.max(np.abs(hs(ys, 0)[..., 1:, :] - hs(ys, 1)[..., 1:, :])) > 1e-3


@pytest.mark.parametrize("layout,with_batch", [("bshd", True), ("bshd", False), ("bhsd", True),
                                               ("thd", False)])
def test_rope_forward_stream_map_takes_each_pairs_position_from_its_stream(rng, layout, with_batch):
    r = 12
    smap = np.array([0, 0, 1, 1, 2, 2])
    b = 1 if layout == "thd" else B
    cfg = RopeConfig(r, stream_map=smap, layout=layout, interleaved=False)
    assert cfg.n_streams == 3
    x = randn(rng, shape_for(layout, b, S, H, 16), "float32")
    pshape = (3, b, S) if with_batch else (3, S)
    positions = rng.integers(0, 64, size=pshape)
    y = cuprope.rope_forward(x, cfg, positions=positions, offset=1)
    p3 = np.broadcast_to(positions if with_batch else positions[:, None, :], (3, b, S)) + 1
    per_pair = np.moveaxis(p3[smap], 0, -1)            # [B, S, R/2]
    assert_rounded(y, expect_api(x, layout, r, False, per_pair, seed_theta(r)), "float32", 5.0)


def test_rope_forward_default_positions_are_zero_to_S_minus_1(rng):
    x = randn(rng, (B, S, H, 8), "float32")
    cfg = RopeConfig(8)
    implicit = cuprope.rope_forward(x, cfg)
    explicit = cuprope.rope_forward(x, cfg, positions=np.arange(S))
    np.testing.assert_array_equal(implicit, explicit)
    # position 0 is the identity rotation
    np.testing.assert_array_equal(implicit[:, 0], x[:, 0])
    assert np.max(np.abs(implicit[:, 1:] - x[:, 1:])) > 1e-3


def test_rope_forward_interleaved_equals_half_split_under_pair_permutation(rng):
    r, d = 16, 20
    perm = pair_permutation(r, d)
    x = randn(rng, (B, S, H, d), "float32")
    pos = rng.integers(0, 1000, size=(B, S))
    y_half = cuprope.rope_forward(x, RopeConfig(r, interleaved=False), positions=pos)
    y_int = cuprope.rope_forward(np.ascontiguousarray(x[..., perm]),
                                 RopeConfig(r, interleaved=True), positions=pos)
    np.testing.assert_array_equal(y_int, y_half[..., perm])
