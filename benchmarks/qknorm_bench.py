"""Fused QK-norm + RoPE (cuprope.qknorm) on the GPU: forward and backward against a
copy of the fewest bytes each must move, against torch.compile of HF's Qwen3 norm +
rotate_half RoPE, and against the unfused pair (torch's RMSNorm, then cuprope's
norm-free RoPE).

Bytes: the forward reads q and k and writes them once (2·|q, k|); the backward
reads q, k and dy and writes dx (3·|q, k|; the weights and their gradients are
negligible). "copy" is a device-to-device copy moving the same bytes (half read,
half written). CUDA events, warm-up, median (cuprope.cli.bench_cases.time_gpu); buffer sets
rotate so the L2 does not hold the inputs. Liger (its RMSNorm, then its RoPE:
what Liger puts into Qwen3) is timed too where ``liger_kernel`` imports.

A measuring module: ``benchmarks/bench_suite.py --only qknorm`` runs it and
writes the rows (issue 25's targets: forward >= 0.90 of copy, backward >= 0.85,
>= 1.2x torch.compile forward and forward+backward).
"""
import torch

import cuprope
from cuprope import qknorm
from cuprope import torch as ctorch
from cuprope.cli.bench_cases import time_gpu

SHAPES = {"llama": ("Llama-3-8B prefill", 4, 4096, 32, 8, 128),
          "qwen3": ("Qwen3-8B prefill", 4, 4096, 32, 8, 128)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SETS = 2


def timed(fn, reps=30):
    return time_gpu(fn, reps=reps, warm=5, sleep_cycles=1_000_000)


def liger_block():
    """Liger's Qwen3 pieces (LigerRMSNorm per head, liger_rotary_pos_emb on the
    [B, H, S, D] view of our [B, S, H, D] tensors), or None without Liger."""
    try:
        from liger_kernel.transformers.functional import liger_rms_norm, liger_rope
    except Exception:  # not installed, or no Triton
        return None

    def block(q, k, wq, wk, cos, sin, eps):
        qn = liger_rms_norm(q, wq, eps, casting_mode="llama")
        kn = liger_rms_norm(k, wk, eps, casting_mode="llama")
        a, c = liger_rope(qn.transpose(1, 2), kn.transpose(1, 2), cos, sin)
        return a.transpose(1, 2), c.transpose(1, 2)
    return block


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


def measure(b, s, hq, hk, d, dt, reps=30):
    """Seconds per call (CUDA-event medians) of one prefill shape: ``copy_f`` /
    ``copy_b`` (copies of the forward's and the backward's bytes, ``bytes_f`` /
    ``bytes_b``), ``fwd`` / ``bwd`` (cuprope.qknorm's raw calls), ``fwd_tab`` /
    ``bwd_tab`` (the same with HF's cos/sin tables and Qwen3's rounding, as
    ``cuprope.torch.patch_hf`` calls it); under torch
    autograd, forward only (``*_f``) and forward + backward (``*_fb``) of
    ``fused`` (cuprope.torch.rope_qk_norm), ``hf`` (torch.compile of HF's Qwen3
    block), ``unf`` (torch RMSNorm, then cuprope RoPE) and ``liger`` (if
    importable)."""
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

    hf_kw = dict(q_weight=wq, k_weight=wk, eps=eps, tables=(cos, sin),
                 rounding="cast_then_weight")

    def fwd_tab():  # what cuprope.torch.patch_hf runs in a Qwen3: HF's tables, its rounding
        j = nxt()
        qknorm.rope_qk_norm_forward(*sets[j], cfg, out=outs[j], **hf_kw)

    def bwd_tab():
        j = nxt()
        qknorm.rope_qk_norm_backward(*sets[j], *grads[j], cfg, out=dxs[j], **hf_kw)

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
    lg = liger_block()
    timers = dict(
        copy_f=lambda: dst[:qk_bytes].copy_(src[:qk_bytes]), copy_b=lambda: dst.copy_(src),
        fwd=fwd, bwd=bwd, fwd_tab=fwd_tab, bwd_tab=bwd_tab, fused_f=fwd_only(fused_fn),
        fused_fb=autograd_step(fused_fn),
        hf_f=fwd_only(hf_fn), hf_fb=autograd_step(hf_fn), unf_f=fwd_only(unf_fn),
        unf_fb=autograd_step(unf_fn))
    if lg is not None:
        lg_fn = lambda q, k, a, c: lg(q, k, a, c, cos, sin, eps)  # noqa: E731
        timers.update(liger_f=fwd_only(lg_fn), liger_fb=autograd_step(lg_fn))
    t = {}
    for name, fn in timers.items():
        try:
            t[name] = timed(fn, reps)
        except Exception as e:  # a peer that fails here is reported, not dropped
            t[name + "_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    t.update(bytes_f=qk_bytes * 2, bytes_b=qk_bytes * 3)
    return t
