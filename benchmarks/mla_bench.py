"""DeepSeek MLA's fused RoPE + fp8 + paged latent-cache append
(cuprope.mla.rope_append_mla) against the unfused torch sequence and a copy
of the same bytes, with FlashInfer's ``RopeQuantizeAppendPagedMLACache``
beside it (its lines from ``fi_bench_bin``).

Shapes (issue 23, as fi_bench.cu's run_mla): DeepSeek-V3 absorbed decode, 128
heads, q_pe [T, 128, 64], q_nope [T, 128, 512], k_pe [T, 64], ckv [T, 512],
bf16 in; q_pe and q_nope out in e4m3, k_pe / ckv appended in e4m3 to
FlashInfer's cache pair (kpe [pages, 64, 64], ckv [pages, 64, 512]), pages of
64, paged indices; T = 1, 64, 256, 1024 decode (context 512) and one 16k
prefill.

* fused: one ``rope_append_mla`` call;
* unfused: ``cuprope.rope_qk_forward`` of q_pe and k_pe, then torch
  quantisation of q_nope and q_pe into the fp8 outputs and of ckv and k_pe
  written by flat slots (``index_copy_``) into the caches;
* copy: ``Tensor.copy_`` of the bytes the op moves (read bf16, write e4m3:
  FlashInfer's own figure).

Each timing: CUDA-graph replay of 50 calls, median of 11 (kvcache_bench's
``graph_us``). ``python benchmarks/mla_bench.py [--csv PATH]`` on a GPU.
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
from cuprope.mla import rope_append_mla  # noqa: E402
from kvcache_bench import flashinfer_lines, graph_us  # noqa: E402

# FlashInfer's harness where ../shared/peers/README.md builds it (or --fi-bin)
FI_DEFAULT = os.path.join(_HERE, "..", "..", "shared", "peers", "fi_bench_bin")

H, R, N, PAGE, CTX = 128, 64, 512, 64, 512
CASES = [("decode", b, 1) for b in (1, 64, 256, 1024)] + [("prefill", 1, 16384)]
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
               "qk_rope_head_dim": 64, "max_position_embeddings": 163840, "rope_theta": 10000,
               "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096}}


def run_case(kind, b, per_req, peers=True):
    """One row: µs of the fused call, a copy of its bytes and (``peers``) the
    unfused sequence."""
    dev, bf, f8 = "cuda", torch.bfloat16, torch.float8_e4m3fn
    ctx = CTX if kind == "decode" else per_req
    t = b * per_req
    pages_per = -(-ctx // PAGE)
    n_pages = b * pages_per
    q_pe, q_nope = torch.randn(t, H, R, device=dev, dtype=bf), torch.randn(t, H, N, device=dev,
                                                                            dtype=bf)
    k_pe, ckv = torch.randn(t, R, device=dev, dtype=bf), torch.randn(t, N, device=dev, dtype=bf)
    q_pe_out, q_nope_out = torch.empty(t, H, R, device=dev, dtype=f8), torch.empty(
        t, H, N, device=dev, dtype=f8)
    kpe_cache = torch.zeros(n_pages, PAGE, R, device=dev, dtype=f8)
    ckv_cache = torch.zeros(n_pages, PAGE, N, device=dev, dtype=f8)
    tok = torch.arange(t, device=dev)
    bi = (tok // per_req).to(torch.int32)
    cp = (ctx - per_req + tok % per_req).to(torch.int32)
    idx = dict(kv_indices=torch.arange(n_pages, device=dev, dtype=torch.int32),
               kv_indptr=torch.arange(b + 1, device=dev, dtype=torch.int32) * pages_per,
               batch_indices=bi, cache_positions=cp)
    slots = bi.long() * pages_per * PAGE + cp.long()
    cfg = cuprope.scaling.rope_config_from_hf(DEEPSEEK_V3)
    cfg_thd = cuprope.RopeConfig(R, inv_freq=cfg.inv_freq, scale=cfg.scale,
                                 interleaved=cfg.interleaved, layout="thd")
    one = torch.ones((), device=dev)
    nbytes = t * (H + 1) * (R + N) * 3
    src = torch.empty(nbytes // 2, device=dev, dtype=torch.uint8)
    dst = torch.empty_like(src)
    row = dict(case=kind, tokens=t, MB=round(nbytes / 2 ** 20, 2))
    row["copy_us"] = graph_us(lambda: dst.copy_(src))
    row["fused_us"] = graph_us(lambda: rope_append_mla(
        q_pe, k_pe, ckv, cfg, cp, ckv_cache=ckv_cache, kpe_cache=kpe_cache, q_nope=q_nope,
        q_nope_out=q_nope_out, q_pe_out=q_pe_out, q_scale=one, kv_scale=one, **idx))
    kflat, cflat = kpe_cache.view(-1, R).view(torch.uint8), ckv_cache.view(-1, N).view(torch.uint8)

    def q8(x, s):
        return (x.float() * (1.0 / s)).clamp(-448, 448).to(f8)

    def unfused():
        qr, kr = cuprope.rope_qk_forward(q_pe, k_pe[:, None], cfg_thd, positions=cp)
        q_pe_out.copy_(q8(qr, one))
        q_nope_out.copy_(q8(q_nope, one))
        kflat.index_copy_(0, slots, q8(kr[:, 0], one).view(torch.uint8))
        cflat.index_copy_(0, slots, q8(ckv, one).view(torch.uint8))
    row["fused_per_copy"] = round(row["copy_us"] / row["fused_us"], 3)
    if peers:
        row["unfused_us"] = graph_us(unfused)
        row["speedup_vs_unfused"] = round(row["unfused_us"] / row["fused_us"], 2)
    row["bytes"] = nbytes
    return row


def flashinfer_mla_rows(lines):
    """{tokens: row} of fi_bench_bin's ``mla_rope_quant_append`` lines."""
    return {r["tokens"]: r for r in lines if r.get("kernel") == "mla_rope_quant_append"}


def run_all(fi_bin=FI_DEFAULT):
    """Every case as a row dict (FlashInfer's figures beside ours where its
    binary is found)."""
    fi = flashinfer_mla_rows(flashinfer_lines(fi_bin))
    rows = []
    for kind, b, per_req in CASES:
        r = run_case(kind, b, per_req)
        f = fi.get(r["tokens"])
        if f:
            r.update(fi_us=f["us"], fi_copy_us=f["copy_us"],
                     fi_over_fused=round(f["us"] / r["fused_us"], 3))
        rows.append(r)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", help="write the rows to this CSV file")
    ap.add_argument("--fi-bin", default=FI_DEFAULT, help="FlashInfer's fi_bench_bin")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}: DeepSeek-V3 MLA, H {H}, R {R}, Dc {N}, bf16 in, "
          f"e4m3 out, pages of {PAGE}")
    print(f"{'case':>8} {'tokens':>6} {'MB':>8} {'copy':>8} {'fused':>8} {'/copy':>6} "
          f"{'unfused':>8} {'x unf':>6} {'FI':>8} {'FI/fused':>8}")
    rows = run_all(args.fi_bin)
    for r in rows:
        fi = (f"{r['fi_us']:8.2f} {r['fi_over_fused']:8.3f}" if "fi_us" in r
              else f"{'-':>8} {'-':>8}")
        print(f"{r['case']:>8} {r['tokens']:>6} {r['MB']:>8} {r['copy_us']:8.2f} "
              f"{r['fused_us']:8.2f} {r['fused_per_copy']:6.3f} {r['unfused_us']:8.2f} "
              f"{r['speedup_vs_unfused']:6.2f} {fi}")
    print("times in µs per call (CUDA-graph replay); FI/fused > 1: FlashInfer slower")
    if args.csv:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        print("wrote", args.csv)


if __name__ == "__main__":
    main()
