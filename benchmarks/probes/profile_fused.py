"""One fused op at one shape, called a few times, for Nsight Compute (the
evidence behind NOTES 44's readings of what bounds each fused kernel):

    ncu -k regex:KERNEL --launch-skip 2 --launch-count 1 --set full \\
        python benchmarks/probes/profile_fused.py CASE

CASE (kernel regex to pass to ncu):
  mla-T          DeepSeek MLA append, T tokens (mla_bench's shapes)  mla_rope_kernel
  prologue-B     decode prologue, B sequences at decode (prologue_bench)  prologue_kernel
  prologue-16k   the same, one 16k prefill
  kv-B / kv-16k  RoPE + fp8 q+k+v paged append (kvcache_bench)  kv_rope_kernel
  qknorm-fwd / qknorm-bwd   QK-norm + RoPE, Qwen3-8B prefill bf16  qknorm
  decode-B       plain RoPE in place at decode, B sequences  rope_kernel
Each builds its bench module's inputs and makes four calls (no graph)."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import cuprope  # noqa: E402


def call_of(case):
    name, _, size = case.partition("-")
    if name == "qknorm":
        return qknorm_call(size)
    kind, n = ("prefill", 16384) if size == "16k" else ("decode", int(size or 1))
    if name == "mla":
        return mla_call(kind, n)
    if name in ("prologue", "kv"):
        return kv_call(name, kind, n)
    if name == "decode":
        q = torch.randn(n, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(n, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
        pos = torch.randint(0, 4096, (n, 1), device="cuda", dtype=torch.int32)
        cfg = cuprope.RopeConfig(128, base=500000.0)
        return lambda: cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
    raise SystemExit(f"unknown case {case!r}; see the docstring")


def mla_call(kind, n):
    import mla_bench as mb
    b, per = (n, 1) if kind == "decode" else (1, n)
    t = b * per
    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    pages_per = -(-(mb.CTX if kind == "decode" else per) // mb.PAGE)
    q_pe = torch.randn(t, mb.H, mb.R, device="cuda", dtype=bf)
    q_nope = torch.randn(t, mb.H, mb.N, device="cuda", dtype=bf)
    k_pe, ckv = (torch.randn(t, w, device="cuda", dtype=bf) for w in (mb.R, mb.N))
    q_pe_out, q_nope_out = torch.empty_like(q_pe, dtype=f8), torch.empty_like(q_nope, dtype=f8)
    kpe = torch.zeros(b * pages_per, mb.PAGE, mb.R, device="cuda", dtype=f8)
    ckv_c = torch.zeros(b * pages_per, mb.PAGE, mb.N, device="cuda", dtype=f8)
    tok = torch.arange(t, device="cuda")
    cp = ((pages_per * mb.PAGE - per) + tok % per).to(torch.int32)
    idx = dict(kv_indices=torch.arange(b * pages_per, device="cuda", dtype=torch.int32),
               kv_indptr=torch.arange(b + 1, device="cuda", dtype=torch.int32) * pages_per,
               batch_indices=(tok // per).to(torch.int32), cache_positions=cp)
    cfg = cuprope.scaling.rope_config_from_hf(mb.DEEPSEEK_V3)
    one = torch.ones((), device="cuda")
    from cuprope.mla import rope_append_mla
    return lambda: rope_append_mla(q_pe, k_pe, ckv, cfg, cp, ckv_cache=ckv_c, kpe_cache=kpe,
                                   q_nope=q_nope, q_nope_out=q_nope_out, q_pe_out=q_pe_out,
                                   q_scale=one, kv_scale=one, **idx)


def kv_call(name, kind, n):
    import kvcache_bench as kb
    from cuprope import kvcache
    from cuprope.prologue import qk_norm_rope_append_kv
    b, per = (n, 1) if kind == "decode" else (1, n)
    x, pos, idx, _, n_pages = kb.setup(kind, b, per)
    f8 = torch.float8_e4m3fn
    kc = torch.zeros(n_pages, kb.PAGE, kb.HK, kb.D, device="cuda", dtype=f8)
    vc = torch.zeros_like(kc)
    one = torch.ones((), device="cuda")
    q_out = torch.empty(x["q"].shape, device="cuda", dtype=f8)
    kw = dict(k_cache=kc, v_cache=vc, q_out=q_out, q_scale=one, k_scale=one, v_scale=one, **idx)
    cfg = cuprope.RopeConfig(kb.D, base=1e6, layout="thd")
    if name == "kv":
        return lambda: kvcache.rope_append_kv(x["q"], x["k"], x["v"], cfg, pos, **kw)
    w = [torch.rand(kb.D, device="cuda", dtype=torch.bfloat16) + 0.5 for _ in range(2)]
    return lambda: qk_norm_rope_append_kv(x["q"], x["k"], x["v"], cfg, pos, q_weight=w[0],
                                          k_weight=w[1], eps=1e-6, **kw)


def qknorm_call(which):
    from cuprope import qknorm
    b, s, hq, hk, d = 4, 4096, 32, 8, 128
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, gq, gk = mk(hq), mk(hk), mk(hq), mk(hk)
    w = [(1 + 0.1 * torch.randn(d, device="cuda")).to(torch.bfloat16) for _ in range(2)]
    cfg = cuprope.RopeConfig(d, base=1e6)
    norm = dict(q_weight=w[0], k_weight=w[1], eps=1e-6)
    if which == "fwd":
        return lambda: qknorm.rope_qk_norm_forward(q, k, cfg, **norm)
    return lambda: qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, **norm)


if __name__ == "__main__":
    fn = call_of(sys.argv[1])
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    print("ran", sys.argv[1], torch.cuda.get_device_name())
