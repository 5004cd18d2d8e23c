"""Fused QK-norm + RoPE (cuprope.qknorm) on the GPU: forward and backward against a
copy of the fewest bytes each must move, against torch.compile of HF's Qwen3 norm +
rotate_half RoPE, and against the unfused pair (torch's RMSNorm, then cuprope's
norm-free RoPE).

Bytes: the forward reads q and k and writes them once (2·|q, k|); the backward
reads q, k and dy and writes dx (3·|q, k|; the weights and their gradients are
negligible). "copy" is a device-to-device copy moving the same bytes (half read,
half written). CUDA events, warm-up, median (cuprope.bench.time_gpu); buffer sets
rotate so the L2 does not hold the inputs.

    python benchmarks/qknorm_bench.py [--shapes llama,qwen3] [--dtypes bf16,fp16,fp32] [--csv out.csv]

Targets (issue 15): forward >= 0.95 of copy, backward >= 0.90, >= 1.05x
torch.compile, >= 1.5x the unfused pair.
"""
import argparse
import csv
import sys

import torch

import cuprope
from cuprope import qknorm
from cuprope import torch as ctorch
from cuprope.bench import time_gpu

SHAPES = {"llama": ("Llama-3-8B prefill", 4, 4096, 32, 8, 128),
          "qwen3": ("Qwen3-8B prefill", 4, 4096, 32, 8, 128)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SETS = 2


def timed(fn):
    return time_gpu(fn, reps=30, warm=5, sleep_cycles=1_000_000)


def hf_block(q, k, wq, wk, cos, sin, eps):
    """HF's Qwen3 q_norm / k_norm (Qwen3RMSNorm) and apply_rotary_pos_emb, [B, S, H, D]."""
    def norm(x, w):
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    def rot(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    q, k = norm(q, wq), norm(k, wk)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return q * c + rot(q) * s, k * c + rot(k) * s


def unfused(q, k, wq, wk, cfg, eps):
    """torch's RMSNorm over the head dim, then cuprope's RoPE (differentiable)."""
    d = q.shape[-1]
    qn = torch.nn.functional.rms_norm(q, (d,), wq, eps)
    kn = torch.nn.functional.rms_norm(k, (d,), wk, eps)
    return ctorch.rope_qk(qn, kn, cfg)


def bench(name, b, s, hq, hk, d, dt):
    eps = 1e-6
    cfg = cuprope.RopeConfig(d, base=1e6)
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=dt)  # noqa: E731
    sets = [(mk(hq), mk(hk)) for _ in range(SETS)]
    grads = [(torch.randn_like(q), torch.randn_like(k)) for q, k in sets]
    outs = [(torch.empty_like(q), torch.empty_like(k)) for q, k in sets]
    dxs = [(torch.empty_like(q), torch.empty_like(k)) for q, k in sets]
    wq = (1 + 0.1 * torch.randn(d, device="cuda")).to(dt)
    wk = (1 + 0.1 * torch.randn(d, device="cuda")).to(dt)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float64) / d))
    ang = torch.arange(s, device="cuda", dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    qk_bytes = (sets[0][0].numel() + sets[0][1].numel()) * sets[0][0].element_size()
    src = torch.empty(qk_bytes * 3 // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    i = [0]

    def nxt():
        i[0] += 1
        return i[0] % SETS

    def fwd():
        j = nxt()
        qknorm.rope_qk_norm_forward(*sets[j], cfg, q_weight=wq, k_weight=wk, eps=eps,
                                    out=outs[j])

    def bwd():
        j = nxt()
        qknorm.rope_qk_norm_backward(*sets[j], *grads[j], cfg, q_weight=wq, k_weight=wk,
                                     eps=eps, out=dxs[j])

    def autograd_step(fn):
        leaves = [(q.detach().requires_grad_(), k.detach().requires_grad_()) for q, k in sets]
        wl = (wq.detach().requires_grad_(), wk.detach().requires_grad_())

        def step():
            j = nxt()
            a, c = fn(*leaves[j], *wl)
            torch.autograd.backward((a, c), grads[j])
        return step

    def fwd_only(fn):
        def step():
            j = nxt()
            fn(*sets[j], wq, wk)
        return step

    fused_fn = lambda q, k, a, c: ctorch.rope_qk_norm(q, k, cfg, q_weight=a, k_weight=c,  # noqa
                                                      eps=eps)
    hf_fn = torch.compile(lambda q, k, a, c: hf_block(q, k, a, c, cos, sin, eps))
    unf_fn = lambda q, k, a, c: unfused(q, k, a, c, cfg, eps)  # noqa: E731
    t = dict(
        copy_f=timed(lambda: dst[:qk_bytes].copy_(src[:qk_bytes])),
        copy_b=timed(lambda: dst.copy_(src)),
        fwd=timed(fwd), bwd=timed(bwd),
        fused_f=timed(fwd_only(fused_fn)), fused_fb=timed(autograd_step(fused_fn)),
        hf_f=timed(fwd_only(hf_fn)), hf_fb=timed(autograd_step(hf_fn)),
        unf_f=timed(fwd_only(unf_fn)), unf_fb=timed(autograd_step(unf_fn)))
    return dict(
        shape=name, dtype=str(dt).replace("torch.", ""), fwd_us=t["fwd"] * 1e6,
        fwd_vs_copy=t["copy_f"] / t["fwd"], bwd_us=t["bwd"] * 1e6,
        bwd_vs_copy=t["copy_b"] / t["bwd"],
        vs_compile_fwd=t["hf_f"] / t["fused_f"], vs_compile_fwdbwd=t["hf_fb"] / t["fused_fb"],
        vs_unfused_fwd=t["unf_f"] / t["fused_f"], vs_unfused_fwdbwd=t["unf_fb"] / t["fused_fb"])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="llama,qwen3")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    args = ap.parse_args(argv)
    rows = []
    print(f"# {torch.cuda.get_device_name()}")
    cols = ("shape", "dtype", "fwd_us", "fwd_vs_copy", "bwd_us", "bwd_vs_copy", "vs_compile_fwd",
            "vs_compile_fwdbwd", "vs_unfused_fwd", "vs_unfused_fwdbwd")
    print(" | ".join(cols))
    for key in args.shapes.split(","):
        name, *dims = SHAPES[key]
        for dk in args.dtypes.split(","):
            row = bench(name, *dims, DTYPES[dk])
            rows.append(row)
            print(" | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else row[c]
                             for c in cols), flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
