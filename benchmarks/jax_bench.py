"""cuprope under jax.jit against XLA's own fusion of the RoPE formula and the
same kernel called from torch, in one process (a GPU with JAX, torch, CuPy).
A measuring module: ``benchmarks/bench_suite.py --only jax`` runs it.

Per call: a host loop of 50 calls after warm-up, its wall time divided by 50,
the median of 9 such loops taken in turn for every variant: the forward of q
and k, and a grad step (``value_and_grad`` of sum(rope(q) * w_q) + sum(rope(k)
* w_k), the rotated q and k passing an ``optimization_barrier`` as they would
pass into attention, so that neither side can fuse the rotation into the
loss). XLA's formula is HF's ``x * cos + rotate_half(x) * sin`` with cos/sin
formed from the positions in float32 inside the same jit (what a JAX user
writes); the torch column times cuprope's torch path on the same tensors.
"""
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

import cuprope
from cuprope import jax as cjax

SHAPES = {"llama3-8b": (4, 4096, 32, 8, 128), "32k": (1, 32768, 32, 8, 128),
          "decode-b1": (1, 1, 32, 8, 128), "decode-b64": (64, 1, 32, 8, 128)}


def xla_rope(q, k, pos, base=500000.0):
    d = q.shape[-1]
    inv = 1.0 / (base ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = pos.astype(jnp.float32)[..., None] * inv
    emb = jnp.concatenate([ang, ang], -1)
    cos, sin = jnp.cos(emb)[:, :, None, :].astype(q.dtype), jnp.sin(emb)[:, :, None, :].astype(q.dtype)

    def rot(x):
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([-x2, x1], -1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def per_call(variants, reps=50, rounds=9):
    """{name: µs per call} for {name: (fn, sync)}, timed round-robin."""
    for fn, sync in variants.values():
        for _ in range(3):
            sync(fn())
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, sync) in variants.items():
            t = time.perf_counter()
            for _ in range(reps):
                out = fn()
            sync(out)
            times[name].append((time.perf_counter() - t) / reps * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def jsync(out):
    jax.block_until_ready(out)


def tsync(out):
    torch.cuda.synchronize()


def measure(dtype, shape, reps=50, rounds=9):
    """µs per call of one (dtype, shape of SHAPES): ``xla_fwd``,
    ``cuprope_jit_fwd``, ``torch_fwd`` (cuprope from torch on the same
    buffers), ``xla_grad``, ``cuprope_jit_grad``."""
    b, s, hq, hk, d = SHAPES[shape]
    cfg = cuprope.RopeConfig(d, base=500000.0)
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((b, s, hq, d), np.float32), dtype)
    k = jnp.asarray(rng.standard_normal((b, s, hk, d), np.float32), dtype)
    pos = jnp.asarray(np.tile(np.arange(s, dtype=np.int32) + (4095 if s == 1 else 0), (b, 1)))
    wq, wk = jnp.ones_like(q), jnp.ones_like(k)
    ours = jax.jit(lambda q, k, p: cjax.rope_qk(q, k, cfg, positions=p))
    theirs = jax.jit(xla_rope)

    def loss(f):
        def l(q, k, p):
            a, c = jax.lax.optimization_barrier(f(q, k, p))
            return jnp.sum((a * wq).astype(jnp.float32)) + jnp.sum((c * wk).astype(jnp.float32))
        return jax.jit(jax.value_and_grad(l, argnums=(0, 1)))
    g_ours = loss(lambda q, k, p: cjax.rope_qk(q, k, cfg, positions=p))
    g_theirs = loss(xla_rope)
    tq, tk, tp = torch.from_dlpack(q), torch.from_dlpack(k), torch.from_dlpack(pos)
    return per_call({
        "xla_fwd": (lambda: theirs(q, k, pos), jsync),
        "cuprope_jit_fwd": (lambda: ours(q, k, pos), jsync),
        "torch_fwd": (lambda: cuprope.rope_qk_forward(tq, tk, cfg, positions=tp), tsync),
        "xla_grad": (lambda: g_theirs(q, k, pos), jsync),
        "cuprope_jit_grad": (lambda: g_ours(q, k, pos), jsync)}, reps=reps, rounds=rounds)
