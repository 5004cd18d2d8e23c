"""GPU kernel vs the float64 reference (skipped with a reason where there is no GPU).

Outputs are poisoned with NaN before each kernel runs (``out=`` prefilled), so
an element the kernel fails to write fails the comparison.
"""
import json
import os

import numpy as np
import pytest

import cuprope
from conftest import GPU_TESTS, HAS_JAX
from oracle import assert_matches, expected

pytestmark = GPU_TESTS

DTYPES = ["float32", "float16", "bfloat16"]
HEAD_DIMS = [64, 80, 96, 128, 256, 48]
LAYOUTS = ["bshd", "bhsd", "thd"]

MAX_ERR: dict = {}


def _record(dtype, err, xmax):
    MAX_ERR[dtype] = max(MAX_ERR.get(dtype, 0.0), err / xmax)


def teardown_module(module):
    """Merge this process's maxima into CUPROPE_ERR_REPORT: under pytest-xdist
    every worker runs its own share of the tests and writes here, so each
    takes the file's lock and keeps the larger value per dtype."""
    path = os.environ.get("CUPROPE_ERR_REPORT")
    if path and MAX_ERR:
        import fcntl
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            try:
                merged = json.loads(f.read() or "{}")
            except ValueError:
                merged = {}
            for k, v in MAX_ERR.items():
                merged[k] = max(merged.get(k, 0.0), v)
            f.seek(0)
            f.truncate()
            json.dump(merged, f, indent=1)


def tdt(dtype):
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def rand(shape, dtype, rng, device="cuda"):
    import torch
    a = rng.standard_normal(shape).astype(np.float32)
    return torch.from_numpy(a).to(device=device, dtype=tdt(dtype))


def host(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def poisoned_like(t):
    import torch
    return torch.full_like(t, float("nan"))


def shape_for(layout, b, s, h, d):
    return {"bshd": (b, s, h, d), "bhsd": (b, h, s, d), "thd": (b * s, h, d)}[layout]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("partial", [False, True], ids=["R=D", "R<D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_and_backward_match_reference(dtype, interleaved, partial, head_dim, layout, rng):
    rot = head_dim // 2 if partial else head_dim
    cfg = cuprope.RopeConfig(rot, interleaved=interleaved, layout=layout, base=10000.0)
    x = rand(shape_for(layout, 2, 19, 3, head_dim), dtype, rng)
    offset = int(rng.integers(0, 5000))
    # packed tokens take explicit positions (random, one per token)
    kw = _positions("pos[S]int32", 1, 38, rng) if layout == "thd" else {}
    kw.update(offset=offset)
    xmax = float(host(x).__abs__().max())
    for inverse, fn in ((False, cuprope.rope_forward), (True, cuprope.rope_backward)):
        out = poisoned_like(x)
        res = fn(x, cfg, out=out, **kw)
        assert res is out
        ref = expected(host(x), cfg, inverse=inverse, **_np_pos(kw))
        _record(dtype, assert_matches(host(out), ref, xmax, dtype), xmax)
        # the default-allocated output path gives the same bits
        res2 = fn(x, cfg, **kw)
        assert type(res2) is type(x) and res2.device == x.device
        assert (res2.view(-1).view(np_int_view(dtype)) == out.view(-1).view(np_int_view(dtype))).all()


def np_int_view(dtype):
    import torch
    return torch.int32 if dtype == "float32" else torch.int16


def _positions(kind, b, s, rng, device="cuda"):
    import torch
    if kind == "implicit":
        return {}
    if kind == "offset+seq_offsets":
        so = torch.tensor(rng.integers(0, 1000, b), dtype=torch.int32, device=device)
        return {"offset": 11, "seq_offsets": so}
    if kind == "pos[S]int32":
        return {"positions": torch.tensor(rng.integers(0, 70000, s), dtype=torch.int32, device=device)}
    if kind == "pos[B,S]int64":
        return {"positions": torch.tensor(rng.integers(0, 2 ** 20, (b, s)), dtype=torch.int64,
                                          device=device)}
    raise AssertionError(kind)


def _np_pos(kw):
    out = {}
    for k, v in kw.items():
        out[k] = v.cpu().numpy() if hasattr(v, "cpu") else v
    return out


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("pos_kind", ["implicit", "offset+seq_offsets", "pos[S]int32", "pos[B,S]int64"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_qk_gqa_on_strided_qkv_slices(dtype, interleaved, pos_kind, inplace, rng):
    """q and k are column slices of one fused qkv projection (no copy), GQA head counts."""
    import torch
    b, s, hq, hk, d, rot = 3, 21, 8, 2, 128, 96
    qkv = rand((b, s, (hq + 2 * hk) * d), dtype, rng)
    q = qkv[..., : hq * d].unflatten(-1, (hq, d))
    k = qkv[..., hq * d: (hq + hk) * d].unflatten(-1, (hk, d))
    v_before = qkv[..., (hq + hk) * d:].clone()
    assert not q.is_contiguous()
    cfg = cuprope.RopeConfig(rot, interleaved=interleaved)
    kw = _positions(pos_kind, b, s, rng)
    q0, k0 = host(q), host(k)
    xmax = max(np.abs(q0).max(), np.abs(k0).max())
    if inplace:
        rq, rk = cuprope.rope_qk_forward(q, k, cfg, inplace=True, **kw)
        assert rq is q and rk is k
        # in-place never touches dims >= R
        assert torch.equal(host_t(q)[..., rot:], torch.from_numpy(q0[..., rot:]))
    else:
        oq, ok = poisoned_like(q), poisoned_like(k)
        rq, rk = cuprope.rope_qk_forward(q, k, cfg, out=(oq, ok), **kw)
        assert rq is oq and rk is ok
    assert torch.equal(qkv[..., (hq + hk) * d:], v_before), "v was written"
    for got, x0 in ((rq, q0), (rk, k0)):
        ref = expected(x0, cfg, **_np_pos(kw))
        _record(dtype, assert_matches(host(got), ref, xmax, dtype), xmax)
    # backward undoes forward (within rounding of the dtype)
    gq, gk = cuprope.rope_qk_backward(rq, rk, cfg, **kw)
    for got, rot_in in ((gq, rq), (gk, rk)):
        ref = expected(host(rot_in), cfg, inverse=True, **_np_pos(kw))
        assert_matches(host(got), ref, xmax, dtype)


def host_t(t):
    import torch
    return torch.from_numpy(host(t))


@pytest.mark.parametrize("partial", [False, True], ids=["R=D", "R<D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_wide_heads_loop_over_several_chunks_per_lane(dtype, interleaved, partial, rng):
    """D 1024: more 16-byte chunks per head than lanes in a warp (64 for R = D
    in every dtype, 32 + 32 pass-through for R = D/2 in fp32), so each lane
    walks several chunks and re-primes its load ring for each."""
    b, s, hq, hk, d = 2, 7, 3, 2, 1024
    rot = d // 2 if partial else d
    cfg = cuprope.RopeConfig(rot, interleaved=interleaved)
    q, k = rand((b, s, hq, d), dtype, rng), rand((b, s, hk, d), dtype, rng)
    q0, k0 = host(q), host(k)
    xmax = max(np.abs(q0).max(), np.abs(k0).max())
    for inverse, fn in ((False, cuprope.rope_qk_forward), (True, cuprope.rope_qk_backward)):
        oq, ok = poisoned_like(q), poisoned_like(k)
        fn(q, k, cfg, offset=321, out=(oq, ok))
        for got, x0 in ((oq, q0), (ok, k0)):
            ref = expected(x0, cfg, inverse=inverse, offset=321)
            _record(dtype, assert_matches(host(got), ref, xmax, dtype), xmax)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_tokens_with_per_sequence_positions(dtype, rng):
    import torch
    seqlens = [5, 17, 1, 9]
    t = sum(seqlens)
    pos = np.concatenate([np.arange(n) for n in seqlens]).astype(np.int64)
    cfg = cuprope.RopeConfig(64, layout="thd")
    q = rand((t, 6, 64), dtype, rng)
    k = rand((t, 2, 64), dtype, rng)
    pt = torch.from_numpy(pos).cuda()
    oq, ok = poisoned_like(q), poisoned_like(k)
    cuprope.rope_qk_forward(q, k, cfg, positions=pt, out=(oq, ok))
    xmax = max(np.abs(host(q)).max(), np.abs(host(k)).max())
    for got, x in ((oq, q), (ok, k)):
        assert_matches(host(got), expected(host(x), cfg, positions=pos), xmax, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_bhsd_view_and_unaligned_fallback(dtype, rng):
    """A [B,H,S,D] view of a [B,S,H,D] tensor, and a misaligned slice that forces
    the narrow (1-pair) kernel."""
    base = rand((2, 13, 4, 64), dtype, rng)
    x = base.transpose(1, 2)          # [B, H, S, D] with bshd memory order
    cfg = cuprope.RopeConfig(64, layout="bhsd", interleaved=True)
    out = poisoned_like(x)
    cuprope.rope_forward(x, cfg, out=out, offset=3)
    xmax = np.abs(host(x)).max()
    assert_matches(host(out), expected(host(x), cfg, offset=3), xmax, dtype)

    wide = rand((2, 13, 4, 67), dtype, rng)
    y = wide[..., 1:65]               # row stride 67, base pointer off by one element
    cfg2 = cuprope.RopeConfig(48)
    out2 = poisoned_like(y)
    cuprope.rope_forward(y, cfg2, out=out2)
    assert_matches(host(out2), expected(host(y), cfg2), np.abs(host(y)).max(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_every_pack_width_gives_the_same_bits(dtype, interleaved, rng):
    """The same values at element offsets 0, 1, 2 and 4 from the 16-byte grid
    run the pack widths 8 (16-bit) / 4 (fp32), 1, 2 and 4: every width rounds
    a pair alike, so the outputs are the same bytes (the fused ops' equality
    with rope_forward on differently aligned tensors rests on this)."""
    import torch
    cfg = cuprope.RopeConfig(64, base=500.0, interleaved=interleaved)
    x = rand((2, 9, 3, 64), dtype, rng)
    pos = torch.from_numpy(rng.integers(0, 2 ** 31 - 1, (2, 9))).cuda()
    outs = []
    for off in (0, 1, 2, 4):
        y = torch.empty((2, 9, 3, 64 + 8), dtype=x.dtype, device="cuda")[..., off:off + 64]
        y.copy_(x)
        outs.append(cuprope.rope_forward(y, cfg, positions=pos).contiguous())
    for off, o in zip((1, 2, 4), outs[1:]):
        assert torch.equal(o.view(torch.uint8), outs[0].view(torch.uint8)), off


@pytest.mark.parametrize("position", [2 ** 20, 131_072, 1_000_003, 2 ** 31 - 1])
def test_angles_exact_at_large_positions(position, rng):
    """fp32 output within 1e-6·max|x| of float64 at very large positions: the
    angle is formed in float64 and reduced mod π/2 there before fp32 polynomials."""
    import torch
    cfg = cuprope.RopeConfig(128, base=10000.0)
    x = rand((1, 8, 4, 128), "float32", rng)
    pos = torch.arange(position - 7, position + 1, dtype=torch.int64, device="cuda")
    out = poisoned_like(x)
    cuprope.rope_forward(x, cfg, positions=pos, out=out)
    xmax = np.abs(host(x)).max()
    err = assert_matches(host(out), expected(host(x), cfg, positions=pos.cpu().numpy()), xmax,
                         "float32")
    _record("float32", err, xmax)


def test_per_head_table_multistream_positions_and_scale(rng):
    import torch
    h, d = 5, 64
    table = rng.uniform(1e-4, 1.0, (h, d // 2))
    smap = np.array([0] * 8 + [1] * 12 + [2] * 12)
    cfg = cuprope.RopeConfig(d, inv_freq=table, stream_map=smap, scale=1.25)
    x = rand((2, 9, h, d), "float32", rng)
    pos = torch.tensor(rng.integers(0, 5000, (3, 2, 9)), dtype=torch.int32, device="cuda")
    out = poisoned_like(x)
    cuprope.rope_forward(x, cfg, positions=pos, out=out)
    ref = expected(host(x), cfg, positions=pos.cpu().numpy())
    assert_matches(host(out), ref, np.abs(host(x)).max(), "float32", scale=1.25)
    back = cuprope.rope_backward(out, cfg, positions=pos)
    ref_b = expected(host(out), cfg, positions=pos.cpu().numpy(), inverse=True)
    assert_matches(host(back), ref_b, np.abs(host(out)).max(), "float32", scale=1.25)


@pytest.mark.parametrize("pos_kind", ["offset", "offset+seq_offsets", "offset 2**31-400"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("partial", [False, True], ids=["R=D", "R<D"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_per_head_token_runs(dtype, interleaved, partial, layout, pos_kind, rng):
    """Per-head frequency rows with implicit positions take token runs: a warp
    per (sequence, token tile, head), each lane's cos/sin exact every RUNS rows
    and composed with an exact step between. S 300 gives several tiles and a
    partial last one; offsets up to 2**31 keep the angles within the fp32
    slack; fused q/k out of place, backward, and in place."""
    import torch

    from cuprope._core.launch import sm_count
    from cuprope.rope import launch as _launch
    b, s, h, d = 2, 300, 3, 128
    rot = d // 2 if partial else d
    itemsize = 4 if dtype == "float32" else 2
    vec = 16 // itemsize
    chunks = rot // 2 // vec + (d - rot) // (2 * vec)
    assert _launch.token_tile(sm_count(0), itemsize, chunks, 2 * h, b, s) > 0  # the path under test
    table = rng.uniform(1e-3, 1.0, (h, rot // 2))
    cfg = cuprope.RopeConfig(rot, inv_freq=table, interleaved=interleaved, layout=layout,
                             scale=0.75)
    kw = {"offset": 2 ** 31 - 400 if "2**31" in pos_kind else 17}
    if "seq_offsets" in pos_kind:
        kw["seq_offsets"] = torch.tensor(rng.integers(0, 10 ** 6, b), dtype=torch.int64,
                                         device="cuda")
    q, k = rand(shape_for(layout, b, s, h, d), dtype, rng), rand(shape_for(layout, b, s, h, d),
                                                                 dtype, rng)
    q0, k0 = host(q), host(k)
    xmax = max(np.abs(q0).max(), np.abs(k0).max())
    for inverse, fn in ((False, cuprope.rope_qk_forward), (True, cuprope.rope_qk_backward)):
        oq, ok = poisoned_like(q), poisoned_like(k)
        fn(q, k, cfg, out=(oq, ok), **kw)
        for got, x0 in ((oq, q0), (ok, k0)):
            ref = expected(x0, cfg, inverse=inverse, **_np_pos(kw))
            _record(dtype, assert_matches(host(got), ref, xmax, dtype, scale=0.75), xmax)
    cuprope.rope_qk_forward(q, k, cfg, inplace=True, **kw)
    for got, x0 in ((q, q0), (k, k0)):
        ref = expected(x0, cfg, **_np_pos(kw))
        assert_matches(host(got), ref, xmax, dtype, scale=0.75)
        if partial:  # in place never touches dims >= R
            assert np.array_equal(host(got)[..., rot:], x0[..., rot:])


def test_nan_and_inf_pass_through_their_own_pair(rng):
    import torch
    cfg = cuprope.RopeConfig(8)
    x = rand((1, 3, 1, 8), "float32", rng)
    x[0, 1, 0, 1] = float("nan")
    x[0, 0, 0, 2] = float("inf")
    y = cuprope.rope_forward(x, cfg)
    yh = host(y)
    assert np.isnan(yh[0, 1, 0, [1, 5]]).all()                   # pair (1, 5) at position 1
    assert np.isfinite(np.delete(yh[0, 1, 0], [1, 5])).all()
    assert np.isinf(yh[0, 0, 0, 2])                              # position 0: cos 1, sin 0
    assert torch.isfinite(y[0, 2]).all()


def test_empty_tensor_returns_empty_without_launch():
    import torch
    cfg = cuprope.RopeConfig(64)
    x = torch.empty((0, 5, 2, 64), device="cuda", dtype=torch.float16)
    y = cuprope.rope_forward(x, cfg)
    assert y.shape == x.shape and y.device == x.device


@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_arrays_in_cupy_out(dtype, rng):
    import cupy
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        import ml_dtypes
        npdt = ml_dtypes.bfloat16
    else:
        npdt = np.dtype(dtype)
    cfg = cuprope.RopeConfig(32, interleaved=True)
    xh = rng.standard_normal((2, 7, 3, 48)).astype(npdt)
    x = cupy.asarray(xh)
    out = cupy.full(x.shape, np.nan, dtype=x.dtype)
    res = cuprope.rope_forward(x, cfg, out=out, offset=100)
    assert res is out
    y = cuprope.rope_forward(x, cfg, offset=100)
    assert isinstance(y, cupy.ndarray)
    ref = expected(xh.astype(np.float64), cfg, offset=100)
    assert_matches(cupy.asnumpy(out).astype(np.float64), ref, np.abs(xh.astype(np.float64)).max(), dtype)
    assert_matches(cupy.asnumpy(y).astype(np.float64), ref, np.abs(xh.astype(np.float64)).max(), dtype)


@pytest.mark.skipif(not HAS_JAX, reason="needs jax: pip install jax")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jax_arrays_in_jax_out(dtype, rng):
    import jax
    import jax.numpy as jnp
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("jax sees no GPU")
    cfg = cuprope.RopeConfig(64)
    xh = rng.standard_normal((2, 11, 4, 64)).astype(np.float32)
    x = jax.device_put(jnp.asarray(xh, dtype=getattr(jnp, dtype)), gpus[0])
    q, k = cuprope.rope_qk_forward(x, x[:, :, :2], cfg, offset=9)
    assert isinstance(q, jax.Array) and isinstance(k, jax.Array)
    x64 = np.asarray(x.astype(jnp.float32)).astype(np.float64)
    xmax = np.abs(x64).max()
    assert_matches(np.asarray(q.astype(jnp.float32)), expected(x64, cfg, offset=9), xmax, dtype)
    assert_matches(np.asarray(k.astype(jnp.float32)), expected(x64[:, :, :2], cfg, offset=9), xmax, dtype)
    # the input JAX array is unchanged (cuprope never writes a JAX buffer)
    assert np.array_equal(np.asarray(x.astype(jnp.float32)), x64.astype(np.float32))
    with pytest.raises(TypeError, match="immutable"):
        cuprope.rope_forward(x, cfg, inplace=True)


def test_runs_on_torch_current_side_stream(rng):
    """The kernel must run on torch's current stream: the input is produced on a
    side stream behind a long sleep; a launch on any other stream would read NaN."""
    import torch
    cfg = cuprope.RopeConfig(128)
    src = rand((4, 256, 8, 128), "bfloat16", rng)
    x = torch.full_like(src, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        x.copy_(src)
        y = cuprope.rope_forward(x, cfg)
    s.synchronize()
    assert_matches(host(y), expected(host(src), cfg), np.abs(host(src)).max(), "bfloat16")


def test_cuda_graph_capture_and_replay(rng):
    import torch
    cfg = cuprope.RopeConfig(64)
    q = rand((2, 16, 4, 64), "float16", rng)
    k = rand((2, 16, 2, 64), "float16", rng)
    pos = torch.arange(16, device="cuda", dtype=torch.int32)
    cuprope.rope_qk_forward(q, k, cfg, positions=pos)  # warm-up: compile, tables
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cuprope.rope_qk_forward(q, k, cfg, positions=pos, out=(oq, ok))
    for _ in range(2):
        q.copy_(rand(tuple(q.shape), "float16", rng))
        pos.add_(1000)
        oq.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert_matches(host(oq), expected(host(q), cfg, positions=pos.cpu().numpy()),
                       np.abs(host(q)).max(), "float16")


def test_second_gpu_when_present(rng):
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU on this machine")
    cfg = cuprope.RopeConfig(64)
    x = rand((2, 5, 3, 64), "float32", rng, device="cuda:1")
    y = cuprope.rope_forward(x, cfg)
    assert y.device == x.device
    assert_matches(host(y), expected(host(x), cfg), np.abs(host(x)).max(), "float32")
    k = rand((2, 5, 3, 64), "float32", rng, device="cuda:0")
    with pytest.raises(ValueError, match="different devices"):
        cuprope.rope_qk_forward(x, k, cfg)


def test_gpu_positions_on_host_rejected(rng):
    cfg = cuprope.RopeConfig(64)
    x = rand((1, 4, 2, 64), "float32", rng)
    with pytest.raises(ValueError, match="positions is on host"):
        cuprope.rope_forward(x, cfg, positions=np.arange(4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeated_calls_take_the_cached_fast_path_correctly(dtype, rng):
    """The first call validates and plans; later calls with the same signature
    reuse the plan and launch through the driver directly. Every call must see
    its own data, pointers, positions and offset."""
    import torch
    cfg = cuprope.RopeConfig(64, interleaved=dtype == "float16")
    pos = torch.arange(10, dtype=torch.int64, device="cuda")
    for call in range(4):
        q = rand((2, 10, 4, 96), dtype, rng)
        k = rand((2, 10, 2, 96), dtype, rng)
        pos.add_(1000 * call)
        oq, ok = cuprope.rope_qk_forward(q, k, cfg, positions=pos, offset=call)
        xmax = max(np.abs(host(q)).max(), np.abs(host(k)).max())
        for got, x in ((oq, q), (ok, k)):
            ref = expected(host(x), cfg, positions=pos.cpu().numpy(), offset=call)
            assert_matches(host(got), ref, xmax, dtype)
        # out= through the fast path: fresh data, poisoned outputs every call
        oq2, ok2 = poisoned_like(q), poisoned_like(k)
        res = cuprope.rope_qk_forward(q, k, cfg, positions=pos, offset=call, out=(oq2, ok2))
        assert res[0] is oq2 and res[1] is ok2
        assert_matches(host(oq2), expected(host(q), cfg, positions=pos.cpu().numpy(), offset=call),
                       xmax, dtype)
        # an out= that overlaps an input is still refused after plans are cached
        with pytest.raises(ValueError, match="overlaps"):
            cuprope.rope_qk_forward(q, k, cfg, positions=pos, offset=call, out=(oq2, q[:, :, :2]))
        # in-place through the fast path too
        q2 = q.clone()
        res = cuprope.rope_qk_forward(q2, k.clone(), cfg, positions=pos, offset=call, inplace=True)
        assert res[0] is q2
        assert_matches(host(q2), expected(host(q), cfg, positions=pos.cpu().numpy(), offset=call),
                       xmax, dtype)
    assert cfg._launches.plans, "no plan was cached"


def test_cuda_array_interface_and_dlpack_producers_come_back_as_cupy(rng):
    """Objects that only expose __cuda_array_interface__ or __dlpack__ are read
    through CuPy; the result is a CuPy array (their own type cannot be built)."""
    import cupy

    class CAIOnly:
        def __init__(self, a):
            self._a = a
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    class DLPackOnly:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    cfg = cuprope.RopeConfig(32)
    xh = rng.standard_normal((2, 6, 3, 32)).astype(np.float32)
    ref = expected(xh.astype(np.float64), cfg)
    for wrap in (CAIOnly, DLPackOnly):
        y = cuprope.rope_forward(wrap(cupy.asarray(xh)), cfg)
        assert isinstance(y, cupy.ndarray)
        assert_matches(cupy.asnumpy(y), ref, np.abs(xh).max(), "float32")


# ---------------------------------------------------------------- CuPy fast path


def _np_dtype(dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _cupy_qk(rng, dtype, b=2, s=10, hq=4, hk=2, d=96):
    """Fresh q [B,S,Hq,D] and k [B,S,Hk,D] as views of one new CuPy buffer, so
    every call has new pointers but the same k − q pointer difference (part of
    the in-place key). Also returns the buffer."""
    import cupy
    nq, nk = b * s * hq * d, b * s * hk * d
    buf = cupy.asarray(rng.standard_normal(nq + nk).astype(np.float32).astype(_np_dtype(dtype)))
    return buf[:nq].reshape(b, s, hq, d), buf[nq:].reshape(b, s, hk, d), buf


def _cupy_host(a):
    import cupy
    return cupy.asnumpy(a).astype(np.float64)


def _cupy_nan_like(a):
    import cupy
    return cupy.full(a.shape, np.nan, dtype=a.dtype)


def _count_general_path(monkeypatch):
    """List that grows by one per call reaching the general GPU backend."""
    from cuprope.rope import engine
    calls = []
    real = engine._gpu_rope

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_gpu_rope", counted)
    return calls


@pytest.mark.parametrize("dtype", DTYPES)
def test_cupy_repeated_calls_take_the_fast_path(dtype, rng, monkeypatch):
    """CuPy q and k: the second call with the same signature skips the general
    path and still sees its own data, positions and offset."""
    import cupy
    calls = _count_general_path(monkeypatch)
    cfg = cuprope.RopeConfig(64, interleaved=dtype == "float16")
    for call in range(2):
        q, k, _ = _cupy_qk(rng, dtype)
        pos = cupy.asarray(rng.integers(0, 70000, q.shape[1]).astype(np.int32))
        q0, k0 = _cupy_host(q), _cupy_host(k)
        rq, rk = cuprope.rope_qk_forward(q, k, cfg, positions=pos, offset=7 * call)
        assert len(calls) == 1, "the second call took the general path"
        assert type(rq) is cupy.ndarray and type(rk) is cupy.ndarray
        assert rq.shape == q.shape and rk.shape == k.shape and rq.dtype == q.dtype
        assert rq.flags.c_contiguous and rk.flags.c_contiguous
        assert rq.device.id == q.device.id
        xmax = max(np.abs(q0).max(), np.abs(k0).max())
        for got, x0 in ((rq, q0), (rk, k0)):
            ref = expected(x0, cfg, positions=cupy.asnumpy(pos), offset=7 * call)
            assert_matches(_cupy_host(got), ref, xmax, dtype)
        # inputs untouched
        assert np.array_equal(_cupy_host(q), q0) and np.array_equal(_cupy_host(k), k0)


def test_cupy_fast_path_out_and_overlap_checks(rng, monkeypatch):
    """out= through the CuPy fast path; an out= that overlaps an input, or the
    other output, on a call whose key is cached must still raise the general
    path's ValueError (and launch nothing)."""
    calls = _count_general_path(monkeypatch)
    cfg = cuprope.RopeConfig(64)
    for call in range(2):
        q, k, _ = _cupy_qk(rng, "float32")
        oq, ok = _cupy_nan_like(q), _cupy_nan_like(k)
        res = cuprope.rope_qk_forward(q, k, cfg, offset=call, out=(oq, ok))
        assert len(calls) == 1, "the second call took the general path"
        assert res[0] is oq and res[1] is ok
        xmax = max(np.abs(_cupy_host(q)).max(), np.abs(_cupy_host(k)).max())
        for got, x in ((oq, q), (ok, k)):
            assert_matches(_cupy_host(got), expected(_cupy_host(x), cfg, offset=call), xmax,
                           "float32")
    # same shapes, strides, dtypes and alignment as the cached out=, so the key hits
    q, k, buf = _cupy_qk(rng, "float32")
    oq, ok = _cupy_nan_like(q), _cupy_nan_like(k)
    k_over_q = buf[: k.size].reshape(k.shape)               # k's layout, q's memory
    assert k_over_q.strides == ok.strides and k_over_q.data.ptr % 16 == ok.data.ptr % 16
    q_before = _cupy_host(q)
    with pytest.raises(ValueError, match="overlaps an input"):
        cuprope.rope_qk_forward(q, k, cfg, out=(oq, k_over_q))
    assert np.array_equal(_cupy_host(q), q_before), "q was written"
    ok_over_oq = oq.reshape(-1)[: k.size].reshape(k.shape)  # the two outputs overlap
    with pytest.raises(ValueError, match="two outputs overlap"):
        cuprope.rope_qk_forward(q, k, cfg, out=(oq, ok_over_oq))
    assert np.isnan(_cupy_host(oq)).all(), "an output was written"
    # and a valid out= still works after the refusals
    res = cuprope.rope_qk_forward(q, k, cfg, out=(oq, ok))
    assert res[0] is oq and len(calls) == 1
    assert_matches(_cupy_host(oq), expected(q_before, cfg), np.abs(q_before).max(), "float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cupy_fast_path_in_place(dtype, rng, monkeypatch):
    """In-place CuPy q and k (views of one buffer: the same pointer difference
    each call) through the fast path; dims >= R are never touched."""
    calls = _count_general_path(monkeypatch)
    rot = 64
    cfg = cuprope.RopeConfig(rot)
    for call in range(2):
        q, k, _ = _cupy_qk(rng, dtype)
        q0, k0 = _cupy_host(q), _cupy_host(k)
        rq, rk = cuprope.rope_qk_forward(q, k, cfg, inplace=True, offset=100 + call)
        assert len(calls) == 1, "the second call took the general path"
        assert rq is q and rk is k
        xmax = max(np.abs(q0).max(), np.abs(k0).max())
        for got, x0 in ((q, q0), (k, k0)):
            gh = _cupy_host(got)
            assert_matches(gh, expected(x0, cfg, offset=100 + call), xmax, dtype)
            assert np.array_equal(gh[..., rot:], x0[..., rot:])
    # q and k overlapping each other: another pointer difference, so another
    # key; the general path refuses it
    q, k, buf = _cupy_qk(rng, dtype)
    with pytest.raises(ValueError, match="overlaps"):
        cuprope.rope_qk_forward(q, buf[: k.size].reshape(k.shape), cfg, inplace=True)


def test_fast_path_out_same_view_then_another_out_copies_the_rest(rng, monkeypatch):
    """out= exactly the inputs (views: nothing to copy past R) and then a
    separate out= of the same layout: the second must get dims >= R copied
    (the launch registered for the first does not copy them), and a third
    call like the second is fast."""
    import torch
    calls = _count_general_path(monkeypatch)
    cfg = cuprope.RopeConfig(64)
    q, k = rand((2, 3, 4, 128), "bfloat16", rng), rand((2, 3, 2, 128), "bfloat16", rng)
    q0, k0 = host(q), host(k)
    cuprope.rope_qk_forward(q, k, cfg, out=(q.view(q.shape), k.view(k.shape)))
    xmax = max(np.abs(q0).max(), np.abs(k0).max())
    assert_matches(host(q), expected(q0, cfg), xmax, "bfloat16")
    for n in range(2):
        x, y = rand((2, 3, 4, 128), "bfloat16", rng), rand((2, 3, 2, 128), "bfloat16", rng)
        oq, ok = poisoned_like(x), poisoned_like(y)
        cuprope.rope_qk_forward(x, y, cfg, out=(oq, ok))
        for got, src in ((oq, x), (ok, y)):
            assert_matches(host(got), expected(host(src), cfg), xmax, "bfloat16")
            assert torch.equal(got[..., 64:], src[..., 64:])
    assert len(calls) == 2, "the disjoint out= took the same-view launch or missed the fast path"


def test_fast_path_repeated_call_with_bad_input_raises(rng):
    import torch
    cfg = cuprope.RopeConfig(64)
    pos = torch.arange(3, device="cuda")
    for _ in range(2):
        q, k = rand((2, 3, 4, 64), "float16", rng), rand((2, 3, 2, 64), "float16", rng)
        cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
    with pytest.raises(ValueError, match="different devices|on host"):
        cuprope.rope_qk_forward(q, k.cpu(), cfg, positions=pos, inplace=True)
    with pytest.raises(ValueError, match="positions is on host"):
        cuprope.rope_qk_forward(q, k, cfg, positions=pos.cpu(), inplace=True)
    with pytest.raises(ValueError):
        cuprope.rope_qk_forward(q, k[:, :2], cfg, positions=pos, inplace=True)
    with pytest.raises(ValueError, match="overlaps"):
        cuprope.rope_qk_forward(q, q[:, :, :2], cfg, positions=pos, inplace=True)


# ---------------------------------------------------------------- decode rows
# Launches of few tokens take rope_decode_kernel (cuprope/rope/decode.py),
# which reads cos/sin from the config's angle table and computes them in
# float64 past it: its results must be the general kernel's bits.

DECODE_SHAPES = [("bshd", 5, 1), ("thd", 1, 7), ("bshd", 3, 4)]  # B>1 S=1; T tokens; B, S > 1


def _decode_call(q, k, cfg, pos, inverse, inplace):
    """The rotated (q, k): in place on copies, or into NaN-poisoned outputs."""
    fn = cuprope.rope_qk_backward if inverse else cuprope.rope_qk_forward
    if inplace:
        q, k = q.clone(), k.clone()
        return fn(q, k, cfg, positions=pos, inplace=True)
    return fn(q, k, cfg, positions=pos, out=(poisoned_like(q), poisoned_like(k)))


def _bits(t):
    """The raw bits of a torch tensor on the host (NumPy integers)."""
    import torch
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).cpu().numpy()


def _decode_inputs(layout, b, s, hq, hk, d, dtype, rows, rng):
    """q, k ([B, S, H, D], or [T, H, D] for thd) and int32 positions, half
    inside [0, rows) and half past it (up to 2**30)."""
    import torch
    shape_q = (b * s, hq, d) if layout == "thd" else (b, s, hq, d)
    shape_k = (b * s, hk, d) if layout == "thd" else (b, s, hk, d)
    n = b * s
    p = np.where(rng.random(n) < 0.5, rng.integers(0, rows, n), rng.integers(rows, 2 ** 30, n))
    p[0], p[-1] = rows - 1, rows  # both sides of the bound
    pos = torch.tensor(p.reshape(n if layout == "thd" else (b, s)), dtype=torch.int32,
                       device="cuda")
    return rand(shape_q, dtype, rng), rand(shape_k, dtype, rng), pos


# (D, R): R = D; partial rotary, whose out-of-place tail moves two packs a
# chunk or (D 136) one; D 512: more chunks than lanes in fp32
DECODE_DIMS = [(128, 128), (128, 64), (64, 64), (80, 48), (256, 256), (136, 128), (512, 512)]


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "in-place"])
@pytest.mark.parametrize("d,rot", DECODE_DIMS, ids=[f"D{d}R{r}" for d, r in DECODE_DIMS])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_rows_equal_the_general_path_bit_for_bit(monkeypatch, decode_taken, dtype,
                                                        interleaved, d, rot, inplace, inverse,
                                                        rng):
    """GQA q/k of 5 tokens (B 5, S 1), 7 (thd) and 12 (B 3, S 4), positions
    on both sides of a 96-row table: the decode rows (checked to be taken)
    give the general kernel's bits and match the float64 reference."""
    from cuprope.rope import decode
    taken = decode_taken
    hq, hk = 8, 2
    for layout, b, s in DECODE_SHAPES:
        def config():
            return cuprope.RopeConfig(rot, base=500000.0, interleaved=interleaved, layout=layout,
                                      scale=0.87)
        q, k, pos = _decode_inputs(layout, b, s, hq, hk, d, dtype, 96, rng)
        rows = _decode_call(q, k, config().cache_angles(96), pos, inverse, inplace)
        assert taken and taken[-1], "the decode rows were not taken"
        with monkeypatch.context() as m:
            m.setattr(decode, "MAX_TOKENS", 0)
            general = _decode_call(q, k, config(), pos, inverse, inplace)
        n = len(taken)
        for got, ref in zip(rows, general):
            assert np.array_equal(_bits(got), _bits(ref)), (layout, b, s)
        assert len(taken) == n  # (the general path planned no decode launch)
        xmax = max(np.abs(host(q)).max(), np.abs(host(k)).max())
        for got, x in zip(rows, (q, k)):
            ref = expected(host(x), config(), inverse=inverse, positions=pos.cpu().numpy())
            assert_matches(host(got), ref, xmax, dtype, scale=0.87)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_rows_default_table_and_none(dtype, rng):
    """Without cache_angles the first decode launch builds the default table
    (CUPROPE_ANGLE_TABLE_BYTES of float32 rows, once per config and device);
    cache_angles(0) leaves none (every angle computed): same bits, and a
    table row equals the float64 reference's cos/sin."""
    from cuprope.rope import decode
    q, k, pos = _decode_inputs("bshd", 9, 1, 4, 4, 128, dtype, 40000, rng)
    cfg = cuprope.RopeConfig(128, base=1e6)
    a = _decode_call(q, k, cfg, pos, False, True)
    table = cfg.angle_tables[0]
    assert table.shape == (decode.TABLE_BYTES // (4 * 128), 128) and table.dtype == np.float32
    _decode_call(q, k, cfg, pos, False, False)
    assert cfg.angle_tables[0] is table  # built once
    b = _decode_call(q, k, cuprope.RopeConfig(128, base=1e6).cache_angles(0), pos, False, True)
    for x, y in zip(a, b):
        assert np.array_equal(_bits(x), _bits(y))
    p = np.array([0, 1, 777, table.shape[0] - 1])
    ang = p[:, None] * cfg.inv_freq[None, :]
    tab = table.get()
    assert_matches(tab[p, :64], np.cos(ang), 1.0, "float32")
    assert_matches(tab[p, 64:], np.sin(ang), 1.0, "float32")


def test_decode_rows_under_capture_before_the_table_exists(rng):
    """A first decode launch captured into a CUDA graph cannot build the
    table (its kernel would be captured): it computes every angle, the plan
    is not kept, and the next eager call builds the table. Results equal
    throughout."""
    import torch
    cfg = cuprope.RopeConfig(128, layout="thd")
    q, k, pos = _decode_inputs("thd", 1, 2048, 8, 2, 128, "bfloat16", 4096, rng)
    cuprope.rope_qk_forward(q, k, cfg, positions=pos)  # warm-up: 2048 tokens, general path
    assert 0 not in cfg.angle_tables
    qs, ks, ps = q[:3], k[:3], pos[:3]
    ref = [t.clone() for t in cuprope.rope_qk_forward(qs, ks, cfg, positions=ps)]
    assert 0 in cfg.angle_tables  # (an eager decode call builds it)
    cfg2 = cuprope.RopeConfig(128, layout="thd")
    cuprope.rope_qk_forward(q, k, cfg2, positions=pos)  # device tables, compiled kernels
    oq, ok = poisoned_like(qs), poisoned_like(ks)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cuprope.rope_qk_forward(qs, ks, cfg2, positions=ps, out=(oq, ok))
    assert 0 not in cfg2.angle_tables
    g.replay()
    torch.cuda.synchronize()
    assert np.array_equal(_bits(oq), _bits(ref[0])) and np.array_equal(_bits(ok), _bits(ref[1]))
    again = cuprope.rope_qk_forward(qs, ks, cfg2, positions=ps, out=(oq, ok))
    assert 0 in cfg2.angle_tables
    assert np.array_equal(_bits(again[0]), _bits(ref[0]))


def test_decode_rows_cupy_and_fast_path(rng):
    """CuPy arrays and repeated torch calls (the fast path replays the decode
    plan) give the first call's bits."""
    import cupy
    import torch
    cfg = cuprope.RopeConfig(128)
    q, k, pos = _decode_inputs("bshd", 4, 1, 8, 2, 128, "float16", 30000, rng)
    first = [t.clone() for t in cuprope.rope_qk_forward(q, k, cfg, positions=pos)]
    for _ in range(3):
        again = cuprope.rope_qk_forward(q, k, cfg, positions=pos)
        assert all(np.array_equal(_bits(x), _bits(y)) for x, y in zip(again, first))
    cq, ck = cupy.from_dlpack(q), cupy.from_dlpack(k)
    cres = cuprope.rope_qk_forward(cq, ck, cfg, positions=cupy.from_dlpack(pos))
    for x, y in zip(cres, first):
        assert np.array_equal(_bits(torch.from_dlpack(x)), _bits(y))


def test_decode_rows_without_room_for_the_table(monkeypatch, rng):
    """No device memory for the angle table: one warning, every angle
    computed (the same bits), and the launch is kept (no retry per call)."""
    import cupy
    from cuprope.rope import decode
    q, k, pos = _decode_inputs("bshd", 6, 1, 8, 2, 128, "bfloat16", 30000, rng)
    ref = _decode_call(q, k, cuprope.RopeConfig(128), pos, False, False)
    real_empty = cupy.empty

    def empty(shape, dtype=float, *a, **kw):
        if dtype == cupy.float32 and len(shape) == 2 and shape[0] == decode.table_rows(cfg):
            raise cupy.cuda.memory.OutOfMemoryError(1, 1)
        return real_empty(shape, dtype, *a, **kw)
    cfg = cuprope.RopeConfig(128)
    monkeypatch.setattr(cupy, "empty", empty)
    with pytest.warns(RuntimeWarning, match="no room for the"):
        got = _decode_call(q, k, cfg, pos, False, False)
    assert cfg.angle_tables == {0: None} and len(cfg._launches.plans) == 1
    again = _decode_call(q, k, cfg, pos, False, False)
    for x, y, z in zip(got, again, ref):
        assert np.array_equal(_bits(x), _bits(z)) and np.array_equal(_bits(y), _bits(z))
