"""One launch each of cuprope's q-only forward and a copy of the same bytes on
the suite's shapes, for Nsight Compute (the copy is torch's copy kernel):

    ncu -k regex:"rope_kernel|copy" --launch-skip 4 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        python benchmarks/profile_shapes.py d64 [bf16]

Shapes as in benchmarks/size_sweep.py: llama, d64, d256."""
import sys

import torch

import cuprope

SHAPES = {"llama": (4, 4096, 32, 128), "d64": (8, 2048, 16, 64), "d256": (2, 4096, 16, 256)}
b, s, h, d = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "d64"]
dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
    sys.argv[2] if len(sys.argv) > 2 else "bf16"]
x = torch.randn(b, s, h, d, device="cuda", dtype=dt)
y = torch.empty_like(x)
cfg = cuprope.RopeConfig(d)
for _ in range(4):  # warm-up launches (skipped by --launch-skip 4)
    cuprope.rope_forward(x, cfg, out=y)
torch.cuda.synchronize()
cuprope.rope_forward(x, cfg, out=y)
y.copy_(x)
torch.cuda.synchronize()
