"""The PyTorch traps of the core functions on CUDA tensors (the CPU versions:
tests/test_torch_traps.py): tensors that require grad get a differentiable
result, in place on a leaf that requires grad raises as torch does, and
torch.compile(fullgraph=True) with the default inductor backend traces the
core calls (the custom ops) without reading device positions back."""
import numpy as np
import pytest

import cuprope
from conftest import GPU_TESTS
from cuprope import qknorm

pytestmark = GPU_TESTS

LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
DTYPES = ["bfloat16", "float16", "float32"]


def cuda(rng, *shape, dtype="bfloat16", grad=False):
    import torch
    t = torch.from_numpy(rng.standard_normal(shape)).to(device="cuda", dtype=getattr(torch, dtype))
    return t.requires_grad_() if grad else t


@pytest.mark.parametrize("dtype", DTYPES)
def test_core_call_on_cuda_tensors_that_require_grad_is_differentiable(dtype, rng):
    import torch
    cfg = cuprope.RopeConfig(128)
    q, k = cuda(rng, 2, 33, 8, 128, dtype=dtype, grad=True), cuda(rng, 2, 33, 2, 128, dtype=dtype,
                                                                   grad=True)
    pos = torch.tensor(rng.integers(0, 70000, 33), dtype=torch.int32, device="cuda")
    a, b = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    assert a.requires_grad and b.requires_grad
    with torch.no_grad():
        a0, b0 = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
    assert torch.equal(a.detach(), a0) and torch.equal(b.detach(), b0)
    wq, wk = cuda(rng, *q.shape, dtype=dtype), cuda(rng, *k.shape, dtype=dtype)
    ((a * wq).float().sum() + (b * wk).float().sum()).backward()
    gq, gk = cuprope.rope_qk_backward(wq, wk, cfg, positions=pos)
    assert torch.equal(q.grad, gq) and torch.equal(k.grad, gk)


def test_in_place_on_a_cuda_leaf_that_requires_grad_raises(rng):
    import torch
    cfg = cuprope.RopeConfig(64)
    q, k = cuda(rng, 1, 16, 4, 64, grad=True), cuda(rng, 1, 16, 1, 64)
    before = q.detach().clone()
    with pytest.raises(RuntimeError, match=LEAF):
        cuprope.rope_qk_forward(q, k, cfg, inplace=True)
    torch.cuda.synchronize()
    assert torch.equal(q.detach(), before)
    with torch.no_grad():
        cuprope.rope_qk_forward(q, k, cfg, inplace=True)
    assert not torch.equal(q.detach(), before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_compile_fullgraph_inductor_of_core_calls_does_not_sync(dtype, rng):
    import torch
    cfg = cuprope.RopeConfig(128, base=500000.0)
    q, k = cuda(rng, 2, 40, 8, 128, dtype=dtype), cuda(rng, 2, 40, 2, 128, dtype=dtype)
    pos = torch.tensor(rng.integers(0, 2 ** 20, (2, 40)), dtype=torch.int64, device="cuda")
    wq = (1 + 0.1 * cuda(rng, 128, dtype=dtype))

    def f(q, k, pos):
        a, b = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
        c = cuprope.rope_forward(q * 2, cfg, positions=pos)
        d, e = qknorm.rope_qk_norm_forward(q, k, cfg, q_weight=wq, positions=pos)
        return a + 1, b, c, d, e

    want = f(q, k, pos)
    torch._dynamo.reset()
    g = torch.compile(f, fullgraph=True)
    g(q, k, pos)  # compile and warm up (tables on the device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a read-back of pos would raise
    try:
        got = g(q, k, pos)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for w, x in zip(want, got):
        assert torch.equal(x, w)


def test_compile_fullgraph_inductor_gradients_bf16(rng):
    import torch
    cfg = cuprope.RopeConfig(128)
    q, k = cuda(rng, 2, 24, 8, 128, grad=True), cuda(rng, 2, 24, 2, 128, grad=True)
    pos = torch.tensor(rng.integers(0, 9000, 24), dtype=torch.int32, device="cuda")
    wq, wk = cuda(rng, *q.shape), cuda(rng, *k.shape)

    def loss(q, k):
        a, b = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
        return (a * wq).float().sum() + (b * wk).float().sum()

    torch._dynamo.reset()
    torch.compile(loss, fullgraph=True)(q, k).backward()
    gq, gk = cuprope.rope_qk_backward(wq, wk, cfg, positions=pos)
    assert torch.equal(q.grad, gq) and torch.equal(k.grad, gk)
    assert np.isfinite(q.grad.float().cpu().numpy()).all()
