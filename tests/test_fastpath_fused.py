"""The fast paths of the decode prologue (``qk_norm_rope_append_kv``) and of
MLA's append (``rope_append_mla``) without a GPU: CPU torch tensors stand in
for CUDA ones (their infos say device 0, a CPU fast-path adapter keys them),
and a recording kernel stands in for the launch. A repeated call with new
arrays of the same signatures skips validation and planning, and the words
it launches with equal, byte for byte, those a fresh general-path plan packs
for the same arrays (so every pointer the kernel reads is a per-call word).
Changed signatures or settings, another thread, stream=, check=True and
overlaps the general path refuses take the general path. The same on the
GPU, with the kernels' outputs: test_gpu_prologue.py, test_gpu_mla.py."""
import sys
import threading

import numpy as np
import pytest

import cuprope
from cuprope._core import arrays as core_arrays
from cuprope._core import driver, engine, fastpath, launcher
from cuprope.mla import api as mla_api
from cuprope.prologue import api as pro_api
from torch_helpers import apply_changes, count_calls

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")


class Kernel:
    """A launch stand-in: records (kernel, grid, block, smem, argument bytes,
    stream) per launch."""
    ptr = 0

    def __init__(self, log, name):
        self.log, self.name = log, name

    def __call__(self, grid, block, params, shared_mem, stream):
        self.log.append((self.name, grid, block, shared_mem,
                         tuple(bytes(p.tobytes()) for p in params), stream.ptr))


@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU torch tensors described as on device 0, the launch recorded; the
    list of launches is returned."""
    log = []
    real = core_arrays.describe

    def on_device0(obj, name):
        info = real(obj, name)
        if info.kind == "torch":
            info.device = 0
        return info

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("cuprope") and \
                getattr(mod, "describe", None) is real:
            monkeypatch.setattr(mod, "describe", on_device0)

    class Modules:
        def functions(self, device, family):
            return type("Catalogue", (), {"__getitem__": lambda s, n: Kernel(log, n)})()

    class Table:
        class data:
            ptr = 4096

    monkeypatch.setattr(launcher, "MODULES", Modules())
    monkeypatch.setattr(launcher, "on_device", lambda device, fn, *a: fn(*a))
    monkeypatch.setattr(driver.DRIVER, "_ok", False)  # every launch through the stand-in
    monkeypatch.setattr(engine, "stream_handle",
                        lambda stream, info: 55 if stream is None else int(stream))
    monkeypatch.setattr(cuprope.RopeConfig, "device_tables", lambda self, device: (Table, None))
    for mod in ("cuprope.prologue.launch", "cuprope.mla.launch"):
        monkeypatch.setattr(sys.modules[mod], "sm_count", lambda device: 132)
    fw = fastpath.Adapter(fastpath.torch_collector(-1), torch.Tensor.data_ptr, torch.empty_like,
                          lambda dev: 1000 + dev, lambda: 0)
    monkeypatch.setitem(fastpath.ADAPTERS, "torch", fw)
    return log


def same_launch(a, b):
    """Two recorded launches agree in all but the stream."""
    return a[:5] == b[:5]


# ---------------------------------------------------------------- the prologue

def cache_addressing(g, t, pages, ps, paged, first_pages):
    """The cache addressing keywords of ``t`` tokens: two sequences over a
    random page order (the first holding ``first_pages`` pages), tokens
    alternating between them at random rows (``paged``), else a random slot
    per token."""
    if not paged:
        return {"slot_mapping": torch.randperm(pages * ps, generator=g)[:t]}
    return dict(kv_indices=torch.randperm(pages, generator=g).to(torch.int32),
                kv_indptr=torch.tensor([0, first_pages, pages], dtype=torch.int32),
                batch_indices=torch.arange(t, dtype=torch.int32) % 2,
                cache_positions=torch.randint(0, ps, (t,), generator=g, dtype=torch.int32))


def prologue_args(seed, dtype=torch.bfloat16, t=4, hq=8, hk=2, d=64, pages=6, ps=4,
                  fp8=False, q8=False, combined=False, paged=False, layout="NHD"):
    """(q, k, v, positions, keywords) of one prologue call, fresh tensors."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(t, h, d, generator=g).to(dtype) for h in (hq, hk, hk))
    cdt = torch.float8_e4m3fn if fp8 else dtype
    inner = (ps, hk, d) if layout == "NHD" else (hk, ps, d)
    kw = dict(q_weight=torch.randn(d, generator=g).to(dtype),
              k_weight=torch.randn(d, generator=g).to(dtype), kv_layout=layout)
    if combined:
        kw["kv_cache"] = torch.zeros((pages, 2) + inner, dtype=cdt)
    else:
        kw["k_cache"] = torch.zeros((pages,) + inner, dtype=cdt)
        kw["v_cache"] = torch.zeros((pages,) + inner, dtype=cdt)
    kw.update(cache_addressing(g, t, pages, ps, paged, first_pages=3))
    if fp8:
        kw["k_scale"], kw["v_scale"] = torch.rand((), generator=g) + 0.1, \
            torch.rand((), generator=g) + 0.1
    if q8:
        kw["q_out"] = torch.zeros((t, hq, d), dtype=torch.float8_e4m3fn)
        kw["q_scale"] = torch.rand((1,), generator=g) + 0.1
    pos = torch.randint(0, 1 << 20, (t,), generator=g)
    return q, k, v, pos, kw


def cfg_thd():
    return cuprope.RopeConfig(64, base=1e6, layout="thd")


PROLOGUE_CASES = {
    "bf16 slots": dict(),
    "fp8 paged, one kv_cache, fp8 q_out": dict(fp8=True, q8=True, combined=True, paged=True),
    "fp16 HND fp8 cache": dict(dtype=torch.float16, fp8=True, layout="HND"),
    "fp32 paged": dict(dtype=torch.float32, paged=True),
}


def _repeat_launches_a_fresh_plans_words(fake_gpu, monkeypatch, api, op, checked_name,
                                          make_cfg, make_args, out_name, kw0):
    """A repeated call of ``op`` (``api``'s) takes the fast path: no new
    spec, no validation (``checked_name`` counted), and its launch's words
    equal those of a fresh config's plan for the same arrays and of the
    registered plan run by the general path (stream=)."""
    specs = count_calls(monkeypatch, api, "_spec")
    checked = count_calls(monkeypatch, api, checked_name)
    cfg = make_cfg()
    first = make_args(1, **kw0)
    op(*first[:3], cfg, first[3], **first[4])
    assert len(specs) == len(checked) == 1 and len(fake_gpu) == 1
    x, k, v, pos, kw = make_args(2, **kw0)
    out = op(x, k, v, cfg, pos, **kw)
    assert out is kw.get(out_name, x)
    assert len(specs) == len(checked) == 1, "the repeated call took the general path"
    fast = fake_gpu[-1]
    assert fast[5] == 1000 and fast[4] != fake_gpu[0][4]
    # a fresh plan for the same arrays (a new config: nothing registered)
    op(x, k, v, make_cfg(), pos, **kw)
    assert len(specs) == 2 and fake_gpu[-1][5] == 55
    assert same_launch(fast, fake_gpu[-1]), "the fast path's words differ from a fresh plan's"
    # ... and from the plan registered first, run by the general path (stream=)
    op(x, k, v, cfg, pos, stream=77, **kw)
    assert len(specs) == 2 and len(checked) == 3 and fake_gpu[-1][5] == 77
    assert same_launch(fast, fake_gpu[-1])


@pytest.mark.parametrize("case", sorted(PROLOGUE_CASES))
def test_prologue_repeat_launches_a_fresh_plans_words_with_the_new_pointers(fake_gpu, case,
                                                                           monkeypatch):
    _repeat_launches_a_fresh_plans_words(fake_gpu, monkeypatch, pro_api,
                                         pro_api.qk_norm_rope_append_kv, "QkNormCall", cfg_thd,
                                         prologue_args, "q_out", PROLOGUE_CASES[case])


def test_prologue_changes_take_the_general_path_then_are_fast(fake_gpu, monkeypatch):
    checked = count_calls(monkeypatch, pro_api, "QkNormCall")
    cfg = cfg_thd()

    def run(args=None, **change):
        q, k, v, pos, kw = apply_changes(args or prologue_args(5, **change.pop("make", {})),
                                         change)
        before = len(checked)
        pro_api.qk_norm_rope_append_kv(q, k, v, cfg, pos, **kw)
        return len(checked) - before

    assert run() == 1                                            # first of its kind
    assert run() == 0                                            # repeated: fast
    assert run(make=dict(t=5)) == 1 and run(make=dict(t=5)) == 0  # tokens
    assert run(pos=lambda p: p.to(torch.int32)) == 1             # positions' dtype
    assert run(q=lambda x: x.transpose(0, 1).contiguous().transpose(0, 1)) == 1  # strides
    assert run(k=lambda x: torch.cat([x, x], -1)[..., :64]) == 1  # a non-contiguous view
    assert run(make=dict(pages=7)) == 1                          # num_pages
    assert run(make=dict(fp8=True)) == 1                         # fp8 cache, scales from None
    assert run(make=dict(paged=True)) == 1                       # addressing
    assert run(kw=lambda kw: {**kw, "q_weight": None}) == 1      # a weight left out
    for setting in (dict(eps=1e-5), dict(eps=np.float64(1e-6)), dict(weight_offset=1.0),
                    dict(rounding="cast_then_weight"), dict(order="rope_then_norm")):
        assert run(kw=lambda kw: {**kw, **setting}) == 1, setting
        assert run(kw=lambda kw: {**kw, **setting}) == 0, setting
    assert run(kw=lambda kw: {**kw, "check": True}) == 1          # check=: always validated
    # an unhashable setting on a registered signature: the general path's error
    q, k, v, pos, kw = prologue_args(6)
    with pytest.raises(ValueError, match="eps must be a non-negative float"):
        pro_api.qk_norm_rope_append_kv(q, k, v, cfg, pos, **{**kw, "eps": [1e-6]})


def test_prologue_other_thread_takes_the_general_path(fake_gpu, monkeypatch):
    checked = count_calls(monkeypatch, pro_api, "QkNormCall")
    cfg = cfg_thd()
    for seed in (1, 2):
        q, k, v, pos, kw = prologue_args(seed)
        pro_api.qk_norm_rope_append_kv(q, k, v, cfg, pos, **kw)
    assert len(checked) == 1
    seen = []

    def worker():
        for seed in (3, 4):
            q, k, v, pos, kw = prologue_args(seed)
            pro_api.qk_norm_rope_append_kv(q, k, v, cfg, pos, **kw)
            seen.append(len(checked))

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert seen == [2, 2]  # its first call validated, its second was fast on its own plan
    q, k, v, pos, kw = prologue_args(5)
    pro_api.qk_norm_rope_append_kv(q, k, v, cfg, pos, **kw)
    assert len(checked) == 2


def test_prologue_refusals_stand_on_a_registered_signature(fake_gpu):
    cfg = cfg_thd()
    for seed in (1, 2):
        q, k, v, pos, kw = prologue_args(seed)
        pro_api.qk_norm_rope_append_kv(q, k, v, cfg, pos, **kw)
    n = len(fake_gpu)
    # k inside the k cache: k's signature, pointers the general path refuses
    flat = kw["k_cache"].view(-1)
    with pytest.raises(ValueError, match="the cache overlaps q, k or v"):
        pro_api.qk_norm_rope_append_kv(q, flat[:k.numel()].view(k.shape), v, cfg, pos, **kw)
    # q's weight inside q (rotated in place)
    with pytest.raises(ValueError, match="overlaps a weight"):
        pro_api.qk_norm_rope_append_kv(q, k, v, cfg, pos, **{**kw, "q_weight": q[0, 0]})
    # a tensor requiring grad with grad mode on: the guard, before any fast path
    kg = k.clone().requires_grad_(True)
    with pytest.raises(TypeError, match="rope_qk_norm"):
        pro_api.qk_norm_rope_append_kv(q, kg, v, cfg, pos, **kw)
    with pytest.raises(RuntimeError, match="leaf"):  # a leaf written in place
        pro_api.qk_norm_rope_append_kv(q.clone().requires_grad_(True), k, v, cfg, pos, **kw)
    with torch.no_grad():
        pro_api.qk_norm_rope_append_kv(q, kg, v, cfg, pos, **kw)
    assert len(fake_gpu) == n + 1


# ---------------------------------------------------------------- MLA

def mla_args(seed, dtype=torch.bfloat16, t=3, h=4, dc=64, dn=32, r=64, pages=5, ps=4,
             fp8=False, layout="vllm", paged=False, nope=True, one_buffer=False):
    """(q_pe, k_pe, ckv, positions, keywords) of one rope_append_mla call."""
    g = torch.Generator().manual_seed(seed)
    q_pe, k_pe, ckv = (torch.randn(s, generator=g).to(dtype) for s in ((t, h, r), (t, r),
                                                                       (t, dc)))
    cdt = torch.float8_e4m3fn if fp8 else dtype
    kw = ({"kv_cache": torch.zeros(pages, ps, dc + r, dtype=cdt)} if layout == "vllm" else
          {"ckv_cache": torch.zeros(pages, ps, dc, dtype=cdt),
           "kpe_cache": torch.zeros(pages, ps, r, dtype=cdt)})
    kw.update(cache_addressing(g, t, pages, ps, paged, first_pages=2))
    if fp8:
        kw["kv_scale"] = torch.rand((), generator=g) + 0.1
        kw["q_scale"] = torch.rand((), generator=g) + 0.1
    qdt = torch.float8_e4m3fn if fp8 else dtype
    if nope:
        kw["q_nope"] = torch.randn((t, h, dn), generator=g).to(dtype)
        if one_buffer:  # FlashMLA's [T, H, Dn + R] query: its two slices
            q_out = torch.zeros((t, h, dn + r), dtype=qdt)
            kw.update(q_nope_out=q_out[..., :dn], q_pe_out=q_out[..., dn:])
        else:
            kw.update(q_nope_out=torch.zeros((t, h, dn), dtype=qdt))
    if fp8 and "q_pe_out" not in kw:
        kw["q_pe_out"] = torch.zeros((t, h, r), dtype=qdt)
    pos = torch.randint(0, 1 << 20, (t,), generator=g)
    return q_pe, k_pe, ckv, pos, kw


def deepseek():
    return cuprope.RopeConfig(64, base=1e4, interleaved=True)


MLA_CASES = {
    "bf16 vllm slots": dict(),
    "fp8 vllm paged, one query buffer": dict(fp8=True, paged=True, one_buffer=True),
    "fp16 flashinfer pair, in place": dict(dtype=torch.float16, layout="flashinfer", nope=False),
    "fp32 flashinfer fp8 paged": dict(dtype=torch.float32, layout="flashinfer", fp8=True,
                                      paged=True),
}


@pytest.mark.parametrize("case", sorted(MLA_CASES))
def test_mla_repeat_launches_a_fresh_plans_words_with_the_new_pointers(fake_gpu, case,
                                                                      monkeypatch):
    _repeat_launches_a_fresh_plans_words(fake_gpu, monkeypatch, mla_api, mla_api.rope_append_mla,
                                         "_caches", deepseek, mla_args, "q_pe_out",
                                         MLA_CASES[case])


def test_mla_changes_threads_and_refusals(fake_gpu, monkeypatch):
    checked = count_calls(monkeypatch, mla_api, "_caches")
    cfg = deepseek()

    def run(**make):
        q_pe, k_pe, ckv, pos, kw = mla_args(7, **make)
        before = len(checked)
        mla_api.rope_append_mla(q_pe, k_pe, ckv, cfg, pos, **kw)
        return len(checked) - before

    assert run() == 1 and run() == 0
    assert run(t=8) == 1 and run(t=8) == 0           # tokens
    assert run(h=2) == 1                             # heads
    assert run(pages=9) == 1                         # num_pages
    assert run(fp8=True) == 1 and run(fp8=True) == 0
    assert run(nope=False) == 1                      # no q_nope
    assert run(layout="flashinfer") == 1
    # another thread: its own general-path call first
    seen = []
    th = threading.Thread(target=lambda: seen.append(run()))
    th.start()
    th.join()
    assert seen == [1] and run() == 0
    # an output inside an input: refused on a registered signature too
    q_pe, k_pe, ckv, pos, kw = mla_args(8)
    buf = torch.zeros(q_pe.numel() * 2, dtype=q_pe.dtype)
    q_in = buf[:q_pe.numel()].view(q_pe.shape)
    q_in.copy_(q_pe)
    out_in = buf[q_pe.numel() // 2:q_pe.numel() // 2 + kw["q_nope_out"].numel()].view(
        kw["q_nope_out"].shape)
    with pytest.raises(ValueError, match="overlaps an input"):
        mla_api.rope_append_mla(q_in, k_pe, ckv, cfg, pos, **{**kw, "q_nope_out": out_in})
    kg = k_pe.clone().requires_grad_(True)
    with pytest.raises(TypeError, match="training"):
        mla_api.rope_append_mla(q_pe, kg, ckv, cfg, pos, **kw)
