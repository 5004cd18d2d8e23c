"""The cos/sin-table angle source (cuprope.tables) and the HF drop-in
``cuprope.torch.apply_rotary_pos_emb``: bit for bit against HF's formula run by
PyTorch itself (outputs and autograd gradients), on CPU tensors (NumPy
emulation) and, where a GPU is visible, on CUDA tensors (the kernel). A small
HF Llama built from a config runs with and without the drop-in when
transformers is installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
import cuprope  # noqa: E402
from cuprope import reference, tables  # noqa: E402
from cuprope import torch as ctorch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and cuprope.gpu_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# ---------------------------------------------------------------- HF's formula, run by torch

def rotate_half(x, interleaved=False):
    if interleaved:  # HF's rotate_every_two
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def hf_rotate(x, cos, sin, unsqueeze_dim=None, interleaved=False):
    """``x * cos + rotate_half(x) * sin`` on the first R dims, the rest passed on."""
    if unsqueeze_dim is not None:
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    r = cos.shape[-1]
    xr = x[..., :r]
    y = xr * cos + rotate_half(xr, interleaved) * sin
    return torch.cat((y, x[..., r:]), dim=-1) if r < x.shape[-1] else y


def hf_tables(b, s, r, dtype, device, interleaved=False, base=10000.0, seed=0, scaling=1.0):
    """cos, sin [B, S, R] as HF's LlamaRotaryEmbedding builds them (float32
    angles from per-sequence positions, cast to the activations' dtype)."""
    g = torch.Generator().manual_seed(seed)
    inv_freq = 1.0 / (base ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
    pos = torch.randint(0, 5000, (b, s), generator=g).to(torch.float32)
    freqs = pos[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * scaling).to(dtype).to(device), (emb.sin() * scaling).to(dtype).to(device))


def randn(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def assert_bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if not torch.equal(a, b):
        diff = (a.float() - b.float()).abs()
        raise AssertionError(f"not bit-identical: {int((a != b).sum())} of {a.numel()} differ, "
                             f"max |diff| {float(diff.max()):.3g}")


# ---------------------------------------------------------------- the drop-in

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_dropin_equals_hf_bit_for_bit_with_gradients(device, dtype, unsqueeze_dim):
    b, s, hq, hk, d = 2, 37, 6, 2, 64
    cos, sin = hf_tables(b, s, d, dtype, device, seed=1, scaling=1.25)
    # q, k as HF builds them: a projection viewed [B, S, H, D], transposed for unsqueeze_dim=1
    q0 = randn((b, s, hq, d), dtype, device, 2)
    k0 = randn((b, s, hk, d), dtype, device, 3)
    if unsqueeze_dim == 1:
        q0, k0 = q0.transpose(1, 2), k0.transpose(1, 2)
    wq, wk = randn(q0.shape, dtype, device, 4), randn(k0.shape, dtype, device, 5)

    def run(fn):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        qo, ko = fn(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        ((qo * wq).sum() + (ko * wk).sum()).backward()
        return qo.detach(), ko.detach(), q.grad, k.grad

    def hf(q, k, cos, sin, unsqueeze_dim):
        return hf_rotate(q, cos, sin, unsqueeze_dim), hf_rotate(k, cos, sin, unsqueeze_dim)

    ours, theirs = run(ctorch.apply_rotary_pos_emb), run(hf)
    for a, t in zip(ours, theirs):
        assert_bitwise(a, t)


@pytest.mark.parametrize("device", DEVICES)
def test_dropin_without_grad_and_under_no_grad(device):
    cos, sin = hf_tables(1, 9, 32, torch.bfloat16, device)
    q = randn((1, 4, 9, 32), torch.bfloat16, device, 6)
    k = randn((1, 2, 9, 32), torch.bfloat16, device, 7)
    ref = (hf_rotate(q, cos, sin, 1), hf_rotate(k, cos, sin, 1))
    for a, t in zip(ctorch.apply_rotary_pos_emb(q, k, cos, sin), ref):
        assert_bitwise(a, t)
    qg = q.clone().requires_grad_()
    with torch.no_grad():
        out = ctorch.apply_rotary_pos_emb(qg, k, cos, sin)
    assert not out[0].requires_grad
    assert_bitwise(out[0], ref[0])


@pytest.mark.parametrize("device", DEVICES)
def test_dropin_falls_back_to_hf_where_the_kernel_does_not_apply(device):
    """cos/sin that need gradients, or of another dtype than q: HF's own
    formula runs, so gradients reach cos/sin and dtypes promote as in HF."""
    cos, sin = hf_tables(1, 5, 16, torch.float32, device)
    q = randn((1, 2, 5, 16), torch.float32, device, 8).requires_grad_()
    k = randn((1, 1, 5, 16), torch.float32, device, 9)
    c = cos.clone().requires_grad_()
    qo, ko = ctorch.apply_rotary_pos_emb(q, k, c, sin)
    (qo.sum() + ko.sum()).backward()
    c2 = cos.clone().requires_grad_()
    q2 = q.detach().clone().requires_grad_()
    (hf_rotate(q2, c2, sin, 1).sum() + hf_rotate(k, c2, sin, 1).sum()).backward()
    assert_bitwise(c.grad, c2.grad)
    assert_bitwise(q.grad, q2.grad)
    qh = q.detach().to(torch.bfloat16)
    out = ctorch.apply_rotary_pos_emb(qh, k.to(torch.bfloat16), cos, sin)
    assert out[0].dtype == torch.float32  # promoted, as HF's would be
    assert_bitwise(out[0], hf_rotate(qh, cos, sin, 1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_tables", [False, True], ids=["kernel", "hf-formula"])
def test_dropin_with_tables_narrower_than_the_head_raises_as_hf_does(device, grad_tables):
    """Llama's formula cannot broadcast cos/sin of R < D dims against a D-dim
    head (RuntimeError); the drop-in raises the same type, naming partial_rotary."""
    cos, sin = hf_tables(1, 5, 8, torch.float32, device)
    cos = cos.clone().requires_grad_(grad_tables)
    q = randn((1, 2, 5, 16), torch.float32, device, 12)
    k = randn((1, 1, 5, 16), torch.float32, device, 13)
    with pytest.raises(RuntimeError):   # Llama's formula
        q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
    try:
        from transformers.models.llama import modeling_llama
    except ImportError:
        pass
    else:
        with pytest.raises(RuntimeError):   # Llama's own function
            modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    with pytest.raises(RuntimeError, match=r"^cos and sin have 8 dims but q's head has 16: HF's "
                                           r"apply_rotary_pos_emb rotates the whole head \(for "
                                           r"partial rotary, .* pass partial_rotary=True\)$"):
        ctorch.apply_rotary_pos_emb(q, k, cos, sin)
    wide_c, wide_s = hf_tables(1, 5, 32, torch.float32, device)
    for partial in (False, True):
        with pytest.raises(RuntimeError, match=r"^cos and sin have 32 dims but q's head has 16: "
                                               r"HF's apply_rotary_pos_emb rotates the whole "
                                               r"head$"):
            ctorch.apply_rotary_pos_emb(q, k, wide_c, wide_s, partial_rotary=partial)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("grad_tables", [False, True], ids=["kernel", "hf-formula"])
def test_dropin_partial_rotary_rotates_the_first_r_dims_bit_for_bit(device, dtype, grad_tables):
    """partial_rotary=True: HF's formula on the first R dims, the rest concatenated back (as
    GPT-NeoX's apply_rotary_pos_emb), outputs and gradients bit for bit."""
    cos, sin = hf_tables(2, 7, 16, dtype, device, seed=5)
    q0 = randn((2, 3, 7, 40), dtype, device, 14)
    k0 = randn((2, 1, 7, 40), dtype, device, 15)
    wq, wk = randn(q0.shape, dtype, device, 16), randn(k0.shape, dtype, device, 17)

    def run(fn):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        c = cos.clone().requires_grad_(grad_tables)
        qo, ko = fn(q, k, c, sin)
        ((qo * wq).sum() + (ko * wk).sum()).backward()
        return qo.detach(), ko.detach(), q.grad, k.grad

    ours = run(lambda q, k, c, s: ctorch.apply_rotary_pos_emb(q, k, c, s, partial_rotary=True))
    theirs = run(lambda q, k, c, s: (hf_rotate(q, c, s, 1), hf_rotate(k, c, s, 1)))
    assert not torch.equal(ours[0][..., :16], q0[..., :16])
    assert torch.equal(ours[0][..., 16:], q0[..., 16:])
    for a, t in zip(ours, theirs):
        assert_bitwise(a, t)
    try:
        from transformers.models.gpt_neox import modeling_gpt_neox
    except ImportError:
        return
    for a, t in zip(ours, run(modeling_gpt_neox.apply_rotary_pos_emb)):
        assert_bitwise(a, t)


def test_dropin_rejects_an_unknown_unsqueeze_dim():
    cos, sin = hf_tables(1, 3, 8, torch.float32, "cpu")
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        ctorch.apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=3)


@pytest.mark.parametrize("device", DEVICES)
def test_dropin_under_torch_compile_fullgraph(device):
    cos, sin = hf_tables(2, 11, 32, torch.float32, device, seed=3)
    q0 = randn((2, 4, 11, 32), torch.float32, device, 10)
    k0 = randn((2, 2, 11, 32), torch.float32, device, 11)

    def f(q, k, cos, sin):
        a, b = ctorch.apply_rotary_pos_emb(q, k, cos, sin)
        return (a * 2.0).sum() + (b * 3.0).sum()

    torch._dynamo.reset()
    fc = torch.compile(f, fullgraph=True, backend="aot_eager")
    q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    fc(q, k, cos, sin).backward()
    q2, k2 = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    f(q2, k2, cos, sin).backward()
    assert_bitwise(q.grad, q2.grad)
    assert_bitwise(k.grad, k2.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_table_custom_op_passes_opcheck(device):
    cos, sin = hf_tables(1, 6, 16, torch.float32, device, seed=4)
    q = randn((1, 6, 3, 16), torch.float32, device, 12).requires_grad_()
    k = randn((1, 6, 1, 16), torch.float32, device, 13).requires_grad_()
    torch.library.opcheck(torch.ops.cuprope.rope_qk_table.default, (q, k, cos, sin, "bshd", False, False))


# ---------------------------------------------------------------- the array API

LAYOUT_CASES = [("bshd", False, 64, 64), ("bhsd", False, 48, 64), ("thd", True, 32, 64),
                ("bshd", True, 64, 80), ("bhsd", True, 16, 16),
                # more chunks per head than lanes: each lane walks several
                ("bshd", False, 1024, 1024), ("bshd", True, 512, 1024)]


def _table_inputs(layout, b, s, h, d, r, dtype, device, interleaved, seed, batch_tables=True):
    cos, sin = hf_tables(b if batch_tables else 1, s, r, dtype, device, interleaved, seed=seed)
    if layout == "thd":
        cos, sin = cos.reshape(-1, r), sin.reshape(-1, r)
        if not batch_tables:
            cos, sin = cos[:s], sin[:s]
        shape = (s, h, d)
    elif layout == "bshd":
        shape = (b, s, h, d)
    else:
        shape = (b, h, s, d)
    return randn(shape, dtype, device, seed + 1), cos, sin


def _hf_on_layout(x, cos, sin, layout, interleaved, backward=False):
    """HF's formula (or its autograd gradient) with tables [B|1, S, R] / [T, R]."""
    c = cos if cos.dim() == 3 else cos[None]
    s_ = sin if sin.dim() == 3 else sin[None]
    if layout == "thd":
        x = x[None]
    unsq = 1 if layout == "bhsd" else 2
    if backward:
        xr = x.detach().clone().requires_grad_()
        hf_rotate(xr, c, s_, unsq, interleaved).backward(x.detach())  # g = x: the gradient of <f(z), g>
        y = xr.grad
    else:
        y = hf_rotate(x, c, s_, unsq, interleaved)
    return y[0] if layout == "thd" else y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout,interleaved,r,d", LAYOUT_CASES)
def test_forward_and_backward_equal_hf_formula_bitwise(device, dtype, layout, interleaved, r, d):
    b, s, hq, hk = (1 if layout == "thd" else 3), 19, 5, 3
    q, cos, sin = _table_inputs(layout, b, s, hq, d, r, dtype, device, interleaved, 20,
                                batch_tables=layout == "bshd")
    k = _table_inputs(layout, b, s, hk, d, r, dtype, device, interleaved, 30)[0]
    qo, ko = tables.rope_qk_table_forward(q, k, cos, sin, layout=layout, interleaved=interleaved)
    assert_bitwise(qo, _hf_on_layout(q, cos, sin, layout, interleaved))
    assert_bitwise(ko, _hf_on_layout(k, cos, sin, layout, interleaved))
    dq, dk = tables.rope_qk_table_backward(q, k, cos, sin, layout=layout, interleaved=interleaved)
    assert_bitwise(dq, _hf_on_layout(q, cos, sin, layout, interleaved, backward=True))
    assert_bitwise(dk, _hf_on_layout(k, cos, sin, layout, interleaved, backward=True))
    one = tables.rope_table_forward(k, cos, sin, layout=layout, interleaved=interleaved)
    assert_bitwise(one, ko)


@pytest.mark.parametrize("device", DEVICES)
def test_tables_from_a_rope_config_agree_with_the_angle_source(device):
    """Tables holding cos/sin of the same angles give the float64 rotation
    within the extra roundings of HF's formula (two products and a sum)."""
    b, s, h, d = 2, 33, 4, 64
    cfg = cuprope.RopeConfig(d)
    pos = np.arange(s) + 1000
    ang = reference.pair_angles(reference.token_positions(b, s, positions=pos), cfg.inv_freq)[:, :, 0]
    emb = np.ascontiguousarray(np.concatenate([ang, ang], axis=-1))
    cos = torch.from_numpy(np.cos(emb).astype(np.float32)).to(device)
    sin = torch.from_numpy(np.sin(emb).astype(np.float32)).to(device)
    x = randn((b, s, h, d), torch.float32, device, 40)
    y = tables.rope_table_forward(x, cos, sin)
    ref = cuprope.rope_forward(x.cpu(), cfg, positions=torch.from_numpy(pos))
    err = (y.cpu().double() - ref.double()).abs().max().item()
    assert 0 < err < 4e-6 * x.abs().max().item()


@pytest.mark.parametrize("device", DEVICES)
def test_out_and_inplace(device):
    q, cos, sin = _table_inputs("bshd", 2, 7, 3, 32, 32, torch.bfloat16, device, False, 50)
    k = _table_inputs("bshd", 2, 7, 1, 32, 32, torch.bfloat16, device, False, 60)[0]
    want = tables.rope_qk_table_forward(q, k, cos, sin)
    outs = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
    got = tables.rope_qk_table_forward(q, k, cos, sin, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    assert_bitwise(outs[0], want[0])
    assert_bitwise(outs[1], want[1])
    q2, k2 = q.clone(), k.clone()
    tables.rope_qk_table_forward(q2, k2, cos, sin, inplace=True)
    assert_bitwise(q2, want[0])
    assert_bitwise(k2, want[1])


def test_numpy_arrays_return_numpy():
    cos, sin = hf_tables(1, 4, 8, torch.float32, "cpu")
    x = np.random.default_rng(0).standard_normal((1, 4, 2, 8)).astype(np.float32)
    y = tables.rope_table_forward(x, cos.numpy(), sin.numpy())
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    assert np.array_equal(y, hf_rotate(torch.from_numpy(x), cos, sin, 2).numpy())


@pytest.mark.parametrize("change,err,match", [
    (lambda c, s, x: (c.double(), s.double(), x), TypeError, "dtype"),
    (lambda c, s, x: (c[..., :7], s[..., :7], x), ValueError, "even"),
    (lambda c, s, x: (torch.cat([c, c], -1), torch.cat([s, s], -1), x), ValueError, "rotary_dim"),
    (lambda c, s, x: (c[:, :3], s[:, :3], x), ValueError, r"\[B, S, R\]"),
    (lambda c, s, x: (c, s[:1], x), ValueError, "same shape"),
    (lambda c, s, x: (c, s.transpose(0, 1).contiguous().transpose(0, 1), x), ValueError,
     "same strides"),
    (lambda c, s, x: (c[..., ::2], s[..., ::2], x), ValueError, "contiguous"),
    (lambda c, s, x: (c, s, x[..., :5]), ValueError, "rotary_dim"),
])
def test_bad_tables_are_rejected(change, err, match):
    cos, sin = hf_tables(2, 4, 8, torch.float32, "cpu")
    x = torch.randn(2, 4, 3, 8)
    c, s, x = change(cos, sin, x)
    with pytest.raises(err, match=match):
        tables.rope_table_forward(x, c, s)


def test_unknown_layout_is_rejected():
    cos, sin = hf_tables(1, 4, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match="layout"):
        tables.rope_table_forward(torch.randn(1, 4, 2, 8), cos, sin, layout="sbhd")


# ---------------------------------------------------------------- GPU only

gpu = pytest.mark.skipif("cuda" not in DEVICES, reason="no CUDA GPU visible (CuPy absent or no device)")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_subnormal_products_are_kept_like_torch(dtype):
    """CuPy compiles with -ftz=true; the table path keeps subnormal products
    and sums as PyTorch does (values ~1e-39)."""
    cos, sin = hf_tables(1, 16, 32, dtype, "cuda", seed=7)
    q = randn((1, 16, 4, 32), dtype, "cuda", 70) * 1e-35
    k = randn((1, 16, 2, 32), dtype, "cuda", 71) * 1e-36
    assert (hf_rotate(q, cos, sin, 2).abs() < 1.1754944e-38).any()  # subnormal results occur
    qo, ko = tables.rope_qk_table_forward(q, k, cos, sin)
    assert_bitwise(qo, hf_rotate(q, cos, sin, 2))
    assert_bitwise(ko, hf_rotate(k, cos, sin, 2))


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout,interleaved,r,d", LAYOUT_CASES)
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "in-place"])
def test_few_tokens_take_the_decode_rows_bit_for_bit(monkeypatch, decode_taken, dtype, layout,
                                                     interleaved, r, d, inplace):
    """A table call of few tokens (decode steps: B 5 S 1, B 3 S 4, 7 thd
    tokens; tables per sequence and broadcast) launches the decode rows
    (rope_decode_kernel, KV_TABLES_T): forward and backward equal the
    general kernel's (decode.MAX_TOKENS 0) and HF's formula bit for bit."""
    from cuprope.rope import decode
    from cuprope.rope import table_call
    taken = decode_taken

    def call(fn, q, k, cos, sin):
        if inplace:
            q, k = q.clone(), k.clone()
            fn(q, k, cos, sin, layout=layout, interleaved=interleaved, inplace=True)
            return q, k
        return fn(q, k, cos, sin, layout=layout, interleaved=interleaved)

    shapes = [(1, 7)] if layout == "thd" else [(5, 1), (3, 4)]
    for (b, s), batch_tables in [(bs, bt) for bs in shapes for bt in (True, False)]:
        q, cos, sin = _table_inputs(layout, b, s, 5, d, r, dtype, "cuda", interleaved, 60,
                                    batch_tables=batch_tables)
        k = _table_inputs(layout, b, s, 3, d, r, dtype, "cuda", interleaved, 61)[0]
        for fn, backward in ((tables.rope_qk_table_forward, False),
                             (tables.rope_qk_table_backward, True)):
            table_call.clear_launches()
            rows = call(fn, q, k, cos, sin)
            assert taken and taken[-1], "the decode rows were not taken"
            n = len(taken)
            with monkeypatch.context() as m:
                m.setattr(decode, "MAX_TOKENS", 0)
                table_call.clear_launches()
                general = call(fn, q, k, cos, sin)
                table_call.clear_launches()
            assert len(taken) == n  # the general call planned no decode launch
            for got, ref, x in zip(rows, general, (q, k)):
                assert_bitwise(got, ref)
                assert_bitwise(got, _hf_on_layout(x, cos, sin, layout, interleaved, backward))


@gpu
def test_fused_qkv_slices_and_repeated_calls_take_the_same_plan():
    """Strided q/k views of one fused projection; a second call with new data
    (the cached plan) is still exact, and outputs are poisoned first."""
    b, s, hq, hk, d = 2, 300, 8, 2, 128
    qkv = randn((b, s, hq + 2 * hk, d), torch.bfloat16, "cuda", 80)
    q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]
    cos, sin = hf_tables(b, s, d, torch.bfloat16, "cuda", seed=8)
    for rep in range(2):
        if rep:
            qkv.copy_(randn(qkv.shape, torch.bfloat16, "cuda", 81))
        outs = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
        tables.rope_qk_table_forward(q, k, cos, sin, out=outs)
        assert_bitwise(outs[0], hf_rotate(q, cos, sin, 2))
        assert_bitwise(outs[1], hf_rotate(k, cos, sin, 2))
        qo, ko = ctorch.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        assert_bitwise(qo, outs[0])


@gpu
def test_cupy_arrays_and_misaligned_tables():
    import cupy
    cos, sin = hf_tables(1, 10, 16, torch.float16, "cuda", seed=9)
    big_c = torch.empty(1, 10, 17, dtype=torch.float16, device="cuda")
    big_s = torch.empty_like(big_c)
    big_c[..., 1:], big_s[..., 1:] = cos, sin
    c, s_ = big_c[..., 1:], big_s[..., 1:]            # 2-byte aligned rows: vector width 1
    x = randn((1, 10, 3, 16), torch.float16, "cuda", 90)
    y = tables.rope_table_forward(cupy.asarray(x), cupy.asarray(c), cupy.asarray(s_))
    assert isinstance(y, cupy.ndarray)
    assert_bitwise(torch.as_tensor(y, device="cuda"), hf_rotate(x, cos, sin, 2))


# ---------------------------------------------------------------- a small HF Llama

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_small_hf_llama_gives_identical_logits_and_gradients(device, dtype, monkeypatch):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    from transformers.models.llama import modeling_llama
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rope_theta=500000.0, attn_implementation="eager")
    torch.manual_seed(0)
    model = modeling_llama.LlamaForCausalLM(config).to(device=device, dtype=dtype)
    embeds = randn((2, 45, 128), dtype, device, 100)
    weights = randn((2, 45, 97), dtype, device, 101)

    def run():
        model.zero_grad(set_to_none=True)
        e = embeds.clone().requires_grad_()
        logits = model(inputs_embeds=e).logits
        (logits * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        assert len(grads) >= 2 * 9  # every layer's weights (embed_tokens is bypassed)
        return logits.detach(), e.grad, grads

    base = run()
    calls = []

    def ours(*args, **kw):
        calls.append(1)
        return ctorch.apply_rotary_pos_emb(*args, **kw)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", ours)
    swapped = run()
    assert len(calls) == 2  # one per layer: the switch took effect
    assert_bitwise(swapped[0], base[0])
    assert_bitwise(swapped[1], base[1])
    assert swapped[2].keys() == base[2].keys()
    for n in base[2]:
        assert_bitwise(swapped[2][n], base[2][n])
