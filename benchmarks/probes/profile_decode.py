"""Decode launches for Nsight Compute: cuprope's fused q/k (B 1, Hq 32, Hk 8,
D 128, bf16, in place, int32 positions) next to one tiny torch kernel, so the
kernel durations (not the launch gaps) can be compared:

    ncu --metrics gpu__time_duration.sum --launch-skip 4 python benchmarks/probes/profile_decode.py
"""
import torch

import cuprope

q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
pos = torch.full((1, 1), 1234, device="cuda", dtype=torch.int32)
cfg = cuprope.RopeConfig(128)
for _ in range(5):
    cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
    q.add_(0)
torch.cuda.synchronize()
