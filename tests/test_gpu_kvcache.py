"""The KV-cache kernels on the GPU (skipped with a reason where there is none).

Rotated q and the k written to the cache must equal ``cuprope.rope_forward``'s
GPU result bit for bit (same cos/sin, same arithmetic); fp8 caches must hold
exactly the e4m3 bytes the NumPy rules (``kvcache_reference.scaled_e4m3``,
checked against the spec in test_kvcache.py) give for those values. Caches
start as random bytes: every byte not written by the spec must survive.
"""
import zlib

import numpy as np
import pytest

import cuprope
from conftest import GPU_TESTS
from torch_helpers import (apply_changes, count_calls, gen,  # noqa: F401 (gen: test_kvcache_cases)
                           host_bytes, randn, record_results, sentinel, tdt)
from cuprope import kvcache
from cuprope.kvcache import api as kvcache_api
from cuprope.kvcache import reference as kref
from cuprope.kvcache.cos_sin_cache import rotary_embedding
from oracle import assert_matches
from test_kvcache import (assert_bytes_equal, distinct_rows, expected_cache, spec_cos_sin,
                          spec_slot)

pytestmark = GPU_TESTS


def _torch():
    import torch
    return torch












def thd(cfg):
    return cuprope.RopeConfig(cfg.rotary_dim, inv_freq=cfg.inv_freq, interleaved=cfg.interleaved,
                              scale=cfg.scale, layout="thd", stream_map=cfg.stream_map)


SCHEMES = {
    "default": lambda d, il: cuprope.RopeConfig(d, base=500000.0, interleaved=il),
    "partial": lambda d, il: cuprope.RopeConfig(d // 2, interleaved=il),
    "yarn": lambda d, il: cuprope.RopeConfig(d, inv_freq=cuprope.scaling.yarn_table(
        d, 1e6, 4.0, original_max_position_embeddings=2048)[0], scale=1.1, interleaved=il),
}


def check_append(seed, dtype, cfg, cache, addressing, kv_layout="NHD", combined=False, t=37,
                 hq=8, hk=2, d=128, pages=23, ps=16, per_head_scale=False, q_offset=0,
                 device="cuda", pos_high=2 ** 31 - 1):
    """One fused call against the core kernel and the spec's cache rows."""
    torch = _torch()
    g = gen(seed, device)
    rng = np.random.default_rng(seed)
    if q_offset:  # a q whose rows start off the 16-byte grid: the one-pair width
        q = randn((t, hq, d + q_offset), dtype, g)[:, :, q_offset:]
    else:
        q = randn((t, hq, d), dtype, g)
    k, v = randn((t, hk, d), dtype, g), randn((t, hk, d), dtype, g)
    pos = torch.from_numpy(rng.integers(0, pos_high, t)).to(device)
    pos[:4] = torch.tensor([0, 1, 4095, 131071])[:t]
    cdt = "fp8" if cache == "fp8" else dtype
    inner = (ps, hk, d) if kv_layout == "NHD" else (hk, ps, d)
    caches = ({"kv_cache": sentinel((pages, 2) + inner, cdt, g)} if combined else
              {"k_cache": sentinel((pages,) + inner, cdt, g),
               "v_cache": sentinel((pages,) + inner, cdt, g)})
    before = {n: host_bytes(c) for n, c in caches.items()}
    kw = {}
    if cache == "fp8":
        shape = (hk,) if per_head_scale else ()
        kw["k_scale"] = torch.rand(shape, device=device, generator=g) * 0.2 + 0.01
        kw["v_scale"] = torch.rand(shape, device=device, generator=g) * 0.2 + 0.01
    if addressing == "slots":
        slots = rng.permutation(pages * ps)[:t].astype(np.int64)
        slots[3 % t], slots[-1] = -1, pages * ps + 5       # padding, past the cache
        rows = [spec_slot(s_, ps, pages) for s_ in slots]
        kw["slot_mapping"] = torch.from_numpy(slots).to(device)
    else:
        indices = np.append(rng.permutation(pages), pages + 1).astype(np.int32)
        indptr = np.array([0, 5, 5, 12, 24], np.int32)
        bi = rng.integers(0, 4, t).astype(np.int32)
        cp = rng.integers(0, 12 * ps, t).astype(np.int32)
        bi[3 % t], cp[-1] = -1, -1
        rows = distinct_rows(bi, cp, indices, indptr, ps, pages)  # a repeated row: padding
        kw.update({n: torch.from_numpy(a).to(device) for n, a in (
            ("kv_indices", indices), ("kv_indptr", indptr), ("batch_indices", bi),
            ("cache_positions", cp))})
    q0, k0 = q.clone(), k.clone()
    q_core = cuprope.rope_forward(q0, thd(cfg), positions=pos)
    k_core = cuprope.rope_forward(k0, thd(cfg), positions=pos)
    out = kvcache.rope_append_kv(q, k, v, cfg, pos, kv_layout=kv_layout, **caches, **kw)
    if device != "cpu":
        torch.cuda.synchronize()
    assert out is q
    assert np.array_equal(host_bytes(q), host_bytes(q_core)), "q differs from the core's"
    if cache == "fp8":
        ks = kw["k_scale"].cpu().numpy().reshape(-1)
        vs = kw["v_scale"].cpu().numpy().reshape(-1)
        kb = kref.scaled_e4m3(k_core.float().cpu().numpy(), ks[:, None] if ks.size > 1 else ks[0])
        vb = kref.scaled_e4m3(v.float().cpu().numpy(), vs[:, None] if vs.size > 1 else vs[0])
    else:
        kb, vb = host_bytes(k_core), host_bytes(v)
    for name, c in caches.items():
        exp = before[name]
        for plane, vals in (((0, kb), (1, vb)) if combined else
                            (((None, kb),) if name == "k_cache" else ((None, vb),))):
            exp = expected_cache(exp, rows, vals, kv_layout, plane)
        assert_bytes_equal(host_bytes(c), exp)


# The check_append cases, as functions of the device (test_kvcache_cases.py
# runs them on "cpu", the NumPy backend, to catch a wrong case before a GPU
# sees it).
def fused_case(dtype, cache, addressing, kv_layout, device="cuda"):
    check_append(zlib.crc32(f"{dtype}{cache}{addressing}{kv_layout}".encode()), dtype,
                 SCHEMES["default"](128, False), cache, addressing, kv_layout, device=device)


def schemes_case(scheme, interleaved, device="cuda"):
    check_append(7 + interleaved, "bfloat16", SCHEMES[scheme](128, interleaved), "fp8", "paged",
                 "HND" if interleaved else "NHD", combined=True, per_head_scale=True,
                 device=device)


def head_dims_case(d, device="cuda"):
    for t in (1, 3, 64):
        check_append(d + t, "bfloat16", SCHEMES["default"](d, False), "fp8", "slots", t=t, hq=32,
                     hk=8, d=d, pages=300, device=device)


def unaligned_case(device="cuda", dtype="bfloat16"):
    check_append(11, dtype, SCHEMES["partial"](128, True), "same", "slots", q_offset=1,
                 device=device)


def per_head_case(device="cuda"):
    rng = np.random.default_rng(3)
    per_head = cuprope.RopeConfig(128, inv_freq=rng.uniform(1e-4, 1.0, (4, 64)))
    check_append(12, "bfloat16", per_head, "same", "paged", hq=4, hk=4, device=device)


# (parameters shared with test_kvcache_cases.py)
FUSED_PARAMS = [(dt, c, a, lay) for dt in ("bfloat16", "float16", "float32")
                for c in ("same", "fp8") for a in ("slots", "paged") for lay in ("NHD", "HND")]
SCHEME_PARAMS = [(sc, il) for sc in sorted(SCHEMES) for il in (False, True)]
HEAD_DIMS = [64, 256]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("scheme,interleaved", [("default", False), ("yarn", True),
                                                ("partial", False)])
@pytest.mark.parametrize("cache", ["fp8", "none"])
def test_angle_table_gives_the_same_bits(dtype, scheme, interleaved, cache):
    """RopeConfig.cache_angles: tokens inside the table read it, the rest
    (positions past it, 131071 and random ones) compute; both must equal the
    core kernel's rotation bit for bit, and the table the computed angles."""
    cfg = SCHEMES[scheme](128, interleaved)
    cfg.cache_angles(5000)
    seed = zlib.crc32(f"table{dtype}{scheme}{cache}".encode())
    check_append(seed, dtype, cfg, cache, "slots", t=61, pos_high=7000)
    check_append(seed + 1, dtype, cfg, cache, "paged", t=5, pos_high=5000)
    from cuprope.kvcache.launch import angle_table
    tab = angle_table(cfg, 0).get()
    half = cfg.rotary_dim // 2
    assert tab.shape == (5000, 2 * half) and tab.dtype == np.float32
    p = np.array([0, 1, 2047, 4999])
    ang = p[:, None] * cfg.inv_freq[None, :]
    for col, fn in ((0, np.cos), (half, np.sin)):
        assert_matches(tab[p, col:col + half], fn(ang) * cfg.scale, 1.0, "float32")


def test_angle_table_off_and_errors():
    cfg = SCHEMES["default"](128, False)
    assert cfg.cache_angles(0) is cfg and cfg.angle_rows == 0
    with pytest.raises(ValueError, match="max_position"):
        cfg.cache_angles(-1)
    with pytest.raises(TypeError, match="max_position"):
        cfg.cache_angles(2.0)


@pytest.mark.parametrize("dtype,cache,addressing,kv_layout", FUSED_PARAMS)
def test_fused_equals_the_core_and_the_spec(dtype, cache, addressing, kv_layout):
    fused_case(dtype, cache, addressing, kv_layout)


@pytest.mark.parametrize("dtype,cache,addressing,kv_layout", FUSED_PARAMS)
def test_wide_instantiation_equals_the_core_and_the_spec(monkeypatch, dtype, cache, addressing,
                                                         kv_layout):
    """The WIDE kv_rope_kernel (held to more resident warps; prefill-sized
    grids take it) writes what the core and the spec say, as the other
    does: every launch takes it here (threshold 0), which is checked."""
    from cuprope.kvcache import launch
    monkeypatch.setattr(launch, "WIDE_WARPS_PER_SM", 0)
    taken = []

    def name(*a):
        taken.append(a[5])
        return kvcache_name(*a)
    kvcache_name = launch.kv_kernel_name
    monkeypatch.setattr(launch, "kv_kernel_name", name)
    fused_case(dtype, cache, addressing, kv_layout)
    assert taken and all(taken), taken


@pytest.mark.parametrize("scheme,interleaved", SCHEME_PARAMS)
def test_schemes_combined_kv_per_head_scales(scheme, interleaved):
    schemes_case(scheme, interleaved)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_head_dims_and_decode_sizes(d):
    head_dims_case(d)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_unaligned_rows_take_the_one_pair_width(dtype):
    """q off the 16-byte grid: the append takes the one-pair width, the core's
    call on an aligned copy the widest; the bits agree (fp32 included)."""
    unaligned_case(dtype=dtype)


def test_per_head_table_and_mrope_equal_the_core():
    per_head_case()
    torch = _torch()
    g = gen(13)
    mrope = cuprope.scaling.mrope_config([16, 24, 24], base=1e6)
    t = 21
    q, k, v = randn((t, 4, 128), "bfloat16", g), randn((t, 2, 128), "bfloat16", g), \
        randn((t, 2, 128), "bfloat16", g)
    pos = torch.randint(0, 100000, (3, t), device="cuda", dtype=torch.int32, generator=g)
    kc = torch.zeros(2, 16, 2, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    q_core = cuprope.rope_forward(q.clone(), thd(mrope), positions=pos)
    k_core = cuprope.rope_forward(k.clone(), thd(mrope), positions=pos)
    kvcache.rope_append_kv(q, k, v, mrope, pos, k_cache=kc, v_cache=vc,
                           slot_mapping=torch.arange(t, device="cuda"))
    assert np.array_equal(host_bytes(q), host_bytes(q_core))
    assert np.array_equal(host_bytes(kc.view(32, 2, 128)[:t]), host_bytes(k_core))
    assert np.array_equal(host_bytes(vc.view(32, 2, 128)[:t]), host_bytes(v))


def test_q_out_fp8():
    torch = _torch()
    g = gen(5)
    q, k, v = randn((9, 8, 128), "bfloat16", g), randn((9, 2, 128), "bfloat16", g), \
        randn((9, 2, 128), "bfloat16", g)
    pos = torch.arange(9, device="cuda") * 7919
    cfg = SCHEMES["default"](128, False)
    q_out = torch.zeros(9, 8, 128, device="cuda", dtype=torch.float8_e4m3fn)
    kc = torch.zeros(1, 16, 2, 128, device="cuda", dtype=torch.float8_e4m3fn)
    qs = torch.tensor([0.05], device="cuda")
    one = torch.ones((), device="cuda")
    q0 = q.clone()
    kvcache.rope_append_kv(q, k, v, cfg, pos, k_cache=kc, v_cache=kc.clone(), q_out=q_out,
                           q_scale=qs, k_scale=one, v_scale=one,
                           slot_mapping=torch.arange(9, device="cuda"))
    assert torch.equal(q, q0)
    q_core = cuprope.rope_forward(q0, thd(cfg), positions=pos)
    assert np.array_equal(host_bytes(q_out), kref.scaled_e4m3(q_core.float().cpu().numpy(), 0.05))


def test_cuda_graph_decode_step_sees_new_positions_slots_and_scales():
    """A decode step captured once and replayed with new inputs, positions,
    slots and scales matches eager calls on copies of the same state."""
    torch = _torch()
    g = gen(21)
    b, hq, hk, d, pages, ps = 8, 32, 8, 128, 40, 16
    cfg = SCHEMES["default"](d, False)
    q, k, v = (randn((b, h, d), "bfloat16", g) for h in (hq, hk, hk))
    pos = torch.zeros(b, dtype=torch.int64, device="cuda")
    slots = torch.zeros(b, dtype=torch.int64, device="cuda")
    ks, vs = torch.ones((), device="cuda"), torch.ones((), device="cuda")
    kv = sentinel((pages, 2, ps, hk, d), "fp8", g)

    def step(q_, k_, v_, pos_, slots_, kv_, ks_, vs_):
        return kvcache.rope_append_kv(q_, k_, v_, cfg, pos_, kv_cache=kv_, slot_mapping=slots_,
                                      k_scale=ks_, v_scale=vs_)
    step(q, k, v, pos, slots, kv, ks, vs)                  # warm-up: compile, device tables
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(q, k, v, pos, slots, kv, ks, vs)
    rng = np.random.default_rng(0)
    for it in range(3):
        new = [randn(x.shape, "bfloat16", g) for x in (q, k, v)]
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        pos.copy_(torch.from_numpy(rng.integers(0, 10 ** 6, b)))
        sl = rng.permutation(pages * ps)[:b]
        sl[it] = -1
        slots.copy_(torch.from_numpy(sl))
        ks.fill_(float(rng.uniform(0.01, 0.3)))
        vs.fill_(float(rng.uniform(0.01, 0.3)))
        kv_eager, q_eager = kv.clone(), q.clone()
        step(q_eager, k.clone(), v.clone(), pos, slots, kv_eager, ks, vs)
        graph.replay()
        torch.cuda.synchronize()
        assert np.array_equal(host_bytes(q), host_bytes(q_eager))
        assert np.array_equal(host_bytes(kv), host_bytes(kv_eager))
        assert not np.array_equal(host_bytes(q), host_bytes(new[0]))  # it did rotate


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("table_dtype", ["float32", "same"])
def test_rotary_embedding_gpu(dtype, neox, table_dtype):
    torch = _torch()
    g = gen(31)
    t, hq, hk, d, r = 45, 32, 8, 128, 128 if neox else 64
    ang = np.arange(4096)[:, None] * 10000.0 ** (-np.arange(r // 2) / (r // 2))
    table = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], -1)).float().cuda()
    if table_dtype == "same":
        table = table.to(tdt(dtype))
    qkv = randn((t, (hq + 2 * hk) * d), dtype, g)
    query, key = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d]
    pos = torch.randint(0, 4096, (t,), device="cuda", generator=g)
    pos[5] = 4096                                              # outside the table: untouched
    before = qkv.clone()
    import cuprope.torch as ctorch
    ctorch.rotary_embedding(pos, query, key, d, table, neox)
    torch.cuda.synchronize()
    tab = table.double().cpu().numpy()
    p = pos.cpu().numpy()
    for x, x0, h in ((query, before[:, :hq * d], hq), (key, before[:, hq * d:(hq + hk) * d], hk)):
        ref = spec_cos_sin(x0.double().cpu().numpy().reshape(t, h, d), p, tab, neox)
        assert_matches(x.double().cpu().numpy().reshape(t, h, d), ref, 5.0, dtype)
    assert np.array_equal(host_bytes(qkv[5]), host_bytes(before[5]))
    assert np.array_equal(host_bytes(qkv[:, (hq + hk) * d:]), host_bytes(before[:, (hq + hk) * d:]))
    if not neox:
        view = qkv[:, :(hq + hk) * d].reshape(t, hq + hk, d)
        assert np.array_equal(host_bytes(view[:, :, r:]),
                              host_bytes(before[:, :(hq + hk) * d].reshape(t, hq + hk, d)[:, :, r:]))


# ---------------------------------------------------------------- fast paths


def _decode_append_args(g, dtype, cache, addressing, b=4, hq=8, hk=2, d=128, pages=9, ps=16,
                        fused_qkv=False):
    """Fresh decode-step arrays: q, k, v (views of one qkv buffer when
    ``fused_qkv``), positions, caches (zeros), addressing and fp8 scales."""
    torch = _torch()
    if fused_qkv:
        qkv = randn((b, (hq + 2 * hk) * d), dtype, g)
        q = qkv[:, :hq * d].view(b, hq, d)
        k = qkv[:, hq * d:(hq + hk) * d].view(b, hk, d)
        v = qkv[:, (hq + hk) * d:].view(b, hk, d)
    else:
        q, k, v = randn((b, hq, d), dtype, g), randn((b, hk, d), dtype, g), randn((b, hk, d), dtype, g)
    pos = torch.randint(0, 100000, (b,), device="cuda", generator=g)
    cdt = tdt("fp8" if cache == "fp8" else dtype)
    kw = {"k_cache": torch.zeros(pages, ps, hk, d, device="cuda", dtype=cdt),
          "v_cache": torch.zeros(pages, ps, hk, d, device="cuda", dtype=cdt)}
    if cache == "fp8":
        kw["k_scale"] = torch.rand((), device="cuda", generator=g) * 0.2 + 0.01
        kw["v_scale"] = torch.rand((), device="cuda", generator=g) * 0.2 + 0.01
    if addressing == "slots":
        kw["slot_mapping"] = torch.randperm(pages * ps, device="cuda", generator=g)[:b]
    else:
        kw["kv_indices"] = torch.randperm(pages, device="cuda", generator=g).to(torch.int32)
        kw["kv_indptr"] = torch.tensor([0, 2, 4, 6, 9], device="cuda", dtype=torch.int32)
        kw["batch_indices"] = torch.arange(b, device="cuda", dtype=torch.int32)
        kw["cache_positions"] = torch.randint(0, 2 * ps, (b,), device="cuda", generator=g,
                                              dtype=torch.int32)
    return q, k, v, pos, kw


def _state(q, kw):
    return [host_bytes(q)] + [host_bytes(kw[n]) for n in ("k_cache", "v_cache")]


@pytest.mark.parametrize("dtype,cache,addressing", [("bfloat16", "same", "slots"),
                                                    ("bfloat16", "fp8", "slots"),
                                                    ("bfloat16", "fp8", "paged"),
                                                    ("float16", "same", "paged")])
@pytest.mark.parametrize("fused_qkv", [False, True])
def test_append_fast_path_equals_the_general_path(dtype, cache, addressing, fused_qkv,
                                                  monkeypatch):
    """Repeated decode steps with fresh tensors take the fast path (one general
    call in all) and write exactly what the general path (check=True) writes
    on copies of the same state."""
    calls = count_calls(monkeypatch, kvcache_api, "_gpu_append")
    cfg = SCHEMES["default"](128, False)
    g = gen(41)
    for step in range(4):
        q, k, v, pos, kw = _decode_append_args(g, dtype, cache, addressing, fused_qkv=fused_qkv)
        q_ref = q.clone()
        kw_ref = {n: (x.clone() if n in ("k_cache", "v_cache") else x) for n, x in kw.items()}
        kvcache.rope_append_kv(q_ref, k, v, cfg, pos, check=True, **kw_ref)  # general path
        n_general = len(calls)
        out = kvcache.rope_append_kv(q, k, v, cfg, pos, **kw)
        if step:
            assert len(calls) == n_general, "a repeated call took the general path"
        assert out is q
        torch = _torch()
        torch.cuda.synchronize()
        for got, want in zip(_state(q, kw), _state(q_ref, kw_ref)):
            assert np.array_equal(got, want)
        assert not np.array_equal(host_bytes(kw["k_cache"]), 0 * host_bytes(kw["k_cache"]))


def test_append_fast_path_not_taken_when_arguments_change(monkeypatch):
    """Each change of a signature or setting reaches the general path (and
    gives the general path's result), then is fast in turn."""
    torch = _torch()
    calls = count_calls(monkeypatch, kvcache_api, "_gpu_append")
    cfg = SCHEMES["default"](128, False)
    g = gen(43)

    def run(**change):
        q, k, v, pos, kw = apply_changes(_decode_append_args(
            g, "bfloat16", change.pop("cache", "same"), "slots", b=change.pop("b", 4)), change)
        before = len(calls)
        q_ref, kw_ref = q.clone(), {n: x.clone() for n, x in kw.items()}
        kvcache.rope_append_kv(q, k, v, cfg, pos, **kw)
        kvcache.rope_append_kv(q_ref, k, v, cfg, pos, check=True, **kw_ref)
        torch.cuda.synchronize()
        for got, want in zip(_state(q, kw), _state(q_ref, kw_ref)):
            assert np.array_equal(got, want)
        return len(calls) - before - 1   # general-path calls of the checked call excluded

    assert run() == 1                                      # first of its kind
    assert run() == 0                                      # repeated: fast
    assert run(b=5) == 1                                   # new shapes
    assert run(pos=lambda p: p.to(torch.int32)) == 1       # positions' dtype
    assert run(q=lambda x: x.transpose(0, 1).contiguous().transpose(0, 1)) == 1  # strides
    assert run(k=lambda x: torch.cat([x, x], -1)[..., :128]) == 1  # a non-contiguous view
    assert run(cache="fp8") == 1                           # fp8 cache, scales from None
    assert run(cache="fp8") == 0
    assert run(kw=lambda kw: {**kw, "q_out": torch.zeros(4, 8, 128, device="cuda",
                                                         dtype=torch.bfloat16)}) == 1
    assert run(kw=lambda kw: {**kw, "q_out": torch.zeros(4, 8, 128, device="cuda",
                                                         dtype=torch.bfloat16)}) == 0


def test_append_repeated_call_still_raises_for_bad_input():
    torch = _torch()
    cfg = SCHEMES["default"](128, False)
    g = gen(47)
    for _ in range(2):
        q, k, v, pos, kw = _decode_append_args(g, "bfloat16", "fp8", "slots")
        kvcache.rope_append_kv(q, k, v, cfg, pos, **kw)
    with pytest.raises(ValueError, match="positions is on host"):
        kvcache.rope_append_kv(q, k, v, cfg, pos.cpu(), **kw)
    with pytest.raises(ValueError, match="k's heads"):
        kvcache.rope_append_kv(q, k, v[:, :1], cfg, pos, **kw)
    with pytest.raises(ValueError, match="k_scale is needed"):
        kvcache.rope_append_kv(q, k, v, cfg, pos, **{**kw, "k_scale": None})
    # the cache overlapping k on a call whose signature is cached: refused
    flat = kw["k_cache"].view(torch.uint8).view(-1)
    with pytest.raises(ValueError, match="overlaps"):
        kvcache.rope_append_kv(q, flat[: k.numel() * 2].view(torch.bfloat16).view(k.shape), v,
                               cfg, pos, **kw)


@pytest.mark.parametrize("bad", [0.0, -0.05, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
def test_append_bad_device_scale_with_check_raises_and_writes_nothing(bad, name):
    """check=True reads the device scales (with the indices) before the launch."""
    torch = _torch()
    cfg = SCHEMES["default"](128, False)
    q, k, v, pos, kw = _decode_append_args(gen(48), "bfloat16", "fp8", "slots")
    kw[name] = torch.tensor(bad, device="cuda")
    before = _state(q, kw)
    with pytest.raises(ValueError, match=rf"^{name} must be positive and finite"):
        kvcache.rope_append_kv(q, k, v, cfg, pos, check=True, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(_state(q, kw), before))
    kvcache.rope_append_kv(q, k, v, cfg, pos, **kw)   # unchecked: the kernel reads it as is


def test_append_numpy_scalar_scale_with_gpu_tensors_says_to_wrap_it():
    cfg = SCHEMES["default"](128, False)
    q, k, v, pos, kw = _decode_append_args(gen(49), "bfloat16", "fp8", "slots")
    with pytest.raises(ValueError, match=r"^k_scale is a NumPy scalar \(host memory\) but the "
                                         r"tensors are on cuda:0: wrap it as a float32 device "
                                         r"scalar, e\.g\. torch\.tensor\(0\.05, "):
        kvcache.rope_append_kv(q, k, v, cfg, pos, **{**kw, "k_scale": np.float32(0.05)})


def _rotary_args(g, dtype, t=6, hq=8, hk=2, d=128, with_key=True):
    torch = _torch()
    ang = np.arange(512)[:, None] * 10000.0 ** (-np.arange(d // 2) / (d // 2))
    table = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], -1)).float().cuda()
    qkv = randn((t, (hq + 2 * hk) * d), dtype, g)
    query = qkv[:, :hq * d]
    key = qkv[:, hq * d:(hq + hk) * d] if with_key else None
    pos = torch.randint(0, 512, (t,), device="cuda", generator=g)
    return pos, query, key, table


def test_rotary_embedding_fast_path_equals_the_general_path(monkeypatch):
    """q and k slices of one qkv tensor (their ranges interleave): repeated
    calls stay on the fast path and match check=True (the general path)."""
    from cuprope.kvcache import cos_sin_cache as csc
    import cuprope.kvcache.rotary as rotary
    import cuprope.torch as ctorch
    calls = count_calls(monkeypatch, rotary, "kv_spec")
    g = gen(53)
    for step in range(4):
        pos, query, key, table = _rotary_args(g, "bfloat16")
        qr, kr = query.clone(), key.clone()
        csc.rotary_embedding(pos, qr, kr, 128, table, True, check=True)
        n_general = len(calls)
        ctorch.rotary_embedding(pos, query, key, 128, table, True)
        if step:
            assert len(calls) == n_general, "a repeated call took the general path"
        assert np.array_equal(host_bytes(query), host_bytes(qr))
        assert np.array_equal(host_bytes(key), host_bytes(kr))
    # key=None, another table dtype, GPT-J pairs: each its own general call first
    for change in ({"with_key": False}, {"table": "same"}, {"neox": False}):
        before = len(calls)
        for _ in range(2):
            pos, query, key, table = _rotary_args(g, "bfloat16",
                                                  with_key=change.get("with_key", True))
            if "table" in change:
                table = table.to(tdt("bfloat16"))
            neox = change.get("neox", True)
            qr = query.clone()
            kr = None if key is None else key.clone()
            csc.rotary_embedding(pos, qr, kr, 128, table, neox, check=True)
            ctorch.rotary_embedding(pos, query, key, 128, table, neox)
            assert np.array_equal(host_bytes(query), host_bytes(qr))
        assert len(calls) - before == 3, change  # two checked calls, one first fast-path miss
    # a repeated signature with query and key overlapping: the general path refuses it
    pos, query, key, table = _rotary_args(g, "bfloat16")
    with pytest.raises(ValueError, match="overlap"):
        ctorch.rotary_embedding(pos, query, query[:, :2 * 128], 128, table, True)
    with pytest.raises(ValueError, match="positions is on host"):
        ctorch.rotary_embedding(pos.cpu(), query, key, 128, table, True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("table_dtype", ["float32", "same"])
@pytest.mark.parametrize("r", [128, 64])
def test_rotary_embedding_decode_rows_equal_kv_rope_kernel(monkeypatch, dtype, neox, table_dtype,
                                                           r):
    """rotary_embedding of few tokens takes rope_decode_kernel (checked): its
    query and key are kv_rope_kernel's bits (MAX_TOKENS 0 forces that one),
    tokens outside the cos_sin_cache untouched, for 1, 7 and 64 tokens."""
    from cuprope.rope import decode
    import cuprope.kvcache.launch as kl
    torch = _torch()
    names = record_results(monkeypatch, (kl, rotary_mod()), "kv_spec", lambda res: res.kernel)
    g = gen(zlib.crc32(f"rotary-decode{dtype}{neox}{table_dtype}{r}".encode()))
    hq, hk, d = 8, 2, 128
    ang = np.arange(300)[:, None] * 10000.0 ** (-np.arange(r // 2) / (r // 2))
    table = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], -1)).float().cuda()
    if table_dtype == "same":
        table = table.to(tdt(dtype))
    full = decode.MAX_TOKENS  # read once: the loop below patches it
    for t in (1, 7, 64):
        qkv = randn((t, (hq + 2 * hk) * d), dtype, g)
        pos = torch.randint(-5, 310, (t,), device="cuda", generator=g)  # some outside
        pos[0] = 17
        pos[-1] = 300 if t > 1 else 17
        runs = []
        for limit in (full, 0):
            monkeypatch.setattr(decode, "MAX_TOKENS", limit)
            x = qkv.clone()
            # stream= takes the general path: the launch is planned anew (kv_spec)
            rotary_embedding(pos, x[:, :hq * d], x[:, hq * d:(hq + hk) * d], d, table, neox,
                             check=False, stream=torch.cuda.current_stream())
            runs.append(x)
        assert "rope_decode_kernel" in names[-2] and "kv_rope_kernel" in names[-1], names[-2:]
        assert np.array_equal(host_bytes(runs[0]), host_bytes(runs[1])), t
        out = (pos < 0) | (pos >= 300)
        assert np.array_equal(host_bytes(runs[0][out]), host_bytes(qkv[out]))
        assert not np.array_equal(host_bytes(runs[0][~out]), host_bytes(qkv[~out]))


def rotary_mod():
    import cuprope.kvcache.rotary as rotary
    return rotary
