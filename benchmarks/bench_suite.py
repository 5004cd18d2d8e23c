"""Full benchmark suite: writes benchmarks/results.csv (with the device name),
then benchmarks/report.py draws benchmarks/results.png and the README table.

    python benchmarks/bench_suite.py [--out benchmarks/results.csv] [--quick]
        [--families core,mla]

Families: ``core`` (the rope core, schemes, decode host time, JIT), ``mla``
(DeepSeek MLA's fused append beside FlashInfer's, benchmarks/mla_bench.py:
writes ``<out>_mla.csv``).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from cuprope.bench import SCHEME_OPS, SHAPES, format_table, run_case, run_scheme_case

PEER_CASES = {("llama3-8b", "bf16"), ("llama3-8b", "fp32"), ("llama3-8b", "fp16"),
              ("seq32k", "bf16"), ("mha-d64", "bf16")}


def jit_times():
    """First-call time in a fresh process with an empty CuPy cache, then in a
    second process reusing that cache (must hit the on-disk cache)."""
    code = ("import time, torch, cuprope; q=torch.randn(1,8,4,128,device='cuda',dtype=torch.bfloat16);"
            "c=cuprope.RopeConfig(128); t=time.perf_counter(); cuprope.rope_forward(q,c);"
            "torch.cuda.synchronize(); print(time.perf_counter()-t)")
    cache = tempfile.mkdtemp(prefix="cuprope-jit-")
    env = dict(os.environ, CUPY_CACHE_DIR=cache)
    out = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        out.append(float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else float("nan"))
    return out


def decode_times(batch):
    """cuprope.bench.decode_host_and_kernel in a fresh process, so the suite's
    state (torch.compile's workers, hundreds of cached plans and buffers) does
    not weigh on the host time. It still varies between runs on the lent
    machine: 10-17 µs per call (benchmarks/NOTES.md 20)."""
    code = ("from cuprope.bench import decode_host_and_kernel as f; "
            f"print(*f('bf16', batch={batch}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode:
        return float("nan"), float("nan")
    host, kern = r.stdout.split()[-2:]
    return float(host), float(kern)


def mla_suite(path):
    """The mla family: benchmarks/mla_bench.py's rows (ours, the unfused torch
    sequence, a copy, FlashInfer's RopeQuantizeAppendPagedMLACache) to ``path``."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mla_bench
    rows = mla_bench.run_all()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["device"] + keys)
        w.writeheader()
        w.writerows({"device": torch.cuda.get_device_name(), **r} for r in rows)
    for r in rows:
        print(json.dumps(r), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.csv"))
    ap.add_argument("--quick", action="store_true", help="bf16 and fp32 only, fewer repetitions")
    ap.add_argument("--families", default="core,mla", help="comma-separated: core, mla")
    args = ap.parse_args()
    families = set(args.families.split(","))
    if "mla" in families:
        mla_suite(os.path.splitext(args.out)[0] + "_mla.csv")
    if "core" not in families:
        return
    dev = torch.cuda.get_device_name()
    dtypes = ("bf16", "fp32") if args.quick else ("bf16", "fp16", "fp32")
    reps = 15 if args.quick else 30
    rows = []
    plan = [(shape, op, dt) for shape in SHAPES for op in ("qk_fwd", "qk_bwd", "qk_inplace", "fwd",
                                                           "qkv_slices") for dt in dtypes]
    t0 = time.time()
    for n, (shape, op, dt) in enumerate(plan):
        peers = op == "qk_fwd" and (shape, dt) in PEER_CASES
        rows += run_case(shape, SHAPES[shape], op, dt, peers=peers, reps=reps)
        print(f"[{n + 1}/{len(plan)}] {shape} {op} {dt} ({time.time() - t0:.0f} s)", file=sys.stderr,
              flush=True)
    for op in SCHEME_OPS:  # frequency schemes and LRPE on the Llama-3-8B prefill shape
        for dt in dtypes:
            rows += run_scheme_case("llama3-8b", SHAPES["llama3-8b"], op, dt, reps=reps)
    extra = {}
    for b in (1, 256):
        h, k = decode_times(b)
        extra[f"decode_B{b}_host_us"] = round(h, 2)
        extra[f"decode_B{b}_kernel_us"] = round(k, 2)
    first, second = jit_times()
    extra["jit_first_call_s"] = round(first, 2)
    extra["jit_second_process_s"] = round(second, 3)
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "case", "op", "dtype", "impl", "B", "S", "Hq", "Hk", "D", "R", "bytes",
                    "us", "TBps", "ratio_to_copy"])
        for r in rows:
            w.writerow([dev, r.case, r.op, r.dtype, r.impl, *r.shape, r.nbytes,
                        f"{r.seconds * 1e6:.2f}", f"{r.tbps:.3f}", f"{r.ratio:.4f}"])
    with open(os.path.splitext(args.out)[0] + "_extra.json", "w") as f:
        json.dump({"device": dev, **extra}, f, indent=1)
    print(format_table(rows))
    print(json.dumps({"device": dev, **extra}))


if __name__ == "__main__":
    main()
