"""Plain RoPE at decode (issue 16): q and k of one token per sequence rotated in
place, kernel time per call under CUDA-graph replay, against a copy of the same
bytes and FlashInfer's cos/sin-cache kernel on the same shapes.

Shapes: B = 1, 64, 256, 512, 1024 sequences, S 1, Hq 32, Hk 8, D 128, bf16,
positions int32 below 4096 (random). Rows:

* core: ``cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)``
  (exact cos/sin evaluated per token);
* core+table: the same with ``cfg.cache_angles(4096)``;
* cos_sin_cache: ``cuprope.torch.rotary_embedding`` with a float32
  ``[4096, 128]`` cache (the serving-engine call);
* FlashInfer: ``BatchQKApplyRotaryPosIdsCosSinCache`` in place, from
  ``fi_bench_bin`` (``kvcache_bench.py`` says where it is looked for).

    python benchmarks/decode_bench.py [--csv PATH]
"""
import argparse
import csv
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cuprope  # noqa: E402
from cuprope.cos_sin_cache import rotary_embedding  # noqa: E402
from kvcache_bench import FI_DEFAULT, flashinfer_lines, graph_us  # noqa: E402

HQ, HK, D, MAXPOS = 32, 8, 128, 4096
BATCHES = (1, 64, 256, 512, 1024)


def flashinfer_decode(path):
    """{B: row} of fi_bench_bin's S = 1 bf16 lines (in-place cos/sin-cache µs)."""
    return {r["B"]: r for r in flashinfer_lines(path)
            if r.get("impl") == "flashinfer" and r.get("S") == 1 and r.get("dtype") == "bf16"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv")
    ap.add_argument("--fi-bin", default=FI_DEFAULT)
    args = ap.parse_args()
    fi = flashinfer_decode(args.fi_bin)
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    cfg = cuprope.RopeConfig(D, base=500000.0, layout="bshd")
    cfg_tab = cuprope.RopeConfig(D, base=500000.0, layout="bshd").cache_angles(MAXPOS)
    csc = torch.randn(MAXPOS, D, device="cuda", generator=g)
    rows = []
    print(f"{torch.cuda.get_device_name()}: decode, Hq {HQ}, Hk {HK}, D {D}, bf16, in place")
    print(f"{'B':>5} {'copy':>6} {'core':>6} {'+table':>6} {'csc':>6} {'FI':>6} {'FI/core':>7} "
          f"{'FI/tab':>6} {'FI/csc':>6}")
    for b in BATCHES:
        q = torch.randn(b, 1, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(b, 1, HK, D, device="cuda", dtype=torch.bfloat16, generator=g)
        pos = torch.randint(0, MAXPOS, (b, 1), device="cuda", dtype=torch.int32, generator=g)
        src = torch.empty(2 * (q.numel() + k.numel()), device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        r = dict(B=b, copy_us=graph_us(lambda: dst.copy_(src)))
        r["core_us"] = graph_us(lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos,
                                                                inplace=True))
        r["core_table_us"] = graph_us(lambda: cuprope.rope_qk_forward(
            q, k, cfg_tab, positions=pos, inplace=True))
        qv, kv, p1 = q.view(b, HQ * D), k.view(b, HK * D), pos.view(b)
        r["csc_us"] = graph_us(lambda: rotary_embedding(p1, qv, kv, D, csc, True))
        f = fi.get(b)
        if f:
            r["fi_us"] = f["cache_inplace_us"]
            for name in ("core", "core_table", "csc"):
                r[f"fi_over_{name}"] = round(r["fi_us"] / r[f"{name}_us"], 3)
        rows.append(r)
        fi_txt = (f"{r['fi_us']:6.2f} {r['fi_over_core']:7.3f} {r['fi_over_core_table']:6.3f} "
                  f"{r['fi_over_csc']:6.3f}" if f else f"{'-':>6} {'-':>7} {'-':>6} {'-':>6}")
        print(f"{b:>5} {r['copy_us']:6.2f} {r['core_us']:6.2f} {r['core_table_us']:6.2f} "
              f"{r['csc_us']:6.2f} {fi_txt}", flush=True)
    print("µs per call, CUDA-graph replay; FI/x > 1: FlashInfer slower than x")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
