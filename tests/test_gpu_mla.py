"""DeepSeek MLA's fused call on the GPU (skipped with a reason where there is
none). The case functions take a ``device``: test_mla.py runs them on "cpu"
(the NumPy backend) too.

The rotated q_pe and the k_pe written to the cache must equal
``cuprope.rope_forward``'s result on the same device bit for bit (same
cos/sin, same arithmetic) and match the float64 reference
(``cuprope.mla.reference``) within the dtype's rounding; fp8 targets hold
exactly the e4m3 bytes of those values (``kvcache_reference.scaled_e4m3``);
caches and outputs start as random bytes, and every byte the spec does not
write must survive (padding, out-of-range slots and pages, other rows).
"""
import threading
import zlib

import numpy as np
import pytest

import cuprope
from conftest import GPU_TESTS
from torch_helpers import count_calls, host_bytes, randn
from torch_helpers import sentinel as poison
from cuprope.kvcache import reference as kref
from cuprope.mla import api as mla_api, rope_append_mla
from cuprope.mla.reference import mla_reference
from hf_configs import CONFIGS as HF
from oracle import assert_matches

pytestmark = GPU_TESTS


def _torch():
    import torch
    return torch










def as_np(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def deepseek_v3():
    return cuprope.scaling.rope_config_from_hf(HF["DeepSeek-V3"])


SCHEMES = {
    "deepseek_v3": deepseek_v3,
    "half_split": lambda: cuprope.RopeConfig(64, base=10000.0, interleaved=False),
    "yarn_scaled": lambda: cuprope.RopeConfig(64, inv_freq=cuprope.scaling.yarn_table(
        64, 1e4, 40.0, original_max_position_embeddings=4096)[0], scale=1.2, interleaved=True),
}


def thd(cfg):
    return cuprope.RopeConfig(cfg.rotary_dim, inv_freq=cfg.inv_freq, interleaved=cfg.interleaved,
                              scale=cfg.scale, layout="thd")


def addressing(kind, t, pages, ps, rng, torch, device):
    """(kwargs, row (page, row) or None per token): slots with padding and one
    past the cache, or paged indices with padding, a batch index out of range,
    a position past its sequence's pages and an out-of-range page id."""
    if kind == "slots":
        slots = rng.permutation(pages * ps)[:t].astype(np.int64)
        slots[min(3, t - 1)] = -1
        if t > 1:
            slots[-1] = pages * ps + 5
        rows = [None if s < 0 or s >= pages * ps else (s // ps, s % ps) for s in slots]
        return {"slot_mapping": torch.from_numpy(slots).to(device)}, rows
    n_seqs = 4
    indices = np.append(rng.permutation(pages), [pages + 1, -2]).astype(np.int32)
    indptr = np.array([0, 5, 5, 12, pages + 2], np.int32)
    bi = rng.integers(0, n_seqs, t).astype(np.int32)
    cp = rng.integers(0, 12 * ps, t).astype(np.int32)
    bi[min(3, t - 1)] = -1
    if t > 2:
        bi[-2] = n_seqs  # batch index out of range
        cp[1] = 5 * ps + 1
        bi[1] = 0          # past sequence 0's 5 pages
    rows, seen = [], set()
    for i in range(t):
        b, p = int(bi[i]), int(cp[i])
        r = None
        if 0 <= b < n_seqs and p >= 0:
            j = indptr[b] + p // ps
            if j < indptr[b + 1] and j < len(indices) and 0 <= indices[j] < pages:
                r = (int(indices[j]), p % ps)
        if r is not None and r in seen:  # two tokens, one row: the later becomes padding
            cp[i], r = -1, None
        if r is not None:
            seen.add(r)
        rows.append(r)
    kw = {"kv_indices": indices, "kv_indptr": indptr, "batch_indices": bi,
          "cache_positions": cp}
    return {n: torch.from_numpy(a).to(device) for n, a in kw.items()}, rows


def mla_case(seed, dtype, *, scheme="deepseek_v3", cache="same", q8=False, layout="vllm",
             addr="slots", t=37, h=16, dc=512, dn=512, r=64, pages=23, ps=16, nope=True,
             device="cuda", strided=False, check=False):
    """One rope_append_mla call against the core, the reference and the
    spec's cache rows; returns the tensors for further checks."""
    torch = _torch()
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = SCHEMES[scheme]()
    assert cfg.rotary_dim == r
    if strided:  # slices of one projection output, as a model holds them
        qall = randn((t, h, dn + r), dtype, g)
        q_nope, q_pe = qall[..., :dn], qall[..., dn:]
        kvall = randn((t, dc + r + 8), dtype, g)
        ckv, k_pe = kvall[:, :dc], kvall[:, dc:dc + r]
    else:
        q_pe, q_nope = randn((t, h, r), dtype, g), randn((t, h, dn), dtype, g)
        k_pe, ckv = randn((t, r), dtype, g), randn((t, dc), dtype, g)
    pos = torch.from_numpy(rng.integers(0, 2 ** 31 - 1, t)).to(device)
    pos[:4] = torch.tensor([0, 1, 4095, 163839])[:t]
    cdt = "fp8" if cache == "fp8" else dtype
    caches = ({"kv_cache": poison((pages, ps, dc + r), cdt, g)} if layout == "vllm" else
              {"ckv_cache": poison((pages, ps, dc), cdt, g),
               "kpe_cache": poison((pages, ps, r), cdt, g)})
    before = {n: host_bytes(c) for n, c in caches.items()}
    kw, rows = addressing(addr, t, pages, ps, rng, torch, device)
    if cache == "fp8":
        kw["kv_scale"] = torch.rand((), device=device, generator=g) * 0.2 + 0.01
    qdt = "fp8" if q8 else dtype
    q_out = poison((t, h, dn + r), qdt, g)
    q_out_before = host_bytes(q_out)
    if q8:
        kw["q_scale"] = torch.rand((1,), device=device, generator=g) * 0.2 + 0.01
    if q8 or nope:
        kw["q_pe_out"] = q_out[..., dn:]
    if nope:
        kw.update(q_nope=q_nope, q_nope_out=q_out[..., :dn])
    q0, k0, ckv0, qn0 = q_pe.clone(), k_pe.clone(), ckv.clone(), q_nope.clone()
    q_core = cuprope.rope_forward(q0.clone(), thd(cfg), positions=pos)
    k_core = cuprope.rope_forward(k0.clone()[:, None, :], thd(cfg), positions=pos)[:, 0]
    out = rope_append_mla(q_pe, k_pe, ckv, cfg, pos, **caches, **kw, check=check)
    if device != "cpu":
        torch.cuda.synchronize()
    # inputs untouched (but q_pe when rotated in place)
    assert np.array_equal(host_bytes(k_pe), host_bytes(k0))
    assert np.array_equal(host_bytes(ckv), host_bytes(ckv0))
    assert np.array_equal(host_bytes(q_nope), host_bytes(qn0))
    # against the float64 reference
    q_ref, k_ref = mla_reference(as_np(q0), as_np(k0), pos.cpu().numpy(), cfg)
    if "q_pe_out" in kw:
        assert out is kw["q_pe_out"]
        assert np.array_equal(host_bytes(q_pe), host_bytes(q0)), "q_pe changed"
    else:
        assert out is q_pe
    if not q8:
        assert_matches(as_np(out), q_ref, 5.0, dtype, cfg.scale)
        assert np.array_equal(host_bytes(out), host_bytes(q_core)), "q_pe differs from the core's"
        if nope:
            assert np.array_equal(host_bytes(q_out[..., :dn]), host_bytes(qn0))
    else:
        qs = float(kw["q_scale"].cpu()[0])
        exp = np.concatenate([kref.scaled_e4m3(as_np(qn0).astype(np.float32), qs),
                              kref.scaled_e4m3(as_np(q_core).astype(np.float32), qs)], -1)
        if not nope:  # q_nope_out not given: its half of the buffer is kept
            exp[..., :dn] = q_out_before[..., :dn]
        assert np.array_equal(host_bytes(q_out), exp), "q's e4m3 bytes differ"
    # the cache: [ckv | rotated k_pe] at the spec's rows, every other byte kept
    kc = as_np(k_core)
    assert_matches(kc, k_ref, 5.0, dtype, cfg.scale)
    vals = np.concatenate([as_np(ckv0), kc], -1)
    if cache == "fp8":
        enc = kref.scaled_e4m3(vals.astype(np.float32), float(kw["kv_scale"].cpu()))
    else:
        enc = np.concatenate([host_bytes(ckv0), host_bytes(k_core)], -1)
    isz = enc.shape[-1] // (dc + r)
    if layout == "vllm":
        exp = before["kv_cache"].copy()
        for i, rw in enumerate(rows):
            if rw is not None:
                exp[rw[0], rw[1]] = enc[i]
        assert np.array_equal(host_bytes(caches["kv_cache"]), exp), "kv_cache bytes differ"
    else:
        for name, lo, hi in (("ckv_cache", 0, dc * isz), ("kpe_cache", dc * isz, (dc + r) * isz)):
            exp = before[name].copy()
            for i, rw in enumerate(rows):
                if rw is not None:
                    exp[rw[0], rw[1]] = enc[i, lo:hi]
            assert np.array_equal(host_bytes(caches[name]), exp), f"{name} bytes differ"
    return rows


CASES = [(dt, c, q8, lay, a) for dt in ("bfloat16", "float16", "float32")
         for c in ("same", "fp8") for q8 in (False, True) for lay in ("vllm", "flashinfer")
         for a in ("slots", "paged")]


def case_id(dt, c, q8, lay, a):
    return f"{dt}-{c}-{'q8' if q8 else 'q'}-{lay}-{a}"


@pytest.mark.parametrize("dtype,cache,q8,layout,addr", CASES, ids=[case_id(*c) for c in CASES])
def test_mla_append(dtype, cache, q8, layout, addr):
    mla_case(zlib.crc32(case_id(dtype, cache, q8, layout, addr).encode()), dtype, cache=cache,
             q8=q8, layout=layout, addr=addr)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("t", [1, 3, 64])
def test_mla_schemes_and_decode_sizes(scheme, t):
    """DeepSeek-V3's config as published, a half-split table, a scaled YaRN
    table; decode sizes (128 heads) with every row spread over warps."""
    mla_case(zlib.crc32(f"{scheme}{t}".encode()), "bfloat16", scheme=scheme, cache="fp8",
             q8=True, t=t, h=128, pages=300, ps=64)


@pytest.mark.parametrize("nope", [False, True])
def test_mla_strided_views_and_in_place(nope):
    """q_pe / q_nope as slices of one [T, H, 576] tensor, ckv / k_pe slices of
    one projection row; q_pe rotated in place (nope False) or out."""
    mla_case(5 + nope, "bfloat16", strided=True, nope=nope, layout="flashinfer", addr="paged")


def test_mla_one_pair_width():
    """A q_pe whose rows start off the 16-byte grid takes the one-pair width."""
    torch = _torch()
    g = torch.Generator(device="cuda")
    g.manual_seed(9)
    cfg = deepseek_v3()
    t, h = 7, 4
    q = randn((t, h, 65), "float16", g)[..., 1:]
    k, ckv = randn((t, 64), "float16", g), randn((t, 512), "float16", g)
    pos = torch.arange(t, device="cuda") * 1000
    cache = poison((4, 8, 576), "float16", g)
    q_core = cuprope.rope_forward(q.clone(), thd(cfg), positions=pos)
    slots = torch.arange(t, device="cuda", dtype=torch.int64) * 3
    rope_append_mla(q, k, ckv, cfg, pos, kv_cache=cache, slot_mapping=slots)
    torch.cuda.synchronize()
    assert torch.equal(q, q_core)
    k_core = cuprope.rope_forward(k.clone()[:, None], thd(cfg), positions=pos)[:, 0]
    flat = cache.view(32, 576)
    assert torch.equal(flat[slots, :512], ckv) and torch.equal(flat[slots, 512:], k_core)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("scheme", ["deepseek_v3", "half_split"])
def test_mla_misaligned_cache_rotates_as_the_aligned_core(dtype, scheme):
    """A cache view off the 16-byte grid sends the whole call to the one-pair
    width while the core's call on aligned copies takes the widest: the
    rotated q_pe and the cached k_pe still equal rope_forward's bit for bit,
    fp32 included (one contraction of the rotation at every width), and so
    does the core's own call on misaligned copies."""
    torch = _torch()
    g = torch.Generator(device="cuda")
    g.manual_seed(zlib.crc32(f"{dtype}{scheme}".encode()))
    cfg = SCHEMES[scheme]()
    t, h, pages, ps = 29, 8, 6, 8
    q, k, ckv = randn((t, h, 64), dtype, g), randn((t, 64), dtype, g), randn((t, 512), dtype, g)
    pos = torch.from_numpy(np.random.default_rng(2).integers(0, 2 ** 31 - 1, t)).cuda()
    cache = poison((pages, ps, 577), dtype, g)[..., 1:]  # rows one element off the grid
    slots = torch.randperm(pages * ps, device="cuda", generator=g)[:t]
    q_core = cuprope.rope_forward(q.clone(), thd(cfg), positions=pos)
    k_core = cuprope.rope_forward(k.clone()[:, None], thd(cfg), positions=pos)[:, 0]
    q_odd = randn((t, h, 65), dtype, g)[..., 1:]
    q_odd.copy_(q)
    q_odd_core = cuprope.rope_forward(q_odd, thd(cfg), positions=pos)  # the one-pair core
    rope_append_mla(q, k, ckv, cfg, pos, kv_cache=cache, slot_mapping=slots)
    torch.cuda.synchronize()
    assert np.array_equal(host_bytes(q), host_bytes(q_core)), "q_pe differs from the core's"
    assert np.array_equal(host_bytes(q_odd_core), host_bytes(q_core)), "core: widths differ"
    rows = cache.reshape(pages * ps, 576)[slots]
    assert np.array_equal(host_bytes(rows[:, :512]), host_bytes(ckv))
    assert np.array_equal(host_bytes(rows[:, 512:]), host_bytes(k_core)), "k_pe differs"


def test_mla_cuda_graph_replays_new_positions_scales_slots():
    """A captured call replays with new positions, scales and slots written
    into the same tensors (the kernel reads them at run time)."""
    torch = _torch()
    g = torch.Generator(device="cuda")
    g.manual_seed(21)
    cfg = deepseek_v3()
    t, h, pages, ps = 8, 16, 16, 64
    q_pe, q_nope = randn((t, h, 64), "bfloat16", g), randn((t, h, 512), "bfloat16", g)
    k_pe, ckv = randn((t, 64), "bfloat16", g), randn((t, 512), "bfloat16", g)
    q_out = torch.empty((t, h, 576), dtype=torch.float8_e4m3fn, device="cuda")
    cache = torch.zeros((pages, ps, 576), dtype=torch.float8_e4m3fn, device="cuda")
    pos = torch.zeros(t, dtype=torch.int64, device="cuda")
    slots = torch.zeros(t, dtype=torch.int64, device="cuda")
    qs = torch.ones((), device="cuda")
    ks = torch.ones((), device="cuda")

    def call():
        rope_append_mla(q_pe, k_pe, ckv, cfg, pos, kv_cache=cache, slot_mapping=slots,
                        q_nope=q_nope, q_nope_out=q_out[..., :512], q_pe_out=q_out[..., 512:],
                        q_scale=qs, kv_scale=ks)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()  # warm-up: compile and plan outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    rng = np.random.default_rng(4)
    for step in range(3):
        p = rng.integers(0, 100000, t)
        sl = rng.permutation(pages * ps)[:t]
        sl[step] = -1
        pos.copy_(torch.from_numpy(p))
        slots.copy_(torch.from_numpy(sl))
        qs.fill_(0.05 + 0.03 * step)
        ks.fill_(0.02 + 0.01 * step)
        cache.zero_()
        graph.replay()
        torch.cuda.synchronize()
        q_core = cuprope.rope_forward(q_pe.clone(), thd(cfg), positions=pos)
        k_core = cuprope.rope_forward(k_pe.clone()[:, None], thd(cfg), positions=pos)[:, 0]
        qsv, ksv = float(qs.cpu()), float(ks.cpu())
        exp_q = np.concatenate([kref.scaled_e4m3(as_np(q_nope).astype(np.float32), qsv),
                                kref.scaled_e4m3(as_np(q_core).astype(np.float32), qsv)], -1)
        assert np.array_equal(host_bytes(q_out), exp_q), step
        rows = np.concatenate([as_np(ckv), as_np(k_core)], -1).astype(np.float32)
        exp_c = np.zeros((pages * ps, 576), np.uint8)
        keep = sl >= 0
        exp_c[sl[keep]] = kref.scaled_e4m3(rows, ksv)[keep]
        assert np.array_equal(host_bytes(cache).reshape(pages * ps, 576), exp_c), step


def test_mla_check_true_names_bad_indices():
    torch = _torch()
    cfg = deepseek_v3()
    q = torch.randn(2, 2, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 64, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(2, 512, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(2, 4, 576, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="slot_mapping"):
        rope_append_mla(q, k, c, cfg, torch.zeros(2, dtype=torch.int64, device="cuda"),
                        kv_cache=cache, check=True,
                        slot_mapping=torch.tensor([0, 8], device="cuda"))
    assert not cache.any()


def test_mla_cupy_arrays():
    """CuPy in and out: the same bytes as the torch call."""
    cupy = pytest.importorskip("cupy")
    torch = _torch()
    cfg = deepseek_v3()
    g = torch.Generator(device="cuda")
    g.manual_seed(2)
    q, k, c = randn((5, 3, 64), "float16", g), randn((5, 64), "float16", g), \
        randn((5, 512), "float16", g)
    pos = torch.arange(5, device="cuda") * 77
    slots = torch.tensor([3, 1, -1, 7, 0], device="cuda")
    outs = []
    for conv in (lambda x: x.clone(), lambda x: cupy.from_dlpack(x.clone())):
        cache = conv(torch.zeros(2, 4, 576, dtype=torch.float16, device="cuda"))
        qq = conv(q)
        r = rope_append_mla(qq, conv(k), conv(c), cfg, conv(pos), kv_cache=cache,
                            slot_mapping=conv(slots))
        assert r is qq
        outs.append([torch.from_dlpack(x).cpu() for x in (qq, cache)])
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def training_case(device, dtype="float32"):
    """Training-side MLA through the core call on strided views: q heads
    [B, S, H, 128 + 64] rotate their last 64 dims, k_pe [B, S, 1, 64] is
    broadcast over heads; forward and backward (torch autograd) against
    the float64 reference (backward: the transposed rotation, k_pe's
    gradient summed over heads)."""
    torch = _torch()
    import cuprope.torch as ct
    g = torch.Generator(device=device)
    g.manual_seed(17)
    cfg = cuprope.scaling.rope_config_from_hf(HF["DeepSeek-V3"])
    b, s, h = 2, 9, 4
    q = randn((b, s, h, 192), dtype, g).requires_grad_(True)
    k_pe = randn((b, s, 1, 64), dtype, g).requires_grad_(True)
    pos = torch.from_numpy(np.random.default_rng(1).integers(0, 160000, (b, s))).to(device)
    qr, kr = ct.rope_qk(q[..., 128:], k_pe, cfg, positions=pos)
    gq, gk = randn((b, s, h, 64), dtype, g), randn((b, s, h, 64), dtype, g)
    loss = (qr.float() * gq.float()).sum() + (kr.expand(b, s, h, 64).float() * gk.float()).sum()
    loss.backward()
    p = pos.cpu().numpy().reshape(-1)
    flat = lambda x: as_np(x).reshape(b * s, -1, 64)  # noqa: E731
    from cuprope.mla.reference import rotate_pe
    kw = dict(scale=cfg.scale, interleaved=cfg.interleaved)
    assert_matches(flat(qr), rotate_pe(flat(q[..., 128:].detach()), p, cfg.inv_freq, **kw), 5.0,
                   dtype, cfg.scale)
    assert_matches(flat(kr), rotate_pe(flat(k_pe.detach()), p, cfg.inv_freq, **kw), 5.0, dtype,
                   cfg.scale)
    # d/dx of (R x) . g = R^T g: the rotation by -theta
    back = lambda x: rotate_pe(x, p, -cfg.inv_freq, **kw)  # noqa: E731
    assert_matches(flat(q.grad[..., 128:]), back(flat(gq)), 5.0, dtype, cfg.scale)
    assert not q.grad[..., :128].any()
    gk_sum = flat(gk).sum(axis=1, keepdims=True)
    assert_matches(flat(k_pe.grad), back(gk_sum), 5.0 * h, dtype, cfg.scale)


def test_mla_training_views_forward_backward():
    training_case("cuda")


# ---------------------------------------------------------------- fast path

def _decode_args(seed, dtype, fp8, layout="vllm", addr="slots", t=8, h=16, pages=40, ps=16):
    """Fresh decode-step arrays: q_pe, k_pe, ckv, positions, the keywords
    (caches of random bytes, addressing, q_nope into the two slices of one
    [T, H, 576] output, fp8 scales) and that output."""
    torch = _torch()
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    rng = np.random.default_rng(seed)
    q_pe, q_nope = randn((t, h, 64), dtype, g), randn((t, h, 512), dtype, g)
    k_pe, ckv = randn((t, 64), dtype, g), randn((t, 512), dtype, g)
    pos = torch.from_numpy(rng.integers(0, 2 ** 20, t)).cuda()
    cdt = "fp8" if fp8 else dtype
    kw = ({"kv_cache": poison((pages, ps, 576), cdt, g)} if layout == "vllm" else
          {"ckv_cache": poison((pages, ps, 512), cdt, g),
           "kpe_cache": poison((pages, ps, 64), cdt, g)})
    kw.update(addressing(addr, t, pages, ps, rng, torch, "cuda")[0])
    q_out = poison((t, h, 576), cdt, g)
    kw.update(q_nope=q_nope, q_nope_out=q_out[..., :512], q_pe_out=q_out[..., 512:])
    if fp8:
        kw["q_scale"] = torch.rand((), device="cuda", generator=g) * 0.2 + 0.01
        kw["kv_scale"] = torch.rand((1,), device="cuda", generator=g) * 0.2 + 0.01
    return q_pe, k_pe, ckv, pos, kw, q_out


CACHES = ("kv_cache", "ckv_cache", "kpe_cache")


def _copies(kw, q_out):
    """(kw, q_out) with the written tensors copied: the caches and q's output."""
    q2 = q_out.clone()
    kw2 = {n: (x.clone() if n in CACHES else x) for n, x in kw.items()}
    kw2.update(q_nope_out=q2[..., :512], q_pe_out=q2[..., 512:])
    return kw2, q2


def _written(kw, q_out):
    """The bytes of what a call writes: q's output and the caches."""
    _torch().cuda.synchronize()
    return [host_bytes(q_out)] + [host_bytes(kw[n]) for n in CACHES if n in kw]


def _assert_same_as_fresh(q_pe, k_pe, ckv, pos, kw, q_out, call):
    """``call()`` (the call on kw, q_out) writes what a fresh config's general
    path writes on copies of the same state."""
    ref, q_ref = _copies(kw, q_out)
    rope_append_mla(q_pe, k_pe, ckv, deepseek_v3(), pos, **ref)
    assert call() is kw["q_pe_out"]
    for got, want in zip(_written(kw, q_out), _written(ref, q_ref)):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("layout,addr", [("vllm", "slots"), ("flashinfer", "paged")])
def test_mla_fast_path_equals_the_general_path(dtype, fp8, layout, addr, monkeypatch):
    """Decode steps with fresh tensors of one signature: the first validates
    and plans, the others take the fast path; every step writes the bytes a
    fresh config's general path writes on copies of the same state."""
    checked = count_calls(monkeypatch, mla_api, "_caches")
    cfg = deepseek_v3()
    for step in range(4):
        q_pe, k_pe, ckv, pos, kw, q_out = _decode_args(90 + step, dtype, fp8, layout, addr)
        n = len(checked)
        _assert_same_as_fresh(q_pe, k_pe, ckv, pos, kw, q_out,
                              lambda: rope_append_mla(q_pe, k_pe, ckv, cfg, pos, **kw))
        assert len(checked) - n == (1 if step else 2), "the fast path was not taken"


def test_mla_fast_path_changes_threads_and_refusals(monkeypatch):
    """A changed shape, dtype or setting and another thread reach the general
    path first (with its bytes); a tensor requiring grad and an output
    overlapping an input raise as before on a warm signature."""
    torch = _torch()
    checked = count_calls(monkeypatch, mla_api, "_caches")
    cfg = deepseek_v3()

    def run(change=None, **make):
        q_pe, k_pe, ckv, pos, kw, q_out = _decode_args(95, "bfloat16", make.pop("fp8", True),
                                                       **make)
        if change:
            pos, kw = change(pos, kw)
        n = len(checked)
        _assert_same_as_fresh(q_pe, k_pe, ckv, pos, kw, q_out,
                              lambda: rope_append_mla(q_pe, k_pe, ckv, cfg, pos, **kw))
        return len(checked) - n - 1  # the fresh config's call left out

    assert run() == 1 and run() == 0
    assert run(t=64) == 1 and run(t=64) == 0                            # tokens
    assert run(h=128) == 1                                              # heads
    assert run(fp8=False) == 1                                          # cache dtype
    assert run(lambda p, kw: (p.to(torch.int32), kw)) == 1              # positions' dtype
    assert run(lambda p, kw: (p, {**kw, "kv_scale": kw["kv_scale"].reshape(())})) == 1
    seen = []
    th = threading.Thread(target=lambda: seen.append(run()))
    th.start()
    th.join()
    assert seen == [1] and run() == 0
    q_pe, k_pe, ckv, pos, kw, _ = _decode_args(96, "bfloat16", True)
    with pytest.raises(TypeError, match="training"):
        rope_append_mla(q_pe, k_pe.clone().requires_grad_(True), ckv, cfg, pos, **kw)
    # ckv inside the cache: ckv's signature, pointers the general path refuses
    inside = kw["kv_cache"].view(torch.uint8).view(-1)[:ckv.numel() * 2]
    with pytest.raises(ValueError, match="overlaps an input"):
        rope_append_mla(q_pe, k_pe, inside.view(torch.bfloat16).view(ckv.shape), cfg, pos, **kw)
