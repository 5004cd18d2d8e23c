"""cuprope.jax on a GPU: the native kernel call under jit, grad, vmap and XLA's
command buffers, against the eager cuprope call on the same arrays (bit for
bit) and the float64 reference (skipped with a reason where there is no GPU)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import HAS_GPU

jax = pytest.importorskip("jax", reason="needs jax: pip install jax")
import jax.numpy as jnp  # noqa: E402

import cuprope  # noqa: E402
from cuprope import jax as cjax  # noqa: E402
from cuprope import lrpe, scaling, tables  # noqa: E402
from oracle import assert_matches, expected  # noqa: E402


def _jax_gpu():
    try:
        return bool(jax.devices("gpu")) and HAS_GPU
    except RuntimeError:
        return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _jax_gpu(), reason="no GPU visible to both JAX and CuPy")]

DTYPES = ["bfloat16", "float16", "float32"]


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(np.float32)
    return jnp.asarray(x, dtype=dtype)


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


CASES = {
    "bshd-gqa": (cuprope.RopeConfig(64, base=5e5), (2, 33, 4, 64), (2, 33, 2, 64), "bs"),
    "bhsd-partial-interleaved": (cuprope.RopeConfig(32, interleaved=True, layout="bhsd"),
                                 (2, 4, 17, 48), (2, 1, 17, 48), "s"),
    "thd": (cuprope.RopeConfig(128, layout="thd", scale=0.75), (40, 4, 128), (40, 2, 128), "t"),
    "per-head": (cuprope.RopeConfig(64, inv_freq=np.random.default_rng(0).uniform(0, 1, (3, 32))),
                 (1, 70, 3, 64), (1, 70, 3, 64), None),
    "mrope": (scaling.mrope_config([8, 12, 12], base=1e6), (2, 9, 4, 64), (2, 9, 2, 64), "3s"),
}


def _positions(kind, b, s, rng):
    if kind is None:
        return None
    if kind == "bs":
        return jnp.asarray(rng.integers(0, 2 ** 31 - 1, (b, s)).astype(np.int32))
    if kind == "3s":
        return jnp.asarray(rng.integers(0, 5000, (3, s)).astype(np.int32))
    return jnp.asarray(rng.integers(0, 100000, (s,)).astype(np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_jit_forward_and_grad_equal_the_eager_calls(case, dtype, rng):
    cfg, qs, ks, pkind = CASES[case]
    q, k = _rand(rng, qs, dtype), _rand(rng, ks, dtype)
    b, s = (1, qs[0]) if cfg.layout == "thd" else ((qs[0], qs[2]) if cfg.layout == "bhsd"
                                                   else qs[:2])
    pos = _positions(pkind, b, s, rng)
    offset = 0 if pkind == "bs" else 11
    f = jax.jit(lambda q, k, p: cjax.rope_qk(q, k, cfg, positions=p, offset=offset))
    got = f(q, k, pos)
    want = cuprope.rope_qk_forward(q, k, cfg, positions=pos, offset=offset)
    for g, w in zip(got, want):
        _same(g, w)
    gq, gk = _rand(rng, qs, dtype), _rand(rng, ks, dtype)
    _, vjp = jax.vjp(lambda q, k: cjax.rope_qk(q, k, cfg, positions=pos, offset=offset), q, k)
    dq, dk = jax.jit(vjp)((gq, gk))
    eq, ek = cuprope.rope_qk_backward(gq, gk, cfg, positions=pos, offset=offset)
    _same(dq, eq)
    _same(dk, ek)
    ref = expected(np.asarray(gq, np.float64), cfg,
                   positions=None if pos is None else np.asarray(pos), offset=offset, inverse=True)
    assert_matches(np.asarray(dq, np.float64), ref, np.abs(np.asarray(gq, np.float64)).max(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vmap_folds_a_leading_axis_and_loops_otherwise(dtype, rng):
    cfg = cuprope.RopeConfig(64)
    x = _rand(rng, (3, 2, 9, 4, 64), dtype)
    pos = jnp.asarray(rng.integers(0, 1000, (3, 9)).astype(np.int32))
    folded = jax.jit(jax.vmap(lambda x: cjax.rope(x, cfg, offset=5)))(x)
    looped = jax.jit(jax.vmap(lambda x, p: cjax.rope(x, cfg, positions=p)))(x, pos)
    for v in range(3):
        _same(folded[v], cuprope.rope_forward(x[v], cfg, offset=5))
        _same(looped[v], cuprope.rope_forward(x[v], cfg, positions=pos[v]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tables_and_lrpe_under_jit(dtype, rng):
    q, k = _rand(rng, (2, 12, 4, 64), dtype), _rand(rng, (2, 12, 2, 64), dtype)
    ang = np.arange(12)[:, None] * 10000.0 ** (-np.arange(32) / 32)
    cos = jnp.asarray(np.cos(np.concatenate([ang, ang], -1))[None], dtype)
    sin = jnp.asarray(np.sin(np.concatenate([ang, ang], -1))[None], dtype)
    got = jax.jit(lambda q, k: cjax.rope_qk_table(q, k, cos, sin))(q, k)
    for g, w in zip(got, tables.rope_qk_table_forward(q, k, cos, sin)):
        _same(g, w)
    theta = 10000.0 ** (-np.arange(24) / 24)
    for act, dim in (("none", None), ("silu", None), ("softmax", -1)):
        y = jax.jit(lambda x: cjax.rotate_1d(x, theta, offset=3, act=act, dim=dim))(q)
        _same(y, lrpe.rotate_1d_forward(q, theta, offset=3, act=act, dim=dim))
        g = jax.grad(lambda x: jnp.sum(cjax.rotate_1d(x, theta, offset=3, act=act, dim=dim)
                                       .astype(jnp.float32) * 1.5))(q)
        _same(g, lrpe.rotate_1d_backward(q, jnp.full_like(q, 1.5), theta, offset=3, act=act,
                                         dim=dim))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,theta_rows", [((2, 37, 3, 64), 1), ((3, 70, 48), 1),
                                              ((1, 9, 5, 32), 5)])
def test_lrpe_softmax_over_the_sequence_under_jit(shape, theta_rows, dtype, rng):
    """LRPE's softmax over the sequence (dim=1) under jit: the statistics pass
    as its own kernel call (the flat entry's one-dimensional blocks), then the
    rotation reading them; forward and the fused backward equal the eager
    calls bit for bit (3-D and 4-D x, shared and per-head θ, B*H*D/2 not a
    multiple of 32, N not a multiple of the slices), and again under jit
    (determinism)."""
    x = _rand(rng, shape, dtype) * 3
    e = shape[-1] // 2 - 4
    theta = rng.uniform(0.01, 1.0, (theta_rows, e) if theta_rows > 1 else (e,))
    f = jax.jit(lambda x: cjax.rotate_1d(x, theta, offset=7, act="softmax", dim=1))
    y = f(x)
    _same(y, lrpe.rotate_1d_forward(x, theta, offset=7, act="softmax", dim=1))
    _same(f(x), y)
    g = _rand(rng, shape, dtype)
    _, vjp = jax.vjp(lambda x: cjax.rotate_1d(x, theta, offset=7, act="softmax", dim=1), x)
    dx, = jax.jit(vjp)(g)
    _same(dx, lrpe.rotate_1d_backward(x, g, theta, offset=7, act="softmax", dim=1))
    _same(jax.jit(vjp)(g)[0], dx)


_GRAPH_SCRIPT = r"""
import numpy as np, jax, jax.numpy as jnp, cuprope
from cuprope import jax as cjax
cfg = cuprope.RopeConfig(128, base=5e5)
q = jnp.asarray(np.random.default_rng(0).standard_normal((2, 64, 8, 128)), jnp.bfloat16)
k = q[:, :, :2]
@jax.jit
def step(q, k, p):
    def body(i, c):
        a, b = cjax.rope_qk(c[0], c[1], cfg, positions=p + i)
        return (a * 1.0, b * 1.0)
    return jax.lax.fori_loop(0, 3, body, (q, k))
p = jnp.arange(64, dtype=jnp.int32)
a, b = step(q, k, p)
want = (q, k)
for i in range(3):
    want = cuprope.rope_qk_forward(*want, cfg, positions=p + i)
print("same", bool((np.asarray(a).view(np.uint16) == np.asarray(want[0]).view(np.uint16)).all()))
print("hlo", "command_buffer" in step.lower(q, k, p).compile().as_text())
"""


@pytest.mark.parametrize("flags", ["", "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL"])
def test_runs_with_command_buffers(flags):
    """A jitted loop around the call, with XLA's default command buffers and
    with custom calls admitted into them (a fresh process: XLA reads its
    flags once)."""
    env = dict(os.environ, XLA_FLAGS=flags)
    out = subprocess.run([sys.executable, "-c", _GRAPH_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "same True" in out.stdout, out.stdout + out.stderr[-2000:]


# ---------------------------------------------------------------- QK-norm + RoPE
from cuprope import qknorm, reference  # noqa: E402
from cuprope.qknorm import reference as qref  # noqa: E402
from cuprope._core.layout import from_canon, to_canon  # noqa: E402

QK_CASES = {  # config, q shape, k shape, settings; "fast": the rows kernel runs (16-byte packs)
    "qwen3-fast": (cuprope.RopeConfig(128, base=1e6), (2, 33, 8, 128), (2, 33, 2, 128),
                   dict(weights="x", positions="bs"), True),
    "gemma-partial-interleaved-general": (
        cuprope.RopeConfig(32, interleaved=True, layout="bhsd"), (2, 4, 17, 48), (2, 1, 17, 48),
        dict(weights="float32", weight_offset=1.0, offset=7), False),
    "olmo2-token": (cuprope.RopeConfig(64, base=5e5), (1, 20, 4, 64), (1, 20, 4, 64),
                    dict(weights="float32", norm_over="token", eps=1e-5), False),
    "llama4-l2-thd": (cuprope.RopeConfig(64, layout="thd"), (40, 4, 64), (40, 2, 64),
                      dict(norm="l2", order="rope_then_norm", positions="s"), True),
    "mrope-q-weight-only": (scaling.mrope_config([8, 12, 12], base=1e6), (2, 9, 4, 64),
                            (2, 9, 2, 64), dict(weights="q", positions="3s"), True),
}


def _qk_case(case, dtype, rng):
    """(cfg, q, k, traced keyword arrays, static keywords)."""
    cfg, qs, ks, kw, _ = QK_CASES[case]
    kw = dict(kw)
    q, k = _rand(rng, qs, dtype), _rand(rng, ks, dtype)
    arrays = {}
    w = kw.pop("weights", None)
    if w is not None:
        over = kw.get("norm_over", "head")
        nq, nk = (qs[-1], ks[-1]) if over == "head" else (qs[2] * qs[3], ks[2] * ks[3])
        wdt = dtype if w in ("x", "q") else w
        arrays["q_weight"] = jnp.asarray(rng.uniform(0.5, 1.5, nq), wdt)
        if w != "q":
            arrays["k_weight"] = jnp.asarray(rng.uniform(0.5, 1.5, nk), wdt)
    b, s = (1, qs[0]) if cfg.layout == "thd" else ((qs[0], qs[2]) if cfg.layout == "bhsd"
                                                   else qs[:2])
    p = kw.pop("positions", None)
    if p is not None:
        arrays["positions"] = _positions(p, b, s, rng)
    return cfg, q, k, arrays, kw, (b, s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(QK_CASES))
def test_qk_norm_jit_and_vjp_equal_the_eager_calls(case, dtype, rng):
    """The native kernel call under jit (forward, and the vjp under jit) gives
    the eager cuprope.qknorm calls' bits on the same GPU (the same kernel,
    grid and words), the weight gradients included; dx and dw against the
    float64 reference (tests/test_gpu_qknorm.py's bounds)."""
    cfg, q, k, arrays, static, (b, s) = _qk_case(case, dtype, rng)

    def fn(q, k, a):
        return cjax.rope_qk_norm(q, k, cfg, **a, **static)
    got = jax.jit(fn)(q, k, arrays)
    want = qknorm.rope_qk_norm_forward(q, k, cfg, **arrays, **static)
    for g, w in zip(got, want):
        _same(g, w)
    gq, gk = _rand(rng, q.shape, dtype), _rand(rng, k.shape, dtype)
    _, vjp = jax.vjp(fn, q, k, arrays)
    dq, dk, da = jax.jit(vjp)((gq, gk))
    eq, ek, ewq, ewk = qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, **arrays, **static)
    _same(dq, eq)
    _same(dk, ek)
    for n, e in (("q_weight", ewq), ("k_weight", ewk)):
        assert (n in arrays) == (e is not None)
        if e is not None:
            _same(da[n], e)
    again = jax.jit(vjp)((gq, gk))  # determinism
    _same(again[0], dq)
    if "q_weight" in arrays:
        _same(again[2]["q_weight"], da["q_weight"])
    pos = reference.token_positions(b, s, offset=static.get("offset", 0), n_streams=cfg.n_streams,
                                    positions=None if "positions" not in arrays
                                    else np.asarray(arrays["positions"]))
    ang = reference.pair_angles(pos, cfg.inv_freq, cfg.stream_map)
    rk = dict(rotary_dim=cfg.rotary_dim, interleaved=cfg.interleaved, scale=cfg.scale,
              eps=static.get("eps", 1e-6), over=static.get("norm_over", "head"),
              order=static.get("order", "norm_then_rope"),
              weight_offset=static.get("weight_offset", 0.0))
    for x, g, y, dx, n in ((q, gq, got[0], dq, "q_weight"), (k, gk, got[1], dk, "k_weight")):
        w = None if n not in arrays else np.asarray(arrays[n], np.float64)
        xc = to_canon(np.asarray(x, np.float64), cfg.layout)
        ref = qref.forward(xc, ang, weight=w, **rk)
        assert_matches(to_canon(np.asarray(y, np.float64), cfg.layout), ref,
                       2 * np.abs(ref).max(), dtype)
        dref, dwref = qref.backward(xc, to_canon(np.asarray(g, np.float64), cfg.layout), ang,
                                    weight=w, **rk)
        assert_matches(to_canon(np.asarray(dx, np.float64), cfg.layout), dref,
                       4 * np.abs(dref).max(), dtype)
        if w is not None and arrays[n].dtype == jnp.float32:
            # fp32 partial sums: 1e-5 of the terms' magnitudes summed (count x the largest
            # |g·n̂|; |Rᵀg| ≤ 2·scale·max|g|)
            axes = (-1,) if rk["over"] == "head" else (-2, -1)
            nhat = xc / np.sqrt(np.mean(xc * xc, axis=axes, keepdims=True) + rk["eps"])
            count = b * s * (xc.shape[2] if rk["over"] == "head" else 1)
            bound = 1e-5 * count * 2 * cfg.scale * np.abs(np.asarray(g, np.float64)).max() \
                * np.abs(nhat).max()
            np.testing.assert_allclose(np.asarray(da[n], np.float64), dwref, rtol=0, atol=bound)


@pytest.mark.parametrize("model_type,rounding,offset", [
    ("qwen3", "cast_then_weight", 0.0), ("gemma3", "weight_then_cast", 1.0)])
def test_qk_norm_model_rounding_under_jit(model_type, rounding, offset, rng):
    """bf16 with HF's cos/sin tables in a model rounding mode (the general
    kernel, the model modes' backward): jit forward and jitted vjp give the
    eager calls' bits."""
    cfg = cuprope.RopeConfig(64)
    q, k = _rand(rng, (2, 16, 4, 64), "bfloat16"), _rand(rng, (2, 16, 2, 64), "bfloat16")
    ang = np.arange(16)[:, None] * 1e4 ** (-np.arange(32) / 32)
    cos = jnp.asarray(np.cos(np.concatenate([ang, ang], -1))[None], jnp.bfloat16)
    sin = jnp.asarray(np.sin(np.concatenate([ang, ang], -1))[None], jnp.bfloat16)
    wq = jnp.asarray(rng.uniform(-0.5, 0.5, 64) + (1.0 - offset), jnp.bfloat16)
    wk = jnp.asarray(rng.uniform(-0.5, 0.5, 64) + (1.0 - offset), jnp.bfloat16)

    def fn(q, k, wq, wk):
        return cjax.rope_qk_norm(q, k, cfg, q_weight=wq, k_weight=wk, weight_offset=offset,
                                 rounding=rounding, tables=(cos, sin))
    got = jax.jit(fn)(q, k, wq, wk)
    kw = dict(q_weight=wq, k_weight=wk, weight_offset=offset, rounding=rounding,
              tables=(cos, sin))
    for g, w in zip(got, qknorm.rope_qk_norm_forward(q, k, cfg, **kw)):
        _same(g, w)
    gq, gk = _rand(rng, q.shape, "bfloat16"), _rand(rng, k.shape, "bfloat16")
    _, vjp = jax.vjp(fn, q, k, wq, wk)
    for g, w in zip(jax.jit(vjp)((gq, gk)), qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg,
                                                                         **kw)):
        _same(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_vmap_on_the_gpu(dtype, rng):
    cfg = cuprope.RopeConfig(128, base=1e6)
    q, k = _rand(rng, (3, 2, 9, 8, 128), dtype), _rand(rng, (3, 2, 9, 2, 128), dtype)
    wq = jnp.asarray(rng.uniform(0.5, 1.5, 128), dtype)
    pos = jnp.asarray(rng.integers(0, 1000, (3, 9)).astype(np.int32))
    folded = jax.jit(jax.vmap(lambda q, k: cjax.rope_qk_norm(q, k, cfg, q_weight=wq, offset=5)))
    looped = jax.jit(jax.vmap(lambda q, k, p: cjax.rope_qk_norm(q, k, cfg, q_weight=wq,
                                                                positions=p)))
    fa, fb = folded(q, k)
    la, lb = looped(q, k, pos)
    for v in range(3):
        ea, eb = qknorm.rope_qk_norm_forward(q[v], k[v], cfg, q_weight=wq, offset=5)
        _same(fa[v], ea)
        _same(fb[v], eb)
        ea, eb = qknorm.rope_qk_norm_forward(q[v], k[v], cfg, q_weight=wq, positions=pos[v])
        _same(la[v], ea)
        _same(lb[v], eb)


@pytest.mark.parametrize("w_dtype", ["bfloat16", "float32"])
def test_qk_norm_grad_under_shard_map_on_one_gpu(w_dtype, rng):
    """jax.grad under shard_map (a one-GPU mesh): the results vary over the
    mesh axis, the replicated weights' gradients come from the float32
    partial path (the reduction kernel writing float32, psum, cast), which
    equals the plain jit's gradient bit for bit (one shard: the same float32
    sum, rounded once)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P
    cfg = cuprope.RopeConfig(64, base=1e6)
    q, k = _rand(rng, (2, 19, 4, 64), "bfloat16"), _rand(rng, (2, 19, 2, 64), "bfloat16")
    qw = jnp.asarray(rng.uniform(0.5, 1.5, 64), w_dtype)
    kw = jnp.asarray(rng.uniform(0.5, 1.5, 64), w_dtype)
    gq, gk = _rand(rng, q.shape, "bfloat16"), _rand(rng, k.shape, "bfloat16")

    def loss(q, k, qw, kw):
        a, b = cjax.rope_qk_norm(q, k, cfg, q_weight=qw, k_weight=kw)
        return jnp.sum(a.astype(jnp.float32) * gq) + jnp.sum(b.astype(jnp.float32) * gk)
    grad = jax.grad(loss, argnums=(0, 1, 2, 3))
    want = jax.jit(grad)(q, k, qw, kw)
    mesh = Mesh(np.array(jax.devices("gpu")[:1]), ("x",))
    sm = jax.shard_map(lambda *a: grad(*a), mesh=mesh, in_specs=(P("x"), P("x"), P(), P()),
                       out_specs=(P("x"), P("x"), P(), P()))
    got = jax.jit(sm)(q, k, qw, kw)
    for g, w in zip(got, want):
        _same(g, w)
