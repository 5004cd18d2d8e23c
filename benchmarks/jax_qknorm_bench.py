"""Fused QK-norm + RoPE under ``jax.jit`` (issue 15): ``cuprope.jax.rope_qk_norm``
against XLA's own fusion of HF's Qwen3 block (RMSNorm over each head's D with a
weight, then rotate_half RoPE with cos/sin formed from the positions in the same
jit), forward and a ``value_and_grad`` step (grads of q, k and both weights, the
outputs materialised), µs per call in a host loop (``jax_bench.per_call``).

Shapes: Llama-3-8B / Qwen3-8B prefill (B 4, S 4096, Hq 32, Hk 8, D 128) and
decode B 64; bf16 and fp16.

    python benchmarks/jax_qknorm_bench.py [--csv PATH]
"""
import argparse
import csv
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    args = ap.parse_args()
    cfg = cuprope.RopeConfig(128, base=1e6)
    rows = []
    print(f"{jax.devices()[0].device_kind}: µs per call under jax.jit")
    print(f"{'shape':>18} {'dtype':>9} {'XLA fwd':>8} {'ours fwd':>8} {'x':>5} {'XLA step':>9} "
          f"{'ours step':>9} {'x':>5}")
    for name, (b, s, hq, hk, d) in SHAPES.items():
        for dt in args.dtypes.split(","):
            rng = np.random.default_rng(0)
            mk = lambda h: jnp.asarray(rng.standard_normal((b, s, h, d)), dtype=dt)  # noqa: E731
            q, k = mk(hq), mk(hk)
            wq = jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype=dt)
            wk = jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype=dt)
            pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))

            def ours(q, k, wq, wk, pos):
                return cjax.rope_qk_norm(q, k, cfg, q_weight=wq, k_weight=wk, eps=EPS,
                                         positions=pos)

            def step(fn):
                def loss(q, k, wq, wk):
                    a, c = fn(q, k, wq, wk, pos)
                    return (jnp.sum(a.astype(jnp.float32)) + jnp.sum(c.astype(jnp.float32)),
                            (a, c))
                g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
                return lambda: g(q, k, wq, wk)
            fx, fo = jax.jit(xla_block), jax.jit(ours)
            t = per_call({"xla": (lambda: fx(q, k, wq, wk, pos), jsync),
                          "ours": (lambda: fo(q, k, wq, wk, pos), jsync),
                          "xla_step": (step(xla_block), jsync),
                          "ours_step": (step(ours), jsync)}, reps=20, rounds=7)
            r = dict(shape=name, dtype=dt, xla_fwd_us=t["xla"], cuprope_fwd_us=t["ours"],
                     fwd_speedup=t["xla"] / t["ours"], xla_step_us=t["xla_step"],
                     cuprope_step_us=t["ours_step"], step_speedup=t["xla_step"] / t["ours_step"])
            rows.append(r)
            print(f"{name:>18} {dt:>9} {r['xla_fwd_us']:8.1f} {r['cuprope_fwd_us']:8.1f} "
                  f"{r['fwd_speedup']:5.2f} {r['xla_step_us']:9.1f} {r['cuprope_step_us']:9.1f} "
                  f"{r['step_speedup']:5.2f}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
