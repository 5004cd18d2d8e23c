"""The decode prologue in one launch (cuprope.prologue.qk_norm_rope_append_kv)
against today's two cuprope launches, the unfused chain and FlashInfer's fused
RoPE + fp8 + paged append (which has no norm).

Shapes as ``kvcache_bench`` (its ``setup``): decode B = 1, 64, 256, 1024 (one
token per sequence at context 512) and one 16k-token prefill; Hq 32, Hk 8,
D 128, bf16 in, Qwen3's per-head RMS norm with both weights, NHD pages of 16,
FlashInfer's paged indices; q out and the k/v cache in e4m3 (the work
FlashInfer's ``RopeQuantizeAppendPagedKVCache`` does, plus the norm).

* fused: one ``qk_norm_rope_append_kv`` call;
* two launches: ``rope_qk_norm_forward`` in place, then ``rope_append_kv``
  with an identity rotation (the sequence the fused op equals byte for byte);
* unfused: torch's ``rms_norm`` of q and k (two ops), then ``rope_append_kv``;
* copy: ``Tensor.copy_`` of the fewest bytes the op moves (q, k, v read in
  bf16, written in e4m3);
* FlashInfer: ``fi_bench_bin``'s fp8 q+k+v append lines (``--fi-bin``).

Each timing: CUDA-graph replay of 50 calls, median of 11 (``graph_us``).
``python benchmarks/prologue_bench.py [--csv PATH] [--fi-bin PATH]`` on a GPU.
"""
import argparse
import csv
import os
import sys

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, ".."))
sys.path.insert(0, _HERE)
import cuprope  # noqa: E402
from cuprope import kvcache, qknorm  # noqa: E402
from cuprope.prologue import qk_norm_rope_append_kv  # noqa: E402
from kvcache_bench import (CASES, D, HK, HQ, PAGE, flashinfer_lines,  # noqa: E402
                           flashinfer_rows, graph_us, setup)


def run_case(kind, b, per_req, peers=True):
    """One row: µs of each implementation and the ratios the issue names
    (without ``peers``: the fused call and the copy only)."""
    x, pos, idx, _, n_pages = setup(kind, b, per_req)
    t = x["q"].shape[0]
    fp8 = torch.float8_e4m3fn
    kc = torch.zeros(n_pages, PAGE, HK, D, device="cuda", dtype=fp8)
    vc = torch.zeros_like(kc)
    one = torch.ones((), device="cuda")
    q_out = torch.empty(t, HQ, D, device="cuda", dtype=fp8)
    qw, kw_ = (torch.rand(D, device="cuda", dtype=torch.bfloat16) + 0.5 for _ in range(2))
    cfg = cuprope.RopeConfig(D, base=1e6, layout="thd")
    ident = cuprope.RopeConfig(D, layout="thd")
    zeros = torch.zeros_like(pos)
    cache = dict(k_cache=kc, v_cache=vc, q_out=q_out, q_scale=one, k_scale=one, v_scale=one,
                 **idx)
    norm = dict(q_weight=qw, k_weight=kw_, eps=1e-6)
    nbytes = t * D * ((HQ + 2 * HK) * 2 + (HQ + 2 * HK) * 1)
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    q, k, v = x["q"], x["k"], x["v"]

    def two_launches():
        qknorm.rope_qk_norm_forward(q, k, cfg, positions=pos, inplace=True, **norm)
        kvcache.rope_append_kv(q, k, v, ident, zeros, **cache)

    def unfused():
        qn = torch.nn.functional.rms_norm(q, (D,), qw, 1e-6)
        kn = torch.nn.functional.rms_norm(k, (D,), kw_, 1e-6)
        kvcache.rope_append_kv(qn, kn, v, cfg, pos, **cache)

    row = dict(case=kind, B=b, tokens=t, MB=round(nbytes / 2 ** 20, 2), bytes=nbytes)
    row["copy_us"] = graph_us(lambda: dst.copy_(src))
    row["fused_us"] = graph_us(lambda: qk_norm_rope_append_kv(q, k, v, cfg, pos, **norm,
                                                              **cache))
    row["fused_per_copy"] = round(row["copy_us"] / row["fused_us"], 3)
    if peers:
        row["two_launches_us"] = graph_us(two_launches)
        row["unfused_us"] = graph_us(unfused)
        row["vs_two_launches"] = round(row["two_launches_us"] / row["fused_us"], 2)
        row["vs_unfused"] = round(row["unfused_us"] / row["fused_us"], 2)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", help="write the rows to this CSV file")
    ap.add_argument("--fi-bin", default=None, help="FlashInfer's fi_bench_bin")
    args = ap.parse_args()
    fi = flashinfer_rows(flashinfer_lines(args.fi_bin)) if args.fi_bin else {}
    rows = []
    for kind, b, per_req in CASES:
        row = run_case(kind, b, per_req)
        f = fi.get(row["tokens"])
        if f is not None:
            row["flashinfer_us"] = f["fused_us"]
            row["flashinfer_per_fused"] = round(f["fused_us"] / row["fused_us"], 2)
        row["device"] = torch.cuda.get_device_name()
        rows.append(row)
        print(row, flush=True)
    if args.csv:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
    print("\n| case | tokens | fused µs | /copy | two launches | unfused | FlashInfer (no norm) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['case']} | {r['tokens']} | {r['fused_us']:.2f} | {r['fused_per_copy']} | "
              f"{r['two_launches_us']:.2f} ({r['vs_two_launches']}×) | {r['unfused_us']:.2f} "
              f"({r['vs_unfused']}×) | {r.get('flashinfer_us', '–')} |")


if __name__ == "__main__":
    main()
