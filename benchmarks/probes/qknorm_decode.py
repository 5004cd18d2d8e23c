"""QK-norm + RoPE forward at decode (entry 42): ``rope_qk_norm_forward`` in
place, Qwen3-8B heads (Hq 32, Hk 8, D 128), bf16, per-head RMS with both
weights, T tokens at random positions; µs per call under CUDA-graph replay
(50 calls, median of 11), beside a copy of the same bytes. Runs against
whichever cuprope is on the path (``PYTHONPATH=<old checkout>`` for a before).

    python benchmarks/probes/qknorm_decode.py
"""
import os
import sys

import torch

import cuprope
from cuprope import qknorm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvcache_bench import graph_us  # noqa: E402


def main():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    cfg = cuprope.RopeConfig(128, base=1e6, layout="thd")
    print(f"{torch.cuda.get_device_name()} cuprope at {cuprope.__file__}")
    for t in (1, 8, 64, 256, 1024, 4096):
        q, k = torch.randn(t, 32, 128, **bf), torch.randn(t, 8, 128, **bf)
        qw, kw = torch.rand(128, **bf) + 0.5, torch.rand(128, **bf) + 0.5
        pos = torch.randint(0, 1 << 16, (t,), device="cuda")
        src = torch.empty(t * 40 * 128 * 2, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        us = graph_us(lambda: qknorm.rope_qk_norm_forward(q, k, cfg, positions=pos, q_weight=qw,
                                                          k_weight=kw, inplace=True))
        print(f"T {t:5d}: {us:7.2f} µs  (copy {graph_us(lambda: dst.copy_(src)):6.2f})")


if __name__ == "__main__":
    main()
