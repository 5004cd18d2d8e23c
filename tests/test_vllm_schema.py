"""The vLLM drop-ins (``cuprope.torch.rotary_embedding``,
``cuprope.torch.fused_qk_norm_rope``) take every input vLLM's own ops take,
on the CPU (torch CPU tensors run on the NumPy backend): positions ``[B, S]``
with query/key ``[B, S, H·D]`` or ``[B, S, H, D]``, a cos/sin cache in any
float dtype apart from the query's, and the schema's later arguments
(``rope_dim_offset``, ``inverse``; ``forced_token_heads_per_warp``).

The expectation is vLLM's Python reference (``RotaryEmbedding.forward_native``,
and DeepSeek V4's for ``rope_dim_offset`` / ``inverse``) evaluated in float64:
the cache rows gathered by the flattened positions, the first ``R/2`` columns
cos and the rest sin (sin negated when inverse), the pairs of dims
``[offset, offset + R)`` of each head turned, the other dims passed through.
"""
import numpy as np
import pytest

from oracle import assert_matches

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
import cuprope.torch as ctorch  # noqa: E402
from cuprope.kvcache import cache_copy  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def vllm_reference(positions, x, head_size, cache, is_neox, rope_dim_offset=0, inverse=False):
    """vLLM's forward_native in float64: x (any shape whose leading dims are
    positions' and the rest H·D or (H, D)) rotated by the cache rows."""
    pos = positions.reshape(-1).long().numpy()
    cs = cache.double().numpy()[pos]                       # index_select: [T, R]
    r = cs.shape[1]
    cos, sin = cs[:, None, :r // 2], cs[:, None, r // 2:]  # chunk(2), unsqueeze(-2)
    if inverse:
        sin = -sin
    xs = x.double().numpy().reshape(pos.size, -1, head_size).copy()
    rot = xs[..., rope_dim_offset:rope_dim_offset + r]
    if is_neox:
        x1, x2 = rot[..., :r // 2].copy(), rot[..., r // 2:].copy()
        rot[..., :r // 2], rot[..., r // 2:] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    else:
        x1, x2 = rot[..., 0::2].copy(), rot[..., 1::2].copy()
        rot[..., 0::2], rot[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return xs.reshape(x.shape)


def cache_table(g, rows, r, dtype=torch.float32):
    """A cos/sin cache with random angles (not a RoPE table: any rows will do)."""
    ang = torch.rand(rows, r // 2, generator=g, dtype=torch.float64) * 6.3
    return torch.cat([ang.cos(), ang.sin()], -1).to(dtype)


def check(got, x0, positions, head_size, cache, is_neox, dtype, rope_dim_offset=0,
          inverse=False):
    ref = vllm_reference(positions, x0, head_size, cache, is_neox, rope_dim_offset, inverse)
    assert_matches(got.double().numpy(), ref, 4.0, dtype)


# ---------------------------------------------------------------- positions [B, S]

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("form", ["flat", "heads", "padded"])
def test_batched_positions(dtype, is_neox, form):
    """positions [B, S] with query and key [B, S, H·D], [B, S, H, D], or
    [B, S, H, D + 16] sliced to D (vLLM's test's three forms); key in
    another form than query (its own strides); R < D leaves the tail."""
    g = torch.Generator().manual_seed(11)
    b, s, hq, hk, d, r = 3, 5, 4, 2, 32, 16
    t = DTYPES[dtype]
    cache = cache_table(g, 40, r)
    pos = torch.randint(0, 40, (b, s), generator=g)

    def make(h, f):
        if f == "flat":
            return torch.randn(b, s, h * d, generator=g).to(t)
        if f == "heads":
            return torch.randn(b, s, h, d, generator=g).to(t)
        return torch.randn(b, s, h, d + 16, generator=g).to(t)[..., :d]

    query = make(hq, form)
    key = make(hk, "heads" if form == "flat" else "flat")
    q0, k0 = query.clone(), key.clone()
    assert ctorch.rotary_embedding(pos, query, key, d, cache, is_neox) is None
    check(query, q0, pos, d, cache, is_neox, dtype)
    check(key, k0, pos, d, cache, is_neox, dtype)
    assert torch.equal(query.reshape(b, s, hq, d)[..., r:], q0.reshape(b, s, hq, d)[..., r:])


def test_batched_positions_key_none_int32_and_errors():
    g = torch.Generator().manual_seed(12)
    cache = cache_table(g, 20, 32)
    pos = torch.randint(0, 20, (2, 3), generator=g, dtype=torch.int32)
    q = torch.randn(2, 3, 2 * 32, generator=g)
    q0 = q.clone()
    ctorch.rotary_embedding(pos, q, None, 32, cache, True)
    check(q, q0, pos, 32, cache, True, "float32")
    with pytest.raises(ValueError, match=r"query must be \[B, S, H\*head_size\]"):
        ctorch.rotary_embedding(pos, q.reshape(3, 2, 64), None, 32, cache, True)
    with pytest.raises(ValueError, match=r"query must be \[T, H\*head_size\]"):
        ctorch.rotary_embedding(pos.reshape(-1), q, None, 32, cache, True)
    with pytest.raises(ValueError, match="positions must be"):
        ctorch.rotary_embedding(pos.reshape(1, 2, 3), q, None, 32, cache, True)
    with pytest.raises(ValueError, match="key must be"):
        ctorch.rotary_embedding(pos, q, torch.randn(2, 4, 32), 32, cache, True)
    with pytest.raises(ValueError, match=r"positions\[1, 2\] = 20 is outside"):
        bad = pos.clone()
        bad[1, 2] = 20
        from cuprope.kvcache.cos_sin_cache import rotary_embedding
        rotary_embedding(bad, q, None, 32, cache, True, check=True)


def test_batched_positions_outside_the_table_are_skipped():
    g = torch.Generator().manual_seed(13)
    cache = cache_table(g, 8, 16)
    pos = torch.tensor([[0, 8, 3], [-1, 7, 2]])
    q = torch.randn(2, 3, 2, 16, generator=g, dtype=torch.float64).float()
    q0 = q.clone()
    ctorch.rotary_embedding(pos, q, None, 16, cache, False)
    assert torch.equal(q[0, 1], q0[0, 1]) and torch.equal(q[1, 0], q0[1, 0])
    inside = torch.tensor([[True, False, True], [False, True, True]])
    ref = vllm_reference(pos.clamp(0, 7), q0, 16, cache, False)
    assert_matches(q[inside].double().numpy(), ref[inside.numpy()], 4.0, "float32")


# ---------------------------------------------------------------- cache dtype

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cache_dtype", list(DTYPES))
@pytest.mark.parametrize("is_neox", [True, False])
def test_cache_dtype_apart_from_the_query(dtype, cache_dtype, is_neox):
    """Every (query, cache) dtype pair: the cache's values as they are (each
    widened exactly, as vLLM's kernel widens them to float), not rounded to
    the query's dtype first."""
    g = torch.Generator().manual_seed(14)
    t, h, d, r = 9, 3, 64, 64
    cache = cache_table(g, 100, r, DTYPES[cache_dtype])
    pos = torch.randint(0, 100, (t,), generator=g)
    query = torch.randn(t, h * d, generator=g).to(DTYPES[dtype])
    key = torch.randn(t, 1, d, generator=g).to(DTYPES[dtype])
    q0, k0 = query.clone(), key.clone()
    ctorch.rotary_embedding(pos, query, key, d, cache, is_neox)
    check(query, q0, pos, d, cache, is_neox, dtype)
    check(key, k0, pos, d, cache, is_neox, dtype)


def test_cache_dtype_errors():
    q = torch.randn(4, 64)
    with pytest.raises(TypeError, match="cos_sin_cache must have dtype float32, float16 or "
                                        "bfloat16, got float64"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 32, torch.randn(10, 32).double())
    with pytest.raises(TypeError, match="got int32"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 32, torch.ones(10, 32, dtype=torch.int32))


# ---------------------------------------------------------------- rope_dim_offset, inverse

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("offset", [0, 8, 48])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope_dim_offset_and_inverse(dtype, is_neox, offset, inverse):
    """The rotated dims start ``rope_dim_offset`` into each head (48 = D − R:
    DeepSeek V4's trailing rope dims) and ``inverse`` turns them by −angle;
    every other dim keeps its bytes."""
    g = torch.Generator().manual_seed(15 + offset)
    t, hq, hk, d, r = 7, 4, 1, 64, 16
    cache = cache_table(g, 30, r)
    pos = torch.randint(0, 30, (t,), generator=g)
    query = torch.randn(t, hq, d, generator=g).to(DTYPES[dtype])
    key = torch.randn(t, hk * d, generator=g).to(DTYPES[dtype])
    q0, k0 = query.clone(), key.clone()
    ctorch.rotary_embedding(pos, query, key, d, cache, is_neox, offset, inverse)
    check(query, q0, pos, d, cache, is_neox, dtype, offset, inverse)
    check(key, k0, pos, d, cache, is_neox, dtype, offset, inverse)
    keep = torch.ones(d, dtype=torch.bool)
    keep[offset:offset + r] = False
    assert torch.equal(query[..., keep], q0[..., keep])
    assert torch.equal(key.reshape(t, hk, d)[..., keep], k0.reshape(t, hk, d)[..., keep])


def test_inverse_undoes_the_rotation_and_keywords():
    g = torch.Generator().manual_seed(16)
    cache = cache_table(g, 50, 32)
    pos = torch.randint(0, 50, (2, 6), generator=g)
    q = torch.randn(2, 6, 3, 48, generator=g, dtype=torch.float64).float()
    q0 = q.clone()
    ctorch.rotary_embedding(pos, q, None, 48, cache, False, rope_dim_offset=16)
    assert not torch.allclose(q, q0)
    ctorch.rotary_embedding(pos, q, None, 48, cache, False, rope_dim_offset=16, inverse=True)
    torch.testing.assert_close(q, q0, rtol=0, atol=1e-6)


def test_rope_dim_offset_errors():
    q = torch.randn(4, 64)
    cache = torch.randn(10, 16)
    with pytest.raises(ValueError, match=r"R \+ rope_dim_offset <= head_size \(24 \+ R <= 32\)"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 32, cache, True, 24)
    with pytest.raises(ValueError, match="rope_dim_offset must be >= 0"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 32, cache, True, -2)
    with pytest.raises(TypeError, match="rope_dim_offset must be an int"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 32, cache, True, True)
    with pytest.raises(TypeError, match="inverse must be a bool"):
        ctorch.rotary_embedding(torch.arange(4), q, None, 32, cache, True, 0, 1)
    # 16 + 16 = 32: the last dims exactly
    ctorch.rotary_embedding(torch.arange(4), q, None, 32, cache, True, 16)


# ---------------------------------------------------------------- custom op, torch.compile

def test_custom_op_takes_the_schema_arguments():
    """cuprope::rotary_embedding carries rope_dim_offset and inverse (with
    vLLM's defaults), passes torch's op checks with [B, S] positions and a
    third cache dtype, and torch.compile(fullgraph=True) traces the drop-in."""
    schema = str(torch.ops.cuprope.rotary_embedding.default._schema)
    assert "rope_dim_offset=0" in schema and "bool inverse=False" in schema
    g = torch.Generator().manual_seed(17)
    cache = cache_table(g, 64, 16, torch.bfloat16)
    pos = torch.randint(0, 64, (2, 3), generator=g)
    args = (pos, torch.randn(2, 3, 2 * 32, generator=g).half(),
            torch.randn(2, 3, 1, 32, generator=g).half(), 32, cache, False, 8, True)
    torch.library.opcheck(torch.ops.cuprope.rotary_embedding.default, args)
    q, k = args[1].clone(), args[2].clone()
    q2, k2 = q.clone(), k.clone()
    ctorch.rotary_embedding(pos, q, k, 32, cache, False, 8, True)

    @torch.compile(fullgraph=True, backend="eager")
    def f(p, q_, k_):
        ctorch.rotary_embedding(p, q_, k_, 32, cache, False, 8, True)
        return q_ * 1, k_ * 1
    qa, ka = f(pos, q2, k2)
    assert torch.equal(qa, q) and torch.equal(ka, k)
    check(q, args[1], pos, 32, cache, False, "float16", 8, True)


# ---------------------------------------------------------------- the kept float32 copies

def test_cache_copies_are_kept_per_tensor_version(monkeypatch):
    """The GPU's float32 copy of a third-dtype cache (driven here with its
    conversion on the host): made once per tensor and version, so a repeated
    call reuses it; an in-place write, another tensor or an inference tensor
    gets a new one; a freed tensor's copy goes."""
    made = []

    def convert(info, stream_ptr):
        made.append(1)
        return info.array.float()

    monkeypatch.setattr(cache_copy, "_convert", convert)
    monkeypatch.setattr(cache_copy, "_capturing", lambda stream_ptr: False)
    monkeypatch.setattr(cache_copy, "_finished", lambda stream_ptr: None)
    monkeypatch.setattr(cache_copy, "_COPIES", {})
    from cuprope._core.arrays import describe
    a = torch.randn(8, 4).bfloat16()
    c1 = cache_copy.float32_copy(describe(a, "c"), 0)
    assert c1.dtype == torch.float32 and torch.equal(c1, a.float())
    assert cache_copy.float32_copy(describe(a, "c"), 0) is c1 and len(made) == 1
    assert cache_copy.held(a) is c1
    a[3, 1] = 5.0                                    # a new version: a new copy
    assert cache_copy.held(a) is a
    c2 = cache_copy.float32_copy(describe(a, "c"), 0)
    assert len(made) == 2 and c2 is not c1 and float(c2[3, 1]) == 5.0
    b = a.clone()                                    # another tensor, same values
    cache_copy.float32_copy(describe(b, "c"), 0)
    assert len(made) == 3 and cache_copy.held(b) is not b
    del b
    assert len(cache_copy._COPIES) == 1              # b's copy went with it
    with torch.inference_mode():
        inf = torch.randn(8, 4).half()
    cache_copy.float32_copy(describe(inf, "c"), 0)
    cache_copy.float32_copy(describe(inf, "c"), 0)
    assert len(made) == 5 and cache_copy.held(inf) is inf
    for _ in range(cache_copy._MAX_COPIES + 3):
        cache_copy.float32_copy(describe(torch.randn(2, 2).half(), "c"), 0)
    assert len(cache_copy._COPIES) <= cache_copy._MAX_COPIES


# ---------------------------------------------------------------- fused_qk_norm_rope

def test_fused_qk_norm_rope_takes_forced_token_heads_per_warp():
    """vLLM's schema ends in ``int forced_token_heads_per_warp=-1`` (a
    launch shape of its kernel): taken positionally or by name, the values
    those of the call without it."""
    from test_prologue_torch import vllm_case
    qkv, args = vllm_case("cpu", torch.bfloat16, True, 32)
    want = qkv.clone()
    ctorch.fused_qk_norm_rope(want, *args)
    for extra, kw in (((-1,), {}), ((4,), {}), ((), {"forced_token_heads_per_warp": 8})):
        got = qkv.clone()
        assert ctorch.fused_qk_norm_rope(got, *args, *extra, **kw) is None
        assert torch.equal(got, want)
    with pytest.raises(TypeError, match="forced_token_heads_per_warp must be an int"):
        ctorch.fused_qk_norm_rope(qkv.clone(), *args, 2.0)


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float16, torch.bfloat16),
                                               (torch.bfloat16, torch.float16),
                                               (torch.bfloat16, torch.float32)])
def test_fused_qk_norm_rope_cache_dtype_apart_from_qkv(dtype, cache_dtype):
    """A cache in another dtype than qkv's: vLLM's native composition (the
    gathered rows cast to qkv's dtype)."""
    from test_prologue_torch import assert_vllm_equal, vllm_case, vllm_native
    qkv, args = vllm_case("cpu", dtype, False, 64)
    args = args[:7] + (args[7].to(cache_dtype),) + args[8:]
    want = vllm_native(qkv.clone(), *args)
    got = qkv.clone()
    ctorch.fused_qk_norm_rope(got, *args)
    assert_vllm_equal(got, want, dtype)
