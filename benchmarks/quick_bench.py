"""Quick roofline check: cuprope vs a device-to-device copy of the same bytes.

Bandwidth counts the fewest bytes the operation must move: q and k read once
and written once (in-place partial rotary: only the rotated part). Timed with
CUDA events, after warm-up, median of many runs, inputs rotated among several
buffer sets so the L2 does not hold them."""
import sys

import torch

import cuprope
from cuprope import tables
from cuprope.bench import _cos_sin, time_gpu


def timed(fn, reps=50, warm=5):
    """Median kernel seconds (cuprope.bench.time_gpu: host overhead kept out)."""
    return time_gpu(fn, reps=reps, warm=warm, sleep_cycles=1_000_000)


SHAPES = {"llama": ("llama3-8b prefill", 4, 4096, 32, 8, 128),
          "32k": ("32k seq", 1, 32768, 32, 8, 128),
          "d64": ("D64 MHA", 8, 2048, 16, 16, 64),
          "d256": ("D256", 2, 4096, 16, 4, 256),
          "decode": ("decode B256", 256, 1, 32, 8, 128),
          "partial": ("partial R64 of 128", 4, 4096, 32, 8, 128, 64),
          "interleaved": ("llama interleaved", 4, 4096, 32, 8, 128, 128, True)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="llama,32k,d64,decode")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--tag", default="")
    ap.add_argument("--decode", action="store_true",
                    help="also the decode B 1 host and kernel time (cuprope.bench)")
    args = ap.parse_args(argv)
    dev = torch.cuda.get_device_name()
    rows = []
    for key in args.shapes.split(","):
        name, b, s, hq, hk, d, *extra = SHAPES[key]
        r = extra[0] if extra else d
        interleaved = len(extra) > 1 and extra[1]
        for dt in (DTYPES[k] for k in args.dtypes.split(",")):
            sets = [(torch.randn(b, s, hq, d, device="cuda", dtype=dt),
                     torch.randn(b, s, hk, d, device="cuda", dtype=dt)) for _ in range(3)]
            outs = [(torch.empty_like(q), torch.empty_like(k)) for q, k in sets]
            cfg = cuprope.RopeConfig(r, interleaved=interleaved)
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

            def run_tables():  # HF's cos/sin tables [S, R] (cuprope.tables)
                j = i[0] % 3
                i[0] += 1
                tables.rope_qk_table_forward(*sets[j], cos, sin, out=outs[j],
                                             interleaved=interleaved)

            t_copy = timed(lambda: dst.copy_(src))
            t_rope = timed(run_rope)
            t_inpl = timed(run_inplace)
            # context for the in-place column: torch's own in-place elementwise
            # kernel over the same bytes (read and written at one address)
            ew = torch.randn(inpl_bytes // 2 // sets[0][0].element_size(), device="cuda", dtype=dt)
            t_ew = timed(lambda: ew.mul_(1))
            # context for in-place partial rotary: torch copying just the rotated part
            # of each row (the same bytes, the same half-row access pattern)
            t_half = float("nan")
            if r < d:
                def half_copy():
                    j = i[0] % 3
                    i[0] += 1
                    for x, y in zip(sets[j], outs[j]):
                        y[..., :r].copy_(x[..., :r])
                t_half = timed(half_copy)
            t_tab = float("nan")
            if r == d:
                cos, sin = _cos_sin(s, d, 10000.0, dt, "cuda")
                t_tab = timed(run_tables)
            rows.append((name, str(dt).replace("torch.", ""), nbytes / t_copy / 1e12,
                         nbytes / t_rope / 1e12, t_rope * 1e6, inpl_bytes / t_inpl / 1e12,
                         nbytes / t_tab / 1e12, inpl_bytes / t_ew / 1e12, inpl_bytes / t_half / 1e12))
    print(f"device: {dev} {args.tag}")
    print(f"{'shape':<18} {'dtype':<9} {'copy TB/s':>9} {'qk TB/s':>8} {'qk us':>8} {'ratio':>6} "
          f"{'inpl ratio':>10} {'tables ratio':>12} {'torch mul_ ratio':>16} {'half-row copy':>13}")
    for r in rows:
        print(f"{r[0]:<18} {r[1]:<9} {r[2]:9.2f} {r[3]:8.2f} {r[4]:8.1f} {r[3] / r[2]:6.3f} "
              f"{r[5] / r[2]:10.3f} {r[6] / r[2]:12.3f} {r[7] / r[2]:16.3f} {r[8] / r[2]:13.3f}")
    if args.decode:
        from cuprope.bench import decode_host_and_kernel
        kern = sorted(decode_host_and_kernel("bf16", batch=1, calls=500)[1] for _ in range(3))
        print(f"decode B1 bf16 kernel us (3 graph runs): {' '.join(f'{k:.2f}' for k in kern)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
