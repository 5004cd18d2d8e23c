"""The JAX adapter under jax.jit and jax.grad: on the CPU backend here (NumPy
backend inside the buffer callback), on the GPU too when one is visible."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax.experimental.buffer_callback")
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
