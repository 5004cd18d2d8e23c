"""The decode prologue (cuprope.prologue) on the CPU: the NumPy backend
against the composition of the two calls it fuses (``rope_qk_norm_forward``
then ``rope_append_kv`` with a rotation by angle 0) byte for byte, the
float64 reference against the formulas, every untouched byte kept, padding
and out-of-range indices skipped, clear errors, and every kernel
instantiation compiled by NVRTC with no spills."""
import re

import numpy as np
import pytest

import cuprope
from cuprope import kvcache, qknorm
from cuprope.qknorm import reference as qref
from cuprope.prologue import qk_norm_rope_append_kv, reference as pref

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16, E4M3 = np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn)


def case(rng, dtype, t=7, hq=4, hk=2, d=16, pages=6, ps=4, fp8=False, layout="NHD"):
    x = {n: rng.standard_normal((t, h, d)).astype(dtype) for n, h in (("q", hq), ("k", hk),
                                                                     ("v", hk))}
    shape = (pages, ps, hk, d) if layout == "NHD" else (pages, hk, ps, d)
    cdt = E4M3 if fp8 else dtype
    raw = rng.integers(0, 256, size=(2,) + shape + (np.dtype(cdt).itemsize,), dtype=np.uint8)
    kc = raw[0].view(cdt).reshape(shape).copy()
    vc = raw[1].view(cdt).reshape(shape).copy()
    slots = rng.permutation(pages * ps)[:t].astype(np.int64)
    slots[1] = -1                   # padding
    slots[3] = pages * ps + 2       # out of range
    pos = rng.integers(0, 500, size=t).astype(np.int64)
    return x, kc, vc, slots, pos


def composed(x, cfg, pos, kc, vc, slots, norm, layout, q_out=None, scales=None):
    """rope_qk_norm_forward, then rope_append_kv of its q and k turned by angle 0."""
    scales = scales or {}
    qn, kn = qknorm.rope_qk_norm_forward(x["q"], x["k"], cfg, positions=pos, **norm)
    ident = cuprope.RopeConfig(x["q"].shape[-1])
    qn = np.ascontiguousarray(qn)
    kvcache.rope_append_kv(qn, np.ascontiguousarray(kn), x["v"], ident,
                           np.zeros(len(pos), np.int64), k_cache=kc, v_cache=vc,
                           kv_layout=layout, slot_mapping=slots, q_out=q_out, **scales)
    return qn if q_out is None else q_out


NORMS = [dict(), dict(rounding="cast_then_weight"), dict(rounding="weight_then_cast",
                                                         weight_offset=1.0),
         dict(order="rope_then_norm"), dict(norm_over="token")]


@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32])
@pytest.mark.parametrize("ni", range(len(NORMS)))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_host_equals_the_two_calls(dtype, ni, layout):
    rng = np.random.default_rng(ni * 7 + len(layout))
    norm = dict(NORMS[ni])
    x, kc, vc, slots, pos = case(rng, dtype, layout=layout)
    over = norm.get("norm_over", "head")
    d, hq, hk = x["q"].shape[-1], x["q"].shape[1], x["k"].shape[1]
    wq = rng.standard_normal(d if over == "head" else hq * d).astype(dtype)
    wk = rng.standard_normal(d if over == "head" else hk * d).astype(dtype)
    norm.update(q_weight=wq, k_weight=wk, eps=1e-5)
    cfg = cuprope.RopeConfig(d, layout="thd", base=1e4)
    kc2, vc2 = kc.copy(), vc.copy()
    want = composed(x, cfg, pos, kc2, vc2, slots, norm, layout)
    q = x["q"].copy()
    got = qk_norm_rope_append_kv(q, x["k"], x["v"], cfg, pos, k_cache=kc, v_cache=vc,
                                 kv_layout=layout, slot_mapping=slots, **norm)
    assert got is q
    assert q.tobytes() == want.tobytes()
    assert kc.tobytes() == kc2.tobytes() and vc.tobytes() == vc2.tobytes()


@pytest.mark.parametrize("per_head", [False, True])
def test_host_fp8_equals_the_two_calls(per_head):
    rng = np.random.default_rng(3)
    x, kc, vc, slots, pos = case(rng, BF16, fp8=True)
    hk = x["k"].shape[1]
    shape = (hk,) if per_head else ()
    sc = {n: rng.uniform(0.01, 0.1, size=shape).astype(np.float32) for n in ("k", "v")}
    qs = np.array([0.02], np.float32)
    scales = dict(k_scale=sc["k"], v_scale=sc["v"], q_scale=qs)
    cfg = cuprope.RopeConfig(16, layout="thd")
    qo1 = np.zeros(x["q"].shape, E4M3)
    kc2, vc2 = kc.copy(), vc.copy()
    composed(x, cfg, pos, kc2, vc2, slots, {}, "NHD", q_out=qo1, scales=scales)
    qo2 = np.zeros(x["q"].shape, E4M3)
    qk_norm_rope_append_kv(x["q"], x["k"], x["v"], cfg, pos, k_cache=kc, v_cache=vc,
                           slot_mapping=slots, q_out=qo2, **scales)
    assert qo1.tobytes() == qo2.tobytes()
    assert kc.tobytes() == kc2.tobytes() and vc.tobytes() == vc2.tobytes()


def test_untouched_bytes_and_skipped_tokens():
    """Written rows are the reference's; every other byte is the poison."""
    rng = np.random.default_rng(5)
    x, kc, vc, slots, pos = case(rng, np.float32)
    before_k, before_v = kc.copy(), vc.copy()
    cfg = cuprope.RopeConfig(16, layout="thd")
    qk_norm_rope_append_kv(x["q"].copy(), x["k"], x["v"], cfg, pos, k_cache=kc, v_cache=vc,
                           slot_mapping=slots)
    written = np.zeros(kc.shape[:2], bool)
    for sl in slots:
        if 0 <= sl < kc.shape[0] * kc.shape[1]:
            written[sl // kc.shape[1], sl % kc.shape[1]] = True
    assert written.sum() == len(slots) - 2
    np.testing.assert_array_equal(kc[~written], before_k[~written])
    np.testing.assert_array_equal(vc[~written], before_v[~written])
    kn = pref.normed(x["k"], None, cfg, pos)
    for t, sl in enumerate(slots):
        if 0 <= sl < kc.shape[0] * kc.shape[1]:
            p, r = divmod(sl, kc.shape[1])
            np.testing.assert_array_equal(kc[p, r], kn[t].astype(np.float32))
            np.testing.assert_array_equal(vc[p, r], x["v"][t])


def test_reference_is_the_formula():
    """normed: x · rsqrt(mean(x²) + eps) · w per head, then the rotation of
    pair j (halves) by pos · base^(-2j/D)."""
    rng = np.random.default_rng(9)
    t, h, d = 3, 2, 8
    x = rng.standard_normal((t, h, d))
    w = rng.standard_normal(d)
    pos = np.array([0, 5, 17])
    cfg = cuprope.RopeConfig(d, layout="thd", base=100.0)
    n = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w
    ang = pos[:, None] * 100.0 ** (-np.arange(d // 2) * 2.0 / d)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = n[..., : d // 2], n[..., d // 2:]
    want = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    np.testing.assert_allclose(pref.normed(x, w, cfg, pos), want, rtol=1e-13, atol=1e-13)


def test_paged_addressing_on_the_host():
    rng = np.random.default_rng(11)
    x, kc, vc, _, pos = case(rng, np.float32, t=4)
    kc0 = kc.copy()
    cfg = cuprope.RopeConfig(16, layout="thd")
    kvi = np.array([2, 0, 5], np.int32)
    ptr = np.array([0, 1, 3], np.int32)
    bi = np.array([0, 1, -1, 1], np.int32)          # token 2: padding
    cp = np.array([3, 6, 0, 9], np.int32)           # token 3: past its pages
    qk_norm_rope_append_kv(x["q"].copy(), x["k"], x["v"], cfg, pos, k_cache=kc, v_cache=vc,
                           kv_indices=kvi, kv_indptr=ptr, batch_indices=bi, cache_positions=cp)
    kn = pref.normed(x["k"], None, cfg, pos).astype(np.float32)
    np.testing.assert_array_equal(kc[2, 3], kn[0])
    np.testing.assert_array_equal(kc[5, 2], kn[1])   # sequence 1: pages 0, 5; position 6
    mask = np.ones(kc.shape[:2], bool)
    mask[2, 3] = mask[5, 2] = False
    np.testing.assert_array_equal(kc[mask], kc0[mask])


def test_errors():
    rng = np.random.default_rng(1)
    x, kc, vc, slots, pos = case(rng, np.float32)
    cfg = cuprope.RopeConfig(16, layout="thd")
    args = (x["q"], x["k"], x["v"], cfg, pos)
    with pytest.raises(ValueError, match="layout 'thd'"):
        qk_norm_rope_append_kv(*args[:3], cuprope.RopeConfig(16, layout="bhsd"), pos,
                               k_cache=kc, v_cache=vc, slot_mapping=slots)
    with pytest.raises(ValueError, match="positions are required"):
        qk_norm_rope_append_kv(*args[:4], None, k_cache=kc, v_cache=vc, slot_mapping=slots)
    with pytest.raises(ValueError, match="give k_cache and v_cache"):
        qk_norm_rope_append_kv(*args, slot_mapping=slots)
    with pytest.raises(ValueError, match="give slot_mapping"):
        qk_norm_rope_append_kv(*args, k_cache=kc, v_cache=vc)
    with pytest.raises(ValueError, match="norm must be one of"):
        qk_norm_rope_append_kv(*args, k_cache=kc, v_cache=vc, slot_mapping=slots, norm="x")
    with pytest.raises(ValueError, match="v must have k's shape"):
        qk_norm_rope_append_kv(*args[:2], x["q"], cfg, pos, k_cache=kc, v_cache=vc,
                               slot_mapping=slots)
    with pytest.raises(ValueError, match="k_scale is needed"):
        qk_norm_rope_append_kv(*args, k_cache=kc.view(np.uint8)[..., :16].copy(),
                               v_cache=vc.view(np.uint8)[..., :16].copy(), slot_mapping=slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        qk_norm_rope_append_kv(*args, k_cache=kc, v_cache=vc, slot_mapping=slots, check=True)


# ---------------------------------------------------------------- NVRTC

def test_every_prologue_instantiation_compiles_without_spills():
    """3 dtypes x 2 pairings x 2 bodies (general, head rows) x 4 fp8
    combinations = 48, for sm_90, with ptxas reporting no spills."""
    tkc = pytest.importorskip("test_kernel_compile")
    from cuprope._core import loader
    from cuprope.prologue import kernels as prologue_kernels
    names = prologue_kernels.prologue_kernel_names()
    assert len(names) == 48
    assert sorted(n for f in prologue_kernels.FAMILIES
                  for n in prologue_kernels.prologue_kernel_names(f)) == sorted(names)
    rc, log, prog = tkc._build("sm_90", names, loader.compile_options() + (
        "--ptxas-options=-v",), prologue_kernels.ENTRY)
    tkc.nvrtc.nvrtcDestroyProgram(prog)
    assert rc == tkc.nvrtc.nvrtcResult.NVRTC_SUCCESS, log
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(re.findall(r"Compiling entry function '_ZN7cuprope15prologue_kernel", log)) == 48
    assert spills
    assert all(a == "0" and b == "0" for a, b in spills), log
    assert "warning" not in log.lower(), log
