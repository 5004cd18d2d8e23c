"""cuprope.kvcache (fused RoPE + KV-cache append) and cuprope.cos_sin_cache on
the NumPy backend, against a float64 reference written here from the spec:
rotation per (token, head, pair), cache rows per token (flat slots or
FlashInfer's paged indices), e4m3 by nearest-even search over the 254 finite
values. Caches start as random bytes (sentinels): every byte the spec does
not write must come back unchanged."""
import numpy as np
import pytest

import cuprope
from cuprope import kvcache
from cuprope.kvcache import reference as kref
from cuprope.kvcache.cos_sin_cache import rotary_embedding
from oracle import assert_matches, round_to

ml_dtypes = pytest.importorskip("ml_dtypes")
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
E4M3 = ml_dtypes.float8_e4m3fn


# ---------------------------------------------------------------- the spec
def spec_rotate(x, pos, cfg):
    """float64 [T, H, D] rotated by cfg at pos ([T], or [n_streams, T])."""
    x = np.asarray(x, np.float64)
    t, h, d = x.shape
    npairs = cfg.rotary_dim // 2
    out = x.copy()
    for j in range(npairs):
        p = np.asarray(pos)[cfg.stream_map[j]] if cfg.stream_map is not None else np.asarray(pos)
        f = cfg.inv_freq[:, j][None, :] if cfg.per_head else cfg.inv_freq[j]
        a = p.astype(np.float64)[:, None] * f                        # [T, H or 1]
        c, s = np.cos(a) * cfg.scale, np.sin(a) * cfg.scale
        i1, i2 = (2 * j, 2 * j + 1) if cfg.interleaved else (j, j + npairs)
        x1, x2 = x[:, :, i1], x[:, :, i2]
        out[:, :, i1], out[:, :, i2] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def _e4m3_table():
    bits = np.arange(127)                                            # 0x00..0x7e: finite >= 0
    e, m = bits >> 3, bits & 7
    return np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7.0))


def spec_e4m3(x):
    """e4m3 bits of float32 x: nearest, ties to an even mantissa, |x| >= 448
    (and inf) to ±448, NaN to 0x7f."""
    x = np.asarray(x, np.float32).astype(np.float64).reshape(-1)
    vals = _e4m3_table()
    out = np.empty(x.size, np.uint8)
    for i, v in enumerate(x):
        if np.isnan(v):
            out[i] = 0x7F
            continue
        a = min(abs(v), 448.0)
        k = int(np.searchsorted(vals, a))
        if k < vals.size and vals[k] == a:
            best = k
        else:
            lo, hi = k - 1, k
            dl, dh = a - vals[lo], vals[hi] - a
            best = lo if dl < dh or (dl == dh and lo % 2 == 0) else hi
        out[i] = best | (0x80 if np.signbit(v) else 0)
    return out


def spec_fp8(x_t, scale):
    """What an fp8 target holds for values x_t (already in the input dtype)."""
    s = np.asarray(scale, np.float32).reshape(-1)
    inv = (np.float32(1) / s)
    inv = inv[:, None] if inv.size > 1 else inv[0]
    with np.errstate(over="ignore", invalid="ignore"):
        prod = np.asarray(x_t, np.float32) * inv
    return spec_e4m3(prod).reshape(prod.shape)


def spec_slot(slot, ps, pages):
    return None if slot < 0 or slot >= pages * ps else (slot // ps, slot % ps)


def spec_paged(b, p, indices, indptr, ps, pages):
    if b < 0 or p < 0 or b >= len(indptr) - 1:
        return None
    j = indptr[b] + p // ps
    if j >= indptr[b + 1] or j >= len(indices) or not 0 <= indices[j] < pages:
        return None
    return indices[j], p % ps


# ---------------------------------------------------------------- fixtures
def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(np.float32).astype(NP[dtype])


def sentinel_cache(rng, shape, dtype):
    """A cache of random bytes (finite or not: it is compared bytewise)."""
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def distinct_rows(bi, cp, indices, indptr, ps, pages):
    """spec_paged's row of each token, where a token whose row an earlier
    token already takes becomes padding (cp set to -1 in place): of two
    tokens with one row, which lands is unspecified (the GPU's warps race)."""
    rows, seen = [], set()
    for i, (b_, p_) in enumerate(zip(bi, cp)):
        r = spec_paged(b_, p_, indices, indptr, ps, pages)
        if r is not None and (int(r[0]), int(r[1])) in seen:
            cp[i], r = -1, None
        if r is not None:
            seen.add((int(r[0]), int(r[1])))
        rows.append(r)
    return rows


def expected_cache(cache0, rows, values_bytes, kv_layout, plane=None):
    """cache0's bytes with values_bytes[i] ([Hk, D] as uint8 of the element
    size) written at rows[i] = (page, row) (None: skipped). No two tokens may
    name one row: which of them lands is unspecified, so no expectation
    holds (draw paged inputs through distinct_rows)."""
    live = [(int(r[0]), int(r[1])) for r in rows if r is not None]
    assert len(set(live)) == len(live), "two tokens write one cache row: the result is unspecified"
    exp = cache0.copy()
    view = exp if plane is None else exp[:, plane]
    if kv_layout == "HND":
        view = view.transpose(0, 2, 1, 3)
    for loc, val in zip(rows, values_bytes):
        if loc is not None:
            view[loc[0], loc[1]] = val
    return exp


def assert_bytes_equal(a, b):
    a8, b8 = np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
    bad = np.flatnonzero(a8.reshape(-1) != b8.reshape(-1))
    assert bad.size == 0, f"{bad.size} bytes differ, first at byte {bad[:5]}"


CONFIGS = {
    "default": lambda d, il: cuprope.RopeConfig(d, base=10000.0, interleaved=il),
    "partial": lambda d, il: cuprope.RopeConfig(d // 2, base=500000.0, interleaved=il),
    "yarn": lambda d, il: cuprope.RopeConfig(d, inv_freq=cuprope.scaling.yarn_table(
        d, 1e6, 4.0, original_max_position_embeddings=2048)[0], scale=1.1, interleaved=il),
}


def _run(rng, dtype, cfg, cache_kind, kv_layout, combined, addressing, q_inplace=True,
         t=13, hq=4, hk=2, d=32, pages=7, ps=4, per_head_scale=False):
    q, k, v = rand(rng, (t, hq, d), dtype), rand(rng, (t, hk, d), dtype), rand(rng, (t, hk, d), dtype)
    pos = rng.integers(0, 70000, size=t).astype(np.int64)
    cdt = NP[dtype] if cache_kind == "same" else E4M3
    inner = (ps, hk, d) if kv_layout == "NHD" else (hk, ps, d)
    caches = ({"kv_cache": sentinel_cache(rng, (pages, 2) + inner, cdt)} if combined else
              {"k_cache": sentinel_cache(rng, (pages,) + inner, cdt),
               "v_cache": sentinel_cache(rng, (pages,) + inner, cdt)})
    before = {n: c.copy() for n, c in caches.items()}
    kw = {}
    if cache_kind == "fp8":
        kw["k_scale"] = (rng.uniform(0.01, 0.5, hk) if per_head_scale else
                         np.array(rng.uniform(0.01, 0.5))).astype(np.float32)
        kw["v_scale"] = (rng.uniform(0.01, 0.5, hk) if per_head_scale else
                         np.array([rng.uniform(0.01, 0.5)])).astype(np.float32)
    if addressing == "slots":
        slots = rng.permutation(pages * ps)[:t].astype(np.int64)
        slots[1], slots[5] = -1, pages * ps + 3                       # padding, out of range
        rows = [spec_slot(sl, ps, pages) for sl in slots]
        kw["slot_mapping"] = slots
    else:
        # seq 1 owns no page; seq 2's 5th page id is not a page of the cache
        indices = np.append(rng.permutation(pages), pages + 2).astype(np.int32)
        indptr = np.array([0, 3, 3, 8], np.int32)
        bi = rng.integers(0, 3, size=t).astype(np.int32)
        cp = rng.integers(0, 5 * ps, size=t).astype(np.int32)
        bi[6:9], cp[6:9] = 2, [4 * ps, 4 * ps + 1, 4 * ps - 1]       # a bad page id, and its neighbour
        bi[2], cp[3], bi[4] = -1, -2, 7                               # padding x2, bad batch
        rows = distinct_rows(bi, cp, indices, indptr, ps, pages)
        kw.update(kv_indices=indices, kv_indptr=indptr, batch_indices=bi, cache_positions=cp)
    q0 = q.copy()
    res = kvcache.rope_append_kv(q, k, v, cfg, pos, kv_layout=kv_layout, **caches, **kw)
    assert res is q
    q_ref = spec_rotate(q0.astype(np.float64), pos, cfg)
    assert_matches(q.astype(np.float64), q_ref, 4.0, dtype)
    thd = cuprope.RopeConfig(cfg.rotary_dim, inv_freq=cfg.inv_freq, interleaved=cfg.interleaved,
                             scale=cfg.scale, layout="thd", stream_map=cfg.stream_map)
    assert_bytes_equal(q, cuprope.rope_forward(q0, thd, positions=pos))  # the core's, bit for bit
    k_t = round_to(spec_rotate(k.astype(np.float64), pos, cfg), dtype).astype(NP[dtype])
    assert_bytes_equal(k_t, cuprope.rope_forward(k, thd, positions=pos))
    if cache_kind == "fp8":
        kb, vb = spec_fp8(k_t, kw["k_scale"]), spec_fp8(v, kw["v_scale"])
    else:
        kb, vb = k_t.view(np.uint8).reshape(t, hk, -1), v.view(np.uint8).reshape(t, hk, -1)
    for name, cache in caches.items():
        for plane, vals in (((0, kb), (1, vb)) if combined else
                            (((None, kb),) if name == "k_cache" else ((None, vb),))):
            before[name] = expected_cache(before[name].view(np.uint8).reshape(
                before[name].shape[:-1] + (-1,)), rows, vals, kv_layout, plane)
        assert_bytes_equal(cache, before[name])
    assert sum(r is not None for r in rows) < t


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("cache_kind", ["same", "fp8"])
@pytest.mark.parametrize("addressing", ["slots", "paged"])
def test_append_matches_the_spec(rng, dtype, cache_kind, addressing):
    _run(rng, dtype, CONFIGS["default"](32, False), cache_kind, "NHD", False, addressing)


@pytest.mark.parametrize("scheme", sorted(CONFIGS))
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("kv_layout,combined", [("NHD", True), ("HND", False), ("HND", True)])
def test_schemes_layouts_and_combined_kv(rng, scheme, interleaved, kv_layout, combined):
    _run(rng, "bfloat16", CONFIGS[scheme](32, interleaved), "fp8", kv_layout, combined, "paged",
         per_head_scale=interleaved)


def test_per_head_table_and_stream_map(rng):
    d = 32
    per_head = cuprope.RopeConfig(d, inv_freq=rng.uniform(1e-4, 1.0, (3, d // 2)))
    _run(rng, "float32", per_head, "same", "NHD", False, "slots", hq=3, hk=3)
    mrope = cuprope.scaling.mrope_config([4, 6, 6], base=1e6)
    t = 9
    q, k, v = rand(rng, (t, 2, d), "bfloat16"), rand(rng, (t, 1, d), "bfloat16"), rand(rng, (t, 1, d), "bfloat16")
    pos = rng.integers(0, 5000, size=(3, t)).astype(np.int32)
    kc = sentinel_cache(rng, (3, 4, 1, d), ml_dtypes.bfloat16)
    vc = kc.copy()
    q0 = q.copy()
    kvcache.rope_append_kv(q, k, v, mrope, pos, k_cache=kc, v_cache=vc, slot_mapping=np.arange(t))
    assert_matches(q.astype(np.float64), spec_rotate(q0.astype(np.float64), pos, mrope), 4.0,
                   "bfloat16")
    k_t = round_to(spec_rotate(k.astype(np.float64), pos, mrope), "bfloat16")
    assert_bytes_equal(kc.reshape(12, 1, d)[:t], k_t.astype(ml_dtypes.bfloat16))
    assert_bytes_equal(vc.reshape(12, 1, d)[:t], v)


def test_q_out_fp8_and_4d_input(rng):
    b, s, hq, hk, d = 2, 3, 4, 2, 16
    q, k, v = rand(rng, (b, s, hq, d), "float16"), rand(rng, (b, s, hk, d), "float16"), \
        rand(rng, (b, s, hk, d), "float16")
    cfg = cuprope.RopeConfig(d)
    pos = rng.integers(0, 100, size=(b, s)).astype(np.int64)
    kc = np.zeros((2, 4, hk, d), np.float16)
    q_out = np.zeros((b, s, hq, d), E4M3)
    q0 = q.copy()
    res = kvcache.rope_append_kv(q, k, v, cfg, pos, k_cache=kc, v_cache=kc.copy(),
                                 slot_mapping=np.arange(b * s).reshape(b, s), q_out=q_out,
                                 q_scale=np.array(0.25, np.float32))
    assert res is q_out
    assert_bytes_equal(q, q0)                                         # q itself untouched
    q_t = round_to(spec_rotate(q0.reshape(-1, hq, d), pos.reshape(-1), cfg), "float16")
    assert_bytes_equal(q_out.reshape(-1, hq, d), spec_fp8(q_t.astype(np.float16), 0.25).view(E4M3))
    k_t = round_to(spec_rotate(k.reshape(-1, hk, d), pos.reshape(-1), cfg), "float16")
    assert_bytes_equal(kc.reshape(8, hk, d)[:6], k_t.astype(np.float16))


def test_partial_rotary_out_of_place_copies_the_rest(rng):
    cfg = cuprope.RopeConfig(16)
    q, k, v = rand(rng, (5, 2, 48), "float32"), rand(rng, (5, 1, 48), "float32"), rand(rng, (5, 1, 48), "float32")
    pos = np.arange(5) * 1000
    q_out = np.full_like(q, np.nan)
    kc = np.full((2, 4, 1, 48), np.nan, np.float32)
    kvcache.rope_append_kv(q, k, v, cfg, pos, k_cache=kc, v_cache=kc.copy(),
                           slot_mapping=np.arange(5, dtype=np.int64), q_out=q_out)
    assert_matches(q_out, spec_rotate(q, pos, cfg), 4.0, "float32")
    assert_bytes_equal(q_out[..., 16:], q[..., 16:])
    assert_bytes_equal(kc.reshape(8, 1, 48)[:5, :, 16:], k[..., 16:])


def test_torch_cpu_tensors_and_fp8_reader(rng):
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    t, hk, d = 6, 2, 16
    g = torch.Generator().manual_seed(int(rng.integers(2 ** 31)))
    q, k, v = (torch.randn(t, h, d, generator=g).to(torch.bfloat16) for h in (4, hk, hk))
    kv = torch.zeros(3, 2, hk, 4, d, dtype=torch.float8_e4m3fn)
    scale = torch.tensor([0.5, 0.125])
    kvcache.rope_append_kv(q, k, v, cuprope.RopeConfig(d), torch.arange(t), kv_cache=kv,
                           kv_layout="HND", kv_indices=torch.tensor([2, 0, 1]),
                           kv_indptr=torch.tensor([0, 3]), batch_indices=torch.zeros(t, dtype=torch.int32),
                           cache_positions=torch.arange(t), k_scale=scale, v_scale=scale)
    vals = kref.dequantize(kv[:, 1], scale, head_axis=-3)             # [pages, Hk, ps, D]
    got = torch.cat([vals[2], vals[0]], dim=1)[:, :t].transpose(0, 1)  # pages 2, 0 hold rows 0..7
    # e4m3 rounds to within half an ulp: 2^-4 relative (3 mantissa bits), and
    # half the subnormal step 2^-9 times the larger scale (0.5) absolute
    assert torch.allclose(got, v.float(), rtol=2 ** -4, atol=0.5 * 2 ** -10)
    assert (kv[1].view(torch.uint8) == 0).all()                       # page 1 untouched


def test_quantizer_matches_the_intrinsic_rules(rng):
    edge = np.array([0.0, -0.0, 448, 449, 463.99, 464, 465, 480, 1e30, np.inf, -np.inf, np.nan,
                     -np.nan, 2 ** -10, 2 ** -10 * 1.0001, 3 * 2 ** -10, -2 ** -9, 1e-40, -1e-40,
                     0.5 + 2 ** -5, 0.5 + 3 * 2 ** -5, 240, 232, 248], np.float32)
    x = np.concatenate([edge, -edge, rng.standard_normal(4000).astype(np.float32) * 100,
                        (rng.standard_normal(2000) * 1e-2).astype(np.float32)])
    assert_bytes_equal(kref.quantize_e4m3(x), spec_e4m3(x))
    assert kref.quantize_e4m3(np.float32(np.nan)) == 0x7F
    assert kref.quantize_e4m3(np.float32(-np.inf)) == 0xFE


def test_out_of_range_indices_are_skipped_or_raise_with_check(rng):
    cfg = cuprope.RopeConfig(16)
    q, k, v = rand(rng, (3, 1, 16), "float32"), rand(rng, (3, 1, 16), "float32"), rand(rng, (3, 1, 16), "float32")
    kc = np.zeros((2, 4, 1, 16), np.float32)
    args = dict(k_cache=kc, v_cache=kc.copy())
    with pytest.raises(ValueError, match=r"slot_mapping\[2\] = 8 is past the cache"):
        kvcache.rope_append_kv(q, k, v, cfg, np.arange(3), slot_mapping=np.array([0, -1, 8]),
                               check=True, **args)
    kvcache.rope_append_kv(q, k, v, cfg, np.arange(3), slot_mapping=np.array([0, -1, 8]), **args)
    assert np.count_nonzero(kc.any(axis=(2, 3))) == 1
    paged = dict(kv_indices=np.array([1, 0]), kv_indptr=np.array([0, 1, 2]))
    bad = [(dict(batch_indices=np.array([0, 2, 0]), cache_positions=np.arange(3)),
            r"batch_indices\[1\] = 2"),
           (dict(batch_indices=np.array([0, 1, 1]), cache_positions=np.array([0, 1, 4])),
            r"cache_positions\[2\] = 4 is past sequence 1's 4"),
           (dict(batch_indices=np.zeros(3, int), cache_positions=np.arange(3),
                 kv_last_page_len=np.array([2, 4])), r"cache_positions\[2\] = 2 is past")]
    for extra, msg in bad:
        with pytest.raises(ValueError, match=msg):
            kvcache.rope_append_kv(q, k, v, cfg, np.arange(3), check=True, **args, **paged, **extra)
    with pytest.raises(ValueError, match=r"kv_indices\[0\] = 5 is not a page"):
        kvcache.rope_append_kv(q, k, v, cfg, np.arange(3), check=True, kv_indices=np.array([5, 0]),
                               kv_indptr=np.array([0, 1, 2]), batch_indices=np.zeros(3, int),
                               cache_positions=np.arange(3), **args)


def test_bad_arguments_name_themselves(rng):
    cfg = cuprope.RopeConfig(16)
    q, k, v = rand(rng, (3, 2, 16), "float16"), rand(rng, (3, 1, 16), "float16"), rand(rng, (3, 1, 16), "float16")
    kc = np.zeros((2, 4, 1, 16), np.float16)
    ok = dict(k_cache=kc, v_cache=kc.copy(), slot_mapping=np.arange(3))
    cases = [
        (TypeError, "config must be", dict(config=None)),
        (TypeError, "k_cache must have q's dtype", dict(k_cache=kc.astype(np.float32),
                                                        v_cache=kc.astype(np.float32))),
        (ValueError, "k_scale is needed", dict(k_cache=kc.astype(E4M3), v_cache=kc.astype(E4M3))),
        (ValueError, "k_scale and v_scale are read only", dict(k_scale=np.ones(1, np.float32))),
        (ValueError, "give slot_mapping or the paged", dict(kv_indptr=np.array([0, 1]))),
        (ValueError, "missing: kv_indices", dict(slot_mapping=None)),
        (TypeError, "slot_mapping must have dtype int64", dict(slot_mapping=np.arange(3, dtype=np.int32))),
        (ValueError, "positions must have shape", dict(positions=np.arange(4))),
        (ValueError, "give k_cache and v_cache, or one kv_cache", dict(kv_cache=kc)),
        (ValueError, "kv_layout must be one of", dict(kv_layout="NDH")),
        (ValueError, "the cache holds 2 heads", dict(k_cache=np.zeros((2, 4, 2, 16), np.float16),
                                                     v_cache=np.zeros((2, 4, 2, 16), np.float16))),
        (ValueError, "q_out overlaps q", dict(q_out=q[::-1])),
        (ValueError, "rotary_dim", dict(config=cuprope.RopeConfig(32))),
        (ValueError, "per-head table", dict(config=cuprope.RopeConfig(16, inv_freq=np.ones((2, 8))))),
        (TypeError, "k_scale must be a float32", dict(k_cache=kc.astype(E4M3), v_cache=kc.astype(E4M3),
                                                     k_scale=np.ones(1), v_scale=np.ones(1))),
    ]
    for exc, msg, change in cases:
        kw = dict(ok, config=cfg, positions=np.arange(3))
        kw.update(change)
        kw = {n: x for n, x in kw.items() if x is not None or n == "config"}
        with pytest.raises(exc, match=msg):
            kvcache.rope_append_kv(q, k, v, **kw)


# ---------------------------------------------------------------- cos_sin_cache
def spec_cos_sin(x, pos, table, neox):
    x = np.asarray(x, np.float64).copy()
    r = table.shape[1]
    for t, p in enumerate(pos):
        if not 0 <= p < table.shape[0]:
            continue
        for j in range(r // 2):
            c, s = float(table[p, j]), float(table[p, r // 2 + j])
            i1, i2 = (j, j + r // 2) if neox else (2 * j, 2 * j + 1)
            x1, x2 = x[t, :, i1].copy(), x[t, :, i2].copy()
            x[t, :, i1], x[t, :, i2] = x1 * c - x2 * s, x2 * c + x1 * s
    return x


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("cache_dtype", ["float32", "same"])
def test_rotary_embedding_matches_the_spec(rng, dtype, neox, cache_dtype):
    t, hq, hk, d, r = 7, 3, 1, 32, 16
    ang = np.arange(50)[:, None] * 10000.0 ** (-np.arange(r // 2) / (r // 2))
    table = np.concatenate([np.cos(ang), np.sin(ang)], -1)
    table = table.astype(np.float32 if cache_dtype == "float32" else NP[dtype])
    qkv = rand(rng, (t, (hq + 2 * hk) * d), dtype)                    # q, k: column slices
    query, key = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d].reshape(t, hk, d)
    pos = np.array([0, 3, 49, 50, -1, 7, 12])
    before = qkv.copy()
    rotary_embedding(pos, query, key, d, table, neox)
    for x, x0, h in ((query, before[:, :hq * d], hq), (key, before[:, hq * d:(hq + hk) * d], hk)):
        ref = spec_cos_sin(x0.reshape(t, h, d), pos, table, neox)
        assert_matches(np.asarray(x, np.float64).reshape(t, h, d), ref, 4.0, dtype)
        assert_bytes_equal(x.reshape(t, h, d)[:, :, r:], x0.reshape(t, h, d)[:, :, r:])
        assert_bytes_equal(x.reshape(t, h, d)[3:5], x0.reshape(t, h, d)[3:5])  # outside the table
    assert_bytes_equal(qkv[:, (hq + hk) * d:], before[:, (hq + hk) * d:])          # v untouched
    with pytest.raises(ValueError, match=r"positions\[3\] = 50 is outside"):
        rotary_embedding(pos, query, key, d, table, neox, check=True)


def test_rotary_embedding_errors_and_torch_entry(rng):
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    import cuprope.torch as ctorch
    q = torch.randn(4, 64, dtype=torch.float16)
    table = torch.randn(10, 32)
    with pytest.raises(ValueError, match="query must be"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 48, table)
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 16, table)
    with pytest.raises(TypeError, match="cos_sin_cache must have dtype float32, float16 or"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 32, table.double())
    with pytest.raises(TypeError, match="positions must have dtype"):
        ctorch.rotary_embedding(torch.arange(4.0), q, None, 32, table)
    q0 = q.clone()
    assert ctorch.rotary_embedding(torch.tensor([1, 2, 3, 4]), q, None, 32, table, False) is None
    ref = spec_cos_sin(q0.view(4, 2, 32).numpy(), [1, 2, 3, 4], table.numpy(), False)
    assert_matches(q.view(4, 2, 32).numpy(), ref, 4.0, "float16")


def test_vector_width_and_pass_through_packs():
    """16-byte packs only where every array (fp8 ones by their 1-byte items)
    and R/2 and the tail allow them; two packs per pass-through chunk where
    the tail splits evenly."""
    from cuprope.kvcache.launch import copy_packs, pick_pack_vec
    ok = [(4096, 2, (6144, 128)), (8192, 1, (2048, 1024, 128))]
    assert pick_pack_vec("bfloat16", ok, (64, 0)) == 8
    assert pick_pack_vec("float32", [(4096, 4, (512, 128))], (64, 0)) == 4
    assert pick_pack_vec("bfloat16", ok + [(4098, 2, (128,))], (64, 0)) == 1   # q off by one
    assert pick_pack_vec("bfloat16", ok + [(4100, 1, (128,))], (64, 0)) == 1   # fp8 cache off by 4
    assert pick_pack_vec("bfloat16", ok + [(4096, 2, (132,))], (64, 0)) == 1
    assert pick_pack_vec("bfloat16", ok, (36, 0)) == 1
    assert pick_pack_vec("bfloat16", ok, (32, 4)) == 1
    assert copy_packs(0, 8, True) == 0 and copy_packs(64, 8, False) == 0
    assert copy_packs(64, 8, True) == 2 and copy_packs(8, 8, True) == 1


def test_rotary_embedding_custom_op_and_compile(rng):
    """cuprope::rotary_embedding passes torch's op checks (mutating query and
    key) and torch.compile traces through it with the eager result."""
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    import cuprope.torch as ctorch
    table = torch.randn(64, 16)
    args = (torch.tensor([3, 9, 63]), torch.randn(3, 2 * 32), torch.randn(3, 1, 32), 32, table, True)
    torch.library.opcheck(torch.ops.cuprope.rotary_embedding.default, args)
    q, k = torch.randn(3, 64), torch.randn(3, 1, 32)
    q2, k2 = q.clone(), k.clone()
    ctorch.rotary_embedding(args[0], q, k, 32, table, False)

    @torch.compile(fullgraph=True, backend="eager")
    def f(p, q_, k_):
        ctorch.rotary_embedding(p, q_, k_, 32, table, False)
        return q_ * 1, k_ * 1
    qa, ka = f(args[0], q2, k2)
    assert torch.equal(qa, q) and torch.equal(ka, k)
