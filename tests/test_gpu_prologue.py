"""The decode prologue (cuprope.prologue.qk_norm_rope_append_kv) on the GPU,
skipped with a reason where there is none.

Exactness: one launch must give the bytes of ``rope_qk_norm_forward``
followed by ``rope_append_kv`` of its q and k turned by angle 0 (cos 1,
sin 0: the identity, so that call only stores), on caches that start as the
same random bytes: q's output, every cache row written, and every byte not
written (padding and out-of-range indices write nothing); up to the sign of
an exact zero, which that identity rotation may flip (constructed zeros). Plus the float64
reference (cuprope.prologue.reference) within a tolerance a wrong kernel
cannot meet, and CUDA-graph replays with new positions, slots and scales.
"""
import threading

import numpy as np
import pytest

import cuprope
from conftest import GPU_TESTS
from torch_helpers import count_calls, gen, host_bytes, randn, sentinel, tdt
from cuprope import kvcache, qknorm
from cuprope.prologue import api as papi, qk_norm_rope_append_kv, reference as pref

pytestmark = GPU_TESTS


def _torch():
    import torch
    return torch












def addressing(kind, rng, t, pages, ps):
    """Distinct cache rows per token, with one padding and one out-of-range
    token: slot_mapping, or FlashInfer's paged indices."""
    torch = _torch()
    if kind == "slots":
        slots = rng.permutation(pages * ps)[:t].astype(np.int64)
        if t > 2:
            slots[1], slots[-1] = -1, pages * ps + 3
        return {"slot_mapping": torch.from_numpy(slots).cuda()}
    nseq = 3
    per = -(-pages // nseq)
    indices = rng.permutation(pages).astype(np.int32)
    indptr = np.array([min(i * per, pages) for i in range(nseq)] + [pages], np.int32)
    bi = (np.arange(t) % nseq).astype(np.int32)
    cp = rng.permutation(per * ps)[: -(-t // nseq)].astype(np.int32)[np.arange(t) // nseq]
    if t > 2:
        bi[1], cp[-1] = -1, per * ps * 4          # padding; past the sequence's pages
    return {n: torch.from_numpy(a).cuda() for n, a in (
        ("kv_indices", indices), ("kv_indptr", indptr), ("batch_indices", bi),
        ("cache_positions", cp))}


def make(seed, dtype, t, hq=32, hk=8, d=128, pages=None, ps=16, kv_layout="NHD", fp8=(),
         combined=False, per_head=False, weights=True, over="head", addr="slots",
         misaligned=False):
    """Inputs, weights, caches (random bytes) and scales of one call."""
    torch = _torch()
    g = gen(seed)
    rng = np.random.default_rng(seed)
    pages = pages or t // ps + 5
    q, k, v = (randn((t, h, d), dtype, g) for h in (hq, hk, hk))
    wlen = (d, d) if over == "head" else (hq * d, hk * d)
    w = {"q_weight": randn((wlen[0],), dtype, g) if weights else None,
         "k_weight": randn((wlen[1],), dtype, g) if weights else None}
    cdt = "fp8" if "cache" in fp8 else dtype
    inner = (ps, hk, d) if kv_layout == "NHD" else (hk, ps, d)
    if misaligned:  # rows one element off the pack grid: stores element by element
        def alloc(shape):
            return sentinel(shape[:-1] + (d + 1,), cdt, g)[..., 1:]
    else:
        def alloc(shape):
            return sentinel(shape, cdt, g)
    caches = ({"kv_cache": alloc((pages, 2) + inner)} if combined else
              {"k_cache": alloc((pages,) + inner), "v_cache": alloc((pages,) + inner)})
    kw = dict(kv_layout=kv_layout, **caches, **addressing(addr, rng, t, pages, ps))
    if "cache" in fp8:
        shape = (hk,) if per_head else ()
        kw["k_scale"] = torch.rand(shape, device="cuda", generator=g) * 0.2 + 0.01
        kw["v_scale"] = torch.rand(shape, device="cuda", generator=g) * 0.2 + 0.01
    if "q" in fp8:
        kw["q_scale"] = torch.rand((), device="cuda", generator=g) * 0.2 + 0.01
    pos = torch.from_numpy(rng.integers(0, 1 << 20, t)).cuda()
    return q, k, v, pos, w, kw


def composed(q, k, v, cfg, pos, norm, kw, q_out_dtype=None):
    """The two calls on copies: (q's output, {cache name: cache})."""
    torch = _torch()
    kw = {n: (x.clone() if n.endswith("cache") else x) for n, x in kw.items()}
    qn, kn = qknorm.rope_qk_norm_forward(q.clone(), k.clone(), cfg, positions=pos, **norm)
    ident = cuprope.RopeConfig(q.shape[-1])
    q_out = None if q_out_dtype is None else torch.zeros(q.shape, dtype=q_out_dtype,
                                                         device="cuda")
    out = kvcache.rope_append_kv(qn, kn, v, ident, torch.zeros_like(pos), q_out=q_out, **kw)
    return out, {n: x for n, x in kw.items() if n.endswith("cache")}


def fused(q, k, v, cfg, pos, norm, kw, q_out_dtype=None):
    torch = _torch()
    kw = {n: (x.clone() if n.endswith("cache") else x) for n, x in kw.items()}
    q1 = q.clone()
    q_out = None if q_out_dtype is None else torch.zeros(q.shape, dtype=q_out_dtype,
                                                         device="cuda")
    out = qk_norm_rope_append_kv(q1, k, v, cfg, pos, q_out=q_out, **norm, **kw)
    assert out is (q1 if q_out is None else q_out)
    return out, {n: x for n, x in kw.items() if n.endswith("cache")}


def assert_same(a, b):
    (qa, ca), (qb, cb) = a, b
    _torch().cuda.synchronize()
    assert np.array_equal(host_bytes(qa), host_bytes(qb)), "q's output differs"
    for n in ca:
        x, y = host_bytes(ca[n]), host_bytes(cb[n])
        assert np.array_equal(x, y), f"{n}: {np.count_nonzero(x != y)} bytes differ"


def run_both(cfg, q, k, v, pos, w, kw, q8=False, **norm):
    norm = {**w, "eps": 1e-6, **norm}
    qdt = _torch().float8_e4m3fn if q8 else None
    a = fused(q, k, v, cfg, pos, norm, kw, qdt)
    b = composed(q, k, v, cfg, pos, norm, kw, qdt)
    assert_same(a, b)
    return a


def cfg_thd(d=128, **kw):
    return cuprope.RopeConfig(d, base=1e6, layout="thd", **kw)


# ---------------------------------------------------------------- exactness, bf16 first

@pytest.mark.parametrize("t", [1, 64, 1024])
@pytest.mark.parametrize("fp8", [(), ("cache",), ("q", "cache")])
def test_bf16_decode_equals_the_two_calls(t, fp8):
    q, k, v, pos, w, kw = make(1 + t, "bfloat16", t, fp8=fp8)
    run_both(cfg_thd(), q, k, v, pos, w, kw, q8="q" in fp8)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("addr", ["slots", "paged"])
@pytest.mark.parametrize("combined", [False, True])
def test_bf16_layouts_and_addressing(kv_layout, addr, combined):
    q, k, v, pos, w, kw = make(7, "bfloat16", 61, kv_layout=kv_layout, addr=addr,
                               combined=combined, fp8=("cache",), per_head=True)
    run_both(cfg_thd(), q, k, v, pos, w, kw)


@pytest.mark.parametrize("norm", [dict(rounding="cast_then_weight"),
                                  dict(rounding="weight_then_cast", weight_offset=1.0),
                                  dict(order="rope_then_norm"), dict(norm_over="token"),
                                  dict(norm="l2")])
def test_bf16_model_roundings_and_orders(norm):
    q, k, v, pos, w, kw = make(3, "bfloat16", 40, over=norm.get("norm_over", "head"),
                               weights=norm.get("norm") != "l2", fp8=("cache",))
    run_both(cfg_thd(), q, k, v, pos, w, kw, **norm)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fp8", [(), ("q", "cache")])
@pytest.mark.parametrize("interleaved", [False, True])
def test_every_dtype(dtype, fp8, interleaved):
    q, k, v, pos, w, kw = make(5, dtype, 77, fp8=fp8)
    run_both(cfg_thd(interleaved=interleaved), q, k, v, pos, w, kw, q8="q" in fp8)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_general_body_partial_rotary_and_odd_head_dim(dtype):
    """R < D and D = 96: the general QK-norm body (not the head rows)."""
    q, k, v, pos, w, kw = make(9, dtype, 33, d=96, fp8=("cache",))
    run_both(cuprope.RopeConfig(64, layout="thd"), q, k, v, pos, w, kw)


def test_misaligned_caches_and_q_out_store_element_by_element():
    q, k, v, pos, w, kw = make(11, "bfloat16", 50, fp8=("cache",), misaligned=True)
    run_both(cfg_thd(), q, k, v, pos, w, kw)
    q, k, v, pos, w, kw = make(12, "float16", 50, misaligned=True)
    run_both(cfg_thd(), q, k, v, pos, w, kw)


def test_prefill_size():
    q, k, v, pos, w, kw = make(13, "bfloat16", 4099, fp8=("q", "cache"), addr="paged")
    run_both(cfg_thd(), q, k, v, pos, w, kw, q8=True)


def test_bshd_and_scaled_config():
    torch = _torch()
    q, k, v, pos, w, kw = make(15, "bfloat16", 24)
    cfg = cuprope.RopeConfig(128, inv_freq=cuprope.scaling.yarn_table(
        128, 1e6, 4.0, original_max_position_embeddings=2048)[0], scale=1.1, layout="bshd")
    q4, k4, v4 = (x.view(4, 6, *x.shape[1:]) for x in (q, k, v))
    kw["slot_mapping"] = kw["slot_mapping"].view(4, 6)
    norm = {**w, "eps": 1e-6}
    a = fused(q4, k4, v4, cfg, pos.view(4, 6), norm, kw)
    # the two calls, in thd
    cfg_t = cuprope.RopeConfig(128, inv_freq=cfg.inv_freq, scale=1.1, layout="thd")
    kw_t = {**kw, "slot_mapping": kw["slot_mapping"].view(-1)}
    b = composed(q, k, v, cfg_t, pos, norm, kw_t)
    assert_same((a[0].reshape(q.shape), a[1]), b)
    assert not torch.equal(a[0].reshape(q.shape), q)


def _zero_signs_cleared(x):
    """x's elements as unsigned integers (its dtype's width), -0.0 made +0.0."""
    b = np.ascontiguousarray(host_bytes(x))
    bits = b.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.element_size()]).copy()
    sign = bits.dtype.type(1 << (8 * bits.itemsize - 1))
    bits[bits == sign] = 0
    return bits


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("fp8", [(), ("q", "cache")])
@pytest.mark.parametrize("interleaved", [False, True])
def test_exact_zeros_after_the_norm_agree_up_to_their_sign(dtype, fp8, interleaved):
    """Weights with zeros (and -0.0) give exact zeros after the norm, both
    elements of some pairs. The two calls' second rotation, by angle 0 (cos
    1, sin +0: x1 - x2·0, x2 + x1·0), can turn a -0.0 into +0.0 (an e4m3
    0x80 into 0x00) where the one launch stores it as its arithmetic gave
    it: the documented equality is up to the sign of zero. Every other byte
    agrees, the q output's and the caches' alike."""
    torch = _torch()
    q, k, v, pos, w, kw = make(41 + interleaved, dtype, 24, fp8=fp8)
    for name in ("q_weight", "k_weight"):
        wt = w[name].clone()
        wt[::4] = 0.0      # with the -0.0s, both elements of pairs (j, j + 64) and
        wt[1::8] = -0.0    # (2i, 2i + 1) for some j and i
        w[name] = wt
    norm = {**w, "eps": 1e-6}
    qdt = torch.float8_e4m3fn if "q" in fp8 else None
    cfg = cfg_thd(interleaved=interleaved)
    a = fused(q, k, v, cfg, pos, norm, kw, qdt)
    b = composed(q, k, v, cfg, pos, norm, kw, qdt)
    torch.cuda.synchronize()
    zeros = 0
    for name, x, y in [("q", a[0], b[0])] + [(n, a[1][n], b[1][n]) for n in a[1]]:
        xs, ys = _zero_signs_cleared(x), _zero_signs_cleared(y)
        assert np.array_equal(xs, ys), f"{name}: {np.count_nonzero(xs != ys)} elements differ"
        zeros += np.count_nonzero(xs == 0)
    assert zeros > 0, "the inputs gave no exact zero"


# ---------------------------------------------------------------- against float64

def test_against_the_float64_reference():
    """q_out and the k rows within a few bf16 ulps of the float64 reference;
    v rows exact; rows not named untouched."""
    torch = _torch()
    t, pages, ps = 45, 8, 16
    q, k, v, pos, w, kw = make(17, "bfloat16", t, pages=pages)
    cfg = cfg_thd()
    kc0 = host_bytes(kw["k_cache"])
    out, caches = fused(q, k, v, cfg, pos, {**w}, kw)
    torch.cuda.synchronize()
    f = lambda x: x.float().cpu().numpy()  # noqa: E731
    p = pos.cpu().numpy()
    qn = pref.normed(f(q), f(w["q_weight"]), cfg, p)
    kn = pref.normed(f(k), f(w["k_weight"]), cfg, p)
    tol = 2 ** -7 * (np.abs(qn).max() + 1)
    np.testing.assert_allclose(f(out), qn, atol=tol / 4, rtol=2 ** -7)
    slots = kw["slot_mapping"].cpu().numpy()
    kc = caches["k_cache"].float().cpu().numpy()
    vc = caches["v_cache"]
    written = np.zeros((pages, ps), bool)
    for i, sl in enumerate(slots):
        if 0 <= sl < pages * ps:
            pg, r = divmod(sl, ps)
            written[pg, r] = True
            np.testing.assert_allclose(kc[pg, r], kn[i], atol=tol / 4, rtol=2 ** -7)
            assert torch.equal(vc[pg, r], v[i])
    assert written.sum() == t - 2
    np.testing.assert_array_equal(host_bytes(caches["k_cache"])[~written], kc0[~written])


# ---------------------------------------------------------------- CUDA graphs

def test_cuda_graph_replays_new_positions_slots_and_scales():
    torch = _torch()
    b, pages, ps = 8, 40, 16
    q, k, v, pos, w, kw = make(21, "bfloat16", b, pages=pages, fp8=("q", "cache"),
                               combined=True)
    cfg = cfg_thd()
    q_out = torch.zeros(q.shape, dtype=torch.float8_e4m3fn, device="cuda")
    norm = {**w, "eps": 1e-6}

    def step(q_, kv_, q_out_):
        return qk_norm_rope_append_kv(q_, k, v, cfg, pos, q_out=q_out_, **norm,
                                      **{**kw, "kv_cache": kv_})
    kv = kw["kv_cache"]
    step(q, kv, q_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(q, kv, q_out)
    rng = np.random.default_rng(0)
    for it in range(3):
        g = gen(100 + it)
        for x in (q, k, v):
            x.copy_(randn(x.shape, "bfloat16", g))
        pos.copy_(torch.from_numpy(rng.integers(0, 10 ** 6, b)))
        sl = rng.permutation(pages * ps)[:b]
        sl[it] = -1
        kw["slot_mapping"].copy_(torch.from_numpy(sl))
        for n in ("q_scale", "k_scale", "v_scale"):
            kw[n].fill_(float(rng.uniform(0.01, 0.3)))
        kv_eager, qo_eager = kv.clone(), torch.zeros_like(q_out)
        step(q, kv_eager, qo_eager)
        graph.replay()
        torch.cuda.synchronize()
        assert np.array_equal(host_bytes(q_out), host_bytes(qo_eager))
        assert np.array_equal(host_bytes(kv), host_bytes(kv_eager))
        assert host_bytes(q_out).any()


def test_empty_and_errors_on_the_gpu():
    torch = _torch()
    q, k, v, pos, w, kw = make(23, "bfloat16", 4)
    cfg = cfg_thd()
    e = torch.empty((0, 32, 128), dtype=torch.bfloat16, device="cuda")
    ek = torch.empty((0, 8, 128), dtype=torch.bfloat16, device="cuda")
    out = qk_norm_rope_append_kv(e, ek, ek, cfg, pos[:0], k_cache=kw["k_cache"],
                                 v_cache=kw["v_cache"],
                                 slot_mapping=kw["slot_mapping"][:0])
    assert out is e
    with pytest.raises(ValueError, match="slot"):
        qk_norm_rope_append_kv(q, k, v, cfg, pos, **{**kw, "check": True})


# ---------------------------------------------------------------- torch op, vLLM drop-in

def test_torch_custom_op_opcheck_and_compile_on_the_gpu():
    torch = _torch()
    from cuprope.prologue import torch as ptorch
    q, k, v, pos, w, kw = make(25, "bfloat16", 16, fp8=("cache",))
    cfg = cfg_thd()
    a = fused(q, k, v, cfg, pos, {**w}, kw)
    kw2 = {n: (x.clone() if n.endswith("cache") else x) for n, x in kw.items()}
    q2 = q.clone()

    def step(q_, kc_, vc_):
        return ptorch.qk_norm_rope_append_kv(q_, k, v, cfg, pos, **w,
                                             **{**kw2, "k_cache": kc_, "v_cache": vc_})
    torch.compile(step, fullgraph=True, backend="aot_eager")(q2, kw2["k_cache"], kw2["v_cache"])
    assert_same(a, (q2, {n: x for n, x in kw2.items() if n.endswith("cache")}))
    # (opcheck's schema test compares tensors by arithmetic, which fp8 lacks)
    q, k, v, pos, w, kw = make(26, "bfloat16", 16)
    args = (q.clone(), k, v, cfg.key, pos, w["q_weight"], w["k_weight"], 1e-6, "rms", 0.0,
            "norm_then_rope", "head", "exact", kw["k_cache"].clone(), kw["v_cache"].clone(),
            None, "NHD", kw["slot_mapping"], None, None, None, None, None, None, None, None)
    torch.library.opcheck(torch.ops.cuprope.qk_norm_rope_append_kv.default, args)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("partial", [False, True])
def test_vllm_fused_qk_norm_rope_drop_in(dtype, is_neox, partial):
    """cuprope.torch.fused_qk_norm_rope against vLLM's native composition in
    torch on the GPU (tests/test_prologue_torch.py: the same on the host)."""
    from cuprope.torch import fused_qk_norm_rope
    from test_prologue_torch import assert_vllm_equal, vllm_case, vllm_native
    qkv, args = vllm_case("cuda", tdt(dtype), is_neox, 64 if partial else 128, t=300, hq=32,
                          hk=8, d=128)
    want = vllm_native(qkv.clone(), *args)
    got = qkv.clone()
    fused_qk_norm_rope(got, *args)
    assert_vllm_equal(got, want, tdt(dtype))
    assert _torch().equal(got[:, 40 * 128:], qkv[:, 40 * 128:])


# ---------------------------------------------------------------- fast path

def _fresh_general(q, k, v, cfg, pos, norm, kw, q_out_dtype=None):
    """The call on copies through a fresh config's general path (nothing
    registered there: validation and a new plan)."""
    fresh = cuprope.RopeConfig(cfg.rotary_dim, inv_freq=cfg.inv_freq,
                               interleaved=cfg.interleaved, scale=cfg.scale, layout=cfg.layout)
    return fused(q, k, v, fresh, pos, norm, kw, q_out_dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fp8", [(), ("cache",), ("q", "cache")])
@pytest.mark.parametrize("addr,combined", [("slots", False), ("paged", True)])
def test_fast_path_equals_the_general_path(dtype, fp8, addr, combined, monkeypatch):
    """Decode steps with fresh tensors of one signature: the first validates
    and plans, the others take the fast path, and every step writes the
    bytes a fresh general-path call writes on copies of the same state."""
    torch = _torch()
    checked = count_calls(monkeypatch, papi, "QkNormCall")
    cfg = cfg_thd()
    qdt = torch.float8_e4m3fn if "q" in fp8 else None
    for step in range(4):
        q, k, v, pos, w, kw = make(60 + step, dtype, 8, fp8=fp8, addr=addr, combined=combined)
        norm = {**w, "eps": 1e-6}
        want = _fresh_general(q, k, v, cfg, pos, norm, kw, qdt)
        before = len(checked)
        got = fused(q, k, v, cfg, pos, norm, kw, qdt)
        assert len(checked) - before == (0 if step else 1), "the fast path was not taken"
        assert_same(got, want)
        assert host_bytes(got[0]).any()


def test_fast_path_not_taken_when_arguments_change(monkeypatch):
    """Each change of a signature or setting reaches the general path (and
    writes the general path's bytes), then is fast in turn."""
    torch = _torch()
    checked = count_calls(monkeypatch, papi, "QkNormCall")
    cfg = cfg_thd()

    def run(t=8, fp8=(), change=None, norm=None):
        q, k, v, pos, w, kw = make(70, "bfloat16", t, fp8=fp8)
        q, k, v, pos, kw = (change or (lambda *a: a))(q, k, v, pos, kw)
        nm = {**w, "eps": 1e-6, **(norm or {})}
        want = _fresh_general(q, k, v, cfg, pos, nm, kw)
        before = len(checked)
        got = fused(q, k, v, cfg, pos, nm, kw)
        assert_same(got, want)
        return len(checked) - before

    assert run() == 1 and run() == 0
    assert run(t=9) == 1 and run(t=9) == 0                              # tokens
    assert run(change=lambda q, k, v, p, kw: (q, k, v, p.to(torch.int32), kw)) == 1
    assert run(change=lambda q, k, v, p, kw: (                          # q's strides
        q.transpose(0, 1).contiguous().transpose(0, 1), k, v, p, kw)) == 1
    assert run(fp8=("cache",)) == 1 and run(fp8=("cache",)) == 0        # fp8 cache, scales
    assert run(norm=dict(eps=1e-5)) == 1 and run(norm=dict(eps=1e-5)) == 0
    assert run(norm=dict(rounding="cast_then_weight")) == 1


def test_fast_path_other_thread_and_grad_take_the_general_path(monkeypatch):
    """Another thread validates its own first call; a tensor requiring grad
    raises as before, warm signature or not."""
    torch = _torch()
    checked = count_calls(monkeypatch, papi, "QkNormCall")
    cfg = cfg_thd()
    q, k, v, pos, w, kw = make(80, "bfloat16", 8, fp8=("cache",))
    norm = {**w, "eps": 1e-6}
    for _ in range(2):
        fused(q, k, v, cfg, pos, norm, kw)
    assert len(checked) == 1
    results = []

    def other():
        results.append(fused(q, k, v, cfg, pos, norm, kw))

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert len(checked) == 2
    assert_same(results[0], fused(q, k, v, cfg, pos, norm, kw))
    assert len(checked) == 2
    with pytest.raises(TypeError, match="rope_qk_norm"):
        qk_norm_rope_append_kv(q, k.clone().requires_grad_(True), v, cfg, pos, **norm, **kw)
    with pytest.raises(RuntimeError, match="leaf"):
        qk_norm_rope_append_kv(q.clone().requires_grad_(True), k, v, cfg, pos, **norm, **kw)
    with pytest.raises(ValueError, match="the cache overlaps q, k or v"):
        flat = kw["k_cache"].view(torch.uint8).view(-1)
        qk_norm_rope_append_kv(q, flat[:k.numel() * 2].view(torch.bfloat16).view(k.shape), v,
                               cfg, pos, **norm, **kw)
