"""LRPE rotate-1d GPU kernels vs the float64 reference (skipped where there is no GPU).

Every act × dim × theta shape × dtype × offset (0, 10, 10**6), forward and fused
backward, on (6, 33, 8, 48), (6, 128, 7, 128) and a 3-D x; outputs are poisoned
with NaN first (``out=`` prefilled), so an element the kernel fails to write
fails the comparison.

Inputs are normal samples rounded to bfloat16 (tiny ones set to 0), exactly
representable in all three dtypes, so one float64 reference serves every dtype.

Tolerance (tests/oracle.py ``assert_matches``): fp16/bf16 within one ulp of the
reference rounded to the dtype plus the fp32 slack; fp32 within the slack
1e-6 · scale · k, where
  * forward:  scale = max|act(x)| (the activation changes magnitudes; the
    rotation's error is relative to what it rotates);
  * backward: scale = max|dO| · A, A bounding |act'|: 1 (none, relu), 1/4
    (sigmoid), 1.1 (silu), 2·max s (softmax: |s ⊙ (g − <g, s>)| ≤ 2·max s·max|g|);
  * k: 1 for none and relu (a rotation of exact values, as for plain RoPE);
    2 for sigmoid and silu (the kernels take e^-x from the SFU and divide
    with a reciprocal: within ~1.5e-7 absolute or a few ulp, on top of the
    rotation's ≈ 1e-7, or ≲ 6e-7 for per-head θ in token runs); 4 for softmax
    (exp, a row sum in fp32 over 2·VEC terms per lane and log2(32) shuffle
    levels, or over the sequence in float64, and a divide: ≲ 1e-6 relative to
    max s in the worst case, typically 3e-7).
"""
import numpy as np
import pytest

from conftest import GPU_TESTS
from cuprope import lrpe
from oracle import assert_matches

pytestmark = GPU_TESTS

DTYPES = ["float32", "float16", "bfloat16"]
OFFSETS = [0, 10, 10 ** 6]
SHAPES = {"6x33x8x48": (6, 33, 8, 48), "6x128x7x128": (6, 128, 7, 128), "3d-5x40x64": (5, 40, 64)}
ACT_DIMS = [("none", None), ("relu", None), ("sigmoid", None), ("silu", None),
            ("softmax", None), ("softmax", -1), ("softmax", 1)]
THETAS = ["H,E", "H,D/2", "1,E", "E", "H", "H,1"]
K = {"none": 1, "relu": 1, "sigmoid": 2, "silu": 2, "softmax": 4}


# ----------------------------------------------------------------- array helpers
# (module-level so a harness can swap the device for another one)

def dev(a, dtype):
    """float64 host values (exactly representable in ``dtype``) as a CUDA tensor."""
    import torch
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(device="cuda", dtype=tdt)


def host(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def poisoned_like(t):
    import torch
    return torch.full_like(t, float("nan"))


def is_same(a, b):
    return a is b


# ----------------------------------------------------------------- data

def exact_normal(rng, shape):
    """Normal samples rounded to bfloat16; magnitudes below fp16's smallest
    normal set to 0, so every dtype holds them exactly."""
    import ml_dtypes
    from cuprope import reference
    v = reference.round_to_dtype(rng.standard_normal(shape), ml_dtypes.bfloat16).astype(np.float64)
    v[np.abs(v) < 2.0 ** -14] = 0.0
    return v


def theta_for(kind, h, d, rng):
    p = d // 2
    e = max(2, (2 * p) // 3)
    assert e != h and h != p  # no 1-D reading is ambiguous for the shapes used here
    shape = {"H,E": (h, e), "H,D/2": (h, p), "1,E": (1, e), "E": (e,), "H": (h,), "H,1": (h, 1)}[kind]
    return rng.uniform(0.01, 1.0, shape)


def canon(a):
    return a[:, :, None, :] if a.ndim == 3 else a


def uncanon(a, ndim):
    return a[:, :, 0, :] if ndim == 3 else a


def act_grad_bound(act, s_max):
    return {"none": 1.0, "relu": 1.0, "sigmoid": 0.25, "silu": 1.1, "softmax": 2.0 * s_max}[act]


def check(out, ref, scale, dtype, act, what):
    try:
        assert_matches(out, ref, scale, dtype, scale=K[act])
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def run_both(x64, do64, theta, act, dim, offsets=OFFSETS, dtypes=DTYPES):
    """Forward and backward kernels vs the reference for every offset and dtype."""
    ndim = x64.ndim
    h, d = (x64.shape[2] if ndim == 4 else 1), x64.shape[-1]
    th2 = lrpe.normalize_theta(theta, h, d)
    xc, doc = canon(x64), canon(do64)
    s = lrpe.activation(xc, act, dim)
    scale_f = float(np.abs(s).max())
    scale_b = float(np.abs(doc).max()) * act_grad_bound(act, scale_f)
    for offset in offsets:
        ref_f = uncanon(lrpe.forward_reference(xc, th2, offset, act, dim), ndim)
        ref_b = uncanon(lrpe.backward_reference(xc, doc, th2, offset, act, dim), ndim)
        for dtype in dtypes:
            x, do = dev(x64, dtype), dev(do64, dtype)
            out = poisoned_like(x)
            res = lrpe.rotate_1d_forward(x, theta, offset=offset, act=act, dim=dim, out=out)
            assert is_same(res, out)
            check(host(out), ref_f, scale_f, dtype, act, f"forward {dtype} offset={offset}")
            out = poisoned_like(x)
            res = lrpe.rotate_1d_backward(x, do, theta, offset=offset, act=act, dim=dim, out=out)
            assert is_same(res, out)
            check(host(out), ref_b, scale_b, dtype, act, f"backward {dtype} offset={offset}")


# ----------------------------------------------------------------- the matrix

@pytest.mark.parametrize("theta_kind", THETAS)
@pytest.mark.parametrize("act,dim", ACT_DIMS, ids=[f"{a}-dim{d}" for a, d in ACT_DIMS])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_kernels_match_reference(shape, act, dim, theta_kind, rng):
    h, d = (shape[2] if len(shape) == 4 else 1), shape[-1]
    theta = theta_for(theta_kind, h, d, rng)
    run_both(exact_normal(rng, shape), exact_normal(rng, shape), theta, act, dim)


# ----------------------------------------------------------------- layouts the matrix does not reach

@pytest.mark.parametrize("act,dim", ACT_DIMS, ids=[f"{a}-dim{d}" for a, d in ACT_DIMS])
@pytest.mark.parametrize("shape", [(2, 9, 3, 512), (2, 1, 40, 16), (3, 1, 5, 64), (2, 7, 33, 2),
                                   (2, 5, 3, 6)],
                         ids=["D512-multichunk", "decode-40heads-split", "decode-N1", "D2", "D6"])
def test_head_and_row_tilings(shape, act, dim, rng):
    """D = 512 fp32 gives 64 chunks per head (a lane owns two; a head-dim softmax
    row must fit 32 lanes, so fp32 D = 512 softmax is refused with a clear error);
    40 heads of D = 16 at one token split over two warps, 32 rows each step;
    D = 2 and D = 6 (odd pair count) run the one-pair kernel."""
    h, d = shape[2], shape[3]
    theta = rng.uniform(0.01, 1.0, (h, d // 2))
    dtypes = ["float32", "bfloat16"]
    if d == 512 and act == "softmax" and dim != 1:
        # a head-dim softmax row must fit 32 lanes of 16-byte packs: fp32 D <= 256
        with pytest.raises(ValueError, match="head dims up to 256"):
            lrpe.rotate_1d_forward(dev(exact_normal(rng, shape), "float32"), theta, act=act, dim=dim)
        dtypes = ["bfloat16"]
    run_both(exact_normal(rng, shape), exact_normal(rng, shape), theta, act, dim,
             offsets=[0, 10 ** 6], dtypes=dtypes)


def _views(dtype, shape, rng, lead=1):
    """x and dO as misaligned views (last-dim offset ``lead`` into a wider buffer):
    the kernels fall back to one pair per lane."""
    b, n, h, d = shape
    xs = exact_normal(rng, (b, n, h, d + 2))
    ds = exact_normal(rng, (b, n, h, d + 2))
    xbuf, dbuf = dev(xs, dtype), dev(ds, dtype)
    return (xbuf[..., lead:lead + d], dbuf[..., lead:lead + d],
            xs[..., lead:lead + d], ds[..., lead:lead + d])


@pytest.mark.parametrize("act,dim", ACT_DIMS, ids=[f"{a}-dim{d}" for a, d in ACT_DIMS])
@pytest.mark.parametrize("dtype,d", [("float32", 128), ("bfloat16", 48), ("float16", 128)])
def test_misaligned_views_run_the_one_pair_kernels(dtype, d, act, dim, rng):
    """D = 128 with one pair per lane is 64 chunks per head; the head-dim softmax
    then runs on aligned contiguous copies (one chunk per lane)."""
    shape = (2, 11, 3, d)
    x, do, x64, do64 = _views(dtype, shape, rng)
    theta = rng.uniform(0.01, 1.0, (3, d // 3))
    th2 = lrpe.normalize_theta(theta, 3, d)
    s_max = float(np.abs(lrpe.activation(x64, act, dim)).max())
    out = poisoned_like(x)
    lrpe.rotate_1d_forward(x, theta, offset=10, act=act, dim=dim, out=out)
    check(host(out), lrpe.forward_reference(x64, th2, 10, act, dim), s_max, dtype, act, "forward")
    out = poisoned_like(x)
    lrpe.rotate_1d_backward(x, do, theta, offset=10, act=act, dim=dim, out=out)
    check(host(out), lrpe.backward_reference(x64, do64, th2, 10, act, dim),
          float(np.abs(do64).max()) * act_grad_bound(act, s_max), dtype, act, "backward")


@pytest.mark.parametrize("act,dim", [("silu", None), ("softmax", -1), ("softmax", 1)],
                         ids=["silu", "softmax-head", "softmax-seq"])
def test_strided_inputs_default_outputs_and_in_place(act, dim, rng):
    """x and dO as head slices of wider tensors (B, N, H strides all custom);
    a freshly allocated output; then out=x (forward) and out=dO, out=x (backward)."""
    dtype, shape = "bfloat16", (3, 17, 5, 64)
    b, n, h, d = shape
    xw = exact_normal(rng, (b, n, 2 * h + 1, d))
    dw = exact_normal(rng, (n, b, h + 3, d)).transpose(1, 0, 2, 3)
    xt = dev(xw, dtype)[:, :, 1:1 + h]
    dt = dev(dw.transpose(1, 0, 2, 3), dtype).transpose(0, 1)[:, :, 2:2 + h]
    x64, do64 = xw[:, :, 1:1 + h], dw[:, :, 2:2 + h]
    theta = rng.uniform(0.01, 1.0, (h, 20))
    th2 = lrpe.normalize_theta(theta, h, d)
    ref_f = lrpe.forward_reference(x64, th2, 10, act, dim)
    ref_b = lrpe.backward_reference(x64, do64, th2, 10, act, dim)
    s_max = float(np.abs(lrpe.activation(x64, act, dim)).max())
    sb = float(np.abs(do64).max()) * act_grad_bound(act, s_max)
    y = lrpe.rotate_1d_forward(xt, theta, offset=10, act=act, dim=dim)
    check(host(y), ref_f, s_max, dtype, act, "forward, new output")
    g = lrpe.rotate_1d_backward(xt, dt, theta, offset=10, act=act, dim=dim)
    check(host(g), ref_b, sb, dtype, act, "backward, new output")
    # in place (each call checked against the untouched inputs' reference)
    x_keep = host(xt)
    res = lrpe.rotate_1d_backward(xt, dt, theta, offset=10, act=act, dim=dim, out=dt)
    assert is_same(res, dt)
    check(host(dt), ref_b, sb, dtype, act, "backward, out=do")
    res = lrpe.rotate_1d_backward(xt, dev(do64, dtype), theta, offset=10, act=act, dim=dim, out=xt)
    check(host(xt), ref_b, sb, dtype, act, "backward, out=x")
    xt2 = dev(x_keep, dtype)
    res = lrpe.rotate_1d_forward(xt2, theta, offset=10, act=act, dim=dim, out=xt2)
    assert is_same(res, xt2)
    check(host(xt2), ref_f, s_max, dtype, act, "forward, out=x")


@pytest.mark.parametrize("act,dim", [("relu", None), ("softmax", None), ("softmax", 1)],
                         ids=["relu", "softmax-head", "softmax-seq"])
def test_repeated_calls_reuse_plans_with_fresh_data_and_offsets(act, dim, rng):
    shape = (2, 13, 4, 64)
    theta = rng.uniform(0.01, 1.0, (4, 32))
    th2 = lrpe.normalize_theta(theta, 4, 64)
    for call, offset in enumerate([0, 7, 10 ** 6, 3]):
        x64, do64 = exact_normal(rng, shape), exact_normal(rng, shape)
        x, do = dev(x64, "float16"), dev(do64, "float16")
        s_max = float(np.abs(lrpe.activation(x64, act, dim)).max())
        y = lrpe.rotate_1d_forward(x, theta, offset=offset, act=act, dim=dim)
        check(host(y), lrpe.forward_reference(x64, th2, offset, act, dim), s_max, "float16", act,
              f"forward call {call}")
        g = lrpe.rotate_1d_backward(x, do, theta, offset=offset, act=act, dim=dim)
        check(host(g), lrpe.backward_reference(x64, do64, th2, offset, act, dim),
              float(np.abs(do64).max()) * act_grad_bound(act, s_max), "float16", act,
              f"backward call {call}")


def test_torch_inputs_requiring_grad_and_theta_on_the_gpu(rng):
    import torch
    x64 = exact_normal(rng, (2, 6, 3, 32))
    x = dev(x64, "float32").requires_grad_()
    theta = torch.tensor(rng.uniform(0.01, 1.0, (3,)), device="cuda")
    with pytest.raises(TypeError, match="cuprope.torch has no LRPE adapter"):
        lrpe.rotate_1d_forward(x, theta, act="sigmoid")  # never silently detached
    with torch.no_grad():
        y = lrpe.rotate_1d_forward(x, theta, act="sigmoid")
    assert isinstance(y, torch.Tensor) and y.device == x.device and not y.requires_grad
    th2 = lrpe.normalize_theta(theta.cpu().numpy(), 3, 32)
    ref = lrpe.forward_reference(x64, th2, 0, "sigmoid", None)
    check(host(y), ref, float(np.abs(lrpe.activation(x64, "sigmoid")).max()), "float32",
          "sigmoid", "forward")


def test_cupy_arrays_in_cupy_out(rng):
    import cupy
    x64 = exact_normal(rng, (2, 9, 3, 48))
    x = cupy.asarray(x64.astype(np.float32))
    theta = rng.uniform(0.01, 1.0, (3, 24))
    y = lrpe.rotate_1d_forward(x, theta, offset=5, act="softmax", dim=1)
    assert isinstance(y, cupy.ndarray)
    ref = lrpe.forward_reference(x64, lrpe.normalize_theta(theta, 3, 48), 5, "softmax", 1)
    check(cupy.asnumpy(y).astype(np.float64), ref,
          float(np.abs(lrpe.activation(x64, "softmax", 1)).max()), "float32", "softmax", "cupy")


def test_empty_inputs_return_empty(rng):
    import torch
    x = torch.empty((0, 4, 2, 16), device="cuda", dtype=torch.bfloat16)
    y = lrpe.rotate_1d_forward(x, np.ones(8), act="softmax", dim=1)
    assert tuple(y.shape) == tuple(x.shape) and y.device == x.device
