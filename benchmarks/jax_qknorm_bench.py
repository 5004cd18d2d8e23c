"""Fused QK-norm + RoPE under ``jax.jit`` (issue 15): ``cuprope.jax.rope_qk_norm``
against XLA's own fusion of HF's Qwen3 block (RMSNorm over each head's D with a
weight, then rotate_half RoPE with cos/sin formed from the positions in the same
jit), forward and a ``value_and_grad`` step (grads of q, k and both weights, the
outputs materialised), µs per call in a host loop (``jax_bench.per_call``).

Shapes: Llama-3-8B / Qwen3-8B prefill (B 4, S 4096, Hq 32, Hk 8, D 128) and
decode B 64; bf16 and fp16. A measuring module: ``benchmarks/bench_suite.py
--only jax`` runs it.
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cuprope  # noqa: E402
from cuprope import jax as cjax  # noqa: E402
from jax_bench import jsync, per_call, xla_rope  # noqa: E402

SHAPES = {"qwen3-8b prefill": (4, 4096, 32, 8, 128), "decode B 64": (64, 1, 32, 8, 128)}
EPS = 1e-6


def xla_block(q, k, wq, wk, pos):
    """HF's Qwen3RMSNorm (fp32 statistics, cast, times w) then rotate_half RoPE."""
    def norm(x, w):
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + EPS)
        return w * xf.astype(x.dtype)
    return xla_rope(norm(q, wq), norm(k, wk), pos, base=1e6)


def measure(shape, dt, reps=20, rounds=7):
    """µs per call of one (shape of SHAPES, dtype name): ``xla``, ``ours``
    (forward), ``xla_step``, ``ours_step`` (value_and_grad)."""
    b, s, hq, hk, d = SHAPES[shape]
    cfg = cuprope.RopeConfig(d, base=1e6)
    rng = np.random.default_rng(0)
    mk = lambda h: jnp.asarray(rng.standard_normal((b, s, h, d)), dtype=dt)  # noqa: E731
    q, k = mk(hq), mk(hk)
    wq = jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype=dt)
    wk = jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype=dt)
    pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))

    def ours(q, k, wq, wk, pos):
        return cjax.rope_qk_norm(q, k, cfg, q_weight=wq, k_weight=wk, eps=EPS, positions=pos)

    def step(fn):
        def loss(q, k, wq, wk):
            a, c = fn(q, k, wq, wk, pos)
            return (jnp.sum(a.astype(jnp.float32)) + jnp.sum(c.astype(jnp.float32)), (a, c))
        g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
        return lambda: g(q, k, wq, wk)
    fx, fo = jax.jit(xla_block), jax.jit(ours)
    return per_call({"xla": (lambda: fx(q, k, wq, wk, pos), jsync),
                     "ours": (lambda: fo(q, k, wq, wk, pos), jsync),
                     "xla_step": (step(xla_block), jsync),
                     "ours_step": (step(ours), jsync)}, reps=reps, rounds=rounds)
