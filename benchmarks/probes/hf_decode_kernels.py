"""One decode step of a real-config model (random weights, bf16, SDPA) under
torch.profiler, after a 512-token prefill: every kernel (name, launches,
device µs) for transformers' eager model, the model under
``cuprope.torch.patch_hf`` and Liger's rope-only patch, with models_profile's
position-encoding + q/k-norm attribution beside them. On a GPU:

    python benchmarks/probes/hf_decode_kernels.py [--model qwen3-0.6b] [--b 1]
"""
import inspect, os, sys, argparse
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
import models_bench as mb, models_profile as mp
import cuprope.torch as ct

ap = argparse.ArgumentParser(); ap.add_argument("--model", default="qwen3-0.6b"); ap.add_argument("--b", type=int, default=1)
a = ap.parse_args()
run = mb.Run(mb.parse_args(["--quick"]))
model = mb.build(a.model, run).eval()
sig = inspect.signature(type(model).forward).parameters
ck = "cache" if "cache" in sig else "past_key_values"
ids = torch.randint(0, 1000, (a.b, 512), device="cuda")

def one(label):
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        pos = torch.full((a.b, 1), 512, device="cuda", dtype=torch.long)
        def step():
            model(nxt, **{ck: cache}, position_ids=pos, use_cache=True)
        step(); torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with mp.ranges(model), torch.profiler.profile(activities=acts) as prof:
            step(); torch.cuda.synchronize()
        f, _, loose = mp.attribute(prof.events(), True)
        print(f"== {label}: attribute() pos+norm device µs {f:.1f} + unlinked cuprope {loose:.1f}")
        ks = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                k = ks.setdefault(e.name[:90], [0, 0.0]); k[0] += 1; k[1] += e.device_time
        tot = sum(v[1] for v in ks.values())
        print(f"   kernels total {sum(v[0] for v in ks.values())} launches, {tot:.1f} µs")
        for n, (c, t) in sorted(ks.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"   {c:5d} {t:9.1f}  {n}")
        # the ranges' own kernel list
        ins = {}
        for e in prof.events():
            if e.name == mp.NAME:
                for k in e.kernels:
                    v = ins.setdefault(k.name[:90], [0, 0.0]); v[0] += 1; v[1] += k.duration
        print("   kernels inside ranges:")
        for n, (c, t) in sorted(ins.items(), key=lambda kv: -kv[1][1])[:15]:
            print(f"   {c:5d} {t:9.1f}  {n}")

one("hf")
ct.patch_hf(model); one("cuprope"); ct.unpatch_hf(model)
if mb.liger_available(run):
    with mb.Liger(mb.CONFIGS[a.model]["model_type"]):
        one("liger-rope")
