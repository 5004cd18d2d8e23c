"""Ratio to copy as the sequence grows: separates a fixed cost per launch
(ramp-up, the last wave's tail, per-warp prologues) from the steady-state rate.

    python benchmarks/probes/size_sweep.py [--shapes mha-d64,d256,llama3-8b] [--dtypes bf16]

Shapes are the suite's (cuprope.cli.bench_cases.SHAPES). For each shape the sequence length is scaled by 1/4 ... 4; each row gives the
ratio to a copy of the same bytes and the *marginal* ratio between a size and
the previous one (the copy's extra time over cuprope's extra time), which is
the steady-state rate with the fixed costs cancelled."""
import argparse

import torch

import cuprope
from cuprope.cli.bench_cases import SHAPES, time_gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SCALES = (0.25, 0.5, 1, 2, 4)


def timed(fn):
    return time_gpu(fn, reps=40, warm=5, sleep_cycles=1_000_000)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="mha-d64,d256,llama3-8b")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--ops", default="fwd,qk_fwd")
    args = ap.parse_args()
    print(f"{'shape':11s} {'op':7s} {'dt':4s} {'S':>6s} {'MiB':>6s} {'copy us':>8s} {'rope us':>8s} "
          f"{'ratio':>6s} {'marginal':>8s}")
    for key in args.shapes.split(","):
        b, s0, hq, hk, d, r = SHAPES[key]
        for dn in args.dtypes.split(","):
            dt = DTYPES[dn]
            cfg = cuprope.RopeConfig(r)
            for op in args.ops.split(","):
                prev = None
                for f in SCALES:
                    s = int(s0 * f)
                    sets = [(torch.randn(b, s, hq, d, device="cuda", dtype=dt),
                             torch.randn(b, s, hk, d, device="cuda", dtype=dt)) for _ in range(3)]
                    outs = [(torch.empty_like(q), torch.empty_like(k)) for q, k in sets]
                    q0, k0 = sets[0]
                    moved = q0.numel() + (k0.numel() if op == "qk_fwd" else 0)
                    nbytes = moved * q0.element_size()  # read once; the copy moves it once too
                    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                    dst = torch.empty_like(src)
                    i = [0]

                    def run():
                        j = i[0] % 3
                        i[0] += 1
                        if op == "fwd":
                            cuprope.rope_forward(sets[j][0], cfg, out=outs[j][0])
                        else:
                            cuprope.rope_qk_forward(*sets[j], cfg, out=outs[j])
                    tc = timed(lambda: dst.copy_(src))
                    tr = timed(run)
                    marg = "" if prev is None else f"{(tc - prev[0]) / (tr - prev[1]):8.3f}"
                    print(f"{key:11s} {op:7s} {dn:4s} {s:6d} {2 * nbytes / 2**20:6.0f} {tc * 1e6:8.2f} "
                          f"{tr * 1e6:8.2f} {tc / tr:6.3f} {marg:>8s}", flush=True)
                    prev = (tc, tr)
                    del sets, outs, src, dst
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
