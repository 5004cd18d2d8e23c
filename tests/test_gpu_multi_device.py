"""Tensors on the second GPU: every public function called on
``cuda:1`` tensors from a process whose current device is 0 runs on GPU 1.

For each call: the outputs are on cuda:1 and equal, bit for bit, the same call
made with ``torch.cuda.device(1)`` current; every kernel and copy the CUDA
profiler (CUPTI, which sees CuPy's and the driver's launches too) records
during the call is on device 1; the current device (torch's and CuPy's) is
still 0 afterwards; and the result is close to the same call on host tensors
(cuprope's NumPy backend), so a call that did nothing fails. Skipped below two
GPUs. ``test_cases_run_on_the_host_backend`` runs the same cases on host
tensors (no GPU needed) to keep the cases themselves working.
"""
import numpy as np
import pytest

from conftest import GPU_TESTS, HAS_TORCH

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
import cuprope  # noqa: E402
import cuprope.torch as ctorch  # noqa: E402
from cuprope import ggml, kvcache, lrpe, qknorm, tables  # noqa: E402

TWO_GPUS = GPU_TESTS + [pytest.mark.skipif(
    not (HAS_TORCH and torch.cuda.is_available() and torch.cuda.device_count() >= 2),
    reason="needs two CUDA GPUs visible to torch")]

T_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Inputs:
    """Deterministic random inputs (never zeros) on one device, the same
    values for every device."""

    def __init__(self, dev, seed):
        self.dev, self.rng = dev, np.random.default_rng(seed)

    def x(self, shape, dtype="float32", grad=False):
        a = torch.from_numpy(self.rng.standard_normal(shape).astype(np.float32))
        t = a.to(device=self.dev, dtype=T_DTYPES[dtype])
        return t.requires_grad_() if grad else t

    def ints(self, high, shape, dtype=torch.int64):
        return torch.from_numpy(self.rng.integers(0, high, shape)).to(self.dev, dtype)

    def perm(self, n, k):
        return torch.from_numpy(self.rng.permutation(n)[:k].astype(np.int64)).to(self.dev)


CFG = cuprope.RopeConfig(64, base=5e5)
CFG_THD = cuprope.RopeConfig(64, base=5e5, layout="thd")
CFG_PARTIAL = cuprope.RopeConfig(32, interleaved=True)


def case_core(i):
    x = i.x((2, 9, 3, 64))
    pos = i.ints(100_000, (9,))
    q, k = i.x((2, 9, 4, 64), "bfloat16"), i.x((2, 9, 2, 64), "bfloat16")
    gq, gk = i.x((2, 9, 4, 64), "bfloat16"), i.x((2, 9, 2, 64), "bfloat16")
    qf, kf = cuprope.rope_qk_forward(q, k, CFG, positions=pos, offset=7)
    qb, kb = cuprope.rope_qk_backward(gq, gk, CFG, positions=pos, offset=7)
    return {"rope_forward": cuprope.rope_forward(x, CFG_PARTIAL, positions=pos),
            "rope_backward": cuprope.rope_backward(x, CFG_PARTIAL, positions=pos),
            "rope_qk_forward.q": qf, "rope_qk_forward.k": kf,
            "rope_qk_backward.q": qb, "rope_qk_backward.k": kb}


def case_tables(i):
    q, k = i.x((2, 9, 4, 64), "bfloat16"), i.x((2, 9, 2, 64), "bfloat16")
    ang = i.x((2, 9, 64)) * 3.0
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    qf, kf = tables.rope_qk_table_forward(q, k, cos, sin)
    qb, kb = tables.rope_qk_table_backward(q, k, cos, sin)
    return {"table_forward.q": qf, "table_forward.k": kf,
            "table_backward.q": qb, "table_backward.k": kb,
            "rope_table_forward": tables.rope_table_forward(q, cos, sin)}


THETA = np.random.default_rng(5).uniform(0.01, 1.0, (3, 32))


def case_lrpe(i):
    x, do = i.x((2, 9, 3, 64)), i.x((2, 9, 3, 64))
    return {"rotate_1d_forward": lrpe.rotate_1d_forward(x, THETA, offset=3, act="silu"),
            "rotate_1d_backward": lrpe.rotate_1d_backward(x, do, THETA, offset=3, act="silu")}


def case_ggml(i):
    x = i.x((9, 3, 64))
    pos = i.ints(3000, (9,), torch.int32)
    kw = dict(n_dims=64, mode=ggml.NEOX, freq_base=1e4)
    return {"ggml.rope": ggml.rope(x, pos, **kw),
            "ggml.rope_back": ggml.rope(x, pos, forward=False, **kw)}


def _qknorm_inputs(i):
    q, k = i.x((2, 9, 4, 64), "bfloat16"), i.x((2, 9, 2, 64), "bfloat16")
    wq, wk = i.x((64,)) * 0.3 + 1.0, i.x((64,)) * 0.3 + 1.0
    pos = i.ints(100_000, (2, 9))
    return q, k, wq, wk, pos


def case_qknorm(i):
    q, k, wq, wk, pos = _qknorm_inputs(i)
    gq, gk = i.x(q.shape, "bfloat16"), i.x(k.shape, "bfloat16")
    kw = dict(q_weight=wq, k_weight=wk, positions=pos)
    yq, yk = qknorm.rope_qk_norm_forward(q, k, CFG, **kw)
    dq, dk, dwq, dwk = qknorm.rope_qk_norm_backward(q, k, gq, gk, CFG, **kw)
    return {"qknorm_forward.q": yq, "qknorm_forward.k": yk, "qknorm_backward.q": dq,
            "qknorm_backward.k": dk, "qknorm_backward.wq": dwq, "qknorm_backward.wk": dwk}


def case_kvcache(i):
    t, pages, page_size = 12, 4, 8
    q, k, v = i.x((t, 4, 64), "bfloat16"), i.x((t, 2, 64), "bfloat16"), i.x((t, 2, 64), "bfloat16")
    kc = i.x((pages, page_size, 2, 64), "bfloat16")
    vc = i.x((pages, page_size, 2, 64), "bfloat16")
    pos = i.ints(100_000, (t,))
    slots = i.perm(pages * page_size, t)
    out = kvcache.rope_append_kv(q, k, v, CFG_THD, pos, k_cache=kc, v_cache=vc,
                                 slot_mapping=slots)
    assert out is q
    return {"rope_append_kv.q": q, "rope_append_kv.k_cache": kc, "rope_append_kv.v_cache": vc}


def case_rotary_embedding(i):
    t = 11
    query, key = i.x((t, 4 * 64), "bfloat16"), i.x((t, 2 * 64), "bfloat16")
    ang = torch.arange(512, dtype=torch.float64)[:, None] * 1e4 ** (-torch.arange(32) / 32)
    table = torch.cat([ang.cos(), ang.sin()], -1).float().to(i.dev)
    pos = i.ints(512, (t,))
    ctorch.rotary_embedding(pos, query, key, 64, table, True)
    return {"rotary_embedding.query": query, "rotary_embedding.key": key}


def case_autograd(i):
    res = {}
    q, k = i.x((2, 9, 4, 64), "bfloat16", grad=True), i.x((2, 9, 2, 64), "bfloat16", grad=True)
    pos = i.ints(100_000, (9,))
    yq, yk = ctorch.rope_qk(q, k, CFG, positions=pos, offset=2)
    torch.autograd.backward((yq, yk), (i.x(yq.shape, "bfloat16"), i.x(yk.shape, "bfloat16")))
    res.update({"torch.rope_qk.q": yq, "torch.rope_qk.k": yk, "torch.rope_qk.dq": q.grad,
                "torch.rope_qk.dk": k.grad})
    x = i.x((2, 9, 3, 64), grad=True)
    y = ctorch.rope(x, CFG_PARTIAL, positions=pos)
    y.backward(i.x(y.shape))
    res.update({"torch.rope": y, "torch.rope.dx": x.grad})
    q, k, wq, wk, pos2 = _qknorm_inputs(i)
    for t in (q, k, wq, wk):
        t.requires_grad_()
    yq, yk = ctorch.rope_qk_norm(q, k, CFG, q_weight=wq, k_weight=wk, positions=pos2)
    torch.autograd.backward((yq, yk), (i.x(yq.shape, "bfloat16"), i.x(yk.shape, "bfloat16")))
    res.update({"torch.rope_qk_norm.q": yq, "torch.rope_qk_norm.k": yk,
                "torch.rope_qk_norm.dq": q.grad, "torch.rope_qk_norm.dk": k.grad,
                "torch.rope_qk_norm.dwq": wq.grad, "torch.rope_qk_norm.dwk": wk.grad})
    q = i.x((2, 4, 9, 64), "bfloat16", grad=True)
    k = i.x((2, 2, 9, 64), "bfloat16", grad=True)
    ang = i.x((1, 9, 64)) * 3.0
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    yq, yk = ctorch.apply_rotary_pos_emb(q, k, cos, sin)
    torch.autograd.backward((yq, yk), (i.x(yq.shape, "bfloat16"), i.x(yk.shape, "bfloat16")))
    res.update({"torch.apply_rotary_pos_emb.q": yq, "torch.apply_rotary_pos_emb.k": yk,
                "torch.apply_rotary_pos_emb.dq": q.grad, "torch.apply_rotary_pos_emb.dk": k.grad})
    return res


CASES = {"core": case_core, "tables": case_tables, "lrpe": case_lrpe, "ggml": case_ggml,
         "qknorm": case_qknorm, "kvcache": case_kvcache,
         "rotary_embedding": case_rotary_embedding, "autograd": case_autograd}


def run(case, dev, seed=18):
    out = CASES[case](Inputs(dev, seed))
    assert out and all(isinstance(v, torch.Tensor) for v in out.values()), out
    return out


def host_bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8).numpy() if t.dtype != torch.bfloat16 \
        else t.view(torch.int16).numpy()


def close_to_host(got, ref, name):
    """``got`` against the NumPy backend's result: a loose bound, one that a
    call that wrote nothing, or wrote the wrong values, fails."""
    a, b = got.detach().float().cpu().numpy(), ref.detach().float().cpu().numpy()
    assert a.shape == b.shape, (name, a.shape, b.shape)
    tol = 1e-4 if got.dtype == torch.float32 else 2e-2
    err = np.abs(a - b).max()
    assert err <= tol * max(1.0, np.abs(b).max()), (name, err)


def kernel_devices(prof):
    from torch.autograd import DeviceType
    return {e.device_index for e in prof.events() if e.device_type == DeviceType.CUDA}


@pytest.mark.parametrize("case", list(CASES))
def test_cases_run_on_the_host_backend(case):
    """The cases below on host tensors (cuprope's NumPy backend): their
    shapes and arguments are valid, and every output is non-trivial."""
    out = run(case, "cpu")
    again = run(case, "cpu")
    for name, t in out.items():
        assert t.device.type == "cpu"
        assert np.isfinite(t.detach().float().numpy()).all(), name
        assert t.detach().float().abs().max() > 0, name
        assert np.array_equal(host_bits(t), host_bits(again[name])), name


@pytest.mark.parametrize("case", list(CASES))
def test_cuda1_tensors_run_on_gpu1_with_device0_current(case):
    import cupy
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.set_device(0)
    cupy.cuda.Device(0).use()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        got = run(case, "cuda:1")
        torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0, "the call changed torch's current device"
    assert cupy.cuda.runtime.getDevice() == 0, "the call changed CuPy's current device"
    devs = kernel_devices(prof)
    assert devs == {1}, f"kernels or copies ran on devices {sorted(devs)}, expected only 1"
    with torch.cuda.device(1):
        want = run(case, "cuda:1")
        torch.cuda.synchronize(1)
    host = run(case, "cpu")
    for name, t in got.items():
        assert t.device == torch.device("cuda", 1), (name, t.device)
        assert np.array_equal(host_bits(t), host_bits(want[name])), \
            f"{name}: differs from the call made with cuda:1 current"
        close_to_host(t, host[name], name)
    torch.cuda.synchronize(0)


for _mark in TWO_GPUS:
    test_cuda1_tensors_run_on_gpu1_with_device0_current = _mark(
        test_cuda1_tensors_run_on_gpu1_with_device0_current)
