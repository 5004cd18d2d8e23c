"""One training step of a real-config model (random weights, bf16, SDPA) under
torch.profiler: models_profile's position-encoding + q/k-norm attribution,
and what it is made of (the ranges' forward kernels; the backward nodes it
counts, by name, with their device µs), for transformers' eager model and
the model under ``cuprope.torch.patch_hf``. On a GPU:

    python benchmarks/probes/hf_train_attribution.py [--model qwen3-0.6b] [--b 1] [--s 2048]
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import cuprope.torch as ct  # noqa: E402
import models_bench as mb  # noqa: E402
import models_profile as mp  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="qwen3-0.6b")
ap.add_argument("--b", type=int, default=1)
ap.add_argument("--s", type=int, default=2048)
a = ap.parse_args()
run = mb.Run(mb.parse_args(["--quick"]))
ids = torch.randint(0, 1000, (a.b, a.s), device="cuda")

for label in ("hf", "cuprope"):
    model = mb.build(a.model, run).train()
    if label == "cuprope":
        ct.patch_hf(model)

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with mp.ranges(model), torch.profiler.profile(activities=acts) as prof:
        step()
        torch.cuda.synchronize()
    ev = prof.events()
    f, b, loose = mp.attribute(ev, True)
    total = sum(e.device_time for e in ev if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"== {label}: attribute() forward {f:.0f} µs, backward {b:.0f} µs, unlinked "
          f"cuprope kernels {loose:.0f} µs; "
          f"every kernel of the step {total:.0f} µs")
    fk = collections.Counter()
    for e in ev:
        if e.name == mp.NAME:
            for k in e.kernels:
                fk[k.name[:80]] += k.duration
    print("   forward kernels in the ranges (µs):")
    for n, t in fk.most_common(8):
        print(f"     {t:9.1f}  {n}")
    tops = [e for e in ev if e.name == mp.NAME]
    seqs = set()
    for e in ev:
        if e.sequence_nr < 0 or e.name.startswith(mp._EVAL) or e.name == mp.NAME:
            continue
        if any(r.thread == e.thread and r.time_range.start <= e.time_range.start
               and e.time_range.end <= r.time_range.end for r in tops):
            seqs.add((e.thread, e.sequence_nr))
    bk = collections.Counter()
    cnt = collections.Counter()
    for e in ev:
        if e.name.startswith(mp._EVAL) and (e.fwd_thread, e.sequence_nr) in seqs:
            bk[e.name[len(mp._EVAL):]] += e.device_time_total
            cnt[e.name[len(mp._EVAL):]] += 1
    print("   backward nodes counted (count, device µs):")
    for n, t in bk.most_common(12):
        print(f"     {cnt[n]:4d} {t:9.1f}  {n}")
    ks = collections.defaultdict(lambda: [0, 0.0])
    for e in ev:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = ks[e.name[:100]]
            k[0] += 1
            k[1] += e.device_time
    print("   the step's kernels (launches, device µs), largest first:")
    for n, (c, t) in sorted(ks.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"     {c:5d} {t:9.1f}  {n}")
    model = None
    torch.cuda.empty_cache()
