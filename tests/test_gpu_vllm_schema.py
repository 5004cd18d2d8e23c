"""The vLLM ``rotary_embedding`` drop-in on the GPU with its schema's every
input form (skipped with a reason where there is no GPU): positions
``[B, S]``, query/key ``[B, S, H·D]``, ``[B, S, H, D]`` or padded heads,
``rope_dim_offset``, ``inverse``, and a cos/sin cache in any float dtype apart
from the query's (read through a float32 copy kept per tensor version).

Expectations: vLLM's forward_native in float64 (``test_vllm_schema``), and
for the cache dtypes the bits of the same call with the cache in float32
(every 16-bit value is exact in float32)."""
import numpy as np
import pytest

from conftest import GPU_TESTS
from oracle import assert_matches
from torch_helpers import count_calls, gen, host_bytes, randn, tdt
from test_vllm_schema import vllm_reference

pytestmark = GPU_TESTS


def _torch():
    import torch
    return torch


def _cache(g, rows, r, dtype="float32"):
    torch = _torch()
    ang = torch.rand(rows, r // 2, generator=g, device=g.device, dtype=torch.float64) * 6.3
    return torch.cat([ang.cos(), ang.sin()], -1).to(tdt(dtype))


def _check(got, x0, pos, d, cache, is_neox, dtype, offset=0, inverse=False):
    ref = vllm_reference(pos.cpu(), x0.cpu(), d, cache.cpu(), is_neox, offset, inverse)
    assert_matches(got.double().cpu().numpy(), ref, 5.0, dtype)


def _tensor(g, b, s, h, d, dtype, form):
    if form == "flat":
        return randn((b, s, h * d), dtype, g)
    if form == "heads":
        return randn((b, s, h, d), dtype, g)
    return randn((b, s, h, d + 16), dtype, g)[..., :d]        # padded heads, sliced


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("form", ["flat", "heads", "padded"])
@pytest.mark.parametrize("offset,inverse", [(0, False), (4, True), (64, False), (64, True)])
def test_batched_positions_offset_inverse_on_the_gpu(dtype, is_neox, form, offset, inverse):
    """positions [B, S]; key in the other form (its own strides); offset 4
    misaligns the packs (one-pair width), 64 = D − R (the trailing dims);
    every dim outside [offset, offset + R) keeps its bytes."""
    import cuprope.torch as ctorch
    g = gen(61)
    b, s, hq, hk, d, r = 3, 37, 8, 2, 128, 64
    cache = _cache(g, 4096, r)
    pos = _torch().randint(0, 4096, (b, s), device="cuda", generator=g)
    query = _tensor(g, b, s, hq, d, dtype, form)
    key = _tensor(g, b, s, hk, d, dtype, "heads" if form == "flat" else "flat")
    q0, k0 = query.clone(), key.clone()
    ctorch.rotary_embedding(pos, query, key, d, cache, is_neox, offset, inverse)
    _torch().cuda.synchronize()
    _check(query, q0, pos, d, cache, is_neox, dtype, offset, inverse)
    _check(key, k0, pos, d, cache, is_neox, dtype, offset, inverse)
    keep = np.ones(d, dtype=bool)
    keep[offset:offset + r] = False
    for x, x0, h in ((query, q0, hq), (key, k0, hk)):
        got, was = x.reshape(b, s, h, d)[..., keep], x0.reshape(b, s, h, d)[..., keep]
        assert np.array_equal(host_bytes(got), host_bytes(was))


def test_inverse_undoes_the_rotation_on_the_gpu():
    import cuprope.torch as ctorch
    g = gen(62)
    cache = _cache(g, 512, 32)
    pos = _torch().randint(0, 512, (4, 9), device="cuda", generator=g)
    q = randn((4, 9, 4, 96), "float32", g)
    q0 = q.clone()
    ctorch.rotary_embedding(pos, q, None, 96, cache, False, 64)
    assert not _torch().allclose(q, q0)
    ctorch.rotary_embedding(pos, q, None, 96, cache, False, 64, True)
    _torch().testing.assert_close(q, q0, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("is_neox", [True, False])
def test_cache_dtype_apart_from_the_query_on_the_gpu(dtype, cache_dtype, is_neox):
    """Every (query, cache) dtype pair: vLLM's semantics (each cache value
    widened to fp32), so the bits of the same call with the cache in float32."""
    import cuprope.torch as ctorch
    g = gen(63)
    t, hq, hk, d = 45, 16, 4, 128
    cache = _cache(g, 4096, d, cache_dtype)
    pos = _torch().randint(0, 4096, (t,), device="cuda", generator=g)
    query, key = randn((t, hq * d), dtype, g), randn((t, hk, d), dtype, g)
    q0, k0 = query.clone(), key.clone()
    qf, kf = query.clone(), key.clone()
    ctorch.rotary_embedding(pos, query, key, d, cache, is_neox)
    ctorch.rotary_embedding(pos, qf, kf, d, cache.float(), is_neox)
    _torch().cuda.synchronize()
    assert np.array_equal(host_bytes(query), host_bytes(qf))
    assert np.array_equal(host_bytes(key), host_bytes(kf))
    _check(query, q0, pos, d, cache, is_neox, dtype)
    _check(key, k0, pos, d, cache, is_neox, dtype)


def test_third_dtype_cache_copied_once_per_version(monkeypatch):
    """A bfloat16 cache with float16 queries: the float32 copy is made on the
    first call and reused (the fast path taken: no new launch plan), and made
    again after the cache is written in place."""
    import cuprope.kvcache.rotary as rotary
    import cuprope.torch as ctorch
    from cuprope.kvcache import cache_copy
    cache_copy.clear()
    converts = count_calls(monkeypatch, cache_copy, "_convert")
    plans = count_calls(monkeypatch, rotary, "kv_spec")
    g = gen(64)
    cache = _cache(g, 1024, 128, "bfloat16")
    try:
        for step in range(4):
            pos = _torch().randint(0, 1024, (2, 5), device="cuda", generator=g)
            query, key = randn((2, 5, 8 * 128), "float16", g), randn((2, 5, 2, 128), "float16", g)
            q0, k0 = query.clone(), key.clone()
            if step == 3:
                cache.mul_(-1.0)                   # in place: a new version of the cache
            ctorch.rotary_embedding(pos, query, key, 128, cache, True)
            _torch().cuda.synchronize()
            _check(query, q0, pos, 128, cache, True, "float16")
            _check(key, k0, pos, 128, cache, True, "float16")
            assert len(converts) == (1 if step < 3 else 2), step
            assert len(plans) == (1 if step < 3 else 2), step
    finally:
        cache_copy.clear()


def test_cuda_graph_replays_batched_positions_with_a_third_dtype_cache():
    """Warm-up outside the capture makes the float32 copy; the captured step
    reads it, and replays with new q, k and positions match eager calls."""
    torch = _torch()
    import cuprope.torch as ctorch
    from cuprope.kvcache import cache_copy
    g = gen(65)
    cache = _cache(g, 2048, 64, "float16")
    pos = torch.zeros(4, 3, dtype=torch.int64, device="cuda")
    query, key = randn((4, 3, 8, 128), "bfloat16", g), randn((4, 3, 2 * 128), "bfloat16", g)

    def step(p, q, k):
        ctorch.rotary_embedding(p, q, k, 128, cache, False, 64, True)
    try:
        step(pos, query.clone(), key.clone())
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(pos, query, key)
        for _ in range(3):
            new = [randn(x.shape, "bfloat16", g) for x in (query, key)]
            query.copy_(new[0])
            key.copy_(new[1])
            pos.copy_(torch.randint(0, 2048, (4, 3), device="cuda", generator=g))
            qe, ke = query.clone(), key.clone()
            step(pos, qe, ke)
            graph.replay()
            torch.cuda.synchronize()
            assert np.array_equal(host_bytes(query), host_bytes(qe))
            assert np.array_equal(host_bytes(key), host_bytes(ke))
            assert not np.array_equal(host_bytes(query), host_bytes(new[0]))
    finally:
        cache_copy.clear()


def test_fast_path_keys_on_rope_dim_offset_and_inverse(monkeypatch):
    """The same arrays with another rope_dim_offset or inverse take their own
    launch: each repeated call equals check=True (the general path) and, once
    every combination was seen, no new plan is made."""
    from cuprope.kvcache import cos_sin_cache as csc
    import cuprope.kvcache.rotary as rotary
    import cuprope.torch as ctorch
    plans = count_calls(monkeypatch, rotary, "kv_spec")
    g = gen(66)
    cache = _cache(g, 512, 64)
    combos = [(0, False), (64, False), (0, True), (64, True), (8, False)]
    seen = 0
    for rnd in range(3):
        for off, inv in combos:
            pos = _torch().randint(0, 512, (6,), device="cuda", generator=g)
            query, key = randn((6, 8 * 128), "bfloat16", g), randn((6, 2, 128), "bfloat16", g)
            qr, kr = query.clone(), key.clone()
            csc.rotary_embedding(pos, qr, kr, 128, cache, True, off, inv, check=True)
            n_general = len(plans)
            ctorch.rotary_embedding(pos, query, key, 128, cache, True, off, inv)
            assert np.array_equal(host_bytes(query), host_bytes(qr)), (off, inv)
            assert np.array_equal(host_bytes(key), host_bytes(kr)), (off, inv)
            if rnd:
                assert len(plans) == n_general, (off, inv)
        if rnd == 0:
            seen = len(plans)
    assert len(plans) == seen + 2 * len(combos)  # rounds 1 and 2: the checked calls alone


def test_custom_op_opcheck_and_compile_on_the_gpu():
    """cuprope::rotary_embedding with the schema's later arguments, [B, S]
    positions and a third cache dtype passes torch's op checks on the GPU,
    and torch.compile(fullgraph=True) gives the eager bits."""
    torch = _torch()
    import cuprope.torch as ctorch
    from cuprope.kvcache import cache_copy
    g = gen(67)
    cache = _cache(g, 256, 64, "bfloat16")
    pos = torch.randint(0, 256, (2, 7), device="cuda", generator=g)
    query, key = randn((2, 7, 4 * 128), "float16", g), randn((2, 7, 2, 128), "float16", g)
    try:
        torch.library.opcheck(torch.ops.cuprope.rotary_embedding.default,
                              (pos, query.clone(), key.clone(), 128, cache, True, 64, True))
        qe, ke = query.clone(), key.clone()
        ctorch.rotary_embedding(pos, qe, ke, 128, cache, True, 64, True)

        @torch.compile(fullgraph=True, backend="aot_eager")
        def f(p, q, k):
            ctorch.rotary_embedding(p, q, k, 128, cache, True, 64, True)
            return q * 1, k * 1
        qc, kc = f(pos, query.clone(), key.clone())
        assert np.array_equal(host_bytes(qc), host_bytes(qe))
        assert np.array_equal(host_bytes(kc), host_bytes(ke))
    finally:
        cache_copy.clear()
