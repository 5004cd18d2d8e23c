"""Plain RoPE at decode (issues 16, 30): q and k of one token per sequence
rotated in place, kernel time per call under CUDA-graph replay, against a copy
of the same bytes and FlashInfer's cos/sin-cache kernel on the same shapes.

Shapes: B = 1, 64, 256, 512, 1024 sequences, S 1, Hq 32, Hk 8, D 128, bf16,
positions int32 below 4096 (random). Rows:

* core: ``cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)``
  (at these sizes the decode rows, ``cuprope.rope.decode``: cos/sin from the
  config's default angle table);
* core+table: the same with ``cfg.cache_angles(4096)``;
* cos_sin_cache: ``cuprope.torch.rotary_embedding`` with a float32
  ``[4096, 128]`` cache (the serving-engine call); cos_sin_cache bf16: the
  same with a bf16 cache (vLLM keeps its cache in the model's dtype);
* general (``measure(general=True)``): the core and ``rotary_embedding`` with
  the decode rows turned off (``decode.MAX_TOKENS`` 0 while their launches
  are planned): the kernels they replace, in the same process;
* FlashInfer: ``BatchQKApplyRotaryPosIdsCosSinCache`` in place, from
  ``fi_bench_bin`` (``kvcache_bench.py`` says where it is looked for).

A measuring module: ``benchmarks/bench_suite.py --only decode`` runs it and
writes the rows. Alone, on a GPU (every row above, a table on stdout):

    python benchmarks/decode_bench.py [--fi-bin PATH] [--csv PATH] [--batches 1,64]
"""
import argparse
import csv
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cuprope  # noqa: E402
from cuprope.rope import decode  # noqa: E402
from cuprope.kvcache.cos_sin_cache import rotary_embedding  # noqa: E402
import cuprope.kvcache.rotary as rotary  # noqa: E402
from kvcache_bench import flashinfer_lines, graph_us  # noqa: E402

HQ, HK, D, MAXPOS = 32, 8, 128, 4096
BATCHES = (1, 64, 256, 512, 1024)
FI_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                          "peers", "fi_bench_bin")


def flashinfer_decode(lines):
    """{B: line} of fi_bench_bin's S = 1 bf16 lines (``kvcache_bench.flashinfer_lines``;
    ``cache_inplace_us``: the in-place cos/sin-cache kernel)."""
    return {r["B"]: r for r in lines
            if r.get("impl") == "flashinfer" and r.get("S") == 1 and r.get("dtype") == "bf16"}


def general_us(fn):
    """graph_us of ``fn`` with the decode rows off while its launches are
    planned (the core's plans are kept per config; rotary_embedding's fast
    path is cleared before and after, so neither path replays the other's)."""
    limit = decode.MAX_TOKENS
    rotary._LAUNCHES.clear()
    decode.MAX_TOKENS = 0
    try:
        return graph_us(fn)
    finally:
        decode.MAX_TOKENS = limit
        rotary._LAUNCHES.clear()


def measure(batches=BATCHES, general=False):
    """[{B, copy_us, core_us, core_table_us, csc_us, csc_bf16_us}] per batch
    (µs per call, CUDA-graph replay); ``bytes``: q and k read and written;
    ``general``: also core_general_us and csc_general_us."""
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    cfg = cuprope.RopeConfig(D, base=500000.0, layout="bshd")
    cfg_tab = cuprope.RopeConfig(D, base=500000.0, layout="bshd").cache_angles(MAXPOS)
    cfg_gen = cuprope.RopeConfig(D, base=500000.0, layout="bshd")
    csc = torch.randn(MAXPOS, D, device="cuda", generator=g)
    csc16 = csc.to(torch.bfloat16)
    rows = []
    for b in batches:
        q = torch.randn(b, 1, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(b, 1, HK, D, device="cuda", dtype=torch.bfloat16, generator=g)
        pos = torch.randint(0, MAXPOS, (b, 1), device="cuda", dtype=torch.int32, generator=g)
        src = torch.empty(2 * (q.numel() + k.numel()), device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        r = dict(B=b, bytes=2 * src.numel(), copy_us=graph_us(lambda: dst.copy_(src)))
        r["core_us"] = graph_us(lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos,
                                                                inplace=True))
        r["core_table_us"] = graph_us(lambda: cuprope.rope_qk_forward(
            q, k, cfg_tab, positions=pos, inplace=True))
        qv, kv, p1 = q.view(b, HQ * D), k.view(b, HK * D), pos.view(b)
        r["csc_us"] = graph_us(lambda: rotary_embedding(p1, qv, kv, D, csc, True))
        r["csc_bf16_us"] = graph_us(lambda: rotary_embedding(p1, qv, kv, D, csc16, True))
        if general:
            r["core_general_us"] = general_us(lambda: cuprope.rope_qk_forward(
                q, k, cfg_gen, positions=pos, inplace=True))
            r["csc_general_us"] = general_us(lambda: rotary_embedding(p1, qv, kv, D, csc, True))
        rows.append(r)
    return rows


COLUMNS = ("copy_us", "core_us", "core_table_us", "core_general_us", "csc_us", "csc_bf16_us",
           "csc_general_us", "fi_cache_inplace_us")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fi-bin", default=FI_DEFAULT, help="FlashInfer's fi_bench_bin")
    ap.add_argument("--csv", default=None, help="write the rows here")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args(argv)
    fi = flashinfer_decode(flashinfer_lines(args.fi_bin))
    rows = measure(tuple(int(b) for b in args.batches.split(",")), general=True)
    for r in rows:
        f = fi.get(r["B"])
        r["fi_cache_inplace_us"] = f["cache_inplace_us"] if f else None
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["B", "bytes", *COLUMNS])
            w.writeheader()
            w.writerows(rows)
    print(f"{torch.cuda.get_device_name()}: µs per call, CUDA-graph replay; in place, "
          f"Hq {HQ} Hk {HK} D {D} bf16")
    print(f"{'B':>5s} " + " ".join(f"{c[:-3]:>17s}" for c in COLUMNS)
          + f" {'core/FI':>8s} {'csc/FI':>7s}")
    for r in rows:
        cells = " ".join(f"{r[c]:17.2f}" if r.get(c) is not None else f"{'-':>17s}"
                         for c in COLUMNS)
        fi_us = r["fi_cache_inplace_us"]
        ratio = (f" {r['core_us'] / fi_us:8.3f} {r['csc_us'] / fi_us:7.3f}" if fi_us
                 else f" {'-':>8s} {'-':>7s}")
        print(f"{r['B']:5d} {cells}{ratio}")


if __name__ == "__main__":
    main()
