"""The torch adapter on CPU tensors (NumPy backend): autograd against torch's own
autograd through the HF formula, the custom ops under opcheck and
torch.compile(fullgraph=True). The same tests run on CUDA tensors when a GPU is
there."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
import cuprope  # noqa: E402
from cuprope import torch as ctorch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and cuprope.gpu_available() else [])


def hf_reference(q, k, inv_freq, pos):
    """HF transformers' formula in float64 torch ops (autograd-capable)."""
    ang = pos.to(torch.float64)[:, None] * torch.tensor(np.array(inv_freq), dtype=torch.float64)[None]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

    def rot(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_gradients_match_torch_autograd_of_the_hf_formula(device, compiled):
    g = torch.Generator().manual_seed(0)
    cfg = cuprope.RopeConfig(32, base=500.0)
    q = torch.randn(2, 7, 4, 32, generator=g).to(device).requires_grad_()
    k = torch.randn(2, 7, 2, 32, generator=g).to(device).requires_grad_()
    pos = torch.arange(7, dtype=torch.int64).to(device) * 13
    wq, wk = torch.randn(2, 7, 4, 32, generator=g).to(device), torch.randn(2, 7, 2, 32, generator=g).to(device)

    def loss_fn(q, k):
        a, b = ctorch.rope_qk(q, k, cfg, positions=pos)
        return (a * wq).sum() + (b * wk).sum()

    if compiled:
        loss_fn = torch.compile(loss_fn, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    loss = loss_fn(q, k)
    loss.backward()
    q64, k64 = q.detach().double().cpu().requires_grad_(), k.detach().double().cpu().requires_grad_()
    a, b = hf_reference(q64, k64, cfg.inv_freq, pos.cpu())
    ref_loss = (a * wq.double().cpu()).sum() + (b * wk.double().cpu()).sum()
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 1e-4 * abs(ref_loss.item()) + 1e-4
    np.testing.assert_allclose(q.grad.cpu().numpy(), q64.grad.numpy(), atol=2e-6, rtol=0)
    np.testing.assert_allclose(k.grad.cpu().numpy(), k64.grad.numpy(), atol=2e-6, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_single_tensor_rope_backward_is_the_transpose(device):
    cfg = cuprope.RopeConfig(16, interleaved=True)
    x = torch.randn(1, 5, 3, 24, device=device, requires_grad=True)
    w = torch.randn(1, 5, 3, 24, device=device)
    (ctorch.rope(x, cfg, offset=9) * w).sum().backward()
    expect = cuprope.rope_backward(w, cfg, offset=9)
    assert torch.allclose(x.grad, expect, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_custom_ops_pass_opcheck(device):
    cfg = cuprope.RopeConfig(16)
    key = cfg.key  # the integer key the custom ops take
    q = torch.randn(2, 5, 3, 16, device=device, requires_grad=True)
    k = torch.randn(2, 5, 1, 16, device=device, requires_grad=True)
    pos = torch.arange(5, device=device, dtype=torch.int32)
    torch.library.opcheck(torch.ops.cuprope.rope_qk.default, (q, k, key, pos, None, 3, False))
    torch.library.opcheck(torch.ops.cuprope.rope.default, (q, key, None, None, 0, True))


def test_config_must_be_a_ropeconfig():
    with pytest.raises(TypeError, match="config"):
        ctorch.rope(torch.zeros(1, 2, 1, 4), object())
