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

A measuring module: ``benchmarks/bench_suite.py --only decode`` runs it and
writes the rows.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cuprope  # noqa: E402
from cuprope.cos_sin_cache import rotary_embedding  # noqa: E402
from kvcache_bench import graph_us  # noqa: E402

HQ, HK, D, MAXPOS = 32, 8, 128, 4096
BATCHES = (1, 64, 256, 512, 1024)


def flashinfer_decode(lines):
    """{B: line} of fi_bench_bin's S = 1 bf16 lines (``kvcache_bench.flashinfer_lines``;
    ``cache_inplace_us``: the in-place cos/sin-cache kernel)."""
    return {r["B"]: r for r in lines
            if r.get("impl") == "flashinfer" and r.get("S") == 1 and r.get("dtype") == "bf16"}


def measure(batches=BATCHES):
    """[{B, copy_us, core_us, core_table_us, csc_us}] per batch (µs per call,
    CUDA-graph replay); ``bytes``: q and k read and written."""
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    cfg = cuprope.RopeConfig(D, base=500000.0, layout="bshd")
    cfg_tab = cuprope.RopeConfig(D, base=500000.0, layout="bshd").cache_angles(MAXPOS)
    csc = torch.randn(MAXPOS, D, device="cuda", generator=g)
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
        rows.append(r)
    return rows
