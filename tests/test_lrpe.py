"""LRPE rotate-1d on the CPU: the float64 reference against the seed's formulas,
its backward against torch autograd and finite differences for every act × dim
× theta shape, the NumPy backend through the public API, every bad input, the
kernel names and the NVRTC compile of every LRPE family."""

import ml_dtypes
import numpy as np
import pytest

from cuprope import lrpe, reference
from cuprope._core import loader as _loader
from cuprope.rope import kernels as rope_kernels

B, N, H, D = 2, 5, 3, 8
P = D // 2
ACT_DIMS = [("none", None), ("relu", None), ("sigmoid", None), ("silu", None),
            ("softmax", None), ("softmax", -1), ("softmax", 1)]
ACT_IDS = [f"{a}-dim{d}" for a, d in ACT_DIMS]
# theta shapes for H = 3 heads, D/2 = 4 pairs: per-head partial, per-head full,
# shared partial (2-D and 1-D), one angle per head (1-D and 2-D), one angle overall
THETA_SHAPES = [(H, 3), (H, P), (1, 2), (2,), (H,), (H, 1), (1, 1)]


def randn(rng, shape):
    """Normal samples kept away from 0 (relu's kink) by at least 1e-3."""
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < 1e-3, 1e-3, x)


def theta_of(shape, rng):
    return rng.uniform(0.05, 1.5, shape)


# --------------------------------------------------------------------------- forward vs the seed

def seed_activation(x, act, dim):
    """The activations written out per element / per softmax slice."""
    if act == "none":
        return x
    if act == "relu":
        return np.maximum(x, 0)
    if act == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if act == "silu":
        return x / (1 + np.exp(-x))
    out = np.empty_like(x)
    if dim == 1:
        for b in range(x.shape[0]):
            for h in range(x.shape[2]):
                for d in range(x.shape[3]):
                    e = np.exp(x[b, :, h, d] - x[b, :, h, d].max())
                    out[b, :, h, d] = e / e.sum()
    else:
        for idx in np.ndindex(*x.shape[:3]):
            e = np.exp(x[idx] - x[idx].max())
            out[idx] = e / e.sum()
    return out


def seed_matrix(t_off, theta_row, d):
    """W_t of the seed: block-diag of [[cos, −sin], [sin, cos]] over the pairs,
    with pair k = (k, k + d/2) after the half-split permutation; o = W x̄."""
    w = np.zeros((d, d))
    half = d // 2
    for k in range(half):
        a = t_off * theta_row[k]
        i, j = k, k + half
        w[i, i], w[i, j] = np.cos(a), -np.sin(a)
        w[j, i], w[j, j] = np.sin(a), np.cos(a)
    return w


@pytest.mark.parametrize("theta_shape", THETA_SHAPES, ids=str)
@pytest.mark.parametrize("act,dim", ACT_DIMS, ids=ACT_IDS)
def test_forward_reference_is_the_seed_block_diagonal_rotation(act, dim, theta_shape, rng):
    x = randn(rng, (B, N, H, D))
    theta = theta_of(theta_shape, rng)
    offset = 17
    th2 = lrpe.normalize_theta(theta, H, D)
    full = np.zeros((th2.shape[0], P))
    full[:, :th2.shape[1]] = th2          # pairs >= E: angle 0, the identity block
    xb = seed_activation(x, act, dim)
    want = np.empty_like(x)
    for b, t, h in np.ndindex(B, N, H):
        w = seed_matrix(t + offset, full[h % full.shape[0]], D)
        want[b, t, h] = w @ xb[b, t, h]
    got = lrpe.forward_reference(x, th2, offset, act, dim)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_forward_reference_half_split_formulas_and_pass_through(rng):
    """O1 = X1 cos − X2 sin, O2 = X1 sin + X2 cos on pairs i < E; pairs >= E
    (both halves) come back bit for bit."""
    x = randn(rng, (B, N, H, D))
    theta = theta_of((H, 2), rng)
    y = lrpe.forward_reference(x, theta, 3)
    t = (np.arange(N) + 3)[None, :, None, None]
    ang = t * theta[None, None, :, :]
    x1, x2 = x[..., :2], x[..., P:P + 2]
    np.testing.assert_allclose(y[..., :2], x1 * np.cos(ang) - x2 * np.sin(ang), atol=1e-14)
    np.testing.assert_allclose(y[..., P:P + 2], x1 * np.sin(ang) + x2 * np.cos(ang), atol=1e-14)
    assert np.array_equal(y[..., 2:P], x[..., 2:P])
    assert np.array_equal(y[..., P + 2:], x[..., P + 2:])


def test_backward_reference_is_the_seed_transposed_rotation(rng):
    """act none: dX1 = dO1 cos + dO2 sin, dX2 = −dO1 sin + dO2 cos."""
    do = randn(rng, (B, N, H, D))
    theta = theta_of((H, P), rng)
    g = lrpe.backward_reference(None, do, theta, 5)
    ang = (np.arange(N) + 5)[None, :, None, None] * theta[None, None]
    d1, d2 = do[..., :P], do[..., P:]
    np.testing.assert_allclose(g[..., :P], d1 * np.cos(ang) + d2 * np.sin(ang), atol=1e-14)
    np.testing.assert_allclose(g[..., P:], -d1 * np.sin(ang) + d2 * np.cos(ang), atol=1e-14)


# --------------------------------------------------------------------------- theta shapes

def test_theta_shapes_read_as_documented(rng):
    t = theta_of((H, P), rng)
    assert np.array_equal(lrpe.normalize_theta(t, H, D), t)
    assert np.array_equal(lrpe.normalize_theta(t[:, :2], H, D), t[:, :2])        # [H, E]
    assert np.array_equal(lrpe.normalize_theta(t[0], H, D), t[:1])                # [E] = [1, E]
    assert np.array_equal(lrpe.normalize_theta(t[0, :2], H, D), t[:1, :2])
    per_head = lrpe.normalize_theta(t[:, 0], H, D)                                # [H]
    assert np.array_equal(per_head, np.repeat(t[:, :1], P, axis=1))
    assert np.array_equal(lrpe.normalize_theta(t[:, :1], H, D), per_head)         # [H, 1]
    assert np.array_equal(lrpe.normalize_theta([[0.5]], H, D), np.full((1, P), 0.5))
    assert np.array_equal(lrpe.normalize_theta([0.5], 1, D), np.full((1, P), 0.5))  # H = 1
    # accepted from other frameworks and as integers
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    assert np.array_equal(lrpe.normalize_theta(torch.tensor(t), H, D), t)
    assert lrpe.normalize_theta(np.array([1, 2]), H, D).dtype == np.float64


def test_one_angle_per_head_equals_explicit_rows(rng):
    x = randn(rng, (B, N, H, D))
    t = theta_of((H,), rng)
    a = lrpe.rotate_1d_forward(x.astype(np.float32), t, offset=4, act="silu")
    b = lrpe.rotate_1d_forward(x.astype(np.float32), np.repeat(t[:, None], P, 1), offset=4, act="silu")
    assert np.array_equal(a, b)


def test_ambiguous_1d_theta_is_rejected_naming_both_readings():
    x = np.zeros((1, 2, 4, 8), np.float32)           # H = D/2 = 4
    with pytest.raises(ValueError, match=r"ambiguous.*one angle per head.*shared by all heads"):
        lrpe.rotate_1d_forward(x, np.ones(4))
    # both 2-D spellings work
    lrpe.rotate_1d_forward(x, np.ones((4, 1)))
    lrpe.rotate_1d_forward(x, np.ones((1, 4)))
    # H = D/2 = 1 reads the same both ways: no error
    lrpe.rotate_1d_forward(np.zeros((1, 2, 1, 2), np.float32), np.ones(1))


@pytest.mark.parametrize("shape,msg", [
    ((2, P), r"theta has 2 rows but x has 3 heads"),
    ((H, P + 1), r"theta's last dim E = 5 must be between 1 and D/2 = 4"),
    ((H, 0), r"theta's last dim E = 0"),
    ((P + 1,), r"theta of shape \[5\] matches neither \[H\] with H = 3 heads nor \[E\]"),
    ((0,), r"theta of shape \[0\] matches neither"),
    ((), r"theta must be \[H, E\], \[1, E\], \[E\], \[H\] or \[H, 1\], got shape \[\]"),
    ((1, H, P), r"theta must be \[H, E\]"),
])
def test_bad_theta_shapes_are_rejected(shape, msg):
    x = np.zeros((B, N, H, D), np.float32)
    with pytest.raises(ValueError, match=msg):
        lrpe.rotate_1d_forward(x, np.ones(shape))


@pytest.mark.parametrize("bad,err,msg", [
    (np.array([np.nan, 1.0]), ValueError, r"theta must be finite"),
    (np.array([np.inf, 1.0]), ValueError, r"theta must be finite"),
    (np.array([True, False]), TypeError, r"theta must hold real numbers"),
    (np.array([1 + 1j, 2]), TypeError, r"theta must hold real numbers"),
    (np.array(["a", "b"]), TypeError, r"theta must hold real numbers"),
])
def test_bad_theta_values_are_rejected(bad, err, msg):
    with pytest.raises(err, match=msg):
        lrpe.rotate_1d_forward(np.zeros((B, N, H, D), np.float32), bad)


# --------------------------------------------------------------------------- backward

def torch_forward(torch, x, theta2, offset, act, dim):
    """The seed's forward in torch ops (float64), independent of lrpe.py."""
    if act == "relu":
        xb = torch.relu(x)
    elif act == "sigmoid":
        xb = torch.sigmoid(x)
    elif act == "silu":
        xb = torch.nn.functional.silu(x)
    elif act == "softmax":
        xb = torch.softmax(x, dim=1 if dim == 1 else -1)
    else:
        xb = x
    d = x.shape[-1]
    half = d // 2
    th = torch.zeros((theta2.shape[0], half), dtype=torch.float64)
    th[:, :theta2.shape[1]] = torch.from_numpy(theta2)
    t = torch.arange(x.shape[1], dtype=torch.float64) + offset
    ang = t[:, None, None] * th[None]                      # [N, 1 or H, D/2]
    x1, x2 = xb[..., :half], xb[..., half:]
    return torch.cat([x1 * torch.cos(ang) - x2 * torch.sin(ang),
                      x1 * torch.sin(ang) + x2 * torch.cos(ang)], dim=-1)


@pytest.mark.parametrize("theta_shape", THETA_SHAPES, ids=str)
@pytest.mark.parametrize("act,dim", ACT_DIMS, ids=ACT_IDS)
def test_backward_reference_matches_torch_autograd(act, dim, theta_shape, rng):
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    x = randn(rng, (B, N, H, D))
    do = randn(rng, (B, N, H, D))
    th2 = lrpe.normalize_theta(theta_of(theta_shape, rng), H, D)
    xt = torch.tensor(x, requires_grad=True)
    out = torch_forward(torch, xt, th2, 1000, act, dim)
    np.testing.assert_allclose(out.detach().numpy(), lrpe.forward_reference(x, th2, 1000, act, dim),
                               rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(out, xt, torch.tensor(do))
    np.testing.assert_allclose(lrpe.backward_reference(x, do, th2, 1000, act, dim), grad.numpy(),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("theta_shape", THETA_SHAPES, ids=str)
@pytest.mark.parametrize("act,dim", ACT_DIMS, ids=ACT_IDS)
def test_backward_reference_matches_finite_differences(act, dim, theta_shape, rng):
    shape = (2, 3, H, D)
    x = randn(rng, shape)
    do = randn(rng, shape)
    th2 = lrpe.normalize_theta(theta_of(theta_shape, rng), H, D)
    g = lrpe.backward_reference(x, do, th2, 6, act, dim)
    eps = 1e-6
    fd = np.empty_like(x)
    for i in np.ndindex(*shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        fp = lrpe.forward_reference(xp, th2, 6, act, dim)
        fm = lrpe.forward_reference(xm, th2, 6, act, dim)
        fd[i] = np.sum((fp - fm) * do) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=0, atol=2e-8 * max(1.0, np.abs(g).max()))


def test_backward_of_3d_input_matches_4d(rng):
    x = randn(rng, (B, N, D)).astype(np.float32)
    do = randn(rng, (B, N, D)).astype(np.float32)
    t = theta_of((P,), rng)
    for act, dim in ACT_DIMS:
        g3 = lrpe.rotate_1d_backward(x, do, t, offset=2, act=act, dim=dim)
        g4 = lrpe.rotate_1d_backward(x[:, :, None], do[:, :, None], t[None], offset=2, act=act,
                                     dim=dim)
        assert g3.shape == x.shape
        assert np.array_equal(g3, g4[:, :, 0])


# --------------------------------------------------------------------------- NumPy backend

def _np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("act,dim", ACT_DIMS, ids=ACT_IDS)
def test_numpy_backend_returns_the_reference_rounded_once(act, dim, dtype, rng):
    x = randn(rng, (B, N, H, D)).astype(_np_dtype(dtype))
    do = randn(rng, (B, N, H, D)).astype(_np_dtype(dtype))
    theta = theta_of((H, 3), rng)
    th2 = lrpe.normalize_theta(theta, H, D)
    x64, do64 = x.astype(np.float64), do.astype(np.float64)
    y = lrpe.rotate_1d_forward(x, theta, offset=10 ** 6, act=act, dim=dim)
    assert y.dtype == x.dtype and y.shape == x.shape
    want = reference.round_to_dtype(lrpe.forward_reference(x64, th2, 10 ** 6, act, dim), x.dtype)
    assert np.array_equal(y.view(np.uint8), want.view(np.uint8))
    g = lrpe.rotate_1d_backward(x, do, theta, offset=10 ** 6, act=act, dim=dim)
    want = reference.round_to_dtype(lrpe.backward_reference(x64, do64, th2, 10 ** 6, act, dim),
                                    x.dtype)
    assert np.array_equal(g.view(np.uint8), want.view(np.uint8))


def test_out_and_in_place_on_the_host(rng):
    x = randn(rng, (B, N, H, D)).astype(np.float32)
    do = randn(rng, (B, N, H, D)).astype(np.float32)
    theta = theta_of((H, P), rng)
    y = lrpe.rotate_1d_forward(x, theta, act="softmax")
    out = np.full_like(x, np.nan)
    assert lrpe.rotate_1d_forward(x, theta, act="softmax", out=out) is out
    assert np.array_equal(out, y)
    x2 = x.copy()
    assert lrpe.rotate_1d_forward(x2, theta, act="softmax", out=x2) is x2
    assert np.array_equal(x2, y)
    g = lrpe.rotate_1d_backward(x, do, theta, act="softmax", dim=1)
    do2, x3 = do.copy(), x.copy()
    assert lrpe.rotate_1d_backward(x, do2, theta, act="softmax", dim=1, out=do2) is do2
    assert lrpe.rotate_1d_backward(x3, do, theta, act="softmax", dim=1, out=x3) is x3
    assert np.array_equal(do2, g) and np.array_equal(x3, g)


def test_torch_cpu_tensors_in_torch_out(rng):
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    x = torch.tensor(randn(rng, (B, N, D)), dtype=torch.bfloat16, requires_grad=True)
    do = torch.tensor(randn(rng, (B, N, D)), dtype=torch.bfloat16)
    with torch.no_grad():  # x requires grad: LRPE has no autograd adapter (test_torch_traps)
        y = lrpe.rotate_1d_forward(x, [0.3, 0.2], act="relu")
        g = lrpe.rotate_1d_backward(x, do, [0.3, 0.2], act="relu")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == x.shape
    assert isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16
    x64 = x.detach().double().numpy()[:, :, None]
    want = lrpe.backward_reference(x64, do.double().numpy()[:, :, None],
                                   lrpe.normalize_theta([0.3, 0.2], 1, D), 0, "relu")[:, :, 0]
    np.testing.assert_allclose(g.double().numpy(), want, rtol=2 ** -8, atol=1e-6)


def test_backward_with_act_none_needs_no_x(rng):
    do = randn(rng, (B, N, H, D)).astype(np.float32)
    theta = theta_of((H, P), rng)
    assert np.array_equal(lrpe.rotate_1d_backward(None, do, theta, offset=3),
                          lrpe.rotate_1d_backward(do, do, theta, offset=3))
    with pytest.raises(ValueError, match=r"x is needed for the backward of act='relu'"):
        lrpe.rotate_1d_backward(None, do, theta, act="relu")


def test_empty_input_returns_empty():
    x = np.zeros((0, N, H, D), np.float32)
    y = lrpe.rotate_1d_forward(x, np.ones(P), act="softmax", dim=1)
    assert y.shape == x.shape


# --------------------------------------------------------------------------- bad inputs

@pytest.fixture
def x(rng):
    return randn(rng, (B, N, H, D)).astype(np.float32)


@pytest.mark.parametrize("bad", ["gelu", "Softmax", "", None, 1])
def test_bad_act_is_rejected(x, bad):
    with pytest.raises(ValueError, match=r"act must be one of \('none', 'relu', 'sigmoid', "
                                         r"'silu', 'softmax'\)"):
        lrpe.rotate_1d_forward(x, np.ones(P), act=bad)


@pytest.mark.parametrize("bad", [0, 2, -2, 3, True, 1.0, "1"])
def test_bad_dim_is_rejected(x, bad):
    with pytest.raises(ValueError, match=r"dim must be None, -1 \(the head dim\) or 1 \(the "
                                         r"sequence dim\)"):
        lrpe.rotate_1d_forward(x, np.ones(P), act="softmax", dim=bad)
    with pytest.raises(ValueError, match=r"dim must be"):
        lrpe.rotate_1d_backward(x, x, np.ones(P), act="relu", dim=bad)


def test_numpy_integer_dim_and_offset_are_accepted(x):
    a = lrpe.rotate_1d_forward(x, np.ones(P), act="softmax", dim=np.int64(1), offset=np.int32(4))
    assert np.array_equal(a, lrpe.rotate_1d_forward(x, np.ones(P), act="softmax", dim=1, offset=4))


@pytest.mark.parametrize("bad,err,msg", [
    (-1, ValueError, r"offset must be an integer >= 0"),
    (2 ** 62, ValueError, r"offset out of range: 4611686018427387904; positions are exact"),
    (2 ** 31 - 4, ValueError, r"offset \+ N - 1 = 2147483648: positions are exact"),
    (1.0, TypeError, r"offset must be an int, got float"),
    (True, TypeError, r"offset must be an int, got bool"),
    ("3", TypeError, r"offset must be an int, got str"),
])
def test_bad_offset_is_rejected(x, bad, err, msg):
    with pytest.raises(err, match=msg):
        lrpe.rotate_1d_forward(x, np.ones(P), offset=bad)
    with pytest.raises(err, match=msg):
        lrpe.rotate_1d_backward(x, x, np.ones(P), offset=bad)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64, np.bool_])
def test_unsupported_dtypes_are_rejected_naming_the_tensor(x, dtype):
    bad = x.astype(dtype)
    with pytest.raises(TypeError, match=r"^x must have dtype float32, float16 or bfloat16"):
        lrpe.rotate_1d_forward(bad, np.ones(P))
    with pytest.raises(TypeError, match=r"^do must have dtype"):
        lrpe.rotate_1d_backward(x, bad, np.ones(P))
    with pytest.raises(TypeError, match=r"^x must have dtype"):
        lrpe.rotate_1d_backward(bad, x, np.ones(P), act="relu")


@pytest.mark.parametrize("shape", [(N, D), (1, B, N, H, D), (D,)])
def test_wrong_rank_is_rejected(shape):
    with pytest.raises(ValueError, match=r"x must be \[B, N, H, D\] or \[B, N, D\]"):
        lrpe.rotate_1d_forward(np.zeros(shape, np.float32), np.ones(1))


@pytest.mark.parametrize("d", [7, 1, 0])
def test_odd_or_tiny_head_dim_is_rejected(d):
    with pytest.raises(ValueError, match=rf"x: the head dim D must be even and >= 2 .* got D = {d}"):
        lrpe.rotate_1d_forward(np.zeros((B, N, H, d), np.float32), np.ones(1))


def test_non_contiguous_head_dim_is_rejected(x):
    with pytest.raises(ValueError, match=r"x: the last \(head\) dim must be contiguous"):
        lrpe.rotate_1d_forward(np.zeros((B, N, H, 2 * D), np.float32)[..., ::2], np.ones(P))


def test_x_and_do_must_agree(x):
    with pytest.raises(ValueError, match=r"x and do must have the same shape"):
        lrpe.rotate_1d_backward(x, x[:, :-1], np.ones(P), act="relu")
    with pytest.raises(TypeError, match=r"x and do must share a dtype"):
        lrpe.rotate_1d_backward(x, x.astype(np.float16), np.ones(P), act="relu")
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    with pytest.raises(TypeError, match=r"x and do must come from the same framework"):
        lrpe.rotate_1d_backward(x, torch.from_numpy(x), np.ones(P), act="relu")


def test_bad_out_is_rejected(x):
    with pytest.raises(ValueError, match=r"out must have shape"):
        lrpe.rotate_1d_forward(x, np.ones(P), out=np.empty((B, N, H, D + 2), np.float32))
    with pytest.raises(ValueError, match=r"out must have shape .* and dtype float32"):
        lrpe.rotate_1d_forward(x, np.ones(P), out=np.empty_like(x, dtype=np.float16))
    ro = np.empty_like(x)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match=r"out is read-only"):
        lrpe.rotate_1d_forward(x, np.ones(P), out=ro)
    wide = np.zeros((B, N, H, D + 1), np.float32)
    with pytest.raises(ValueError, match=r"out overlaps an input without being exactly that input"):
        lrpe.rotate_1d_forward(wide[..., :D], np.ones(P), out=wide[..., 1:])
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    with pytest.raises(TypeError, match=r"out must be a numpy array like its input"):
        lrpe.rotate_1d_forward(x, np.ones(P), out=torch.empty(x.shape))


def test_non_arrays_are_rejected():
    with pytest.raises(TypeError, match=r"x must be an array"):
        lrpe.rotate_1d_forward([[1.0, 2.0]], np.ones(1))
    with pytest.raises(TypeError, match=r"do must be an array"):
        lrpe.rotate_1d_backward(None, "do", np.ones(1))


# --------------------------------------------------------------------------- kernels (no GPU needed)

def test_plain_kernel_names_are_short_and_lrpe_families_are_separate():
    assert rope_kernels.kernel_name("bfloat16", False, 8, rope_kernels.SRC_PER_HEAD) == \
        "cuprope::rope_kernel<__nv_bfloat16, false, 8, 1>"
    assert rope_kernels.kernel_name("float32", True, 4, rope_kernels.SRC_TABLE) == \
        "cuprope::rope_kernel<float, true, 4, 2>"
    assert rope_kernels.kernel_name("float32", False, 4, rope_kernels.SRC_SHARED, 4, True) == \
        "cuprope::rope_kernel<float, false, 4, 0, 4, true>"
    with pytest.raises(ValueError, match="angle source"):
        rope_kernels.kernel_name("float32", False, 4, 3)
    for fam, src in (("shared", 0), ("per_head", 1), ("table", 2)):
        names = _loader.all_kernel_names(fam)
        assert len(names) == 22 and all(n.endswith(f", {src}>") for n in names)
    lrpe_fams = [f for f in rope_kernels.FAMILIES if f.startswith("lrpe_")]
    assert len(lrpe_fams) == 5
    for fam in lrpe_fams:
        names = _loader.all_kernel_names(fam)
        # 3 dtypes x 2 widths (widest, 1) x shared/per-head x forward/backward (+ 6 statistics passes)
        assert len(names) == (30 if fam == "lrpe_softmax_seq" else 24)
        assert all(", false, " in n or "lrpe_seq_stats" in n for n in names)  # half split only


@pytest.mark.parametrize("family", [f for f in rope_kernels.FAMILIES if f.startswith("lrpe_")])
def test_every_lrpe_family_compiles_with_nvrtc(family):
    """Each LRPE family is its own module at run time; compile it alone for sm_90."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings not installed")
    pathfinder = pytest.importorskip("cuda.pathfinder", reason="cuda-pathfinder not installed")
    import test_kernel_compile as tkc
    cudart = pathfinder.find_nvidia_header_directory("cudart")
    if cudart is None:
        pytest.skip("CUDA runtime headers (nvidia-cuda-runtime wheel) not found")
    names = _loader.all_kernel_names(family)
    lowered, nbytes, log = tkc._compile("sm_90", names)
    assert all(lowered.values()) and len(set(lowered.values())) == len(names)
    assert "warning" not in log.lower(), log
    assert nvrtc is not None and nbytes > 10_000
