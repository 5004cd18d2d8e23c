"""Warp timeline of one large launch, from the phase probe's globaltimer marks
(benchmarks/phase_probe.patch, applied on the device only):

    patch -p1 < benchmarks/phase_probe.patch && python benchmarks/timeline_probe.py mha-d64
    patch -R -p1 < benchmarks/phase_probe.patch

q-only forward, bf16, the suite's shapes (cuprope.bench.SHAPES). Prints the launch's span
from the first warp's start to the last warp's end, how long the GPU takes
to reach its peak count of resident warps (the ramp), how long the count
stays below half of that peak at the end (the tail), and the copy of the same
bytes for scale. globaltimer ticks are coarse (~0.25 us here), so read the
figures to that precision."""
import os
import statistics
import sys

import torch

key = sys.argv[1] if len(sys.argv) > 1 else "mha-d64"
MAX_UNITS = 1 << 20
buf = torch.zeros(10 * MAX_UNITS, dtype=torch.int64, device="cuda")
os.environ["CUPROPE_KERNEL_DEFINES"] = (os.environ.get("CUPROPE_KERNEL_DEFINES", "")
                                        + f" CUPROPE_PHASES={buf.data_ptr()}ull")
import cuprope  # noqa: E402  (the define must be set before the first compile)
from cuprope.bench import SHAPES, time_gpu  # noqa: E402

b, s, h, _, d, r = SHAPES[key]
x = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
cfg = cuprope.RopeConfig(r)
for _ in range(3):
    cuprope.rope_forward(x, cfg, out=y)
t_rope = time_gpu(lambda: cuprope.rope_forward(x, cfg, out=y), reps=20)
src = torch.empty(x.numel() * 2, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
t_copy = time_gpu(lambda: dst.copy_(src), reps=20)
spans, ramps, tails, peaks, lives = [], [], [], [], []
for _ in range(10):
    buf.zero_()
    torch.cuda._sleep(1_000_000)
    cuprope.rope_forward(x, cfg, out=y)
    torch.cuda.synchronize()
    m = buf.view(-1, 10)
    m = m[m[:, 7] != 0].double()
    g0, g1 = m[:, 6] - m[:, 6].min(), m[:, 7] - m[:, 6].min()
    span = float(g1.max())
    edges = torch.arange(0, span + 256, 128, dtype=torch.float64, device=m.device)
    active = ((g0[None, :] <= edges[:, None]) & (g1[None, :] > edges[:, None])).sum(1).double()
    peak = float(active.max())
    ramp = float(edges[int(torch.nonzero(active >= 0.95 * peak)[0])])
    last_half = int(torch.nonzero(active >= 0.5 * peak)[-1])
    tails.append(span - float(edges[last_half]))
    spans.append(span)
    ramps.append(ramp)
    peaks.append(peak)
    lives.append(float((g1 - g0).median()))
print(f"{key} q-only forward bf16 ({b}, {s}, {h}, {d}), {int(m.shape[0])} warps; medians of 10 launches")
print(f"  event time (probe build) {t_rope * 1e6:.2f} us, copy of the same bytes {t_copy * 1e6:.2f} us")
print(f"  warp span (first start to last end) {statistics.median(spans) / 1e3:.2f} us; "
      f"peak resident warps {statistics.median(peaks):.0f}")
print(f"  ramp to 95 % of the peak {statistics.median(ramps) / 1e3:.2f} us; tail below half the "
      f"peak {statistics.median(tails) / 1e3:.2f} us; median warp lifetime "
      f"{statistics.median(lives) / 1e3:.2f} us")
