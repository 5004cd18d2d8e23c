"""Host time per call for a decode-sized RoPE (B 1, S 1, Hq 32, Hk 8, D 128; bf16
for torch, fp32 for CuPy, whose arrays cannot be bf16 through the CUDA array
interface), from torch and from CuPy, with a cProfile of the torch and CuPy
fast paths. The "general path" row passes stream= so every call validates."""
import cProfile
import pstats
import time

import cupy
import torch

import cuprope


def per_call(fn, n=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    cfg = cuprope.RopeConfig(128)
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    pos = torch.tensor([1000], device="cuda", dtype=torch.int32)
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    cq, ck = cupy.asarray(q.float()), cupy.asarray(k.float())
    cpos = cupy.asarray(pos)
    coq, cok = cupy.empty_like(cq), cupy.empty_like(ck)
    cstream = cupy.cuda.get_current_stream()
    x = torch.randn(1, 1, 32, 128, device="cuda")
    # the HF drop-in: q, k [B, H, S, D] views, cos/sin [B, S, D] in q's dtype
    from cuprope.torch import _hf_formula, apply_rotary_pos_emb
    hq, hk = q.transpose(1, 2), k.transpose(1, 2)
    hcos = torch.randn(1, 1, 128, device="cuda", dtype=torch.bfloat16)
    hsin = torch.randn_like(hcos)
    rows = [
        ("torch add_ (one eager op)", per_call(lambda: x.add_(1.0))),
        ("torch qk fwd, new outputs", per_call(lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos))),
        ("torch qk fwd, out=", per_call(lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos, out=(oq, ok)))),
        ("torch qk fwd, in-place", per_call(lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True))),
        ("torch single fwd", per_call(lambda: cuprope.rope_forward(q, cfg))),
        ("HF drop-in apply_rotary_pos_emb", per_call(lambda: apply_rotary_pos_emb(hq, hk, hcos, hsin))),
        ("HF formula, torch eager", per_call(lambda: _hf_formula(hq, hk, hcos, hsin, 1))),
        ("cupy qk fwd", per_call(lambda: cuprope.rope_qk_forward(cq, ck, cfg))),
        ("cupy qk fwd, positions", per_call(lambda: cuprope.rope_qk_forward(cq, ck, cfg, positions=cpos))),
        ("cupy qk fwd, out=", per_call(lambda: cuprope.rope_qk_forward(cq, ck, cfg, positions=cpos, out=(coq, cok)))),
        ("cupy qk fwd, in-place", per_call(lambda: cuprope.rope_qk_forward(cq, ck, cfg, positions=cpos, inplace=True))),
        ("cupy single fwd", per_call(lambda: cuprope.rope_forward(cq, cfg))),
        ("cupy qk fwd, general path", per_call(lambda: cuprope.rope_qk_forward(cq, ck, cfg, positions=cpos, stream=cstream))),
    ]
    for title, call in (("torch", lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos)),
                        ("cupy", lambda: cuprope.rope_qk_forward(cq, ck, cfg, positions=cpos))):
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            call()
        pr.disable()
        torch.cuda.synchronize()
        print(f"---- cProfile, {title} qk fwd with positions (fast path)")
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    print(f"{'host path':<30} {'us/call':>8}")
    for name, us in rows:
        print(f"{name:<30} {us:8.1f}")


if __name__ == "__main__":
    main()
