"""The JAX adapter under jax.jit, jax.grad and jax.vmap: on the CPU backend here
(the NumPy backend through jax.pure_callback), on the GPU too when one is
visible (tests/test_gpu_jax.py holds the GPU-only checks)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="needs jax: pip install jax")
import jax.numpy as jnp  # noqa: E402

import cuprope  # noqa: E402
from cuprope import jax as cjax  # noqa: E402
from oracle import expected  # noqa: E402


def _devices():
    devs = [jax.devices("cpu")[0]]
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if gpus and cuprope.gpu_available():
        devs.append(gpus[0])
    return devs


@pytest.mark.parametrize("device", _devices(), ids=lambda d: d.platform)
def test_jit_forward_matches_reference(device):
    rng = np.random.default_rng(1)
    cfg = cuprope.RopeConfig(32)
    qh = rng.standard_normal((2, 6, 4, 32)).astype(np.float32)
    kh = rng.standard_normal((2, 6, 2, 32)).astype(np.float32)
    pos = np.arange(6, dtype=np.int32) * 7
    q, k, p = (jax.device_put(a, device) for a in (qh, kh, pos))
    f = jax.jit(lambda q, k, p: cjax.rope_qk(q, k, cfg, positions=p, offset=3))
    a, b = f(q, k, p)
    np.testing.assert_allclose(np.asarray(a), expected(qh, cfg, positions=pos, offset=3), atol=3e-6)
    np.testing.assert_allclose(np.asarray(b), expected(kh, cfg, positions=pos, offset=3), atol=3e-6)
    np.testing.assert_array_equal(np.asarray(q), qh)  # the input buffer is untouched


@pytest.mark.parametrize("device", _devices(), ids=lambda d: d.platform)
def test_grad_is_the_transposed_rotation(device):
    rng = np.random.default_rng(2)
    cfg = cuprope.RopeConfig(16, interleaved=True, scale=1.5)
    xh = rng.standard_normal((1, 5, 3, 24)).astype(np.float32)
    wh = rng.standard_normal((1, 5, 3, 24)).astype(np.float32)
    x, w = jax.device_put(xh, device), jax.device_put(wh, device)
    g = jax.jit(jax.grad(lambda x: jnp.sum(cjax.rope(x, cfg, offset=11) * w)))(x)
    np.testing.assert_allclose(np.asarray(g), expected(wh, cfg, offset=11, inverse=True), atol=3e-6)
    gq, gk = jax.grad(lambda q, k: jnp.sum(cjax.rope_qk(q, k, cfg)[0] * w) + jnp.sum(cjax.rope_qk(q, k, cfg)[1]),
                      argnums=(0, 1))(x, x)
    np.testing.assert_allclose(np.asarray(gq), expected(wh, cfg, inverse=True), atol=3e-6)
    np.testing.assert_allclose(np.asarray(gk), expected(np.ones_like(wh), cfg, inverse=True), atol=3e-6)


def test_offset_must_be_static_int():
    cfg = cuprope.RopeConfig(8)
    with pytest.raises(TypeError, match="offset"):
        cjax.rope(jnp.ones((1, 2, 1, 8)), cfg, offset=jnp.int32(3))


def test_bfloat16_and_vmap_on_the_cpu_backend():
    """bf16 host buffers reach the NumPy backend; a vmapped call (folded into
    the batch, or looped when positions are batched) equals the calls one by one."""
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(3)
    cfg = cuprope.RopeConfig(16)
    x = jax.device_put(jnp.asarray(rng.standard_normal((3, 2, 5, 2, 16)), jnp.bfloat16), cpu)
    pos = jax.device_put(jnp.asarray(rng.integers(0, 99, (3, 5)), jnp.int32), cpu)
    folded = jax.jit(jax.vmap(lambda x: cjax.rope(x, cfg, offset=4)))(x)
    looped = jax.jit(jax.vmap(lambda x, p: cjax.rope(x, cfg, positions=p)))(x, pos)
    assert folded.dtype == jnp.bfloat16
    for v in range(3):
        np.testing.assert_array_equal(np.asarray(folded[v]),
                                      np.asarray(cuprope.rope_forward(x[v], cfg, offset=4)))
        np.testing.assert_array_equal(np.asarray(looped[v]),
                                      np.asarray(cuprope.rope_forward(x[v], cfg, positions=pos[v])))


def test_tables_and_lrpe_on_the_cpu_backend():
    from cuprope import lrpe, tables
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.standard_normal((1, 6, 2, 8)), jnp.float32)
    cos = jnp.asarray(rng.uniform(-1, 1, (6, 8)), jnp.float32)
    sin = jnp.asarray(rng.uniform(-1, 1, (6, 8)), jnp.float32)
    got = jax.jit(lambda q: cjax.rope_table(q, cos, sin))(q)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(tables.rope_table_forward(q, cos, sin)))
    g = jax.grad(lambda q: jnp.sum(cjax.rope_table(q, cos, sin) * 2.0))(q)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(
        tables.rope_table_backward(jnp.full_like(q, 2.0), cos, sin)))
    theta = np.linspace(0.1, 1.0, 3)
    y = jax.jit(lambda q: cjax.rotate_1d(q, theta, offset=2, act="silu"))(q)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(
        lrpe.rotate_1d_forward(q, theta, offset=2, act="silu")))
    gx = jax.grad(lambda q: jnp.sum(cjax.rotate_1d(q, theta, offset=2, act="silu")))(q)
    np.testing.assert_array_equal(np.asarray(gx), np.asarray(
        lrpe.rotate_1d_backward(q, jnp.ones_like(q), theta, offset=2, act="silu")))


def test_bad_shapes_are_refused_when_traced():
    cfg = cuprope.RopeConfig(8)
    q, k = jnp.ones((1, 4, 2, 8)), jnp.ones((1, 5, 1, 8))
    with pytest.raises(ValueError, match="same batch and sequence sizes"):
        jax.jit(lambda q, k: cjax.rope_qk(q, k, cfg)).lower(q, k)
    with pytest.raises(ValueError, match="positions must have shape"):
        jax.jit(lambda q: cjax.rope(q, cfg, positions=jnp.arange(3))).lower(q)
    with pytest.raises(ValueError, match="offset out of range"):
        cjax.rope(q, cfg, offset=2 ** 31)
    with pytest.raises(TypeError, match="theta must be concrete"):
        jax.jit(lambda q, t: cjax.rotate_1d(q, t))(q, jnp.ones(4))


_SHARDED = r"""
import numpy as np, jax, jax.numpy as jnp, cuprope
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from cuprope import jax as cjax
assert len(jax.devices()) == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
rng = np.random.default_rng(0)
cfg = cuprope.RopeConfig(16, base=500.0)
q = jnp.asarray(rng.standard_normal((4, 6, 4, 16)), jnp.float32)
k = jnp.asarray(rng.standard_normal((4, 6, 2, 16)), jnp.float32)
pos = jnp.asarray(rng.integers(0, 1000, (4, 6)), jnp.int32)
want = cuprope.rope_qk_forward(np.asarray(q), np.asarray(k), cfg, positions=np.asarray(pos))
qs = jax.device_put(q, NamedSharding(mesh, P("data", None, "model", None)))
ks = jax.device_put(k, NamedSharding(mesh, P("data", None, "model", None)))
ps = jax.device_put(pos, NamedSharding(mesh, P("data", None)))
f = jax.jit(lambda q, k, p: cjax.rope_qk(q, k, cfg, positions=p))
a, b = f(qs, ks, ps)  # on the CPU backend: not partitioned, run by XLA as it sees fit
np.testing.assert_array_equal(np.asarray(a), want[0])
np.testing.assert_array_equal(np.asarray(b), want[1])
from cuprope._core import jax_sharding
jax_sharding.PARTITION_ON_CPU = True  # lower and compile the program a GPU would run
f = jax.jit(lambda q, k, p: cjax.rope_qk(q, k, cfg, positions=p))
hlo = f.lower(qs, ks, ps).compile().as_text()
# the call is lowered per shard, on the local shapes (on the CPU backend the
# callback itself then runs on device 0; a GPU runs the kernel on every device)
cb = [l for l in hlo.splitlines() if "custom-call" in l and "callback" in l]
assert cb and all("(f32[2,6,2,16]{3,2,1,0}, f32[2,6," in l and "s32[2,6]" in l for l in cb), cb
mha = jax.jit(lambda q, k: cjax.rope_qk(q, k, cfg)).lower(qs, qs).compile().as_text()
cb = [l for l in mha.splitlines() if "custom-call" in l and "callback" in l]
assert cb and all("(f32[2,6,2,16]{3,2,1,0}, f32[2,6,2,16]{3,2,1,0})" in l for l in cb), cb
seq_sharded = jax.device_put(q, NamedSharding(mesh, P(None, "data", "model", None)))
hlo = jax.jit(lambda q: cjax.rope(q, cfg)).lower(seq_sharded).compile().as_text()
cb = [l for l in hlo.splitlines() if "custom-call" in l and "callback" in l]
assert cb and all("f32[4,6,2,16]" in l for l in cb), cb  # the sequence is gathered
g = jax.jit(jax.grad(lambda q: jnp.sum(cjax.rope(q, cfg, positions=pos) ** 2)))
cb = [l for l in g.lower(qs).compile().as_text().splitlines() if "callback" in l and "custom-call" in l]
assert len(cb) == 2 and all("f32[2,6,2,16]" in l for l in cb), cb  # forward and backward
jax_sharding.PARTITION_ON_CPU = False

def per_shard(q, k, p):
    return cjax.rope_qk(q, k, cfg, positions=p)
sm = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=(P("data"), P("data"), P("data")),
                           out_specs=(P("data"), P("data"))))
a2, b2 = sm(qs, ks, ps)
np.testing.assert_array_equal(np.asarray(a2), want[0])
print("sharded ok")
"""


def test_sharded_calls_run_per_shard_on_several_cpu_devices():
    """Batch- and head-sharded q/k on 4 host CPU devices: under jit the
    partitioned program lowers the call per shard on its local shapes (a
    sharded sequence is gathered first), under shard_map each shard runs it,
    and results equal the unsharded call."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _SHARDED], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "sharded ok" in out.stdout


# ---------------------------------------------------------------- QK-norm + RoPE
from cuprope import qknorm, reference  # noqa: E402
from cuprope.qknorm import reference as qref  # noqa: E402
from cuprope._core.layout import from_canon, to_canon  # noqa: E402

QK_CASES = {  # config, q shape, k shape, keywords (weights: "q"/"k" by length, "dtype" their dtype)
    "qwen3-bshd-gqa": (cuprope.RopeConfig(16, base=1e4), (2, 5, 4, 16), (2, 5, 2, 16),
                       dict(weights=16, positions="bs")),
    "gemma-bhsd-partial-interleaved": (
        cuprope.RopeConfig(8, interleaved=True, layout="bhsd"), (1, 3, 6, 12), (1, 1, 6, 12),
        dict(weights=12, weight_offset=1.0, offset=5, w_dtype="x")),
    "llama4-l2-thd": (cuprope.RopeConfig(16, layout="thd", scale=0.5), (7, 2, 16), (7, 1, 16),
                      dict(norm="l2", order="rope_then_norm", positions="s")),
    "olmo2-token": (cuprope.RopeConfig(16, base=500.0), (2, 4, 3, 16), (2, 4, 1, 16),
                    dict(weights="token", norm_over="token", eps=1e-5)),
}


def _qk_inputs(case, dtype, rng):
    """(cfg, q, k, keyword arguments of rope_qk_norm) as JAX arrays."""
    cfg, qs, ks, kw = QK_CASES[case]
    kw = dict(kw)
    q = jnp.asarray(rng.standard_normal(qs), dtype)
    k = jnp.asarray(rng.standard_normal(ks), dtype)
    w, w_dtype = kw.pop("weights", None), kw.pop("w_dtype", "float32")
    if w is not None:
        w_dtype = dtype if w_dtype == "x" else w_dtype
        nq, nk = (w, w) if w != "token" else (qs[2] * qs[3], ks[2] * ks[3])
        kw["q_weight"] = jnp.asarray(rng.uniform(0.5, 1.5, nq), w_dtype)
        kw["k_weight"] = jnp.asarray(rng.uniform(0.5, 1.5, nk), w_dtype)
    p = kw.pop("positions", None)
    if p == "bs":
        kw["positions"] = jnp.asarray(rng.integers(0, 3000, qs[:2]), jnp.int32)
    elif p == "s":
        kw["positions"] = jnp.asarray(rng.integers(0, 3000, qs[:1]), jnp.int32)
    return cfg, q, k, kw


def _qk_ref(x, cfg, kw, w, b, s, g=None):
    """The float64 reference of one tensor (forward, or (dx, dw) with ``g``), canonical."""
    pos = reference.token_positions(b, s, offset=kw.get("offset", 0), n_streams=cfg.n_streams,
                                    positions=None if kw.get("positions") is None
                                    else np.asarray(kw["positions"]))
    common = dict(rotary_dim=cfg.rotary_dim, interleaved=cfg.interleaved, scale=cfg.scale,
                  weight=None if w is None else np.asarray(w, np.float64),
                  weight_offset=kw.get("weight_offset", 0.0), eps=kw.get("eps", 1e-6),
                  over=kw.get("norm_over", "head"), order=kw.get("order", "norm_then_rope"))
    ang = reference.pair_angles(pos, cfg.inv_freq, cfg.stream_map)
    xc = to_canon(np.asarray(x, np.float64), cfg.layout)
    if g is None:
        return qref.forward(xc, ang, **common)
    return qref.backward(xc, to_canon(np.asarray(g, np.float64), cfg.layout), ang, **common)


def _bs(cfg, shape):
    return (1, shape[0]) if cfg.layout == "thd" else (
        (shape[0], shape[2]) if cfg.layout == "bhsd" else shape[:2])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", list(QK_CASES))
def test_qk_norm_jit_forward_is_the_reference_rounded_once(case, dtype):
    """Under jit on the CPU backend: the eager NumPy backend's bits, which are
    the float64 reference rounded once to the dtype (on the CPU also where a
    GPU is the default device: the GPU's bounds are test_gpu_jax.py's)."""
    with jax.default_device(jax.devices("cpu")[0]):
        _forward_is_the_reference_rounded_once(case, dtype)


def _forward_is_the_reference_rounded_once(case, dtype):
    cfg, q, k, kw = _qk_inputs(case, dtype, np.random.default_rng(10))
    arrays = {n: v for n, v in kw.items() if isinstance(v, jax.Array)}
    static = {n: v for n, v in kw.items() if n not in arrays}
    got = jax.jit(lambda q, k, a: cjax.rope_qk_norm(q, k, cfg, **a, **static))(q, k, arrays)
    want = qknorm.rope_qk_norm_forward(q, k, cfg, **kw)
    b, s = _bs(cfg, q.shape)
    for g, w, x, wt in zip(got, want, (q, k), (kw.get("q_weight"), kw.get("k_weight"))):
        assert g.dtype == x.dtype and g.shape == x.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        ref = reference.round_to_dtype(from_canon(_qk_ref(x, cfg, kw, wt, b, s), cfg.layout),
                                       np.asarray(x).dtype)
        np.testing.assert_array_equal(np.asarray(g, np.float64), ref.astype(np.float64))


@pytest.mark.parametrize("case", list(QK_CASES))
def test_qk_norm_grads_match_float64(case):
    """jax.grad in q, k and both weights (fp32) against the float64 backward,
    and the jitted vjp equals the eager rope_qk_norm_backward bit for bit."""
    rng = np.random.default_rng(11)
    cfg, q, k, kw = _qk_inputs(case, "float32", rng)
    cq, ck = (jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in (q, k))
    ws = {n: kw.pop(n) for n in ("q_weight", "k_weight") if n in kw}

    def loss(q, k, ws):
        a, b = cjax.rope_qk_norm(q, k, cfg, **kw, **ws)
        return jnp.sum(a * cq) + jnp.sum(b * ck)
    gq, gk, gw = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, ws)
    b, s = _bs(cfg, q.shape)
    for x, c, g, n in ((q, cq, gq, "q_weight"), (k, ck, gk, "k_weight")):
        dx, dw = _qk_ref(x, cfg, kw, ws.get(n), b, s, g=c)
        dx = from_canon(dx, cfg.layout)
        np.testing.assert_allclose(np.asarray(g), dx, rtol=0, atol=2e-6 * np.abs(dx).max())
        if n in ws:
            np.testing.assert_allclose(np.asarray(gw[n]), dw, rtol=0, atol=1e-5 * np.abs(dw).max())
    _, vjp = jax.vjp(lambda q, k, ws: cjax.rope_qk_norm(q, k, cfg, **kw, **ws), q, k, ws)
    dq, dk, dws = jax.jit(vjp)((cq, ck))
    eq, ek, ewq, ewk = qknorm.rope_qk_norm_backward(q, k, cq, ck, cfg, **kw, **ws)
    np.testing.assert_array_equal(np.asarray(dq), np.asarray(eq))
    np.testing.assert_array_equal(np.asarray(dk), np.asarray(ek))
    for n, e in (("q_weight", ewq), ("k_weight", ewk)):
        assert (n in ws) == (e is not None)
        if e is not None:
            np.testing.assert_array_equal(np.asarray(dws[n]), np.asarray(e))


def test_qk_norm_vmap_folds_or_loops_bf16():
    """A leading axis of q and k folds into the batch (one call, no loop in the
    jaxpr); batched positions, and the backward with weights, loop; every
    element equals the call on that element."""
    rng = np.random.default_rng(12)
    cfg = cuprope.RopeConfig(16, base=1e4)
    q = jnp.asarray(rng.standard_normal((3, 2, 5, 4, 16)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((3, 2, 5, 2, 16)), jnp.bfloat16)
    wq = jnp.asarray(rng.uniform(0.5, 1.5, 16), jnp.bfloat16)
    pos = jnp.asarray(rng.integers(0, 999, (3, 5)), jnp.int32)

    def fwd(q, k):
        return cjax.rope_qk_norm(q, k, cfg, q_weight=wq, offset=4)
    folded = jax.jit(jax.vmap(fwd))
    text = str(jax.make_jaxpr(jax.vmap(fwd))(q, k))
    assert text.count("cuprope_rope_qk_norm") == 1 and "while" not in text and "scan" not in text
    looped = jax.jit(jax.vmap(lambda q, k, p: cjax.rope_qk_norm(q, k, cfg, q_weight=wq,
                                                                positions=p)))
    assert "scan" in str(jax.make_jaxpr(jax.vmap(lambda q, k, p: cjax.rope_qk_norm(
        q, k, cfg, positions=p)))(q, k, pos))
    fa, fb = folded(q, k)
    la, lb = looped(q, k, pos)
    gw = jax.jit(jax.vmap(jax.grad(lambda q, k, w: jnp.sum(
        cjax.rope_qk_norm(q, k, cfg, q_weight=w)[0].astype(jnp.float32)), argnums=2),
        in_axes=(0, 0, None)))(q, k, wq)
    assert fa.dtype == jnp.bfloat16 and gw.shape == (3, 16)
    for v in range(3):
        ea, eb = qknorm.rope_qk_norm_forward(q[v], k[v], cfg, q_weight=wq, offset=4)
        np.testing.assert_array_equal(np.asarray(fa[v]), np.asarray(ea))
        np.testing.assert_array_equal(np.asarray(fb[v]), np.asarray(eb))
        ea, eb = qknorm.rope_qk_norm_forward(q[v], k[v], cfg, q_weight=wq, positions=pos[v])
        np.testing.assert_array_equal(np.asarray(la[v]), np.asarray(ea))
        np.testing.assert_array_equal(np.asarray(lb[v]), np.asarray(eb))
        ones = jnp.ones_like(q[v])
        _, _, dw, _ = qknorm.rope_qk_norm_backward(q[v], k[v], ones, jnp.zeros_like(k[v]), cfg,
                                                   q_weight=wq)
        np.testing.assert_array_equal(np.asarray(gw[v]), np.asarray(dw))


def test_qk_norm_model_mode_with_tables_under_jit():
    """rounding='cast_then_weight' with HF's tables (bf16): the eager call's bits
    under jit, gradients (through the model-mode backward) in the weights' dtype."""
    rng = np.random.default_rng(13)
    cfg = cuprope.RopeConfig(16)
    q = jnp.asarray(rng.standard_normal((1, 6, 2, 16)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((1, 6, 1, 16)), jnp.bfloat16)
    ang = np.arange(6)[:, None] * 100.0 ** (-np.arange(8) / 8)
    cos = jnp.asarray(np.cos(np.concatenate([ang, ang], -1))[None], jnp.bfloat16)
    sin = jnp.asarray(np.sin(np.concatenate([ang, ang], -1))[None], jnp.bfloat16)
    wq, wk = (jnp.asarray(rng.uniform(0.5, 1.5, 16), jnp.bfloat16) for _ in range(2))
    kw = dict(q_weight=wq, k_weight=wk, rounding="cast_then_weight", tables=(cos, sin))
    got = jax.jit(lambda q, k: cjax.rope_qk_norm(q, k, cfg, **kw))(q, k)
    for g, w in zip(got, qknorm.rope_qk_norm_forward(q, k, cfg, **kw)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    gq, gk = jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16), jnp.ones_like(k)
    _, vjp = jax.vjp(lambda q, k, wq, wk: cjax.rope_qk_norm(
        q, k, cfg, q_weight=wq, k_weight=wk, rounding="cast_then_weight", tables=(cos, sin)),
        q, k, wq, wk)
    got = jax.jit(vjp)((gq, gk))
    want = qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, **kw)
    for g, w in zip(got, want):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(norm="layer"), ValueError, "norm must be"),
    (dict(order="sideways"), ValueError, "order must be"),
    (dict(q_weight=jnp.ones(15)), ValueError, r"q_weight must have shape \(16,\)"),
    (dict(norm="l2", k_weight=jnp.ones(16)), ValueError, "l2"),
    (dict(rounding="exact", tables=(jnp.ones((3, 16)),) * 2), ValueError, "model rounding"),
    (dict(positions=jnp.arange(4)), ValueError, "positions must have shape"),
    (dict(positions=jnp.arange(3.0)), TypeError, "positions must have dtype"),
])
def test_qk_norm_errors_are_raised_when_traced(kw, exc, match):
    cfg = cuprope.RopeConfig(16)
    q, k = jnp.ones((1, 3, 2, 16)), jnp.ones((1, 3, 1, 16))
    with pytest.raises(exc, match=match):
        jax.jit(lambda q, k: cjax.rope_qk_norm(q, k, cfg, **kw)).lower(q, k)


def test_qk_norm_static_arguments_and_shapes():
    cfg = cuprope.RopeConfig(16)
    q, k = jnp.ones((1, 3, 2, 16)), jnp.ones((1, 3, 1, 16))
    with pytest.raises(TypeError, match="eps must be a Python float"):
        jax.jit(lambda q, k, e: cjax.rope_qk_norm(q, k, cfg, eps=e))(q, k, 1e-6)
    with pytest.raises(TypeError, match="offset must be a Python int"):
        jax.jit(lambda q, k, o: cjax.rope_qk_norm(q, k, cfg, offset=o))(q, k, 2)
    with pytest.raises(ValueError, match="same batch and sequence sizes"):
        cjax.rope_qk_norm(q, jnp.ones((1, 4, 1, 16)), cfg)
    with pytest.raises(TypeError, match="config must be a cuprope.RopeConfig"):
        cjax.rope_qk_norm(q, k, object())
    empty = cjax.rope_qk_norm(jnp.ones((0, 3, 2, 16)), jnp.ones((0, 3, 1, 16)), cfg)
    assert empty[0].shape == (0, 3, 2, 16) and empty[1].shape == (0, 3, 1, 16)


def _aligned(a):
    """A copy of ``a`` at a 256-byte aligned address (as GPU buffers are)."""
    a = np.asarray(a)
    buf = np.empty(a.nbytes + 256, np.uint8)
    off = (-buf.ctypes.data) % 256
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs inside it, in order."""
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


@pytest.mark.parametrize("case,backward,dtype,fast", [
    ("qwen3-bshd-gqa", True, "bfloat16", True), ("qwen3-bshd-gqa", False, "float32", True),
    ("gemma-bhsd-partial-interleaved", True, "float32", False),
    ("llama4-l2-thd", False, "float16", True), ("olmo2-token", True, "bfloat16", False)])
def test_qk_norm_gpu_lowering_plan_built_on_the_cpu(case, backward, dtype, fast):
    """The GPU lowering's kernel calls, built from the primitive's avals as the
    traced program holds them (no jaxlib kernel call, no GPU): the flat entry
    of the kernel the eager path picks for the same arrays, its grid and
    shared memory, every scalar word equal to the eager path's packed struct,
    a buffer for every pointer the call reads or writes (inputs before
    outputs) and 0 for the rest, and one reduction per weight."""
    from cuprope._core import loader
    from cuprope.qknorm import kernels as qknorm_kernels
    from cuprope.qknorm import launch as ql
    from cuprope.qknorm.jax import launch_plan, qknorm_p
    rng = np.random.default_rng(14)
    cfg, q, k, kw = _qk_inputs(case, dtype, rng)
    arrays = {n: v for n, v in kw.items() if isinstance(v, jax.Array)}
    static = {n: v for n, v in kw.items() if n not in arrays}
    gq, gk = jnp.ones_like(q), jnp.ones_like(k)
    if backward:
        def fn(q, k, a):
            return jax.vjp(lambda q, k: cjax.rope_qk_norm(q, k, cfg, **a, **static), q, k)[1](
                (gq, gk))
    else:
        def fn(q, k, a):
            return cjax.rope_qk_norm(q, k, cfg, **a, **static)
    eqns = [e for e in _eqns(jax.make_jaxpr(fn)(q, k, arrays).jaxpr) if e.primitive is qknorm_p]
    eqn = eqns[-1]  # the backward's, where there are two
    call, avals = eqn.params["call"], [v.aval for v in eqn.invars]
    assert call.backward == backward
    plan = launch_plan(call, avals, 132)
    # the eager path on aligned host copies of the same arrays
    host = {n: _aligned(v) for n, v in arrays.items()}
    xs = [_aligned(x) for x in (q, k)]
    gs = [_aligned(g) for g in (gq, gk)] if backward else [None, None]
    c = qknorm.QkNormCall.of(*xs, *gs, cfg, host.get("q_weight"), host.get("k_weight"),
                             static.get("eps", 1e-6), static.get("norm", "rms"),
                             static.get("weight_offset", 0.0),
                             static.get("order", "norm_then_rope"),
                             static.get("norm_over", "head"), "exact", None,
                             host.get("positions"), static.get("offset", 0), None)
    ins = c.ginfos if backward else c.infos
    outs = [cuprope._core.arrays.describe(_aligned(np.zeros_like(x)), "out") for x in xs]
    geo = ql.geometry(c, ins, outs, backward, 132)
    assert (geo.vec > 0) == fast
    st = ql.QKNORM_ARGS
    packed = np.frombuffer(st.pack(**ql.struct_fields(c, ins, outs, geo, inv_freq_ptr=1,
                                                      stream_map_ptr=0, part_ptr=0)), np.int64)
    words = [int(packed[i]) for i in st.flat_words]
    main = plan[0]
    assert main.name == geo.flat_name == qknorm_kernels.qknorm_flat_kernel_name(dtype, cfg.interleaved,
                                                                        geo.vec, backward)
    assert main.grid == (geo.blocks, 1, 1) and main.warps == 8 and main.smem == geo.smem
    assert geo.blocks == -(-min(c.b * c.s * geo.step_groups, (8 if fast else 4) * 8 * 132) // 8)
    assert main.smem + ql.QKNORM_ARGS.size <= 48 * 1024
    n_ptr = len(st.pointers)
    assert [p[1] for p in main.params[n_ptr:]] == words and len(main.params) == 68
    has = {"in_ptr0": True, "in_ptr1": True, "x_ptr0": backward, "x_ptr1": backward,
           "pos_ptr": "positions" in arrays, "seq_off_ptr": False,
           "w_ptr0": "q_weight" in arrays, "w_ptr1": "k_weight" in arrays,
           "inv_freq_ptr": True, "stream_map_ptr": cfg.stream_map is not None,
           "out_ptr0": True, "out_ptr1": True, "part_ptr": backward and "q_weight" in arrays}
    kinds = [p[0] for p in main.params[:n_ptr]]
    assert kinds == ["array" if has[r] else "scalar" for r in st.pointers]
    assert all(p == ("scalar", 0, "u64") for p in main.params[:n_ptr] if p[0] == "scalar")
    assert kinds.count("array") == len(main.operands) + len(main.results)
    aligns = dict(zip(st.pointers, [p[1] for p in main.params[:n_ptr]]))
    assert aligns["in_ptr0"] == aligns["out_ptr1"] == geo.vec * np.dtype(avals[0].dtype).itemsize
    n_rot = 4 if backward else 2
    assert [r for r in main.operands[:n_rot]] == [("operand", i) for i in (
        (2, 3, 0, 1) if backward else (0, 1))]
    assert [s for s, _ in main.results[:2]] == [q.shape, k.shape]
    dws = plan[1:]
    assert len(dws) == (int("q_weight" in arrays) + int("k_weight" in arrays) if backward else 0)
    if dws:
        assert main.results[2] == ((geo.part_rows * geo.part_cols,), np.dtype(np.float32))
        assert geo.part_rows == (geo.blocks if fast else 8 * geo.blocks)
    col0 = 0
    for launch, name in zip(dws, ("q_weight", "k_weight")):
        w = arrays[name]
        assert launch.name == qknorm_kernels.QKNORM_DW_KERNEL and launch.operands == (("part",),)
        assert launch.grid == (-(-w.shape[0] // 32), 1, 1) and launch.warps == 8
        assert [p[:2] for p in launch.params] == [
            ("array", 0), ("scalar", geo.part_rows), ("scalar", geo.part_cols),
            ("scalar", col0), ("scalar", w.shape[0]), ("array", 0),
            ("scalar", ql.W_DTYPE[np.dtype(w.dtype).name])]
        assert launch.results == ((w.shape, np.dtype(w.dtype)),)
        col0 += w.shape[0]


# ---------------------------------------------------------------- QK-norm under sharding
_QK_SHARDED = r"""
import numpy as np, jax, jax.numpy as jnp, cuprope
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from cuprope import jax as cjax
from cuprope.qknorm import jax as jax_qknorm
from cuprope._core import jax_sharding
assert len(jax.devices()) == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("x",))
rng = np.random.default_rng(0)
cfg = cuprope.RopeConfig(16, base=500.0)
q = jnp.asarray(rng.standard_normal((4, 5, 4, 16)), jnp.bfloat16)
k = jnp.asarray(rng.standard_normal((4, 5, 2, 16)), jnp.bfloat16)
pos = jnp.asarray(rng.integers(0, 1000, (4, 5)), jnp.int32)
G = (jnp.asarray(rng.standard_normal(q.shape), jnp.bfloat16),
     jnp.asarray(rng.standard_normal(k.shape), jnp.bfloat16))
CASES = {"head": dict(norm_over="head", n=(16, 16)), "token": dict(norm_over="token", n=(64, 32))}

def weights(case, dtype):
    nq, nk = CASES[case]["n"]
    return (jnp.asarray(rng.uniform(0.5, 1.5, nq), dtype), jnp.asarray(rng.uniform(0.5, 1.5, nk), dtype))

def loss_fn(case):
    over = CASES[case]["norm_over"]
    def f(q, k, qw, kw, p):
        a, b = cjax.rope_qk_norm(q, k, cfg, q_weight=qw, k_weight=kw, positions=p, norm_over=over)
        return a, b
    return f

def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    np.testing.assert_array_equal(a.astype(np.float32), b.astype(np.float32))

def close_dw(a, b, dtype):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ulp = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7}[dtype]
    # float32 partials summed in another order, rounded once to the dtype:
    # a few ulps of the largest term (the sums cancel), one ulp of the dtype
    np.testing.assert_allclose(a, b, rtol=ulp, atol=4 * 2.0 ** -23 * np.abs(b).max())
    assert not np.array_equal(a, np.zeros_like(a))

def grads(f, args):
    def loss(q, k, qw, kw):
        a, b = f(q, k, qw, kw, args[4])
        return (jnp.sum(a.astype(jnp.float32) * G[0].astype(jnp.float32))
                + jnp.sum(b.astype(jnp.float32) * G[1].astype(jnp.float32)))
    return jax.grad(loss, argnums=(0, 1, 2, 3))(*args[:4])

# ---- shard_map: each shard runs the call on its local rows; grads of the replicated weights are the full sums
for case in CASES:
    for wdt in ("float32", "bfloat16"):
        qw, kw = weights(case, wdt)
        f = loss_fn(case)
        want_y = jax.jit(f)(q, k, qw, kw, pos)
        want_g = jax.jit(lambda *a: grads(f, a))(q, k, qw, kw, pos)
        for spec in (P("x"), P(None, None, "x")) if case == "head" else (P("x"),):
            pspec = P("x") if spec == P("x") else P()
            sm = jax.shard_map(f, mesh=mesh, in_specs=(spec, spec, P(), P(), pspec),
                               out_specs=(spec, spec))
            got_y = jax.jit(sm)(q, k, qw, kw, pos)
            same(got_y[0], want_y[0]); same(got_y[1], want_y[1])
            got_g = jax.jit(lambda *a: grads(sm, a))(q, k, qw, kw, pos)
            same(got_g[0], want_g[0]); same(got_g[1], want_g[1])
            close_dw(got_g[2], want_g[2], wdt); close_dw(got_g[3], want_g[3], wdt)
            # jax.vjp inside shard_map, the cotangents varying over the mesh
            def inner(q, k, qw, kw, p, gq, gk):
                _, vjp = jax.vjp(lambda q, k, qw, kw: f(q, k, qw, kw, p), q, k, qw, kw)
                return vjp((gq, gk))
            vj = jax.jit(jax.shard_map(inner, mesh=mesh,
                                       in_specs=(spec, spec, P(), P(), pspec, spec, spec),
                                       out_specs=(spec, spec, P(), P())))
            got_v = vj(q, k, qw, kw, pos, *G)
            same(got_v[0], want_g[0]); close_dw(got_v[2], want_g[2], wdt)
            close_dw(got_v[3], want_g[3], wdt)

# ---- the per-shard partition function: float32 partials summed across the axis, then cast
qw, kw = weights("head", "bfloat16")
call = jax_qknorm.QkNormStatic(cfg.key, backward=True, has_pos=True, has_qw=True, has_kw=True)
def shard(q, k, gq, gk, p, qw, kw):
    return jax_qknorm.local_call(call, {2: ("x",), 3: ("x",)}, q, k, gq, gk, p, qw, kw)
got = jax.jit(jax.shard_map(shard, mesh=mesh, in_specs=(P("x"),) * 5 + (P(), P()),
                            out_specs=(P("x"), P("x"), P(), P()), check_vma=False))(
    q, k, *G, pos, qw, kw)
want = cuprope.qknorm.rope_qk_norm_backward(*(np.asarray(a) for a in (q, k, *G)), cfg,
                                            q_weight=np.asarray(qw), k_weight=np.asarray(kw),
                                            positions=np.asarray(pos))
same(got[0], want[0]); same(got[1], want[1])
assert got[2].dtype == jnp.bfloat16
close_dw(got[2], want[2], "bfloat16"); close_dw(got[3], want[3], "bfloat16")

# ---- NamedSharding under jit: on the CPU backend not partitioned (equal to the unsharded call) ...
for case in CASES:
    qw, kw = weights(case, "float32")
    f = loss_fn(case)
    want_y = jax.jit(f)(q, k, qw, kw, pos)
    want_g = jax.jit(lambda *a: grads(f, a))(q, k, qw, kw, pos)
    for spec in (P("x"), P(None, None, "x")):
        qs = jax.device_put(q, NamedSharding(mesh, spec))
        ks = jax.device_put(k, NamedSharding(mesh, spec))
        ps = jax.device_put(pos, NamedSharding(mesh, P("x") if spec == P("x") else P()))
        y = jax.jit(f)(qs, ks, qw, kw, ps)
        same(y[0], want_y[0]); same(y[1], want_y[1])
        g = jax.jit(lambda *a: grads(f, a))(qs, ks, qw, kw, ps)
        same(g[0], want_g[0]); same(g[1], want_g[1])
        np.testing.assert_array_equal(np.asarray(g[2]), np.asarray(want_g[2]))

# ---- ... and the program a GPU runs, lowered and compiled per shard
jax_sharding.PARTITION_ON_CPU = True
def callbacks(fn, *args):
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return hlo, [l for l in hlo.splitlines() if "custom-call" in l and "callback" in l]
for case, spec, local_q, local_k in (
        ("head", P("x"), "bf16[2,5,4,16]", "bf16[2,5,2,16]"),
        # GQA: q's heads take the axis, k's (the fewer) are gathered, as in rope_qk
        ("head", P(None, None, "x"), "bf16[4,5,2,16]", "bf16[4,5,2,16]"),
        ("token", P("x"), "bf16[2,5,4,16]", "bf16[2,5,2,16]"),
        ("token", P(None, None, "x"), "bf16[4,5,4,16]", "bf16[4,5,2,16]")):  # heads gathered
    qw, kw = weights(case, "bfloat16")
    f = loss_fn(case)
    qs = jax.device_put(q, NamedSharding(mesh, spec))
    ks = jax.device_put(k, NamedSharding(mesh, spec))
    ps = jax.device_put(pos, NamedSharding(mesh, P("x") if spec == P("x") else P()))
    _, cb = callbacks(f, qs, ks, qw, kw, ps)
    assert len(cb) == 1 and local_q in cb[0] and local_k in cb[0], (case, spec, cb)
    hlo, cb = callbacks(lambda *a: grads(f, a), qs, ks, qw, kw, ps)
    # (the forward's outputs are dead in a linear loss's gradient: only the backward is left)
    assert cb and all(local_q in l and local_k in l for l in cb), (case, spec, cb)
    nq, nk = CASES[case]["n"]
    sharded = not (case == "token" and spec != P("x"))  # else nothing of q is split
    dw = "f32" if sharded else "bf16"  # float32 partials where they are summed across shards
    bwd = [l for l in cb if "%s[%d]{0}, %s[%d]{0})" % (dw, nq, dw, nk) in l]
    assert len(bwd) == 1, cb
    reduces = [l for l in hlo.splitlines() if "all-reduce(" in l and "f32[" in l]
    assert bool(reduces) == sharded, (case, spec, reduces)
jax_sharding.PARTITION_ON_CPU = False
print("qk-norm sharded ok")
"""


def test_qk_norm_sharded_on_two_cpu_devices():
    """rope_qk_norm on 2 host CPU devices, bf16 q/k, float32 and bf16
    weights, norms over the head and over the token: under shard_map (batch-
    or head-sharded) forward and grad (q, k and the replicated weights, whose
    gradients are summed across the mesh) and jax.vjp with cotangents varying
    over the mesh equal the unsharded call (dq, dk bit for bit; dw to a few
    ulps: float32 partials summed in another order); the partition function
    sums float32 partials across the axis; under NamedSharding the jit'd
    program equals the unsharded call, and the program a GPU runs lowers the
    call on the local shapes (heads gathered for the token norm, k's heads
    for GQA), the weight gradients float32 partials all-reduced where q is
    split, the weights' dtype where nothing is."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _QK_SHARDED], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "qk-norm sharded ok" in out.stdout


def test_qk_norm_partial_weight_gradients_plan_and_rule():
    """The partial backward (``dw_f32``: per-shard weight gradients to be
    summed across shards) plans the reduction kernel writing float32, and the
    sharding rule keeps weights replicated, heads whole for a token norm, and
    sums each weight's gradient over its own tensor's factors."""
    import dataclasses

    from cuprope.qknorm import launch as ql
    from cuprope.qknorm.jax import QkNormStatic, launch_plan, sharding_rule
    cfg = cuprope.RopeConfig(16)
    call = QkNormStatic(cfg.key, backward=True, has_pos=True, has_qw=True, has_kw=True)
    shapes = [(2, 5, 4, 16), (2, 5, 2, 16)] * 2 + [(2, 5), (16,), (16,)]
    bf = [jax.core.ShapedArray(s, jnp.int32 if len(s) == 2 else jnp.bfloat16) for s in shapes]
    plan = launch_plan(dataclasses.replace(call, dw_f32=True), bf, 132)
    assert [launch.results for launch in plan[1:]] == [(((16,), np.dtype(np.float32)),)] * 2
    assert all(launch.params[-1][1] == ql.W_DTYPE["float32"] for launch in plan[1:])
    plan = launch_plan(call, bf, 132)
    assert all(launch.params[-1][1] == ql.W_DTYPE["bfloat16"] for launch in plan[1:])
    rule = sharding_rule(call, shapes)
    assert rule.operands == [list("bshd"), list("bsgd")] * 2 + [["b", "s"], ["w"], ["v"]]
    assert rule.results == [list("bshd"), list("bsgd"), ["w"], ["v"]]
    assert {"w", "v", "s", "d"} <= rule.keep and not {"b", "h", "g"} & rule.keep
    assert rule.sums == ((2, list("bshd")), (3, list("bsgd")))
    token = sharding_rule(dataclasses.replace(call, norm_over="token"),
                          shapes[:5] + [(64,), (32,)])
    assert {"h", "g"} <= token.keep and "b" not in token.keep
    mha = sharding_rule(dataclasses.replace(call, backward=False, has_qw=False, has_kw=False),
                        [(2, 5, 4, 16), (2, 5, 4, 16), (5,)])
    assert mha.operands == [list("bshd"), list("bshd"), ["s"]] and mha.sums == ()
