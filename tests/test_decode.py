"""The decode rows' host side, no GPU needed: which launches take
rope_decode_kernel (cuprope/rope/decode.py), their grid, their arguments,
and the angle table's size. The kernel's results are compared with the
general path's bit for bit in test_gpu_rope.py and test_gpu_kvcache.py."""
import itertools

import numpy as np
import pytest

import cuprope
from cuprope._core import loader
from cuprope.rope import args
from cuprope.rope import decode, launch
from cuprope.rope import kernels as rope_kernels

HQ, HK, D = 32, 8, 128


def _plans(b, s, hq=HQ, hk=HK, d=D, ptr=0):
    """q and k as [B, S, H, D] contiguous tensors at byte address ``ptr``."""
    return [launch.TensorPlan(ptr, ptr, (s * h * d, h * d, d), (s * h * d, h * d, d), h)
            for h in (hq, hk)]


def _spec(b, s, *, dtype="bfloat16", angles=None, plans=None, rot=D, copy_rest=False, **kw):
    fields = dict(sms=132, dtype=dtype, interleaved=False, plans=plans or _plans(b, s),
                  n_batch=b, n_seq=s, head_dim=D, rot_dim=rot, copy_rest=copy_rest,
                  pos=(0, 0, 0, 1), seq_off=None, inv_freq_ptr=1, freq_sh=0, stream_map_ptr=0,
                  scale=1.0, sin_sign=1.0, angles=angles)
    fields.update(kw)
    return launch.rope_spec(**fields)


class Table:
    """An angle source that records whether it was asked."""

    def __init__(self, ptr=4096, rows=32768):
        self.ptr, self.rows, self.asked = ptr, rows, 0

    def __call__(self):
        self.asked += 1
        return self.ptr, self.rows


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("b,s", [(1, 1), (64, 1), (1024, 1), (3, 4)])
def test_few_tokens_take_the_decode_rows_with_the_general_words(dtype, b, s):
    """A launch of at most MAX_TOKENS tokens takes rope_decode_kernel: its
    RopeArgs are the general spec's words, its KvArgs hold the table."""
    table = Table()
    spec = _spec(b, s, dtype=dtype, angles=table)
    general = _spec(b, s, dtype=dtype)
    assert spec.kernel == rope_kernels.decode_kernel_name(dtype, False, rope_kernels.KV_ANGLES)
    assert spec.family == "decode" and spec.smem == 0 and table.asked == 1
    assert spec.params[0] == general.params[0]
    kv = dict(zip([f for f, _, _ in args.KV_ARGS.fields],
                  np.frombuffer(spec.params[1][1], dtype=np.int64)))
    assert (kv["cs_ptr"], kv["cs_st"], kv["cs_rows"]) == (4096, D, 32768)
    assert spec.calls == general.calls and spec.vec == general.vec
    assert (spec.grid, spec.block) == decode.geometry(132, D // 2 // spec.vec, HQ + HK, b, s)


@pytest.mark.parametrize("case", ["prefill", "jax", "off", "per_head", "stream_map",
                                  "unaligned", "lrpe"])
def test_other_launches_keep_the_general_kernel(monkeypatch, case):
    """More tokens than MAX_TOKENS, no angle source (the JAX lowering), the
    path turned off, per-head tables, stream maps, narrow packs and LRPE keep
    rope_kernel, and never ask for the table."""
    table = Table()
    kw = {}
    b = 4
    if case == "prefill":
        b = decode.MAX_TOKENS + 1
    elif case == "off":
        monkeypatch.setattr(decode, "MAX_TOKENS", 0)
    elif case == "per_head":
        kw = dict(freq_sh=D // 2)
    elif case == "stream_map":
        kw = dict(stream_map_ptr=8)
    elif case == "unaligned":
        kw = dict(plans=_plans(b, 1, ptr=2))
    elif case == "lrpe":
        kw = dict(plans=_plans(b, 1)[:1], act=rope_kernels.LRPE_ACTS["silu"], calls=launch.LRPE_CALLS)
    spec = _spec(b, 1, angles=None if case == "jax" else table, **kw)
    assert "rope_decode_kernel" not in spec.kernel and spec.kernel.startswith("cuprope::rope_")
    assert table.asked == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_table_calls_of_few_tokens_take_the_decode_rows(dtype, interleaved):
    """The cos/sin-table source with decode_tables (the eager table calls)
    takes rope_decode_kernel's KV_TABLES_T with the general spec's RopeArgs
    and no angle table; without it (the JAX lowering), with more tokens than
    MAX_TOKENS, or with narrow packs it keeps rope_kernel."""
    table = (8192, 16384, 128 * 4, 128)  # cos, sin, stride_b, stride_s
    kw = dict(dtype=dtype, interleaved=interleaved, pos=None, table=table, inv_freq_ptr=0)
    spec = _spec(4, 1, decode_tables=True, **kw)
    general = _spec(4, 1, **kw)
    assert spec.kernel == rope_kernels.decode_kernel_name(dtype, interleaved, rope_kernels.KV_TABLES_T)
    assert "rope_decode_kernel" not in general.kernel and general.family == "table"
    assert spec.params[0] == general.params[0] and spec.calls == general.calls
    kv = np.frombuffer(spec.params[1][1], dtype=np.int64)
    assert not kv[:3].any()
    b = decode.MAX_TOKENS + 1
    assert "rope_decode_kernel" not in _spec(b, 1, decode_tables=True, **kw).kernel
    odd = dict(kw, table=(8192 + 2, 16384, 128 * 4, 128))
    assert "rope_decode_kernel" not in _spec(4, 1, decode_tables=True, **odd).kernel


@pytest.mark.parametrize("chunks,htot,n_batch,n_seq", [
    (8, 40, 1, 1), (8, 40, 64, 1), (8, 40, 1024, 1), (4, 3, 5, 1), (4, 3, 1, 5), (16, 40, 7, 1),
    (32, 1, 2, 1), (40, 6, 3, 1), (6, 10, 3, 3), (1, 33, 12, 1), (8, 40, 2, 300), (8, 40, 300, 2)])
def test_geometry_covers_every_token_head_and_chunk_once(chunks, htot, n_batch, n_seq):
    """Thread (x, y, z) of block (i, j, k) takes chunks x, x + cx, ... of head
    j·hy + y of token (k·tz + z, 0) when S is 1, else (k, i·tz + z)
    (kernels/decode.cuh): every (token, head, chunk) exactly once, blocks of
    at most WARPS warps' worth of threads."""
    (gx, gy, gz), (cx, hy, tz) = decode.geometry(132, chunks, htot, n_batch, n_seq)
    assert cx * hy * tz <= 32 * decode.WARPS and gy <= decode.MAX_GRID_Y
    seen = np.zeros((n_batch, n_seq, htot, chunks), dtype=np.int64)
    for i, j, k, x, y, z in itertools.product(range(gx), range(gy), range(gz), range(cx),
                                              range(hy), range(tz)):
        run = (k if n_seq == 1 else i) * tz + z
        b, s = (run, 0) if n_seq == 1 else (k, run)
        h = j * hy + y
        if run < (n_batch if n_seq == 1 else n_seq) and h < htot:
            seen[b, s, h, x::cx] += 1
    assert (seen == 1).all()


def test_geometry_spreads_one_token_over_many_blocks():
    """B 1 (Llama-3-8B heads): a block per 4 heads (10 blocks of a warp);
    B 1024: 4 tokens a block; a sequence of 1024 tokens the same along S."""
    assert decode.geometry(132, 8, 40, 1, 1) == ((1, 10, 1), (8, 4, 1))
    assert decode.geometry(132, 8, 40, 1024, 1) == ((1, 10, 256), (8, 4, 4))
    assert decode.geometry(132, 8, 40, 1, 1024) == ((256, 10, 1), (8, 4, 4))


def test_table_rows_default_explicit_none():
    """The angle table's rows: CUPROPE_ANGLE_TABLE_BYTES of float32 rows by
    default (32768 positions at R 128), cache_angles' count, 0 for none and
    for angles a row cannot hold (per-head tables, stream maps)."""
    cfg = cuprope.RopeConfig(128)
    assert cfg.angle_rows is None
    assert decode.table_rows(cfg) == decode.TABLE_BYTES // 512 == 32768
    assert decode.table_rows(cuprope.RopeConfig(64)) == 65536
    assert decode.table_rows(cfg.cache_angles(100)) == 100
    assert decode.table_rows(cfg.cache_angles(0)) == 0
    assert decode.table_rows(cuprope.RopeConfig(8, inv_freq=np.ones((2, 4)))) == 0
    assert decode.table_rows(cuprope.RopeConfig(8, stream_map=[0, 1, 0, 1])) == 0
    from cuprope.kvcache.launch import angle_table
    assert angle_table(cuprope.RopeConfig(128), 0) is None  # the KV append: opt-in only


@pytest.mark.parametrize("dtype,il,src,ptr,stride,ok", [
    ("bfloat16", False, rope_kernels.KV_COS_SIN_F32, 256, 128, True),
    ("bfloat16", False, rope_kernels.KV_COS_SIN_F32, 8, 128, False),
    ("bfloat16", False, rope_kernels.KV_COS_SIN_F32, 256, 130, False),
    ("bfloat16", True, rope_kernels.KV_COS_SIN_F32, 16, 132, True),
    ("bfloat16", False, rope_kernels.KV_COS_SIN_T, 16, 64, True),
    ("bfloat16", False, rope_kernels.KV_COS_SIN_T, 8, 64, False),
    ("float32", True, rope_kernels.KV_COS_SIN_F32, 8, 66, True),
    ("float32", True, rope_kernels.KV_COS_SIN_F32, 4, 66, False)])
def test_table_alignment(dtype, il, src, ptr, stride, ok):
    """A chunk's run of cos (half split: vec pairs, interleaved: vec/2) is read
    in loads of up to 16 bytes: the table's address and row stride must allow
    them."""
    vec = loader.vec_widths(dtype)[0]
    assert decode.table_aligned(dtype, il, vec, src, ptr, stride) is ok


def test_rotary_embedding_of_few_tokens_takes_the_decode_rows(monkeypatch):
    """kv_spec (rotary_embedding's launch): a cos_sin_cache rotation of few
    tokens takes rope_decode_kernel with the cache's source; an aligned
    KV append, a prefill and an unaligned cache keep kv_rope_kernel."""
    from cuprope.kvcache import launch as kl
    monkeypatch.setattr(kl, "sm_count", lambda device: 132)
    rope = dict(in_ptr=(0, 0), out_ptr=(0, 0), in_ss=(HQ * D, HK * D), in_sh=(D, D),
                out_ss=(HQ * D, HK * D), out_sh=(D, D), heads=(HQ, HK), n_batch=1, n_seq=64,
                head_dim=D, rot_dim=D, pos_ptr=0, pos_is64=1, pos_ss=1, scale=1.0, sin_sign=1.0)

    def spec(src=rope_kernels.KV_COS_SIN_F32, **change):
        r = dict(rope, **change.pop("rope", {}))
        kv = {**dict(cs_ptr=512, cs_st=D, cs_rows=4096), **change}
        return kl.kv_spec(0, dtype="bfloat16", interleaved=False, vec=8, src=src, fp8=0, rope=r,
                          kv=kv)
    for src in (rope_kernels.KV_COS_SIN_F32, rope_kernels.KV_COS_SIN_T):
        assert spec(src).kernel == rope_kernels.decode_kernel_name("bfloat16", False, src)
    assert "kv_rope_kernel" in spec(rope=dict(n_seq=decode.MAX_TOKENS + 1)).kernel
    assert "kv_rope_kernel" in spec(cs_st=130).kernel
    assert "kv_rope_kernel" in spec(rope_kernels.KV_ANGLES, k_cache=64, v_ptr=64).kernel


def test_decode_kernel_names():
    assert rope_kernels.decode_kernel_name("float16", True, rope_kernels.KV_COS_SIN_T) == \
        "cuprope::rope_decode_kernel<__half, true, 8, 2>"
    with pytest.raises(ValueError, match="no rope_decode_kernel"):
        rope_kernels.decode_kernel_name("float32", False, rope_kernels.KV_COS_SIN_T)
    assert rope_kernels.decode_kernel_name("float32", True, rope_kernels.KV_TABLES_T) == \
        "cuprope::rope_decode_kernel<float, true, 4, 3>"
    assert loader.family_names(rope_kernels.DECODE_FAMILY)[0][0] == rope_kernels.KV_ANGLE_TABLE_KERNEL
