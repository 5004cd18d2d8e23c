"""The JAX adapter under jax.jit, jax.grad and jax.vmap: on the CPU backend here
(the NumPy backend through jax.pure_callback), on the GPU too when one is
visible (tests/test_gpu_jax.py holds the GPU-only checks)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
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
