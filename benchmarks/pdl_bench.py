"""Programmatic dependent launch (``enable_pdl``) at decode: what it saves
behind the GEMM that writes q and k, under CUDA-graph replay.

A chain of L layers, each [``torch.matmul`` writing the layer's q, k (and v)
-> one cuprope decode op on them], is captured three times: the op launched
with ``enable_pdl=True``, without it, and the matmuls alone. Each graph is
replayed many times, the three interleaved round by round, timed with CUDA
events; a row gives the median µs per layer of each, and what the op adds to
the matmul with and without PDL.

Ops (``OPS``), Llama-3-8B heads (Hq 32, Hk 8, D 128, bf16) for all but MLA:

* ``rope_qk_forward in place``: ``cuprope.rope_qk_forward(q, k, ..., inplace=True)``;
* ``rotary_embedding``: ``cuprope.torch.rotary_embedding`` with a float32
  ``[4096, 128]`` cos/sin cache;
* ``rope_append_kv fp8 paged``: q into an fp8 q_out, k and v into an fp8
  paged cache (FlashInfer's paged indices);
* ``qk_norm_rope_append_kv fp8 paged``: the decode prologue, same outputs;
* ``rope_append_mla fp8``: DeepSeek-V3 MLA (H 128, rope 64, kv_lora 512):
  the matmul writes q_pe, k_pe and ckv; q_nope (absorbed) is a fixed
  buffer; fp8 q outputs and latent cache.

The matmul: x ``[B, hidden]`` times a bf16 weight ``[hidden, N]`` (N the
widths the op reads), into the layer's own output buffer; positions int32
below 4096, every sequence at a 2048-token context.

    python benchmarks/pdl_bench.py [--batches 1,64] [--layers 32] [--hidden 512]
                                   [--replays 31] [--ops NAME,...] [--csv PATH]

``benchmarks/bench_suite.py --only pdl`` writes the same rows into the suite's
CSV (family ``pdl``).
"""
import argparse
import csv
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cuprope  # noqa: E402

HQ, HK, D = 32, 8, 128
MLA_H, MLA_R, MLA_NOPE, MLA_DC, MLA_PAGE = 128, 64, 512, 512, 64
PAGE, CTX, MAXPOS = 16, 2048, 4096
BATCHES = (1, 64)
LAYERS = 32
DEVICE = "cuda"
OPS = ("rope_qk_forward in place", "rotary_embedding", "rope_append_kv fp8 paged",
       "qk_norm_rope_append_kv fp8 paged", "rope_append_mla fp8")
COLUMNS = ("op", "B", "layers", "hidden", "matmul_us", "plain_us", "pdl_us", "op_plain_us",
           "op_pdl_us", "saved_us")


def _paged(b, dev):
    """FlashInfer's paged indices: sequence i owns pages [i·P, (i+1)·P), its
    one new token at position CTX - 1."""
    per = -(-CTX // PAGE)
    i32 = torch.int32
    return dict(kv_indices=torch.arange(b * per, device=dev, dtype=i32),
                kv_indptr=torch.arange(b + 1, device=dev, dtype=i32) * per,
                batch_indices=torch.arange(b, device=dev, dtype=i32),
                cache_positions=torch.full((b,), CTX - 1, device=dev, dtype=i32)), b * per


def build(op, b, hidden, layers, g):
    """(x, w, [per-layer state], call(state, pdl)) of one op at batch ``b``."""
    dev, bf16, fp8 = DEVICE, torch.bfloat16, torch.float8_e4m3fn
    pos = torch.randint(0, MAXPOS, (b,), device=dev, dtype=torch.int32, generator=g)
    cfg = cuprope.RopeConfig(D, base=500000.0, layout="thd")
    if op == "rope_append_mla fp8":
        n = MLA_H * MLA_R + MLA_DC + MLA_R
    else:
        n = (HQ + 2 * HK) * D
    x = torch.randn(b, hidden, device=dev, dtype=bf16, generator=g)
    w = torch.randn(hidden, n, device=dev, dtype=bf16, generator=g) * hidden ** -0.5
    states = [{"qkv": torch.empty(b, n, device=dev, dtype=bf16)} for _ in range(layers)]

    def qkv(s):
        t = s["qkv"]
        return (t[:, :HQ * D].view(b, HQ, D), t[:, HQ * D:(HQ + HK) * D].view(b, HK, D),
                t[:, (HQ + HK) * D:].view(b, HK, D))

    if op == "rope_qk_forward in place":
        def call(s, pdl):
            q, k, _ = qkv(s)
            cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True, enable_pdl=pdl)
    elif op == "rotary_embedding":
        import cuprope.torch as ctorch
        from cuprope.kvcache.cos_sin_cache import build_cos_sin_cache
        table = build_cos_sin_cache(cfg, MAXPOS, like=x)

        def call(s, pdl):
            t = s["qkv"]
            ctorch.rotary_embedding(pos, t[:, :HQ * D], t[:, HQ * D:(HQ + HK) * D], D, table,
                                    True, enable_pdl=pdl)
    elif op in ("rope_append_kv fp8 paged", "qk_norm_rope_append_kv fp8 paged"):
        idx, pages = _paged(b, dev)
        cpos = idx["cache_positions"]
        cache = torch.zeros(pages, 2, PAGE, HK, D, device=dev, dtype=fp8)
        scales = {n: torch.tensor(v, device=dev) for n, v in
                  (("q_scale", 0.05), ("k_scale", 0.07), ("v_scale", 0.11))}
        for s in states:
            s["q_out"] = torch.empty(b, HQ, D, device=dev, dtype=fp8)
        kw = dict(kv_cache=cache, **idx, **scales)
        if op.startswith("rope_append_kv"):
            from cuprope.kvcache import rope_append_kv

            def call(s, pdl):
                q, k, v = qkv(s)
                rope_append_kv(q, k, v, cfg, cpos, q_out=s["q_out"], enable_pdl=pdl, **kw)
        else:
            from cuprope.prologue import qk_norm_rope_append_kv
            qw, kw_ = (torch.rand(D, device=dev, dtype=bf16, generator=g) + 0.5 for _ in range(2))

            def call(s, pdl):
                q, k, v = qkv(s)
                qk_norm_rope_append_kv(q, k, v, cfg, cpos, q_weight=qw, k_weight=kw_,
                                       q_out=s["q_out"], enable_pdl=pdl, **kw)
    elif op == "rope_append_mla fp8":
        from cuprope.mla import rope_append_mla
        mcfg = cuprope.RopeConfig(MLA_R, interleaved=True)
        pages = b * -(-CTX // MLA_PAGE)
        cache = torch.zeros(pages, MLA_PAGE, MLA_DC + MLA_R, device=dev, dtype=fp8)
        slots = (torch.arange(b, device=dev) * -(-CTX // MLA_PAGE) * MLA_PAGE + CTX - 1)
        q_nope = torch.randn(b, MLA_H, MLA_NOPE, device=dev, dtype=bf16, generator=g)
        qs, ks = torch.tensor(0.05, device=dev), torch.tensor(0.03, device=dev)
        for s in states:
            s["q_out"] = torch.empty(b, MLA_H, MLA_NOPE + MLA_R, device=dev, dtype=fp8)

        def call(s, pdl):
            t, qo = s["qkv"], s["q_out"]
            q_pe = t[:, :MLA_H * MLA_R].view(b, MLA_H, MLA_R)
            ckv = t[:, MLA_H * MLA_R:MLA_H * MLA_R + MLA_DC]
            k_pe = t[:, MLA_H * MLA_R + MLA_DC:]
            rope_append_mla(q_pe, k_pe, ckv, mcfg, pos, kv_cache=cache, slot_mapping=slots,
                            q_nope=q_nope, q_nope_out=qo[..., :MLA_NOPE],
                            q_pe_out=qo[..., MLA_NOPE:], q_scale=qs, kv_scale=ks,
                            enable_pdl=pdl)
    else:
        raise KeyError(f"unknown op {op!r}; one of {OPS}")
    return x, w, states, call


def capture(layer, states):
    """A CUDA graph of ``layer(state)`` for every layer's state, after a
    warm-up on a side stream (compiles, tables, plans)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for s in states:
                layer(s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s in states:
            layer(s)
    return graph


def time_graphs(graphs, replays):
    """{name: median µs of one replay}, the graphs replayed in turn each round."""
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    times = {n: [] for n in graphs}
    for _ in range(replays):
        for n, g in graphs.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            torch.cuda.synchronize()
            times[n].append(a.elapsed_time(b) * 1e3)
    return {n: statistics.median(v) for n, v in times.items()}


def measure(ops=OPS, batches=BATCHES, layers=LAYERS, hidden=512, replays=31):
    """One row per (op, B): µs per layer of the matmul chain alone
    (``matmul_us``), with the op launched plainly (``plain_us``) and with
    enable_pdl (``pdl_us``); ``op_*_us``: the op's share (the chain minus the
    matmuls), ``saved_us``: plain minus pdl."""
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    rows = []
    for op in ops:
        for b in batches:
            x, w, states, call = build(op, b, hidden, layers, g)

            def mm(s):
                torch.matmul(x, w, out=s["qkv"])

            graphs = {"matmul": capture(mm, states),
                      "plain": capture(lambda s: (mm(s), call(s, False)), states),
                      "pdl": capture(lambda s: (mm(s), call(s, True)), states)}
            t = {n: v / layers for n, v in time_graphs(graphs, replays).items()}
            rows.append(dict(op=op, B=b, layers=layers, hidden=hidden, matmul_us=t["matmul"],
                             plain_us=t["plain"], pdl_us=t["pdl"],
                             op_plain_us=t["plain"] - t["matmul"],
                             op_pdl_us=t["pdl"] - t["matmul"], saved_us=t["plain"] - t["pdl"]))
            del graphs
            torch.cuda.synchronize()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--hidden", type=int, default=512, help="the matmul's inner dim")
    ap.add_argument("--replays", type=int, default=31, help="timed replays of each graph")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated, of: " + ", ".join(OPS))
    ap.add_argument("--csv", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        sys.exit(f"pdl_bench: unknown ops {bad}; choose from {', '.join(OPS)}")
    rows = measure(ops, tuple(int(b) for b in args.batches.split(",")), args.layers,
                   args.hidden, args.replays)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=COLUMNS)
            wr.writeheader()
            wr.writerows(rows)
    print(f"{torch.cuda.get_device_name()}: µs per layer of [matmul -> op], CUDA-graph replay of "
          f"{args.layers} layers, median of {args.replays}; hidden {args.hidden}")
    print(f"{'op':34s} {'B':>4s} {'matmul':>8s} {'plain':>8s} {'pdl':>8s} {'op plain':>9s} "
          f"{'op pdl':>8s} {'saved':>7s} {'plain/pdl':>9s}")
    for r in rows:
        print(f"{r['op']:34s} {r['B']:4d} {r['matmul_us']:8.2f} {r['plain_us']:8.2f} "
              f"{r['pdl_us']:8.2f} {r['op_plain_us']:9.2f} {r['op_pdl_us']:8.2f} "
              f"{r['saved_us']:7.2f} {r['plain_us'] / r['pdl_us']:9.3f}")


if __name__ == "__main__":
    main()
