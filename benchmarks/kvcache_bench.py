"""Fused RoPE + KV-cache append (cuprope.kvcache) against the unfused sequence
and a copy of the fewest bytes, with FlashInfer's fused kernel beside it.

Shapes (issue #16): decode B = 1, 64, 256, 1024 (one token per sequence at
context 512) and one 16k-token prefill; Hq 32, Hk 8, D 128, bf16 in, NHD pages
of 16, FlashInfer's paged indices. Modes: ``bf16`` (bf16 cache, q rotated in
place), ``fp8kv`` (e4m3 k/v cache, q in place), ``fp8qkv`` (q out in e4m3
too: the work FlashInfer's ``RopeQuantizeAppendPagedKVCache`` does).

* fused: one ``rope_append_kv`` call;
* unfused: ``cuprope.rope_qk_forward`` in place, then torch writes of k and v
  into the cache by precomputed flat slots (``index_copy_``), with the fp8
  quantisation as torch ops where the mode has it;
* copy: ``cudaMemcpyAsync`` (``Tensor.copy_``) of the fewest bytes the fused
  op moves (q, k, v read; q, k, v written in their output dtypes);
* FlashInfer: ``fi_bench_bin`` (built from ``../shared/peers/fi_bench.cu``,
  see its README) run in its own process, its figures beside its own copy.

Each timing: CUDA-graph replay of 50 calls, median of 11 replays, per call
(as ``../shared/peers/side_by_side.py``). A measuring module:
``benchmarks/bench_suite.py --only kv`` runs it and writes the rows.
"""
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cuprope  # noqa: E402
from cuprope import kvcache  # noqa: E402

HQ, HK, D, PAGE, CTX = 32, 8, 128, 16, 512
CASES = [("decode", b, 1) for b in (1, 64, 256, 1024)] + [("prefill", 1, 16384)]
MODES = ("bf16", "fp8kv", "fp8qkv")



def graph_us(fn, n=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(11):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / n)
    return sorted(ts)[len(ts) // 2]


def setup(kind, b, per_req):
    """Tensors of one case: FlashInfer's layout (sequence b owns pages
    [b·P, (b+1)·P), its tokens at the end of its context)."""
    dev = "cuda"
    ctx = CTX if kind == "decode" else per_req
    t = b * per_req
    pages_per = -(-ctx // PAGE)
    x = {n: torch.randn(t, h, D, device=dev, dtype=torch.bfloat16)
         for n, h in (("q", HQ), ("k", HK), ("v", HK))}
    tok = torch.arange(t, device=dev)
    bi = (tok // per_req).to(torch.int32)
    cp = (ctx - per_req + tok % per_req).to(torch.int32)
    idx = dict(kv_indices=torch.arange(b * pages_per, device=dev, dtype=torch.int32),
               kv_indptr=(torch.arange(b + 1, device=dev, dtype=torch.int32) * pages_per),
               batch_indices=bi, cache_positions=cp)
    slots = (bi.long() * pages_per * PAGE + cp.long())
    return x, cp, idx, slots, b * pages_per


def run_case(kind, b, per_req, mode):
    x, pos, idx, slots, n_pages = setup(kind, b, per_req)
    ctx = CTX if kind == "decode" else per_req
    t = x["q"].shape[0]
    fp8_kv = mode != "bf16"
    cdt = torch.float8_e4m3fn if fp8_kv else torch.bfloat16
    kc = torch.zeros(n_pages, PAGE, HK, D, device="cuda", dtype=cdt)
    vc = torch.zeros_like(kc)
    cfg = cuprope.RopeConfig(D, base=500000.0)
    cfg_thd = cuprope.RopeConfig(D, base=500000.0, layout="thd")
    one = torch.ones((), device="cuda")
    kw = dict(k_cache=kc, v_cache=vc, **idx)
    if fp8_kv:
        kw.update(k_scale=one, v_scale=one)
    if mode == "fp8qkv":
        kw.update(q_out=torch.empty(t, HQ, D, device="cuda", dtype=torch.float8_e4m3fn),
                  q_scale=one)
    q_bytes = 1 if mode == "fp8qkv" else 2
    c_bytes = 1 if fp8_kv else 2
    nbytes = t * D * ((HQ + 2 * HK) * 2 + HQ * q_bytes + 2 * HK * c_bytes)
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    row = dict(case=kind, B=b, tokens=t, mode=mode, MB=round(nbytes / 2 ** 20, 2), bytes=nbytes)
    row["copy_us"] = graph_us(lambda: dst.copy_(src))
    row["fused_us"] = graph_us(lambda: kvcache.rope_append_kv(x["q"], x["k"], x["v"], cfg, pos,
                                                              **kw))
    # the same call with RopeConfig.cache_angles (positions < ctx read a float32 table)
    cfg_tab = cuprope.RopeConfig(D, base=500000.0).cache_angles(ctx)
    row["table_us"] = graph_us(lambda: kvcache.rope_append_kv(x["q"], x["k"], x["v"], cfg_tab,
                                                              pos, **kw))
    kflat, vflat = kc.view(-1, HK, D), vc.view(-1, HK, D)
    qo = kw.get("q_out")

    def unfused():
        cuprope.rope_qk_forward(x["q"], x["k"], cfg_thd, positions=pos, inplace=True)
        if qo is not None:
            qo.copy_((x["q"].float() * (1.0 / one)).clamp(-448, 448).to(torch.float8_e4m3fn))
        for src_, flat, sc in ((x["k"], kflat, one), (x["v"], vflat, one)):
            if fp8_kv:  # (index_copy_ on the bytes: no fp8 kernels needed)
                val = (src_.float() * (1.0 / sc)).clamp(-448, 448).to(cdt)
                flat.view(torch.uint8).index_copy_(0, slots, val.view(torch.uint8))
            else:
                flat.index_copy_(0, slots, src_)
    row["unfused_us"] = graph_us(unfused)
    row["fused_per_copy"] = round(row["copy_us"] / row["fused_us"], 3)
    row["speedup_vs_unfused"] = round(row["unfused_us"] / row["fused_us"], 2)
    return row


def flashinfer_lines(path):
    """The JSON lines fi_bench_bin prints (one per case), or [] without the binary."""
    if not path or not os.path.exists(path):
        return []
    res = subprocess.run([path], capture_output=True, text=True, timeout=300)
    if res.returncode:
        raise RuntimeError(f"{path} exited with {res.returncode}: {res.stderr[-300:]}")
    out = res.stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def flashinfer_rows(lines):
    """{tokens: line} of fi_bench_bin's fused RoPE + fp8 + paged-append lines
    (``flashinfer_lines``)."""
    return {r["tokens"]: r for r in lines
            if r.get("impl") == "flashinfer_rope_fp8_paged_append"}
