"""Where the fused QK-norm + RoPE's autograd step (forward + backward, the
suite's ``fwd+bwd autograd`` row) spends its time: GPU time with the suite's
head start (a 1M-cycle GPU sleep before the start event) and with a 20M-cycle
one, the host's wall time per step (no sync inside the loop), and torch's
profiler over a few steps (host ops by CPU time, kernels by GPU time).
Qwen3-8B prefill shape, bf16. ``python benchmarks/probes/qknorm_autograd_host.py``."""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cuprope  # noqa: E402
import cuprope.torch as ctorch  # noqa: E402
from cuprope.cli.bench_cases import time_gpu  # noqa: E402

b, s, hq, hk, d = 4, 4096, 32, 8, 128
dt = torch.bfloat16
mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=dt)  # noqa: E731
q, k = mk(hq).requires_grad_(), mk(hk).requires_grad_()
gq, gk = mk(hq), mk(hk)
wq = (1 + 0.1 * torch.randn(d, device="cuda")).to(dt).requires_grad_()
wk = (1 + 0.1 * torch.randn(d, device="cuda")).to(dt).requires_grad_()
cfg = cuprope.RopeConfig(d, base=1e6)


def step():
    a, c = ctorch.rope_qk_norm(q, k, cfg, q_weight=wq, k_weight=wk, eps=1e-6)
    torch.autograd.backward((a, c), (gq, gk))


def fwd_only():
    with torch.no_grad():
        ctorch.rope_qk_norm(q, k, cfg, q_weight=wq, k_weight=wk, eps=1e-6)


for _ in range(5):
    step()
torch.cuda.synchronize()
for name, fn in (("step", step), ("forward (no grad)", fwd_only)):
    for cyc in (1_000_000, 20_000_000):
        print(f"{name}: GPU µs, head start {cyc:>10} cycles: "
              f"{time_gpu(fn, reps=20, warm=3, sleep_cycles=cyc) * 1e6:8.1f}")
    torch.cuda.synchronize()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"{name}: host µs per step (no sync) {(t1 - t0) / n * 1e6:8.1f}; "
          f"with the drain {(t2 - t0) / n * 1e6:8.1f}")
from torch.profiler import ProfilerActivity, profile  # noqa: E402
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=18))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10))
