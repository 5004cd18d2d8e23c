"""Per-head angle tables on the Llama-3-8B prefill shape, as a ratio to a
device-to-device copy of the same bytes: LRPE rotate-1d (per-head θ [H, D/2],
forward with SiLU or no activation, the fused SiLU backward) and plain RoPE
with a per-head inv_freq table on fused q/k. Bytes: each input read once,
each output written once (the backward reads x and dO).

    python benchmarks/probes/perhead_bench.py [--dtypes bf16,fp16,fp32] [--tag T]

Run it under CUPROPE_KERNEL_DEFINES variants (benchmarks/tune.py's way) to
compare kernels; CUPROPE_TOKEN_RUNS=0 turns token runs off on the host."""
import argparse
import os

import numpy as np
import torch

import cuprope
from cuprope import lrpe
from cuprope.cli.bench_cases import time_gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--tag", default=os.environ.get("CUPROPE_KERNEL_DEFINES", "") or "default")
    args = ap.parse_args()
    b, s, hq, hk, d = 4, 4096, 32, 8, 128
    rng = np.random.default_rng(0)
    theta = rng.uniform(0.01, 1.0, (hq, d // 2))
    cfg_q = cuprope.RopeConfig(d, inv_freq=rng.uniform(1e-4, 1.0, (hq, d // 2)))
    print(f"# {torch.cuda.get_device_name()}  variant: {args.tag}")
    print(f"{'case':<22}{'dtype':<6}{'us':>9}{'copy us':>9}{'ratio':>7}")
    for name in args.dtypes.split(","):
        dt = DTYPES[name]
        sets = 3
        xs = [torch.randn(b, s, hq, d, device="cuda", dtype=dt) for _ in range(sets)]
        dos = [torch.randn_like(x) for x in xs]
        outs = [torch.empty_like(x) for x in xs]
        ks = [torch.randn(b, s, hq, d, device="cuda", dtype=dt) for _ in range(sets)]
        kouts = [torch.empty_like(k) for k in ks]
        i = [0]

        def nxt():
            i[0] += 1
            return i[0] % sets

        xbytes = xs[0].numel() * xs[0].element_size()
        cases = {
            "lrpe silu fwd": (2 * xbytes, lambda: (lambda j: lrpe.rotate_1d_forward(
                xs[j], theta, act="silu", out=outs[j]))(nxt())),
            "lrpe none fwd": (2 * xbytes, lambda: (lambda j: lrpe.rotate_1d_forward(
                xs[j], theta, out=outs[j]))(nxt())),
            "lrpe silu bwd": (3 * xbytes, lambda: (lambda j: lrpe.rotate_1d_backward(
                xs[j], dos[j], theta, act="silu", out=outs[j]))(nxt())),
            "per-head rope q/k fwd": (4 * xbytes, lambda: (lambda j: cuprope.rope_qk_forward(
                xs[j], ks[j], cfg_q, out=(outs[j], kouts[j])))(nxt())),
        }
        for case, (nbytes, fn) in cases.items():
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            t_copy = time_gpu(lambda: dst.copy_(src), reps=30)
            t = time_gpu(fn, reps=30)
            print(f"{case:<22}{name:<6}{t * 1e6:9.1f}{t_copy * 1e6:9.1f}{t_copy / t:7.3f}",
                  flush=True)
            del src, dst


if __name__ == "__main__":
    main()
