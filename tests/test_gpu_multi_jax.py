"""cuprope.jax across two GPUs: ``rope_qk`` forward and its VJP in
bfloat16 under ``jax.jit`` on inputs sharded over a two-GPU mesh
(``NamedSharding``: batch sharding, head sharding) and under ``shard_map``
equal the single-GPU run on unsharded inputs bit for bit; each output shard
lives on its own GPU and the kernel call is lowered on the local shard shapes.
Skipped below two GPUs visible to JAX.

The checks are module-level functions taking the two devices, so the same
logic also runs on two forced host CPU devices
(``test_multi_device_logic_on_two_host_cpu_devices``, a subprocess): there the
calls are not partitioned (``jax_sharding.PARTITION_ON_CPU``), so only the
bit equality and shard_map's placement are checked at run time, and the
partitioned program is compiled (not run) to check its per-shard call shapes.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import HAS_GPU

jax = pytest.importorskip("jax", reason="needs jax: pip install jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import cuprope  # noqa: E402
from cuprope import jax as cjax  # noqa: E402

TWO_GPUS = "needs two CUDA GPUs visible to JAX"


def _jax_gpus():
    try:
        return len(jax.devices("gpu")) if HAS_GPU else 0
    except RuntimeError:
        return 0


GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(_jax_gpus() < 2, reason=TWO_GPUS)]

CFG = cuprope.RopeConfig(64, base=5e5)
# batch 4, sequence 24, heads: q 4, k 2 (GQA) or 4 (MHA), head dim 64 (R = D)
B, S, D = 4, 24, 64


def _bytes(a):
    a = np.asarray(a)
    return a.dtype, a.shape, a.view(np.uint8)


def same_bits(got, want, what):
    g, w = _bytes(got), _bytes(want)
    assert g[0] == w[0] and g[1] == w[1], (what, g[:2], w[:2])
    assert np.array_equal(g[2], w[2]), f"{what}: differs from the single-device run"


def inputs(seed, hk):
    """bf16 q, k, cotangents gq, gk (random normal, never zeros) and int32
    positions [B, S], as NumPy arrays."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    bf = ml_dtypes.bfloat16
    q = rng.standard_normal((B, S, 4, D)).astype(bf)
    k = rng.standard_normal((B, S, hk, D)).astype(bf)
    gq = rng.standard_normal((B, S, 4, D)).astype(bf)
    gk = rng.standard_normal((B, S, hk, D)).astype(bf)
    pos = rng.integers(0, 100_000, (B, S)).astype(np.int32)
    return q, k, gq, gk, pos


def fwd_and_vjp(q, k, gq, gk, pos):
    """(q_rot, k_rot, dq, dk): rope_qk and its VJP at the cotangents (gq, gk)."""
    (qr, kr), vjp = jax.vjp(lambda q, k: cjax.rope_qk(q, k, CFG, positions=pos), q, k)
    dq, dk = vjp((gq, gk))
    return qr, kr, dq, dk


STEP = jax.jit(fwd_and_vjp)


def single_device(arrays, device):
    """The reference: one device, unsharded inputs."""
    outs = STEP(*[jax.device_put(jnp.asarray(a), device) for a in arrays])
    for o in outs:
        assert o.devices() == {device}
    return [np.asarray(o) for o in outs]


def check_shards(out, devices, dim, what):
    """``out`` is split along ``dim`` into one shard per device, each shard's
    data on its own device."""
    shards = out.addressable_shards
    assert {s.device for s in shards} == set(devices), (what, [s.device for s in shards])
    assert len(shards) == len(devices), what
    for s in shards:
        assert s.data.devices() == {s.device}, what
        want = list(out.shape)
        want[dim] //= len(devices)
        assert list(s.data.shape) == want, (what, s.data.shape, want)
        assert np.array_equal(_bytes(s.data)[2], _bytes(np.asarray(out)[s.index])[2]), what


def _mesh(devices):
    return Mesh(np.array(devices), ("x",))


def check_named_sharding(devices, placement=True, seed=0):
    """jit over NamedSharding inputs: batch sharding (GQA: k has 2 heads) and
    head sharding (MHA: q and k both 4 heads). Equal bits to one device; with
    ``placement``, each output is split over both devices along the sharded
    dim (the call runs per shard)."""
    mesh = _mesh(devices)
    results = {}
    for name, hk, spec, pspec, dim in (
            ("batch", 2, P("x", None, None, None), P("x", None), 0),
            ("heads", 4, P(None, None, "x", None), P(), 2)):
        arrays = inputs(seed, hk)
        want = single_device(arrays, devices[0])
        q, k, gq, gk, pos = arrays
        put = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec)) for a in (q, k, gq, gk)]
        p = jax.device_put(jnp.asarray(pos), NamedSharding(mesh, pspec))
        outs = STEP(*put, p)
        for o, w, what in zip(outs, want, ("q_rot", "k_rot", "dq", "dk")):
            same_bits(o, w, f"{name}-sharded {what}")
            if placement:
                check_shards(o, devices, dim, f"{name}-sharded {what}")
        results[name] = outs
    return results


def check_shard_map(devices, seed=1):
    """shard_map over the batch: each device runs forward and VJP on its half;
    the assembled results equal one device's bits, one shard per device."""
    mesh = _mesh(devices)
    arrays = inputs(seed, 2)
    want = single_device(arrays, devices[0])
    sm = jax.jit(jax.shard_map(fwd_and_vjp, mesh=mesh, in_specs=(P("x"),) * 5,
                               out_specs=(P("x"),) * 4))
    sharding = NamedSharding(mesh, P("x"))
    outs = sm(*[jax.device_put(jnp.asarray(a), sharding) for a in arrays])
    for o, w, what in zip(outs, want, ("q_rot", "k_rot", "dq", "dk")):
        same_bits(o, w, f"shard_map {what}")
        check_shards(o, devices, 0, f"shard_map {what}")
    return outs


def call_shapes(devices, target, seed=2):
    """The operand shapes of every ``target`` custom call in the compiled
    batch- and head-sharded programs (the call lowered on local shapes)."""
    mesh = _mesh(devices)
    found = {}
    for name, hk, spec, pspec in (("batch", 2, P("x", None, None, None), P("x", None)),
                                  ("heads", 4, P(None, None, "x", None), P())):
        q, k, gq, gk, pos = inputs(seed, hk)
        put = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec)) for a in (q, k, gq, gk)]
        p = jax.device_put(jnp.asarray(pos), NamedSharding(mesh, pspec))
        hlo = STEP.lower(*put, p).compile().as_text()
        found[name] = [line for line in hlo.splitlines()
                       if "custom-call" in line and target in line]
    return found


def check_local_call_shapes(devices, target):
    found = call_shapes(devices, target)
    # forward and backward: one call each, on half the batch / half the heads
    assert len(found["batch"]) == 2, found["batch"]
    assert all("bf16[2,24,4,64]" in line and "bf16[2,24,2,64]" in line and "s32[2,24]" in line
               for line in found["batch"]), found["batch"]
    assert len(found["heads"]) == 2, found["heads"]
    assert all("bf16[4,24,2,64]" in line and "bf16[4,24,4,64]" not in line
               for line in found["heads"]), found["heads"]


# ---------------------------------------------------------------- on two GPUs

def _gpus():
    return jax.devices("gpu")[:2]


def _on_two_gpus(test):
    for mark in GPU_MARKS:
        test = mark(test)
    return test


@_on_two_gpus
def test_named_sharding_over_two_gpus_equals_one_gpu():
    check_named_sharding(_gpus())


@_on_two_gpus
def test_shard_map_over_two_gpus_equals_one_gpu():
    check_shard_map(_gpus())


@_on_two_gpus
def test_sharded_kernel_call_runs_on_local_shapes_on_two_gpus():
    check_local_call_shapes(_gpus(), "triton_kernel_call")


# ---------------------------------------------------------------- the same logic on host CPUs

_ON_CPU = r"""
import sys
sys.path.insert(0, sys.argv[1])
import jax
assert len(jax.devices()) == 2, jax.devices()
import test_gpu_multi_jax as m
from cuprope._core import jax_sharding
devs = jax.devices()[:2]
# run: not partitioned on the CPU backend (the callback cannot run inside a
# custom-partitioned computation); jit may place outputs as it likes
m.check_named_sharding(devs, placement=False)
m.check_shard_map(devs)
# compile (not run) the partitioned program a GPU would run
jax_sharding.PARTITION_ON_CPU = True
m.STEP = jax.jit(lambda *a: m.fwd_and_vjp(*a))  # a new function: traced anew
m.check_local_call_shapes(devs, "callback")
print("multi ok")
"""


def test_multi_device_logic_on_two_host_cpu_devices():
    """The two-device checks above, run on two forced host CPU devices."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _ON_CPU, here], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "multi ok" in out.stdout


# ---------------------------------------------------------------- fused QK-norm + RoPE on two GPUs

def qk_norm_step(norm_over):
    """jit of (q_out, k_out, dq, dk, dq_weight, dk_weight): rope_qk_norm and its
    VJP at (gq, gk), the weights differentiated too."""
    def fn(q, k, gq, gk, pos, qw, kw):
        def f(q, k, qw, kw):
            return cjax.rope_qk_norm(q, k, CFG, q_weight=qw, k_weight=kw, positions=pos,
                                     norm_over=norm_over)
        out, vjp = jax.vjp(f, q, k, qw, kw)
        return tuple(out) + tuple(vjp((gq, gk)))
    return fn


def _qk_weights(seed, hk, norm_over, dtype):
    rng = np.random.default_rng(seed + 100)
    nq, nk = (D, D) if norm_over == "head" else (4 * D, hk * D)
    return (rng.uniform(0.5, 1.5, nq).astype(dtype), rng.uniform(0.5, 1.5, nk).astype(dtype))


def _close_dw(got, want, dtype, what):
    """Weight gradients summed in another order (float32 partials per shard,
    rounded once to the weight's dtype): 2**-13 of the largest entry (float32
    sums of ~400 terms in another order; a lost or doubled shard is off by
    tens of percent), one ulp of the dtype."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.asarray(got).dtype == np.asarray(want).dtype, what
    ulp = 2.0 ** -7 if dtype != np.float32 else 2.0 ** -23
    np.testing.assert_allclose(g, w, rtol=ulp, atol=2.0 ** -13 * np.abs(w).max(), err_msg=what)


@_on_two_gpus
@pytest.mark.parametrize("norm_over", ["head", "token"])
@pytest.mark.parametrize("w_dtype", ["bfloat16", "float32"])
def test_qk_norm_sharded_over_two_gpus_equals_one_gpu(norm_over, w_dtype):
    """rope_qk_norm under jit on NamedSharding inputs (batch-sharded GQA,
    head-sharded MHA) and under shard_map over the batch: outputs, dq and dk
    equal one GPU's bits, the weight gradients (summed across the GPUs in
    float32) equal it to the summation order; outputs split over both GPUs
    where the norm allows (a token norm gathers the heads), and the compiled
    program launches the kernel on the local shapes."""
    import ml_dtypes
    devices = _gpus()
    mesh = _mesh(devices)
    dtype = ml_dtypes.bfloat16 if w_dtype == "bfloat16" else np.float32
    step = jax.jit(qk_norm_step(norm_over))
    for name, hk, spec, pspec, dim in (
            ("batch", 2, P("x", None, None, None), P("x", None), 0),
            ("heads", 4, P(None, None, "x", None), P(), 2)):
        arrays = inputs(7, hk) + _qk_weights(7, hk, norm_over, dtype)
        want = step(*[jax.device_put(jnp.asarray(a), devices[0]) for a in arrays])
        put = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec)) for a in arrays[:4]]
        put += [jax.device_put(jnp.asarray(arrays[4]), NamedSharding(mesh, pspec))]
        put += [jax.device_put(jnp.asarray(w), NamedSharding(mesh, P())) for w in arrays[5:]]
        got = step(*put)
        for o, w, what in zip(got[:4], want[:4], ("q_out", "k_out", "dq", "dk")):
            same_bits(o, w, f"{name}-sharded {norm_over} {what}")
            if norm_over == "head" or name == "batch":
                check_shards(o, devices, dim, f"{name}-sharded {what}")
        for o, w, what in zip(got[4:], want[4:], ("dq_weight", "dk_weight")):
            _close_dw(o, w, dtype, f"{name}-sharded {norm_over} {what}")
        hlo = step.lower(*put).compile().as_text()
        calls = [line for line in hlo.splitlines()
                 if "custom-call" in line and "triton_kernel_call" in line]
        local_q = "bf16[2,24,4,64]" if name == "batch" else (
            "bf16[4,24,2,64]" if norm_over == "head" else "bf16[4,24,4,64]")
        assert calls and any(local_q in line for line in calls), (name, norm_over, calls)
    arrays = inputs(8, 2) + _qk_weights(8, 2, norm_over, dtype)
    want = step(*[jax.device_put(jnp.asarray(a), devices[0]) for a in arrays])
    sm = jax.jit(jax.shard_map(qk_norm_step(norm_over), mesh=mesh,
                               in_specs=(P("x"),) * 5 + (P(), P()),
                               out_specs=(P("x"),) * 4 + (P(), P())))
    got = sm(*[jax.device_put(jnp.asarray(a), NamedSharding(mesh, P("x") if i < 5 else P()))
               for i, a in enumerate(arrays)])
    for o, w, what in zip(got[:4], want[:4], ("q_out", "k_out", "dq", "dk")):
        same_bits(o, w, f"shard_map {norm_over} {what}")
    for o, w, what in zip(got[4:], want[4:], ("dq_weight", "dk_weight")):
        _close_dw(o, w, dtype, f"shard_map {norm_over} {what}")
