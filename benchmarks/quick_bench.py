"""Quick roofline check: cuprope vs a device-to-device copy of the same bytes.

Bandwidth counts the fewest bytes the operation must move: q and k read once
and written once (in-place partial rotary: only the rotated part). Timed with
CUDA events, after warm-up, median of many runs, inputs rotated among several
buffer sets so the L2 does not hold them."""
import sys

import torch

import cuprope
from cuprope.bench import time_gpu


def timed(fn, reps=50, warm=5):
    """Median kernel seconds (cuprope.bench.time_gpu: host overhead kept out)."""
    return time_gpu(fn, reps=reps, warm=warm, sleep_cycles=1_000_000)


SHAPES = {"llama": ("llama3-8b prefill", 4, 4096, 32, 8, 128),
          "32k": ("32k seq", 1, 32768, 32, 8, 128),
          "d64": ("D64 MHA", 8, 2048, 16, 16, 64),
          "decode": ("decode B256", 256, 1, 32, 8, 128),
          "partial": ("partial R64 of 128", 4, 4096, 32, 8, 128, 64)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="llama,32k,d64,decode")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    dev = torch.cuda.get_device_name()
    rows = []
    for key in args.shapes.split(","):
        name, b, s, hq, hk, d, *rot = SHAPES[key]
        r = rot[0] if rot else d
        for dt in (DTYPES[k] for k in args.dtypes.split(",")):
            sets = [(torch.randn(b, s, hq, d, device="cuda", dtype=dt),
                     torch.randn(b, s, hk, d, device="cuda", dtype=dt)) for _ in range(3)]
            outs = [(torch.empty_like(q), torch.empty_like(k)) for q, k in sets]
            cfg = cuprope.RopeConfig(r)
            nbytes = 2 * sum(q.numel() + k.numel() for q, k in sets[:1]) * sets[0][0].element_size()
            inpl_bytes = nbytes * r // d  # in place only the rotated part moves
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            i = [0]

            def run_rope():
                j = i[0] % 3
                i[0] += 1
                cuprope.rope_qk_forward(*sets[j], cfg, out=outs[j])

            def run_inplace():
                j = i[0] % 3
                i[0] += 1
                cuprope.rope_qk_forward(*sets[j], cfg, inplace=True)

            t_copy = timed(lambda: dst.copy_(src))
            t_rope = timed(run_rope)
            t_inpl = timed(run_inplace)
            rows.append((name, str(dt).replace("torch.", ""), nbytes / t_copy / 1e12,
                         nbytes / t_rope / 1e12, t_rope * 1e6, inpl_bytes / t_inpl / 1e12))
    print(f"device: {dev} {args.tag}")
    print(f"{'shape':<18} {'dtype':<9} {'copy TB/s':>9} {'qk TB/s':>8} {'qk us':>8} {'ratio':>6} {'inpl ratio':>10}")
    for r in rows:
        print(f"{r[0]:<18} {r[1]:<9} {r[2]:9.2f} {r[3]:8.2f} {r[4]:8.1f} {r[3] / r[2]:6.3f} {r[5] / r[2]:10.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
