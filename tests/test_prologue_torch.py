"""The prologue's torch custom op and the vLLM ``fused_qk_norm_rope`` drop-in
on the CPU (the NumPy backend): opcheck, torch.compile, and the drop-in
against vLLM's native composition written in torch (RMSNorm.forward_native
then RotaryEmbedding.forward_native)."""
import numpy as np
import pytest

import cuprope

torch = pytest.importorskip("torch")
from cuprope.prologue import qk_norm_rope_append_kv  # noqa: E402
from cuprope.prologue import torch as ptorch  # noqa: E402
from cuprope.torch import fused_qk_norm_rope  # noqa: E402


def vllm_native(qkv, hq, hk, hv, d, eps, qw, kw, cache, is_neox, pos):
    """vLLM's reference: per-head RMSNorm (fp32 variance, v·r cast to the
    dtype, times the weight), then the cos/sin-cache rotation in the dtype."""
    t = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hk * d, hv * d], dim=-1)

    def rms(x, w, h):
        x = x.reshape(t, h, d)
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        return (xf * torch.rsqrt(var + eps)).to(x.dtype) * w

    def rot(x):
        r = cache.shape[-1]
        cos, sin = cache.index_select(0, pos).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        xr, xp = x[..., :r], x[..., r:]
        if is_neox:
            x1, x2 = xr.chunk(2, dim=-1)
            o = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = xr[..., ::2], xr[..., 1::2]
            o = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((o, xp), dim=-1)

    return torch.cat([rot(rms(q, qw, hq)).reshape(t, -1), rot(rms(k, kw, hk)).reshape(t, -1),
                      v], dim=-1)


def vllm_case(device, dtype, is_neox, r, t=13, hq=4, hk=2, d=64, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g, device=device).to(dtype)
    qw = (torch.randn(d, generator=g, device=device) * 0.5 + 1).to(dtype)
    kw = (torch.randn(d, generator=g, device=device) * 0.5 + 1).to(dtype)
    ang = np.arange(4096)[:, None] * 10000.0 ** (-np.arange(r // 2) / (r // 2))
    cache = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], -1)).float().to(device)
    pos = torch.randint(0, 4096, (t,), generator=g, device=device)
    return qkv, (hq, hk, hk, d, 1e-6, qw, kw, cache, is_neox, pos)


def assert_vllm_equal(got, want, dtype):
    """Bit for bit but for the fp32 sum of squares' order (a last-bit change
    of a normed value, which the rotation's cancellations may widen): almost
    every element identical, none further than two ulps of the largest."""
    a, b = got.float(), want.float()
    assert float((a - b).abs().max()) <= 2 * torch.finfo(dtype).eps * float(b.abs().max())
    assert float((a == b).float().mean()) > 0.99


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("partial", [False, True])
def test_vllm_drop_in_on_the_host(dtype, is_neox, partial):
    qkv, args = vllm_case("cpu", dtype, is_neox, 32 if partial else 64)
    want = vllm_native(qkv.clone(), *args)
    got = qkv.clone()
    assert fused_qk_norm_rope(got, *args) is None
    assert_vllm_equal(got, want, dtype)
    hq, hk, d = args[0], args[1], args[3]
    assert torch.equal(got[:, (hq + hk) * d:], qkv[:, (hq + hk) * d:])  # v untouched


def test_vllm_drop_in_errors():
    qkv, args = vllm_case("cpu", torch.bfloat16, True, 64)
    with pytest.raises(ValueError, match="qkv must be"):
        fused_qk_norm_rope(qkv[:, :-64], *args)


def _op_case(device="cpu"):
    g = torch.Generator(device=device).manual_seed(1)
    t, hq, hk, d, pages, ps = 6, 4, 2, 32, 3, 4
    q, k, v = (torch.randn(t, h, d, generator=g, device=device) for h in (hq, hk, hk))
    kc = torch.randn(pages, ps, hk, d, generator=g, device=device)
    vc = torch.randn(pages, ps, hk, d, generator=g, device=device)
    pos = torch.randint(0, 100, (t,), generator=g, device=device)
    slots = torch.tensor([3, -1, 0, 7, 11, 5], device=device)
    return q, k, v, pos, kc, vc, slots


def test_custom_op_matches_the_eager_call_and_passes_opcheck():
    cfg = cuprope.RopeConfig(32, layout="thd")
    q, k, v, pos, kc, vc, slots = _op_case()
    q1, kc1, vc1 = q.clone(), kc.clone(), vc.clone()
    qk_norm_rope_append_kv(q1, k, v, cfg, pos, k_cache=kc1, v_cache=vc1, slot_mapping=slots)
    q2, kc2, vc2 = q.clone(), kc.clone(), vc.clone()
    out = ptorch.qk_norm_rope_append_kv(q2, k, v, cfg, pos, k_cache=kc2, v_cache=vc2,
                                        slot_mapping=slots)
    assert out is q2
    assert torch.equal(q1, q2) and torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    args = (q.clone(), k, v, cfg.key, pos, None, None, 1e-6, "rms", 0.0, "norm_then_rope",
            "head", "exact", kc.clone(), vc.clone(), None, "NHD", slots, None, None, None, None,
            None, None, None, None)
    torch.library.opcheck(torch.ops.cuprope.qk_norm_rope_append_kv.default, args)


def test_custom_op_under_torch_compile():
    cfg = cuprope.RopeConfig(32, layout="thd")
    q, k, v, pos, kc, vc, slots = _op_case()

    def step(q_, kc_, vc_):
        return ptorch.qk_norm_rope_append_kv(q_, k, v, cfg, pos, k_cache=kc_, v_cache=vc_,
                                             slot_mapping=slots)
    q1, kc1, vc1 = q.clone(), kc.clone(), vc.clone()
    step(q1, kc1, vc1)
    q2, kc2, vc2 = q.clone(), kc.clone(), vc.clone()
    torch.compile(step, fullgraph=True, backend="aot_eager")(q2, kc2, vc2)
    assert torch.equal(q1, q2) and torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    assert not torch.equal(q1, q)
