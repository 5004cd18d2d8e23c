"""Fused QK-norm + RoPE on the CPU: the float64 reference (cuprope.qknorm.reference)
against an independent torch float64 implementation and its autograd (forward,
dx, dw), the NumPy backend through the public API (dtypes, layouts, GQA,
partial rotary, positions, schemes), the model rounding modes bit for bit
against transformers' Qwen3 and Gemma 3 attention on the CPU, and the errors."""
import numpy as np
import pytest

import cuprope
from cuprope import qknorm
from cuprope.qknorm import reference as qref
from cuprope import reference, scaling
from oracle import assert_matches

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")


def torch_qknorm(x, angles, rotary_dim, interleaved, scale, w, offset, eps, over, order):
    """y = R(N(x)) or N(R(x)) in float64 torch ops (autograd-capable), written from
    the formulas: the rotation as a complex product, the norm as torch expressions."""
    d = x.shape[-1]
    ang = torch.as_tensor(angles)
    rot = torch.polar(torch.full_like(ang, float(scale)), ang)

    def rope(v):
        r = rotary_dim
        if interleaved:
            a, b = v[..., 0:r:2], v[..., 1:r:2]
        else:
            a, b = v[..., : r // 2], v[..., r // 2: r]
        z = torch.complex(a, b) * rot
        if interleaved:
            head = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
        else:
            head = torch.cat((z.real, z.imag), dim=-1)
        return torch.cat((head, v[..., r:]), dim=-1)

    def norm(v):
        dims = (-1,) if over == "head" else (-2, -1)
        y = v * torch.rsqrt(v.pow(2).mean(dims, keepdim=True) + eps)
        if w is not None:
            y = y * (offset + (w.view(1, d) if over == "head" else w.view(v.shape[-2], d)))
        return y

    return norm(rope(x)) if order == "rope_then_norm" else rope(norm(x))


def _angles(cfg, b, s, positions=None, offset=0):
    pos = reference.token_positions(b, s, positions=positions, offset=offset,
                                    n_streams=cfg.n_streams)
    return reference.pair_angles(pos, cfg.inv_freq, cfg.stream_map)


CASES = [  # (order, over, weight offset or None, interleaved, R)
    ("norm_then_rope", "head", 0.0, False, 32),
    ("norm_then_rope", "head", 1.0, True, 32),
    ("norm_then_rope", "token", 0.0, False, 16),
    ("norm_then_rope", "head", None, False, 20),
    ("rope_then_norm", "head", None, False, 32),
    ("rope_then_norm", "head", 0.5, True, 24),
    ("rope_then_norm", "token", 0.0, False, 32),
]


@pytest.mark.parametrize("order,over,offset,interleaved,r", CASES)
def test_reference_matches_torch_autograd(rng, order, over, offset, interleaved, r):
    b, s, h, d = 2, 5, 3, 32
    cfg = cuprope.RopeConfig(r, base=100.0, interleaved=interleaved)
    ang = _angles(cfg, b, s, offset=7)
    scale = 1.3
    x = rng.standard_normal((b, s, h, d)) * 2.0
    dy = rng.standard_normal((b, s, h, d))
    wn = None if offset is None else rng.standard_normal(d if over == "head" else h * d)
    kw = dict(rotary_dim=r, interleaved=interleaved, scale=scale, weight=wn,
              weight_offset=offset or 0.0, eps=1e-3, over=over, order=order)
    y = qref.forward(x, ang, **kw)
    dx, dw = qref.backward(x, dy, ang, **kw)
    xt = torch.tensor(x, requires_grad=True)
    wt = None if wn is None else torch.tensor(wn, requires_grad=True)
    yt = torch_qknorm(xt, ang, r, interleaved, scale, wt, offset or 0.0, 1e-3, over, order)
    (yt * torch.tensor(dy)).sum().backward()
    np.testing.assert_allclose(y, yt.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), atol=1e-12)
    if wn is None:
        assert dw is None
    else:
        np.testing.assert_allclose(dw, wt.grad.numpy(), atol=1e-11)


def test_reference_backward_matches_finite_differences(rng):
    cfg = cuprope.RopeConfig(8, base=10.0)
    x = rng.standard_normal((1, 2, 2, 12))
    dy = rng.standard_normal(x.shape)
    w = rng.standard_normal(12)
    ang = _angles(cfg, 1, 2)
    kw = dict(rotary_dim=8, interleaved=False, weight_offset=1.0, eps=1e-2, order="norm_then_rope")
    dx, dw = qref.backward(x, dy, ang, weight=w, **kw)
    h = 1e-6
    for idx in [(0, 0, 0, 0), (0, 1, 1, 5), (0, 1, 0, 11)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        fd = ((qref.forward(xp, ang, weight=w, **kw) - qref.forward(xm, ang, weight=w, **kw))
              * dy).sum() / (2 * h)
        assert abs(fd - dx[idx]) < 1e-6
    wp, wm = w.copy(), w.copy()
    wp[3] += h
    wm[3] -= h
    fd = ((qref.forward(x, ang, weight=wp, **kw) - qref.forward(x, ang, weight=wm, **kw))
          * dy).sum() / (2 * h)
    assert abs(fd - dw[3]) < 1e-6


def _bf16_exact(rng, shape, scale=1.0):
    import ml_dtypes
    return (rng.standard_normal(shape) * scale).astype(ml_dtypes.bfloat16).astype(np.float32)


def _cast(a, dtype):
    if dtype == "bfloat16":
        import ml_dtypes
        return a.astype(ml_dtypes.bfloat16)
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("order,over,offset,interleaved,r", CASES[:1] + CASES[2:3] + CASES[5:6])
def test_host_api_against_torch_reference(rng, dtype, layout, order, over, offset, interleaved, r):
    """The public API on NumPy arrays: every layout and dtype (GQA: 4 q heads, 2 k
    heads; positions; partial rotary), against the torch float64 formulas."""
    b, s, d = (1 if layout == "thd" else 2), 6, 32
    cfg = cuprope.RopeConfig(r, base=50.0, interleaved=interleaved, layout=layout)
    pos = rng.integers(0, 1000, size=(s,))
    qc, kc = _bf16_exact(rng, (b, s, 4, d), 3.0), _bf16_exact(rng, (b, s, 2, d), 0.5)
    wq = _bf16_exact(rng, (d if over == "head" else 4 * d,))
    wk = _bf16_exact(rng, (d if over == "head" else 2 * d,))
    dyq, dyk = _bf16_exact(rng, qc.shape), _bf16_exact(rng, kc.shape)

    def lay(a):
        a = a.transpose(0, 2, 1, 3) if layout == "bhsd" else (a[0] if layout == "thd" else a)
        return _cast(np.ascontiguousarray(a), dtype)

    def unlay(a):
        a = np.asarray(a, dtype=np.float64)
        return a.transpose(0, 2, 1, 3) if layout == "bhsd" else (a[None] if layout == "thd" else a)

    kw = dict(norm_over=over, order=order, weight_offset=offset, eps=1e-5, positions=pos)
    yq, yk = qknorm.rope_qk_norm_forward(lay(qc), lay(kc), cfg, q_weight=_cast(wq, dtype),
                                         k_weight=_cast(wk, dtype), **kw)
    dq, dk, dwq, dwk = qknorm.rope_qk_norm_backward(
        lay(qc), lay(kc), lay(dyq), lay(dyk), cfg, q_weight=_cast(wq, dtype),
        k_weight=_cast(wk, dtype), **kw)
    ang = _angles(cfg, b, s, positions=pos)
    for x, w, dy, y, dx, dw in ((qc, wq, dyq, yq, dq, dwq), (kc, wk, dyk, yk, dk, dwk)):
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
        yt = torch_qknorm(xt, ang, r, interleaved, 1.0, wt, offset, 1e-5, over, order)
        (yt * torch.tensor(dy, dtype=torch.float64)).sum().backward()
        ref = yt.detach().numpy()
        assert_matches(unlay(y), ref, np.abs(ref).max(), dtype)
        assert_matches(unlay(dx), xt.grad.numpy(), np.abs(xt.grad.numpy()).max(), dtype)
        assert_matches(np.asarray(dw, dtype=np.float64), wt.grad.numpy(),
                       np.abs(wt.grad.numpy()).max(), dtype)


@pytest.mark.parametrize("make", ["per_head", "mrope", "yarn"])
def test_host_schemes(rng, make):
    """Per-head tables, stream maps (MRoPE) and a scaled table reach the rotation."""
    b, s, d = 2, 5, 32
    if make == "per_head":
        cfg = cuprope.RopeConfig(32, inv_freq=rng.uniform(0.01, 1.0, size=(3, 16)))
        pos = None
    elif make == "mrope":
        cfg = scaling.mrope_config([4, 6, 6], base=1e4)
        pos = rng.integers(0, 500, size=(3, b, s))
    else:
        inv, sc = scaling.yarn_table(32, 1e4, 4.0, original_max_position_embeddings=64)
        cfg = cuprope.RopeConfig(32, inv_freq=inv, scale=sc)
        pos = None
    q = rng.standard_normal((b, s, 3, d)).astype(np.float32)
    k = rng.standard_normal((b, s, 3, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    yq, yk = qknorm.rope_qk_norm_forward(q, k, cfg, q_weight=w, k_weight=w, positions=pos,
                                         offset=3)
    ang = _angles(cfg, b, s, positions=pos, offset=3)
    for x, y in ((q, yq), (k, yk)):
        ref = torch_qknorm(torch.tensor(x, dtype=torch.float64), ang, 32, False, cfg.scale,
                           torch.tensor(w, dtype=torch.float64), 0.0, 1e-6, "head",
                           "norm_then_rope").numpy()
        assert_matches(y, ref, np.abs(ref).max(), "float32")


def test_l2_norm_is_llama4s(rng):
    """norm='l2', rope_then_norm: Llama4TextL2Norm after the rotation."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm
    cfg = cuprope.RopeConfig(16, interleaved=True)
    q = rng.standard_normal((1, 4, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 4, 1, 16)).astype(np.float32)
    yq, _ = qknorm.rope_qk_norm_forward(q, k, cfg, norm="l2", order="rope_then_norm", eps=1e-5)
    rq = cuprope.rope_forward(q.astype(np.float64).astype(np.float32), cfg)
    expect = Llama4TextL2Norm(1e-5)(torch.tensor(rq)).numpy()
    np.testing.assert_allclose(yq, expect, atol=2e-6)


def test_out_and_inplace(rng):
    cfg = cuprope.RopeConfig(16)
    q = rng.standard_normal((2, 3, 2, 16)).astype(np.float32)
    k = rng.standard_normal((2, 3, 1, 16)).astype(np.float32)
    yq, yk = qknorm.rope_qk_norm_forward(q, k, cfg)
    oq, ok = np.full_like(q, np.nan), np.full_like(k, np.nan)
    rq, rk = qknorm.rope_qk_norm_forward(q, k, cfg, out=(oq, ok))
    assert rq is oq and rk is ok
    np.testing.assert_array_equal(oq, yq)
    q2, k2 = q.copy(), k.copy()
    qknorm.rope_qk_norm_forward(q2, k2, cfg, inplace=True)
    np.testing.assert_array_equal(q2, yq)
    np.testing.assert_array_equal(k2, yk)


# ---------------------------------------------------------------- HF models, bit for bit
def _tiny(model_type):
    from transformers import AutoConfig
    kw = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              max_position_embeddings=256)
    if model_type == "gemma3_text":
        kw.update(sliding_window=8, query_pre_attn_scalar=32)
    return AutoConfig.for_model(model_type, **kw)


def _hf_attention_qk(model_type, dtype, seed, device="cpu"):
    """(q_proj, k_proj outputs [B, S, H, D], the model's q/k after norm + RoPE
    [B, S, H, D], the norm weights, cos, sin, eps) of layer 0 of a tiny random
    model on ``device``."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_tiny(model_type)).to(dtype).to(device)
    with torch.no_grad():
        for p in model.parameters():  # HF inits some weights to ones/zeros: make them random
            p.normal_(0.0, 0.5)
    inner = model.model
    attn = inner.layers[0].self_attn
    hidden = torch.randn(2, 11, 64, dtype=dtype).to(device)
    pos = torch.arange(3, 14, device=device)[None].expand(2, -1)
    rot = inner.rotary_emb if hasattr(inner, "rotary_emb") else None
    try:
        cos, sin = rot(hidden, pos)
    except TypeError:
        cos, sin = rot(hidden, pos, layer_type=inner.config.layer_types[0])
    mod = __import__(type(attn).__module__, fromlist=["apply_rotary_pos_emb"])
    with torch.no_grad():
        qp = attn.q_proj(hidden).view(2, 11, -1, 32)
        kp = attn.k_proj(hidden).view(2, 11, -1, 32)
        qh, kh = mod.apply_rotary_pos_emb(attn.q_norm(qp).transpose(1, 2),
                                          attn.k_norm(kp).transpose(1, 2), cos, sin)
    return (qp, kp, qh.transpose(1, 2), kh.transpose(1, 2), attn.q_norm.weight.detach(),
            attn.k_norm.weight.detach(), cos, sin, attn.q_norm.variance_epsilon
            if hasattr(attn.q_norm, "variance_epsilon") else attn.q_norm.eps)


@pytest.mark.parametrize("model_type,rounding,offset", [
    ("qwen3", "cast_then_weight", 0.0), ("gemma3_text", "weight_then_cast", 1.0)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_model_rounding_is_hf_bit_for_bit(model_type, rounding, offset, dtype, seed):
    td = getattr(torch, dtype)
    qp, kp, qh, kh, wq, wk, cos, sin, eps = _hf_attention_qk(model_type, td, seed)
    cfg = cuprope.RopeConfig(32)
    yq, yk = qknorm.rope_qk_norm_forward(qp, kp, cfg, q_weight=wq, k_weight=wk, eps=eps,
                                         weight_offset=offset, rounding=rounding,
                                         tables=(cos, sin))
    assert yq.dtype == td and isinstance(yq, torch.Tensor)
    for y, h in ((yq, qh), (yk, kh)):
        if dtype == "float32":  # squares round in fp32: PyTorch's summation order shows
            assert (y - h).abs().max() <= 1e-6 * h.abs().max()
        else:  # bf16 squares are exact in fp32 (fp16 ones nearly), and so are these sums
            assert torch.equal(y, h), (y.float() - h.float()).abs().max()


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("kw,exc,match", [
    (dict(norm="layer"), ValueError, "norm must be"),
    (dict(order="sideways"), ValueError, "order must be"),
    (dict(norm_over="batch"), ValueError, "norm_over must be"),
    (dict(rounding="fast"), ValueError, "rounding must be"),
    (dict(eps=-1.0), ValueError, "eps"),
    (dict(weight_offset="1"), TypeError, "weight_offset"),
    (dict(norm="l2", q_weight=np.ones(16, np.float32)), ValueError, "l2"),
    (dict(q_weight=np.ones(15, np.float32)), ValueError, r"q_weight must have shape \(16,\)"),
    (dict(q_weight=np.ones(16, np.float32), norm_over="token"), ValueError,
     r"q_weight must have shape \(32,\) for norm_over='token'"),
    (dict(q_weight=np.ones(16, np.int32)), TypeError, "q_weight"),
    (dict(tables=(np.ones((3, 16), np.float32),) * 2), ValueError, "model rounding"),
    (dict(q_weight=np.ones(16, np.float64).astype(np.float32), rounding="cast_then_weight"),
     TypeError, "cast_then_weight"),
])
def test_errors_name_the_argument(kw, exc, match):
    cfg = cuprope.RopeConfig(16)
    q = np.zeros((1, 3, 2, 16), np.float16)
    k = np.zeros((1, 3, 1, 16), np.float16)
    with pytest.raises(exc, match=match):
        qknorm.rope_qk_norm_forward(q, k, cfg, **kw)


def test_config_must_be_a_ropeconfig():
    with pytest.raises(TypeError, match="config"):
        qknorm.rope_qk_norm_forward(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 1, 4)), object())


def test_backward_out_must_not_overlap_the_saved_inputs():
    cfg = cuprope.RopeConfig(16)
    q = np.zeros((1, 3, 2, 16), np.float32)
    k = np.zeros((1, 3, 1, 16), np.float32)
    with pytest.raises(ValueError, match="overlaps q or k"):
        qknorm.rope_qk_norm_backward(q, k, q.copy(), k.copy(), cfg, out=(q, k.copy()))


# ---------------------------------------------------------------- torch adapter (CPU)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
@pytest.mark.parametrize("order,over", [("norm_then_rope", "head"), ("rope_then_norm", "token")])
def test_torch_adapter_gradients(compiled, order, over):
    from cuprope import torch as ctorch
    g = torch.Generator().manual_seed(0)
    cfg = cuprope.RopeConfig(16, base=100.0)
    q = torch.randn(2, 5, 4, 24, generator=g).requires_grad_()
    k = torch.randn(2, 5, 2, 24, generator=g).requires_grad_()
    wq = torch.randn(24 if over == "head" else 96, generator=g).requires_grad_()
    wk = torch.randn(24 if over == "head" else 48, generator=g).requires_grad_()
    cq, ck = torch.randn(2, 5, 4, 24, generator=g), torch.randn(2, 5, 2, 24, generator=g)
    pos = torch.arange(5) * 3

    def loss_fn(q, k, wq, wk):
        a, b = ctorch.rope_qk_norm(q, k, cfg, q_weight=wq, k_weight=wk, weight_offset=1.0,
                                   order=order, norm_over=over, positions=pos)
        return (a * cq).sum() + (b * ck).sum()

    if compiled:
        loss_fn = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    loss_fn(q, k, wq, wk).backward()
    ang = _angles(cfg, 2, 5, positions=pos.numpy())
    for x, w, c in ((q, wq, cq), (k, wk, ck)):
        x64 = x.detach().double().requires_grad_()
        w64 = w.detach().double().requires_grad_()
        y = torch_qknorm(x64, ang, 16, False, 1.0, w64, 1.0, 1e-6, over, order)
        (y * c.double()).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), x64.grad.numpy(), atol=1e-5 * x64.grad.abs().max().item())
        np.testing.assert_allclose(w.grad.numpy(), w64.grad.numpy(), atol=1e-5 * w64.grad.abs().max().item())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_torch_adapter_gradients_without_weights(compiled):
    """Llama 4's L2 norm has no weight: the backward op returns an empty
    tensor for each missing weight gradient, two tensors, not one twice."""
    from cuprope import torch as ctorch
    g = torch.Generator().manual_seed(1)
    cfg = cuprope.RopeConfig(16, base=100.0, interleaved=True)
    q = torch.randn(2, 5, 4, 16, generator=g).requires_grad_()
    k = torch.randn(2, 5, 2, 16, generator=g).requires_grad_()
    cq, ck = torch.randn(2, 5, 4, 16, generator=g), torch.randn(2, 5, 2, 16, generator=g)
    pos = torch.arange(5) * 3

    def loss_fn(q, k):
        a, b = ctorch.rope_qk_norm(q, k, cfg, norm="l2", order="rope_then_norm", positions=pos)
        return (a * cq).sum() + (b * ck).sum()

    if compiled:
        loss_fn = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    loss_fn(q, k).backward()
    ang = _angles(cfg, 2, 5, positions=pos.numpy())
    for x, c in ((q, cq), (k, ck)):
        x64 = x.detach().double().requires_grad_()
        y = torch_qknorm(x64, ang, 16, True, 1.0, None, 0.0, 1e-6, "head", "rope_then_norm")
        (y * c.double()).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), x64.grad.numpy(),
                                   atol=1e-5 * x64.grad.abs().max().item())


def test_torch_custom_ops_pass_opcheck():
    from cuprope import torch as ctorch
    cfg = cuprope.RopeConfig(16)
    key = cfg.key
    q = torch.randn(2, 5, 3, 16, requires_grad=True)
    k = torch.randn(2, 5, 1, 16, requires_grad=True)
    wq = torch.randn(16, requires_grad=True)
    pos = torch.arange(5, dtype=torch.int32)
    scalars = (key, 2, 1e-6, "rms", 1.0, "norm_then_rope", "head", "exact")
    torch.library.opcheck(torch.ops.cuprope.rope_qk_norm.default,
                          (q, k, wq, None, None, None, pos, None) + scalars)
    torch.library.opcheck(torch.ops.cuprope.rope_qk_norm_backward.default,
                          (q.detach(), k.detach(), torch.randn_like(q), torch.randn_like(k), wq.detach(),
                           None, None, None, pos, None) + scalars)
    assert ctorch.rope_qk_norm is not None


# ---------------------------------------------------------------- whole models, bit for bit
MODEL_MODES = {"qwen3": ("cast_then_weight", 0.0), "gemma3_text": ("weight_then_cast", 1.0)}


class _Fused:
    """Swaps every attention layer of a HF model to the fused call: q_norm and
    k_norm become identities and the modelling module's apply_rotary_pos_emb
    runs cuprope.torch.rope_qk_norm with the layer's norm weights (the layer
    being run is recorded by a forward pre-hook). Undone on exit."""

    def __init__(self, model, model_type):
        self.model, self.rounding, self.offset = model, *MODEL_MODES[model_type]
        self.layers = [m.self_attn for m in model.model.layers]
        self.mod = __import__(type(self.layers[0]).__module__, fromlist=["x"])

    def __enter__(self):
        from cuprope import torch as ctorch
        self.saved = self.mod.apply_rotary_pos_emb
        self.norms = [(a.q_norm, a.k_norm) for a in self.layers]
        current = {}
        self.hooks = [a.register_forward_pre_hook(lambda m, args, c=current: c.update(m=m))
                      for a in self.layers]
        for a, (qn, kn) in zip(self.layers, self.norms):
            a.q_norm, a.k_norm = torch.nn.Identity(), torch.nn.Identity()
            a._cuprope_norms = (qn, kn)

        def fused(q, k, cos, sin, unsqueeze_dim=1):
            qn, kn = current["m"]._cuprope_norms
            eps = getattr(qn, "variance_epsilon", getattr(qn, "eps", None))
            cfg = cuprope.RopeConfig(cos.shape[-1], layout="bhsd")
            return ctorch.rope_qk_norm(q, k, cfg, q_weight=qn.weight, k_weight=kn.weight,
                                       eps=eps, weight_offset=self.offset,
                                       rounding=self.rounding, tables=(cos, sin))
        self.mod.apply_rotary_pos_emb = fused
        return self

    def __exit__(self, *exc):
        self.mod.apply_rotary_pos_emb = self.saved
        for h in self.hooks:
            h.remove()
        for a, (qn, kn) in zip(self.layers, self.norms):
            a.q_norm, a.k_norm = qn, kn
            del a._cuprope_norms


def model_logits_match(model_type, dtype, seed, device="cpu"):
    """Logits of a tiny random HF model with and without the fused call: equal
    in bf16 (squares of bf16 values are exact in fp32, and so, here, are their
    sums, whatever the order). In fp16 a square has 22 bits and PyTorch's order
    of the fp32 sum can round differently in the last bit, now and then
    flipping a q or k element by one ulp: there, equal within 1e-2·max|logit|."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_tiny(model_type)).to(dtype).to(device).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    ids = torch.randint(0, 128, (2, 13), device=device)
    with torch.no_grad():
        ref = model(ids).logits
        with _Fused(model, model_type):
            got = model(ids).logits
    if dtype == torch.bfloat16:
        assert torch.equal(got, ref), (got.float() - ref.float()).abs().max()
    else:
        assert (got.float() - ref.float()).abs().max() <= 1e-2 * ref.float().abs().max()


@pytest.mark.parametrize("model_type", list(MODEL_MODES))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("seed", [0, 1])
def test_model_logits_bit_for_bit(model_type, dtype, seed):
    model_logits_match(model_type, getattr(torch, dtype), seed)


def model_gradients_match(model_type, seed, device="cpu"):
    """bf16: the loss's gradients for every parameter of a tiny random HF model,
    with and without the fused call (model rounding, the model's tables). The
    backward follows autograd op by op, but PyTorch's order of the fp32 sums
    (Σ dn·v per head, Σ over tokens for dw) is its own: where it rounds
    differently a last bit flips and spreads to the layers below. So: every
    gradient within 2^-5·max|grad| of HF's, and most parameters' the same bits.
    Returns the fraction of parameters whose gradients are bit for bit HF's."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_tiny(model_type)).to(torch.bfloat16).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    ids = torch.randint(0, 128, (2, 13), device=device)
    probe = torch.randn(2, 13, 128, device=device, dtype=torch.bfloat16)

    def grads(fused):
        model.zero_grad()
        if fused:
            with _Fused(model, model_type):
                (model(ids).logits * probe).float().sum().backward()
        else:
            (model(ids).logits * probe).float().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    ref, got = grads(False), grads(True)
    assert ref.keys() == got.keys()
    for n in ref:
        err = (got[n].float() - ref[n].float()).abs().max()
        assert err <= 2.0 ** -5 * ref[n].float().abs().max(), (n, err)
    return sum(torch.equal(got[n], ref[n]) for n in ref) / len(ref)


def test_model_gradients_match_hf():
    fractions = [model_gradients_match(m, seed) for m in MODEL_MODES for seed in (0, 1)]
    assert sum(f == 1.0 for f in fractions) >= 2, fractions


def test_host_mirror_is_the_c_struct():
    """cuprope/qknorm/kernels.py QKNORM_ARGS is struct QkNormArgs (kernels/qknorm.cuh)
    field by field: a RopeArgs, then the norm's fields; its rounding codes are
    the reference's roundings in order."""
    from test_launch import c_struct_fields
    from cuprope.rope import args
    from cuprope.qknorm import kernels as qknorm_kernels, launch as ql
    fields = c_struct_fields("qknorm.cuh", "QkNormArgs")
    assert fields[0] == ("r", 1, "RopeArgs")
    assert qknorm_kernels.QKNORM_ARGS.fields == args.ARGS_FIELDS + tuple(fields[1:])
    assert [n for n, c, k in fields[1:] if k == "d"] == ["eps", "weight_offset"]
    assert qknorm_kernels.QKNORM_ARGS.size == args.ARGS.size + 8 * (sum(c for _, c, _ in fields[1:]))
    assert ql.ROUNDINGS == qref.ROUNDINGS


@pytest.mark.parametrize("model_type,rounding,offset", [
    ("qwen3", "cast_then_weight", 0.0), ("gemma3_text", "weight_then_cast", 1.0)])
def test_model_rounding_backward_is_hf_autograd(model_type, rounding, offset):
    hf_backward_match(model_type, rounding, offset)


def hf_backward_match(model_type, rounding, offset, device="cpu"):
    """bf16 q, k, their norm weights: rope_qk_norm_backward in a model mode against
    autograd through HF's q_norm / k_norm and apply_rotary_pos_emb, on 4 seeds: dq,
    dk bit for bit on every seed; the weight gradients (Σ over tokens in fp32,
    PyTorch's order vs ours) bit for bit on most."""
    same_w = 0
    for seed in range(4):
        qp, kp, _, _, wq, wk, cos, sin, eps = _hf_attention_qk(model_type, torch.bfloat16, seed,
                                                               device)
        q0, k0 = qp.clone().requires_grad_(), kp.clone().requires_grad_()
        wq0, wk0 = wq.clone().requires_grad_(), wk.clone().requires_grad_()
        mod_name = "qwen3" if model_type == "qwen3" else "gemma3"
        mod = __import__(f"transformers.models.{mod_name}.modeling_{mod_name}", fromlist=["x"])
        norm_cls = mod.Qwen3RMSNorm if model_type == "qwen3" else mod.Gemma3RMSNorm
        qn = norm_cls(32, eps=eps).to(torch.bfloat16).to(device)
        kn = norm_cls(32, eps=eps).to(torch.bfloat16).to(device)
        qn.weight, kn.weight = torch.nn.Parameter(wq0), torch.nn.Parameter(wk0)
        qh, kh = mod.apply_rotary_pos_emb(qn(q0).transpose(1, 2), kn(k0).transpose(1, 2), cos, sin)
        gq, gk = torch.randn_like(qh), torch.randn_like(kh)
        torch.autograd.backward((qh, kh), (gq, gk))
        dq, dk, dwq, dwk = qknorm.rope_qk_norm_backward(
            qp, kp, gq.transpose(1, 2), gk.transpose(1, 2), cuprope.RopeConfig(32), q_weight=wq,
            k_weight=wk, eps=eps, weight_offset=offset, rounding=rounding, tables=(cos, sin))
        assert torch.equal(dq, q0.grad) and torch.equal(dk, k0.grad), seed
        for got, ref in ((dwq, qn.weight.grad), (dwk, kn.weight.grad)):
            assert (got.float() - ref.float()).abs().max() <= 2.0 ** -7 * ref.float().abs().max()
            same_w += torch.equal(got, ref)
    assert same_w >= 6, same_w


def test_rows_kernel_step_groups_split_a_tokens_heads_at_decode():
    """qknorm_rows_kernel's work items: with fewer tokens than the grid holds
    warps, a token's ceil(H / heads-per-step) steps go to several warps in
    contiguous, non-empty groups; at prefill one warp takes the whole token."""
    from types import SimpleNamespace as NS

    from cuprope.qknorm import launch as ql
    call = NS(layout="thd")
    ins = [NS(shape=(1, 32, 128)), NS(shape=(1, 8, 128))]  # Qwen3-8B: 40 heads of 128
    # bf16 packs of 8: 8 lanes a head, 4 heads a step, 10 steps a token
    assert ql.step_groups(call, ins, 64, 8, 1, 8448) == 10
    assert ql.step_groups(call, ins, 64, 8, 1024, 8448) == 1  # an eighth of the grid's warps
    assert ql.step_groups(call, ins, 64, 8, 16384, 8448) == 1
    for tokens in range(1, 40):
        g = ql.step_groups(call, ins, 64, 8, tokens, 512)
        per = -(-10 // g)
        assert 1 <= g <= 10 and (g - 1) * per < 10 <= g * per  # every group has steps
        assert tokens * g <= max(64, tokens)


def test_general_kernel_unit_groups_split_a_tokens_heads_at_decode():
    """qknorm_kernel (tables, partial rotary, the norm over the token): at
    decode a token's units (heads; a tensor's heads for the norm over the
    token) spread over warps in contiguous non-empty groups instead of one
    warp's chain of all of them; at prefill one warp takes the whole token."""
    from types import SimpleNamespace as NS

    from cuprope.qknorm import launch as ql
    ins = [NS(shape=(1, 16, 128)), NS(shape=(1, 8, 128))]  # Qwen3-0.6B at decode: 24 heads
    head, token = NS(layout="thd", over="head"), NS(layout="thd", over="token")
    assert ql.unit_groups(head, ins, 1, 4224) == 24
    assert ql.unit_groups(token, ins, 1, 4224) == 2
    assert ql.unit_groups(token, [ins[0], NS(shape=(1, 0, 128))], 1, 4224) == 1
    assert ql.unit_groups(head, ins, 16384, 4224) == 1
    for tokens in range(1, 60):
        g = ql.unit_groups(head, ins, tokens, 512)
        per = -(-24 // g)
        assert 1 <= g <= 24 and (g - 1) * per < 24 <= g * per  # every group has units


def test_torch_op_outputs_keep_the_strides_the_fake_kernels_promise():
    """The custom ops' outputs have torch.empty_like's strides of what their
    fake kernels copy (q and k forward, the gradients backward), except where
    a dim has one element: no copy is made for those (inductor ignores them)."""
    torch = pytest.importorskip("torch")
    from cuprope.qknorm import torch as qt
    q = torch.randn(2, 5, 4, 8).transpose(1, 2)       # [B, H, S, D] over [B, S, H, D] memory
    contiguous = q.contiguous()
    fixed = qt._strided_like(contiguous, q)
    assert fixed.stride() == torch.empty_like(q).stride() and torch.equal(fixed, q)
    assert qt._strided_like(q, q) is q
    one = torch.randn(1, 4, 1, 8)                     # decode: S 1
    odd = one.as_strided(one.shape, (999, 8, 777, 1))
    assert qt._strided_like(one, odd) is one          # only size-1 dims' strides differ
