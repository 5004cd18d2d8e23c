"""Where the decode kernel's time goes, phase by phase, from clock64() marks
inside the kernel (benchmarks/phase_probe.patch; applied on the device only,
never committed into the kernel):

    patch -p1 < benchmarks/phase_probe.patch && python benchmarks/phase_probe.py [--twice]
    patch -R -p1 < benchmarks/phase_probe.patch

(tests/test_kernel_compile.py checks that the patch still applies and compiles.)

Marks per warp (SM cycles since the warp's first instruction): 0 indices
decoded, 1 position, first frequency and ring loads issued, 2 cos/sin in
shared memory (position load + trig), 3 first head landed, 4 last store
issued; plus the warp's globaltimer span. Decode B 1: Hq 32, Hk 8, D 128, bf16, in place, int32
positions, replayed in a CUDA graph."""
import os
import statistics
import sys

import torch

buf = torch.zeros(10 * 64, dtype=torch.int64, device="cuda")
os.environ["CUPROPE_KERNEL_DEFINES"] = (os.environ.get("CUPROPE_KERNEL_DEFINES", "")
                                        + f" CUPROPE_PHASES={buf.data_ptr()}ull")
TWICE = "--twice" in sys.argv  # two launches per graph: the marks are the second's
import cuprope  # noqa: E402  (the define must be set before the first compile)

q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
pos = torch.full((1, 1), 1234, device="cuda", dtype=torch.int32)
cfg = cuprope.RopeConfig(128)
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    for _ in range(3):
        cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(2 if TWICE else 1):
        cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
samples = []
for _ in range(200):
    buf.zero_()
    g.replay()
    torch.cuda.synchronize()
    samples.append(buf.view(-1, 10)[:10].cpu())
marks = torch.stack(samples).double()  # [rep, warp, 10]
names = ["indices", "loads issued", "cos/sin", "1st landed", "stores issued", "", "", "", "", "end"]
print(os.environ["CUPROPE_KERNEL_DEFINES"].split(" CUPROPE_PHASES")[0] or "default",
      "(second of two launches)" if TWICE else "")
print("decode B1 phases, median over 200 replays x 10 warps (SM cycles since the warp started)")
for i in (0, 1, 2, 3, 4, 9):
    v = marks[:, :, i].flatten().tolist()
    print(f"  {names[i]:14s} {statistics.median(v):8.0f}  (p10 {sorted(v)[len(v)//10]:.0f}, "
          f"p90 {sorted(v)[9*len(v)//10]:.0f})")
span = (marks[:, :, 7] - marks[:, :, 6]).flatten().tolist()
first = marks[:, :, 6].min(1).values
last = marks[:, :, 7].max(1).values
print(f"  warp globaltimer span median {statistics.median(span):.0f} ns; first start to last end "
      f"median {statistics.median((last - first).tolist()):.0f} ns")
cyc = marks[:, :, 9].flatten()
ns = torch.tensor(span)
ok = ns > 0
print(f"  clock: {float((cyc[ok] / ns[ok]).median()):.2f} cycles/ns (globaltimer granularity permitting)")
print("  SMs used:", sorted(set(int(x) for x in marks[0, :, 8].tolist())))
