"""One launch each of cuprope's q-only forward and a copy of the same bytes on
the suite's shapes, for Nsight Compute (the copy is torch's copy kernel):

    ncu -k regex:"rope_kernel|copy" --launch-skip 4 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        python benchmarks/probes/profile_shapes.py mha-d64 [bf16]

Shapes: the suite's (cuprope.cli.bench_cases.SHAPES), q alone."""
import sys

import torch

import cuprope
from cuprope.cli.bench_cases import SHAPES

b, s, h, _, d, r = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "mha-d64"]
dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
    sys.argv[2] if len(sys.argv) > 2 else "bf16"]
x = torch.randn(b, s, h, d, device="cuda", dtype=dt)
y = torch.empty_like(x)
cfg = cuprope.RopeConfig(r)
for _ in range(4):  # warm-up launches (skipped by --launch-skip 4)
    cuprope.rope_forward(x, cfg, out=y)
torch.cuda.synchronize()
cuprope.rope_forward(x, cfg, out=y)
y.copy_(x)
torch.cuda.synchronize()
