"""The PyTorch traps of the core functions, on CPU tensors (NumPy backend):

1. tensors that require grad (grad mode on) get a differentiable result (the
   ``cuprope.torch`` adapter) or a TypeError naming what to use, never a
   silently detached one; under no_grad / inference_mode nothing changes;
2. in place (``inplace=True`` or ``out=``) into a leaf that requires grad
   raises RuntimeError as torch's own in-place ops, and leaves it untouched;
3. ``torch.compile(fullgraph=True)`` of user code calling the core functions
   traces (the custom ops), with the "eager" backend and with inductor; where
   no custom op serves, a clean graph break.

The GPU versions are in tests/test_gpu_torch.py.
"""
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch tests need torch: pip install torch")
import cuprope  # noqa: E402
from cuprope import lrpe, qknorm, tables  # noqa: E402
from cuprope import torch as ctorch  # noqa: E402

LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
HAS_CC = shutil.which("cc") is not None or shutil.which("g++") is not None
BACKENDS = ["eager", pytest.param("inductor", marks=pytest.mark.skipif(
    not HAS_CC, reason="inductor on the CPU needs a C++ compiler (cc/g++)"))]


def randn(rng, *shape, dtype=torch.float32, grad=False):
    t = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    return t.requires_grad_() if grad else t


def cfg16(**kw):
    return cuprope.RopeConfig(16, base=500.0, **kw)


def tables_for(cfg, s, dtype=torch.float32):
    ang = np.arange(s)[:, None] * np.asarray(cfg.inv_freq)[None]
    emb = np.concatenate([ang, ang], axis=-1)
    return (torch.from_numpy(np.cos(emb)).to(dtype)[None],
            torch.from_numpy(np.sin(emb)).to(dtype)[None])


# ---------------------------------------------------------------- 1. requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_qk_forward_on_tensors_that_require_grad_is_differentiable(dtype, rng):
    cfg = cfg16()
    q, k = randn(rng, 2, 5, 3, 16, dtype=dtype, grad=True), randn(rng, 2, 5, 1, 16, dtype=dtype,
                                                                   grad=True)
    pos = torch.tensor([3, 9, 1, 40, 7])
    a, b = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    assert a.requires_grad and b.requires_grad
    with torch.no_grad():
        a0, b0 = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    assert torch.equal(a.detach(), a0) and torch.equal(b.detach(), b0)
    wq, wk = randn(rng, *q.shape, dtype=dtype), randn(rng, *k.shape, dtype=dtype)
    ((a * wq).float().sum() + (b * wk).float().sum()).backward()
    gq, gk = cuprope.rope_qk_backward(wq, wk, cfg, positions=pos)
    assert torch.equal(q.grad, gq) and torch.equal(k.grad, gk)


def test_only_k_requiring_grad_still_routes(rng):
    cfg = cfg16()
    q, k = randn(rng, 1, 4, 2, 16), randn(rng, 1, 4, 2, 16, grad=True)
    a, b = cuprope.rope_qk_forward(q, k, cfg, offset=5)
    assert b.requires_grad
    b.sum().backward()
    assert k.grad is not None and not torch.equal(k.grad, torch.ones_like(k))


@pytest.mark.parametrize("fn", ["rope_forward", "rope_backward"])
def test_single_tensor_functions_are_differentiable(fn, rng):
    """rope_backward's own gradient is the forward rotation (it is linear)."""
    cfg = cfg16(interleaved=True)
    x = randn(rng, 1, 6, 2, 24, grad=True)
    y = getattr(cuprope, fn)(x, cfg, offset=11)
    assert y.requires_grad
    w = randn(rng, *x.shape)
    (y * w).sum().backward()
    other = cuprope.rope_backward if fn == "rope_forward" else cuprope.rope_forward
    assert torch.equal(x.grad, other(w, cfg, offset=11))


def test_rope_qk_backward_is_differentiable(rng):
    cfg = cfg16()
    gq, gk = randn(rng, 1, 4, 2, 16, grad=True), randn(rng, 1, 4, 1, 16, grad=True)
    dq, dk = cuprope.rope_qk_backward(gq, gk, cfg)
    assert dq.requires_grad and dk.requires_grad
    wq, wk = randn(rng, *gq.shape), randn(rng, *gk.shape)
    ((dq * wq).sum() + (dk * wk).sum()).backward()
    fq, fk = cuprope.rope_qk_forward(wq, wk, cfg)
    assert torch.equal(gq.grad, fq) and torch.equal(gk.grad, fk)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_grad_modes_change_nothing(mode, rng):
    cfg = cfg16()
    q, k = randn(rng, 1, 4, 2, 16, grad=True), randn(rng, 1, 4, 1, 16, grad=True)
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        a, b = cuprope.rope_qk_forward(q, k, cfg)
    assert not a.requires_grad and not b.requires_grad
    ref = cuprope.rope_qk_forward(q.detach(), k.detach(), cfg)
    assert torch.equal(a, ref[0]) and torch.equal(b, ref[1])


def test_in_place_on_a_non_leaf_is_differentiable(rng):
    cfg = cfg16()
    p = randn(rng, 1, 4, 2, 16, grad=True)
    pk = randn(rng, 1, 4, 1, 16, grad=True)
    q, k = p * 2, pk * 3  # non-leaves
    q0 = q.detach().clone()
    res = cuprope.rope_qk_forward(q, k, cfg, inplace=True)
    assert res[0] is q and res[1] is k and q.requires_grad
    assert torch.equal(q.detach(), cuprope.rope_forward(q0, cfg))
    w = randn(rng, *q.shape)
    (q * w).sum().backward()
    assert torch.equal(p.grad, 2 * cuprope.rope_backward(w, cfg))


def test_out_or_stream_with_grad_raise_naming_the_adapter(rng):
    cfg = cfg16()
    q, k = randn(rng, 1, 4, 2, 16, grad=True), randn(rng, 1, 4, 1, 16)
    out = (torch.empty(1, 4, 2, 16), torch.empty(1, 4, 1, 16))
    with pytest.raises(TypeError, match=r"out=.*cuprope\.torch\.rope_qk"):
        cuprope.rope_qk_forward(q, k, cfg, out=out)
    with pytest.raises(TypeError, match=r"stream=.*cuprope\.torch\.rope_qk"):
        cuprope.rope_qk_forward(q, k, cfg, stream=0)
    x = randn(rng, 1, 4, 2, 16, grad=True)
    with pytest.raises(TypeError, match=r"out=.*cuprope\.torch\.rope\("):
        cuprope.rope_forward(x, cfg, out=torch.empty(1, 4, 2, 16))
    with torch.no_grad():
        cuprope.rope_qk_forward(q, k, cfg, out=out)  # fine without autograd
    assert torch.equal(out[0], cuprope.rope_forward(q.detach(), cfg))


def test_qk_tables_are_differentiable_and_single_tensor_tables_raise(rng):
    cfg = cfg16()
    cos, sin = tables_for(cfg, 5)
    q, k = randn(rng, 2, 5, 3, 16, grad=True), randn(rng, 2, 5, 1, 16, grad=True)
    a, b = tables.rope_qk_table_forward(q, k, cos, sin)
    assert a.requires_grad and b.requires_grad
    wq, wk = randn(rng, *q.shape), randn(rng, *k.shape)
    ((a * wq).sum() + (b * wk).sum()).backward()
    gq, gk = tables.rope_qk_table_backward(wq, wk, cos, sin)
    assert torch.equal(q.grad, gq) and torch.equal(k.grad, gk)
    dq, _ = tables.rope_qk_table_backward(q, k, cos, sin)  # the backward, differentiated
    assert dq.requires_grad
    with pytest.raises(TypeError, match=r"cuprope\.torch\.apply_rotary_pos_emb"):
        tables.rope_table_forward(q, cos, sin)
    with pytest.raises(TypeError, match=r"cuprope\.torch\.apply_rotary_pos_emb"):
        tables.rope_qk_table_forward(q.detach(), k.detach(), cos.requires_grad_(), sin)


def test_qknorm_forward_is_differentiable_and_its_backward_raises(rng):
    cfg = cfg16()
    q, k = randn(rng, 2, 5, 3, 16, grad=True), randn(rng, 2, 5, 1, 16, grad=True)
    wq = (1 + 0.1 * randn(rng, 16)).requires_grad_()
    a, b = qknorm.rope_qk_norm_forward(q, k, cfg, q_weight=wq)
    assert a.requires_grad and b.requires_grad
    gq, gk = randn(rng, *q.shape), randn(rng, *k.shape)
    ((a * gq).sum() + (b * gk).sum()).backward()
    dq, dk, dwq, dwk = qknorm.rope_qk_norm_backward(q.detach(), k.detach(), gq, gk, cfg,
                                                    q_weight=wq.detach())
    assert dwk is None
    assert torch.equal(q.grad, dq) and torch.equal(k.grad, dk) and torch.equal(wq.grad, dwq)
    with pytest.raises(TypeError, match=r"cuprope\.torch\.rope_qk_norm"):
        qknorm.rope_qk_norm_backward(q, k, gq, gk, cfg, q_weight=wq)


def test_lrpe_under_autograd_raises_a_type_error(rng):
    x = randn(rng, 1, 4, 2, 8, grad=True)
    with pytest.raises(TypeError, match=r"torch\.autograd\.Function.*no LRPE adapter"):
        lrpe.rotate_1d_forward(x, [0.3, 0.2], act="relu")
    with pytest.raises(TypeError, match=r"rotate_1d_backward"):
        lrpe.rotate_1d_backward(x, randn(rng, *x.shape), [0.3, 0.2], act="relu")
    with torch.no_grad():
        assert not lrpe.rotate_1d_forward(x, [0.3, 0.2], act="relu").requires_grad


def test_ggml_rope_is_differentiable(rng):
    x = randn(rng, 5, 2, 16, grad=True)
    pos = torch.tensor([0, 4, 2, 9, 1], dtype=torch.int32)
    y = cuprope.ggml.rope(x, pos, n_dims=16, mode=cuprope.ggml.NEOX)
    assert y.requires_grad
    w = randn(rng, *x.shape)
    (y * w).sum().backward()
    assert torch.equal(x.grad, cuprope.ggml.rope(w, pos, n_dims=16, mode=cuprope.ggml.NEOX,
                                                 forward=False))


def test_rope_qk_function_apply_keeps_its_six_argument_form(rng):
    cfg = cfg16()
    q, k = randn(rng, 1, 4, 2, 16, grad=True), randn(rng, 1, 4, 1, 16, grad=True)
    a, b = ctorch.RopeQKFunction.apply(q, k, cfg, None, 3, None)
    (a.sum() + b.sum()).backward()
    gq, gk = cuprope.rope_qk_backward(torch.ones_like(q), torch.ones_like(k), cfg, offset=3)
    assert torch.equal(q.grad, gq) and torch.equal(k.grad, gk)


# ---------------------------------------------------------------- 2. in place on a leaf


def _leaf_calls(rng):
    cfg = cfg16()
    cos, sin = tables_for(cfg, 4)
    pos = torch.arange(4, dtype=torch.int32)
    x = randn(rng, 1, 4, 2, 16, grad=True)
    k = randn(rng, 1, 4, 1, 16)
    return x, {
        "rope_forward inplace": lambda: cuprope.rope_forward(x, cfg, inplace=True),
        "rope_backward inplace": lambda: cuprope.rope_backward(x, cfg, inplace=True),
        "rope_qk_forward inplace": lambda: cuprope.rope_qk_forward(x, k, cfg, inplace=True),
        "rope_qk_backward inplace": lambda: cuprope.rope_qk_backward(k, x, cfg, inplace=True),
        "rope_forward out=x": lambda: cuprope.rope_forward(x, cfg, out=x),
        "rope_forward out=leaf": lambda: cuprope.rope_forward(x.detach().clone(), cfg, out=x),
        "rope_qk_forward out=(x, k)": lambda: cuprope.rope_qk_forward(x, k, cfg, out=(x, k)),
        "rope_table_forward inplace": lambda: tables.rope_table_forward(x, cos, sin,
                                                                        inplace=True),
        "rope_qk_table_forward inplace": lambda: tables.rope_qk_table_forward(
            x, k, cos, sin, inplace=True),
        "rope_qk_norm_forward inplace": lambda: qknorm.rope_qk_norm_forward(x, k, cfg,
                                                                           inplace=True),
        "rope_qk_norm_backward out=": lambda: qknorm.rope_qk_norm_backward(
            k.expand(1, 4, 2, 16).contiguous(), k, randn(rng, 1, 4, 2, 16), k, cfg,
            out=(x, torch.empty_like(k))),
        "rotate_1d_forward out=x": lambda: lrpe.rotate_1d_forward(x, [0.1, 0.2], out=x),
        "ggml rope inplace": lambda: cuprope.ggml.rope(x[0], pos, n_dims=16,
                                                       mode=cuprope.ggml.NEOX, inplace=True),
    }


@pytest.mark.parametrize("case", list(_leaf_calls(np.random.default_rng(0))[1]))
def test_in_place_on_a_leaf_that_requires_grad_raises_as_torch(case, rng):
    x, calls = _leaf_calls(rng)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match=LEAF):
        calls[case]()
    assert torch.equal(x.detach(), before), "the leaf was written"


def test_in_place_on_a_view_of_a_leaf_raises_as_torch(rng):
    x = randn(rng, 1, 4, 4, 16, grad=True)
    with pytest.raises(RuntimeError, match="a view of " + LEAF):
        cuprope.rope_forward(x[:, :, :2], cfg16(), inplace=True)


def test_in_place_on_a_leaf_under_no_grad_writes_it(rng):
    cfg = cfg16()
    x = randn(rng, 1, 4, 2, 16, grad=True)
    want = cuprope.rope_forward(x.detach(), cfg)
    with torch.no_grad():
        assert cuprope.rope_forward(x, cfg, inplace=True) is x
    assert torch.equal(x.detach(), want)


# ---------------------------------------------------------------- 3. torch.compile


def _compiled(fn, backend):
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fullgraph_of_core_calls(backend, rng):
    cfg = cfg16()
    q, k = randn(rng, 2, 5, 3, 16), randn(rng, 2, 5, 1, 16)
    pos = torch.tensor([3, 9, 1, 40, 7])
    cos, sin = tables_for(cfg, 5)
    wq = 1 + 0.1 * randn(rng, 16)

    def f(q, k, pos):
        a, b = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
        c, d = cuprope.rope_qk_backward(a, b, cfg, positions=pos, offset=2)
        e = cuprope.rope_forward(q, cfg, offset=7)
        g = cuprope.rope_backward(e, cfg, offset=7)
        h, i = tables.rope_qk_table_forward(q, k, cos, sin)
        j, m = qknorm.rope_qk_norm_forward(q, k, cfg, q_weight=wq, positions=pos)
        n = qknorm.rope_qk_norm_backward(q, k, j, m, cfg, q_weight=wq, positions=pos)
        return a, b, c, d, e, g, h, i, j, m, n[0], n[1], n[2]

    want = f(q, k, pos)
    got = _compiled(f, backend)(q, k, pos)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fullgraph_in_place_and_out(backend, rng):
    cfg = cfg16()
    q, k = randn(rng, 1, 4, 2, 16), randn(rng, 1, 4, 1, 16)

    def f(q, k):
        q, k = q.clone(), k.clone()
        cuprope.rope_qk_forward(q, k, cfg, inplace=True, offset=3)
        o = torch.empty_like(q)
        cuprope.rope_forward(q, cfg, out=o)
        return q, k, o

    want = f(q, k)
    got = _compiled(f, backend)(q, k)
    for w, g in zip(want, got):
        assert torch.equal(g, w)


@pytest.mark.parametrize("backend", ["aot_eager"] + BACKENDS[1:])
def test_compile_fullgraph_gradients_of_core_calls(backend, rng):
    cfg = cfg16()
    q, k = randn(rng, 2, 5, 3, 16, grad=True), randn(rng, 2, 5, 1, 16, grad=True)
    wq, wk = randn(rng, *q.shape), randn(rng, *k.shape)

    def loss(q, k):
        a, b = cuprope.rope_qk_forward(q, k, cfg, offset=4)
        return (a * wq).sum() + (b * wk).sum()

    _compiled(loss, backend)(q, k).backward()
    gq, gk = cuprope.rope_qk_backward(wq, wk, cfg, offset=4)
    torch.testing.assert_close(q.grad, gq, rtol=0, atol=0)
    torch.testing.assert_close(k.grad, gk, rtol=0, atol=0)


def test_compile_keeps_the_position_range_check_at_run_time(rng):
    cfg = cfg16()
    q, k = randn(rng, 1, 3, 2, 16), randn(rng, 1, 3, 1, 16)
    pos = torch.tensor([0, 1, 2 ** 31])

    def f(q, k, pos):
        return cuprope.rope_qk_forward(q, k, cfg, positions=pos)

    with pytest.raises(ValueError, match=r"2\*\*31 - 1"):
        _compiled(f, "eager")(q, k, pos)


def test_compile_without_a_custom_op_is_a_clean_graph_break(rng):
    x = randn(rng, 1, 4, 2, 8)
    pos = torch.arange(4, dtype=torch.int32)

    def f(x):
        y = lrpe.rotate_1d_forward(x, [0.3, 0.2], act="relu")
        return cuprope.ggml.rope(y + 1, pos, n_dims=8, mode=cuprope.ggml.NEOX)[0] * 2

    want = f(x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, backend="eager")(x), want)
    with pytest.raises(Exception, match=r"(?i)disable|skip"):
        _compiled(f, "eager")(x)


# ---------------------------------------------------------------- the inference ops (in place)


def _kv_args(rng, grad_q=False):
    q = randn(rng, 3, 2, 16, grad=grad_q)
    k, v = randn(rng, 3, 1, 16), randn(rng, 3, 1, 16)
    kc, vc = torch.zeros(2, 4, 1, 16), torch.zeros(2, 4, 1, 16)
    pos = torch.tensor([5, 6, 7])
    slots = torch.tensor([1, 2, 6])
    return q, k, v, pos, dict(k_cache=kc, v_cache=vc, slot_mapping=slots)


def test_kv_append_on_tensors_that_require_grad_raises(rng):
    from cuprope import kvcache
    cfg = cfg16()
    q, k, v, pos, kw = _kv_args(rng, grad_q=True)
    before = q.detach().clone()
    with pytest.raises(RuntimeError, match=LEAF):
        kvcache.rope_append_kv(q, k, v, cfg, pos, **kw)
    assert torch.equal(q.detach(), before) and not kw["k_cache"].any()
    with pytest.raises(TypeError, match=r"rope_append_kv\(\) is not differentiable"):
        kvcache.rope_append_kv(q * 1, k, v, cfg, pos, **kw)
    with torch.no_grad():
        kvcache.rope_append_kv(q, k, v, cfg, pos, **kw)
    assert torch.equal(q.detach(), cuprope.rope_forward(before[None], cfg, positions=pos[None])[0])


def test_kv_append_under_compile_is_a_graph_break(rng):
    from cuprope import kvcache
    cfg = cfg16()
    q, k, v, pos, kw = _kv_args(rng)

    def f(q):
        q = q.clone()
        kvcache.rope_append_kv(q, k, v, cfg, pos, **kw)
        return q * 2

    want = f(q)
    kw["k_cache"].zero_()
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, backend="eager")(q), want)
    assert kw["k_cache"].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cos_sin_cache_rotation_compiles_fullgraph(backend, rng):
    from cuprope import cos_sin_cache as csc
    cfg = cfg16()
    ang = np.arange(64)[:, None] * np.asarray(cfg.inv_freq)[None]
    table = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], -1)).float()
    q, k = randn(rng, 5, 3, 16), randn(rng, 5, 1, 16)
    pos = torch.tensor([3, 9, 1, 40, 7])

    def f(q, k):
        q, k = q.clone(), k.clone()
        csc.rotary_embedding(pos, q, k, 16, table, True)
        return q, k

    want = f(q, k)
    got = _compiled(f, backend)(q, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    leaf = q.clone().requires_grad_()
    with pytest.raises(RuntimeError, match=LEAF):
        csc.rotary_embedding(pos, leaf, None, 16, table, True)
