"""Host time per call at decode, against one torch eager ``mul_`` timed in
the same loop and process (targets: the plain rotation's rows ≤ 1.3× ``mul_``,
the KV append's, the prologue's and MLA's ≤ 1.5×).

Rows (B 8 tokens, Hq 32, Hk 8, D 128, bf16; per-token positions):
  * torch ``mul_`` on q (one eager op; the reference);
  * ``cuprope.rope_qk_forward`` in place with positions (int32 and int64
    [B, 1]), and with new outputs;
  * ``cuprope.torch.rotary_embedding`` (query/key slices of one qkv tensor,
    fp32 cos_sin_cache);
  * the fused KV-cache append ``cuprope.kvcache.rope_append_kv``: bf16 and
    fp8 (device-scalar scales) caches, flat slots and paged indices;
  * the decode prologue ``cuprope.prologue.qk_norm_rope_append_kv`` (both
    norm weights, paged indices): bf16 cache with q in place, and fp8 cache
    with an fp8 q output (device-scalar scales);
  * DeepSeek MLA's ``cuprope.mla.rope_append_mla`` at T 8 (its own shapes:
    128 heads, R 64, Dc 512, q_nope 512; ``ROW_CASES``): fp8 q_pe / q_nope
    outputs and FlashInfer's fp8 cache pair, paged indices;
  * the general path of the core (stream= given: every call validates);
  * CuPy rows (fp32: CuPy arrays cannot be bf16).
Each row: µs per call, the median of ``--blocks`` blocks of ``--calls`` calls
(one synchronize per block), rows interleaved block by block so every row
sees the same host state; then the ratio to ``mul_``. A cProfile of the
torch in-place call and a few fast-path steps timed alone follow; the table
comes last. ``benchmarks/bench_suite.py --only host`` times the same rows
(``decode_rows``, ``measure``) into the suite's CSV; this script adds the
profile and the single steps.

    python3 benchmarks/host_overhead.py
"""
import argparse
import cProfile
import pstats
import statistics
import time

import torch

import cuprope
import cuprope.torch as ctorch
from cuprope import kvcache
from cuprope.mla import rope_append_mla
from cuprope.prologue import qk_norm_rope_append_kv

# The case of every row: decode_rows' shapes, but where ROW_CASES names another.
CASE = "B 8 Hq 32 Hk 8 D 128"
MLA_ROW = "rope_append_mla fp8, DeepSeek-V3 (fp8 q_nope/q_pe out, cache pair, paged)"
ROW_CASES = {MLA_ROW: "T 8 H 128 R 64 Dc 512"}


def block_us(fn, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def measure(rows, calls, blocks):
    """{name: [µs per call of each block]}, the rows interleaved block by block."""
    for _, fn in rows:
        for _ in range(3):
            fn()  # compile, plan, register the fast path
    out = {name: [] for name, _ in rows}
    for _ in range(blocks):
        for name, fn in rows:
            out[name].append(block_us(fn, calls))
    return out


def decode_rows(b=8, hq=32, hk=8, d=128, pages=64, ps=16, dev="cuda"):
    """[(name, call)]: the first the reference (torch ``mul_``); ``dev``
    "cpu" builds the same calls on host tensors (``--dry-cpu``)."""
    bf = torch.bfloat16
    cfg = cuprope.RopeConfig(d, base=500000.0)
    cfg_thd = cuprope.RopeConfig(d, base=500000.0, layout="thd")
    q = torch.randn(b, 1, hq, d, device=dev, dtype=bf)
    k = torch.randn(b, 1, hk, d, device=dev, dtype=bf)
    pos32 = torch.randint(0, 4096, (b,), device=dev, dtype=torch.int32)
    pos64 = pos32.to(torch.int64).view(b, 1)
    # serving layout: query/key/value slices of one qkv tensor
    qkv = torch.randn(b, (hq + 2 * hk) * d, device=dev, dtype=bf)
    query, key = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d]
    tq, tk, tv = (qkv[:, :hq * d].view(b, hq, d), qkv[:, hq * d:(hq + hk) * d].view(b, hk, d),
                  qkv[:, (hq + hk) * d:].view(b, hk, d))
    ang = torch.arange(4096, device=dev, dtype=torch.float64)[:, None] * \
        500000.0 ** (-torch.arange(d // 2, device=dev, dtype=torch.float64) / (d // 2))
    cos_sin = torch.cat([ang.cos(), ang.sin()], -1).float()
    caches = {}
    for name, dt in (("bf16", bf), ("fp8", torch.float8_e4m3fn)):
        caches[name] = {"k_cache": torch.zeros(pages, ps, hk, d, device=dev, dtype=dt),
                        "v_cache": torch.zeros(pages, ps, hk, d, device=dev, dtype=dt)}
    scales = {"k_scale": torch.tensor(0.05, device=dev), "v_scale": torch.tensor(0.05, device=dev)}
    slots = {"slot_mapping": torch.randperm(pages * ps, device=dev)[:b]}
    paged = {"kv_indices": torch.randperm(pages, device=dev, dtype=torch.int32),
             "kv_indptr": torch.arange(0, b + 1, device=dev, dtype=torch.int32) * (pages // b),
             "batch_indices": torch.arange(b, device=dev, dtype=torch.int32),
             "cache_positions": torch.randint(0, ps, (b,), device=dev, dtype=torch.int32)}
    stream = torch.cuda.current_stream() if dev == "cuda" else None
    pos32c = pos32.view(-1, 1)  # the core's [B, S] positions of q [B, 1, H, D]

    def append(cache, addr, extra=None):
        kw = {**caches[cache], **addr, **(extra or {})}
        return lambda: kvcache.rope_append_kv(tq, tk, tv, cfg_thd, pos32, **kw)

    weights = dict(q_weight=torch.rand(d, device=dev, dtype=bf) + 0.5,
                   k_weight=torch.rand(d, device=dev, dtype=bf) + 0.5, eps=1e-6)
    q8 = {"q_out": torch.empty(b, hq, d, device=dev, dtype=torch.float8_e4m3fn),
          "q_scale": torch.tensor(0.05, device=dev)}

    def prologue(cache, extra=None):
        kw = {**caches[cache], **paged, **weights, **(extra or {})}
        return lambda: qk_norm_rope_append_kv(tq, tk, tv, cfg_thd, pos32, **kw)

    return [
        ("torch mul_ (one eager op)", lambda: q.mul_(1.0)),
        ("rope_qk_forward in place, positions int32 [B,1]",
         lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos32c, inplace=True)),
        ("rope_qk_forward in place, positions int64 [B,1]",
         lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos64, inplace=True)),
        ("rope_qk_forward, new outputs",
         lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos32c)),
        ("cuprope.torch.rotary_embedding (qkv slices)",
         lambda: ctorch.rotary_embedding(pos32, query, key, d, cos_sin, True)),
        ("kv append bf16, flat slots", append("bf16", slots)),
        ("kv append bf16, paged", append("bf16", paged)),
        ("kv append fp8 (device scales), flat slots", append("fp8", slots, scales)),
        ("kv append fp8 (device scales), paged", append("fp8", paged, scales)),
        ("prologue bf16, paged", prologue("bf16")),
        ("prologue fp8 (device scales, fp8 q out), paged", prologue("fp8", {**scales, **q8})),
        (MLA_ROW, mla_row(b, dev=dev)),
    ] + ([("rope_qk_forward general path (stream=)",
           lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos32c, inplace=True,
                                           stream=stream))] if stream is not None else [])


def mla_row(t, h=128, r=64, n=512, page=64, ctx=512, dev="cuda"):
    """DeepSeek-V3's absorbed decode step as mla_bench times it: T tokens,
    one per sequence at context ``ctx``; returns the call."""
    from mla_bench import DEEPSEEK_V3
    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    cfg = cuprope.scaling.rope_config_from_hf(DEEPSEEK_V3)
    pages_per = -(-ctx // page)
    q_pe, q_nope = (torch.randn(t, h, w, device=dev, dtype=bf) for w in (r, n))
    k_pe, ckv = (torch.randn(t, w, device=dev, dtype=bf) for w in (r, n))
    pos = torch.full((t,), ctx - 1, device=dev, dtype=torch.int64)
    kw = dict(kpe_cache=torch.zeros(t * pages_per, page, r, device=dev, dtype=f8),
              ckv_cache=torch.zeros(t * pages_per, page, n, device=dev, dtype=f8),
              kv_indices=torch.arange(t * pages_per, device=dev, dtype=torch.int32),
              kv_indptr=torch.arange(t + 1, device=dev, dtype=torch.int32) * pages_per,
              batch_indices=torch.arange(t, device=dev, dtype=torch.int32),
              cache_positions=torch.full((t,), ctx - 1, device=dev, dtype=torch.int32),
              q_nope=q_nope, q_nope_out=torch.empty(t, h, n, device=dev, dtype=f8),
              q_pe_out=torch.empty(t, h, r, device=dev, dtype=f8),
              q_scale=torch.tensor(0.05, device=dev), kv_scale=torch.tensor(0.05, device=dev))
    return lambda: rope_append_mla(q_pe, k_pe, ckv, cfg, pos, **kw)


def cupy_rows(b=8, hq=32, hk=8, d=128):
    import cupy
    cfg = cuprope.RopeConfig(d)
    cq = cupy.random.standard_normal((b, 1, hq, d), dtype=cupy.float32)
    ck = cupy.random.standard_normal((b, 1, hk, d), dtype=cupy.float32)
    cpos = cupy.arange(b, dtype=cupy.int32).reshape(b, 1)
    return [("cupy rope_qk_forward in place (fp32)",
             lambda: cuprope.rope_qk_forward(cq, ck, cfg, positions=cpos, inplace=True))]


def step_rows():
    """Single steps of the torch fast path, timed alone (µs per call)."""
    import cupy
    from cuprope._core import fastpath
    q = torch.randn(8, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    fw = fastpath.fast_adapter("torch")
    steps = [
        ("q.data_ptr()", q.data_ptr),
        ("q.get_device()", q.get_device),
        ("q.device", lambda: q.device),
        ("signature of one tensor (collect)", lambda: fw.collect((q,), [], [])),
        ("cupy.cuda.runtime.getDevice()", cupy.cuda.runtime.getDevice),
        ("torch._C._cuda_getDevice()", torch._C._cuda_getDevice),
        ("torch.cuda.current_device()", torch.cuda.current_device),
        ("torch._C._cuda_getCurrentRawStream(0)", lambda: fw.stream(0)),
        ("torch.cuda.current_stream().cuda_stream",
         lambda: torch.cuda.current_stream().cuda_stream),
        ("torch.compiler.is_compiling()", torch.compiler.is_compiling),
    ]
    out = []
    for name, fn in steps:
        n = 20000
        best = min(_loop_us(fn, n) for _ in range(5))
        out.append((name, best))
    return out


def _loop_us(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per block")
    ap.add_argument("--blocks", type=int, default=9, help="blocks per row (median)")
    ap.add_argument("--no-cupy", action="store_true")
    ap.add_argument("--dry-cpu", action="store_true",
                    help="no GPU: build every row on host tensors and call it once (the NumPy "
                         "backend validates the arguments); no timing")
    a = ap.parse_args()
    if a.dry_cpu:
        for name, fn in decode_rows(dev="cpu"):
            fn()
            print(f"ran once on the host: {name}")
        return
    rows = decode_rows()
    if not a.no_cupy:
        rows += cupy_rows()
    res = measure(rows, a.calls, a.blocks)
    # where the time goes: the torch in-place call under cProfile
    fn = rows[1][1]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    print("---- cProfile, rope_qk_forward in place with positions (fast path)")
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
    print("---- single steps, µs per call")
    for name, us in step_rows():
        print(f"  {name:<45} {us:6.3f}")
    ref = statistics.median(res[rows[0][0]])
    table = []
    for name, _ in rows:
        med = statistics.median(res[name])
        table.append((name, med, min(res[name]), max(res[name]), med / ref))
    print(f"---- host time per call ({CASE}, bf16, but where named), median of {a.blocks} "
          f"blocks of {a.calls}; targets ≤ 1.3× mul_ (plain rotation), ≤ 1.5× (KV append, "
          f"prologue, MLA)")
    print(f"{'row':<74} {'µs/call':>8} {'min':>7} {'max':>7} {'× mul_':>7}")
    for name, med, lo, hi, r in table:
        label = name + (f" [{ROW_CASES[name]}]" if name in ROW_CASES else "")
        print(f"{label:<74} {med:8.2f} {lo:7.2f} {hi:7.2f} {r:7.2f}")


if __name__ == "__main__":
    main()
