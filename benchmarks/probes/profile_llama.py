"""One launch each of cuprope's fused q/k forward and torch.compile's kernel for
the HF formula on the Llama-3-8B prefill shape, for Nsight Compute:

    ncu --kernel-name regex:"rope_kernel|triton" --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python benchmarks/probes/profile_llama.py [bf16|fp16|fp32]
"""
import sys

import torch

import cuprope
from cuprope.cli.bench_cases import cos_sin_tables, hf_rope

dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
    sys.argv[1] if len(sys.argv) > 1 else "bf16"]
q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=dt)
k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=dt)
out = (torch.empty_like(q), torch.empty_like(k))
cfg = cuprope.RopeConfig(128)
cos, sin = cos_sin_tables(4096, 128, 10000.0, dt, "cuda")
compiled = torch.compile(hf_rope, dynamic=False)
for _ in range(3):  # the third of each is the one profiled (--launch-skip 2)
    cuprope.rope_qk_forward(q, k, cfg, out=out)
for _ in range(3):
    compiled(q, k, cos, sin)
torch.cuda.synchronize()
