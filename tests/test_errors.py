"""Bad inputs to the public API on NumPy arrays: each raises an error naming the
argument. Also the edge inputs that are not errors: empty tensors, NaN, Inf."""
import types

import ml_dtypes
import numpy as np
import pytest

import cuprope
from cuprope import RopeConfig, reference, rope_backward, rope_forward, rope_qk_backward, rope_qk_forward

B, S, H, D = 2, 5, 3, 8


def randn(rng, shape, dtype=np.float32):
    x = rng.standard_normal(shape)
    x[x == 0] = 0.5
    return x.astype(dtype)


@pytest.fixture
def x(rng):
    return randn(rng, (B, S, H, D))


@pytest.fixture
def cfg():
    return RopeConfig(D)


# --------------------------------------------------------------------------- rotary_dim

@pytest.mark.parametrize("bad", [3, 7, 0, -2, -3])
def test_odd_zero_or_negative_rotary_dim_is_rejected(bad):
    with pytest.raises(ValueError, match=r"rotary_dim must be a positive even integer"):
        RopeConfig(bad)
    with pytest.raises(ValueError, match=r"rotary_dim must be a positive even integer"):
        reference.default_inv_freq(bad)


@pytest.mark.parametrize("bad", [4.0, "4", None, True, np.float32(4), [4]])
def test_non_int_rotary_dim_is_rejected(bad):
    with pytest.raises(TypeError, match=r"rotary_dim must be an int"):
        RopeConfig(bad)


def test_numpy_integer_rotary_dim_is_accepted():
    assert RopeConfig(np.int64(8)).rotary_dim == 8


@pytest.mark.parametrize("fn", ["forward", "backward", "qk_forward", "qk_backward"])
def test_rotary_dim_larger_than_head_dim_is_rejected(x, fn):
    big = RopeConfig(D + 2)
    call = {"forward": lambda: rope_forward(x, big),
            "backward": lambda: rope_backward(x, big),
            "qk_forward": lambda: rope_qk_forward(x, x.copy(), big),
            "qk_backward": lambda: rope_qk_backward(x, x.copy(), big)}[fn]
    with pytest.raises(ValueError, match=r"rotary_dim \(10\) must be <= the head dim of (x|grad_out|q|grad_q) \(8\)"):
        call()


# --------------------------------------------------------------------------- dtypes and shapes

@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64, np.complex64, np.bool_,
                                   ml_dtypes.float8_e4m3fn])
def test_unsupported_dtype_is_rejected_naming_the_tensor(rng, cfg, dtype):
    bad = randn(rng, (B, S, H, D)).astype(dtype)
    good = randn(rng, (B, S, H, D))
    with pytest.raises(TypeError, match=r"x must have dtype float32, float16 or bfloat16"):
        rope_forward(bad, cfg)
    with pytest.raises(TypeError, match=r"grad_out must have dtype"):
        rope_backward(bad, cfg)
    with pytest.raises(TypeError, match=r"k must have dtype"):
        rope_qk_forward(good, bad, cfg)
    with pytest.raises(TypeError, match=r"grad_q must have dtype"):
        rope_qk_backward(bad, good, cfg)


@pytest.mark.parametrize("layout,shape", [("bshd", (B, S, D)), ("bshd", (1, B, S, H, D)),
                                          ("bhsd", (S, H, D)), ("thd", (B, S, H, D)),
                                          ("thd", (S, D))])
def test_wrong_rank_for_layout_is_rejected(rng, layout, shape):
    with pytest.raises(ValueError, match=r"x must be \[.*\] for layout"):
        rope_forward(randn(rng, shape), RopeConfig(D, layout=layout))


@pytest.mark.parametrize("bad", [None, [[1.0, 2.0]], 3.0, "x"])
def test_non_array_tensor_is_rejected_naming_it(x, cfg, bad):
    with pytest.raises(TypeError, match=r"^x must be an array"):
        rope_forward(bad, cfg)
    with pytest.raises(TypeError, match=r"^k must be an array"):
        rope_qk_forward(x, bad, cfg)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("which", ["batch", "seq"])
def test_q_and_k_with_different_batch_or_sequence_sizes_are_rejected(rng, layout, which):
    cfg = RopeConfig(D, layout=layout)
    canon_q, canon_k = (B, S, 4, D), ((B + 1, S, 2, D) if which == "batch" else (B, S + 1, 2, D))
    to = (lambda s: s) if layout == "bshd" else (lambda s: (s[0], s[2], s[1], s[3]))
    q, k = randn(rng, to(canon_q)), randn(rng, to(canon_k))
    with pytest.raises(ValueError, match=r"q and k must have the same batch and sequence sizes"):
        rope_qk_forward(q, k, cfg)
    with pytest.raises(ValueError, match=r"grad_q and grad_k must have the same batch and sequence"):
        rope_qk_backward(q, k, cfg)


def test_q_and_k_with_different_token_counts_are_rejected_for_thd(rng):
    cfg = RopeConfig(D, layout="thd")
    with pytest.raises(ValueError, match=r"q and k must have the same token count"):
        rope_qk_forward(randn(rng, (S, 4, D)), randn(rng, (S + 2, 4, D)), cfg)


def test_q_and_k_with_different_head_dims_are_rejected(rng):
    cfg = RopeConfig(4)
    with pytest.raises(ValueError, match=r"q and k must have the same head dim, got 8 and 10"):
        rope_qk_forward(randn(rng, (B, S, H, 8)), randn(rng, (B, S, H, 10)), cfg)


def test_q_and_k_with_different_dtypes_are_rejected(rng, cfg):
    q = randn(rng, (B, S, H, D))
    with pytest.raises(TypeError, match=r"q and k must share a dtype, got float32 and float16"):
        rope_qk_forward(q, q.astype(np.float16), cfg)
    with pytest.raises(TypeError, match=r"grad_q and grad_k must share a dtype"):
        rope_qk_backward(q.astype(ml_dtypes.bfloat16), q, cfg)


class _HostJaxLike:
    """Stand-in for a CPU ``jax.Array`` (jax is not a test dependency): cuprope
    identifies an array's framework by its type's module, and reads a host JAX
    array through ``devices()`` and ``__array__``."""
    __module__ = "jax._stand_in"

    def __init__(self, a):
        self._a = a

    def devices(self):
        return [types.SimpleNamespace(platform="cpu")]

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


def _other_frameworks():
    kinds = [pytest.param(_HostJaxLike, id="jax-stand-in")]
    try:
        import torch
        kinds.append(pytest.param(lambda a: torch.from_numpy(a), id="torch"))
    except Exception:
        kinds.append(pytest.param(None, id="torch", marks=pytest.mark.skip(
            reason="needs torch: pip install torch")))
    try:
        import jax.numpy as jnp
        kinds.append(pytest.param(lambda a: jnp.asarray(a), id="jax"))
    except Exception:
        kinds.append(pytest.param(None, id="jax", marks=pytest.mark.skip(
            reason="needs jax: pip install jax")))
    return kinds


@pytest.mark.parametrize("wrap", _other_frameworks())
def test_q_and_k_from_different_frameworks_are_rejected(x, cfg, wrap):
    other = wrap(x.copy())
    with pytest.raises(TypeError, match=r"q and k must come from the same framework, got numpy and"):
        rope_qk_forward(x, other, cfg)
    with pytest.raises(TypeError, match=r"grad_q and grad_k must come from the same framework"):
        rope_qk_backward(other, x, cfg)


def test_non_contiguous_last_dim_is_rejected_naming_the_tensor(rng):
    cfg = RopeConfig(4)
    wide = randn(rng, (B, S, H, 2 * D))
    strided = wide[..., ::2]
    assert strided.shape[-1] == D
    with pytest.raises(ValueError, match=r"^x: the last \(head\) dim must be contiguous"):
        rope_forward(strided, cfg)
    with pytest.raises(ValueError, match=r"^k: the last \(head\) dim must be contiguous"):
        rope_qk_forward(np.ascontiguousarray(strided), strided, cfg)
    with pytest.raises(ValueError, match=r"^grad_out: the last \(head\) dim must be contiguous"):
        rope_backward(wide[..., ::-1][..., :D], cfg)


# --------------------------------------------------------------------------- positions / offsets

@pytest.mark.parametrize("layout,pshape", [("bshd", (S + 1,)), ("bshd", (B, S, 1)), ("bshd", (B + 1, S)),
                                           ("bshd", (S, B)), ("bshd", ()), ("bhsd", (H, S)),
                                           ("thd", (1, S)), ("thd", (S - 1,))])
def test_positions_of_wrong_shape_are_rejected(rng, layout, pshape):
    shape = {"bshd": (B, S, H, D), "bhsd": (B, H, S, D), "thd": (S, H, D)}[layout]
    cfg = RopeConfig(D, layout=layout)
    pos = np.full(pshape, 1, np.int64)
    with pytest.raises(ValueError, match=r"^positions must have shape"):
        rope_forward(randn(rng, shape), cfg, positions=pos)


def test_multi_stream_positions_without_the_stream_axis_are_rejected(x):
    cfg = RopeConfig(D, stream_map=[0, 1, 1, 0])
    with pytest.raises(ValueError, match=r"^positions must have shape \[2, 5\] or \[2, 2, 5\]"):
        rope_forward(x, cfg, positions=np.arange(S))
    with pytest.raises(ValueError, match=r"^positions must have shape"):
        rope_forward(x, cfg, positions=np.zeros((3, S), np.int64))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int16, np.uint32, np.uint64, np.bool_])
def test_positions_of_wrong_dtype_are_rejected(x, cfg, dtype):
    with pytest.raises(TypeError, match=r"^positions must have dtype int32 or int64"):
        rope_forward(x, cfg, positions=np.arange(S).astype(dtype))


def test_positions_that_are_not_an_array_are_rejected(x, cfg):
    with pytest.raises(TypeError, match=r"^positions must be an array"):
        rope_forward(x, cfg, positions=list(range(S)))


@pytest.mark.parametrize("sshape", [(B + 1,), (B, 1), (1,), ()])
def test_seq_offsets_of_wrong_shape_are_rejected(x, cfg, sshape):
    with pytest.raises(ValueError, match=r"^seq_offsets must have shape \[2\]"):
        rope_forward(x, cfg, seq_offsets=np.zeros(sshape, np.int32))


def test_seq_offsets_of_wrong_dtype_are_rejected(x, cfg):
    with pytest.raises(TypeError, match=r"^seq_offsets must have dtype int32 or int64"):
        rope_forward(x, cfg, seq_offsets=np.zeros(B, np.float32))


def test_non_contiguous_seq_offsets_are_rejected(x, cfg):
    with pytest.raises(ValueError, match=r"^seq_offsets must be contiguous"):
        rope_forward(x, cfg, seq_offsets=np.arange(2 * B, dtype=np.int64)[::2])


def test_more_than_2_to_the_31_tokens_per_call_are_rejected(cfg):
    # a zero-stride view: 2^16 x 2^15 + 1 tokens without allocating them
    huge = np.broadcast_to(np.ones((1, 1, 1, D), np.float32), (2 ** 16, 2 ** 15 + 1, 1, D))
    with pytest.raises(ValueError, match=r"^at most 2147483647 tokens \(B\*S\) per call"):
        rope_forward(huge, cfg)


@pytest.mark.parametrize("bad", [1.0, np.float64(2), "3", None, True, 1 + 0j])
def test_non_int_offset_is_rejected(x, cfg, bad):
    with pytest.raises(TypeError, match=r"^offset must be an int"):
        rope_forward(x, cfg, offset=bad)
    with pytest.raises(TypeError, match=r"^offset must be an int"):
        rope_qk_backward(x, x.copy(), cfg, offset=bad)


def test_numpy_integer_offset_is_accepted_and_equals_the_python_int(x, cfg):
    np.testing.assert_array_equal(rope_forward(x, cfg, offset=np.int32(9)), rope_forward(x, cfg, offset=9))


@pytest.mark.parametrize("bad", [2 ** 63, -(2 ** 63), 2 ** 31, -(2 ** 31)])
def test_offset_out_of_range_is_rejected(x, cfg, bad):
    with pytest.raises(ValueError, match=r"^offset out of range.*exact for \|position\| <= 2\*\*31 - 1"):
        rope_forward(x, cfg, offset=bad)


def test_offsets_at_the_ends_of_the_exact_range_are_accepted(x, cfg):
    for off in (2 ** 31 - 1 - (S - 1), -(2 ** 31 - 1)):
        y = rope_forward(x, cfg, offset=off)
        assert y.shape == x.shape and np.isfinite(y).all()


@pytest.mark.parametrize("what", ["positions", "seq_offsets", "sum"])
def test_host_positions_past_the_exact_range_are_rejected_naming_them(x, cfg, what):
    pos = np.arange(S, dtype=np.int64)
    seq = np.zeros(B, dtype=np.int64)
    if what == "positions":
        pos[-1] = 2 ** 40
        name = "positions"
    elif what == "seq_offsets":
        seq[0] = -(2 ** 62)
        name = "seq_offsets"
    else:
        seq[-1] = 2 ** 31 - 1 - (S - 2)   # the last token lands one past the range
        name = r"positions \+ offset \+ seq_offsets"
    with pytest.raises(ValueError, match=rf"^{name} reach \d+: positions are exact"):
        rope_forward(x, cfg, positions=pos, seq_offsets=seq)
    seq[...] = 0
    pos[...] = np.arange(S)
    pos[-1] = 2 ** 31 - 1                  # the largest exact position is fine
    assert np.isfinite(rope_forward(x, cfg, positions=pos, seq_offsets=seq)).all()


# --------------------------------------------------------------------------- out= / inplace

def test_out_overlapping_a_shifted_view_of_the_input_is_rejected(rng, cfg):
    n = B * S * H * D
    buf = randn(rng, (n + D,))
    xa = buf[:n].reshape(B, S, H, D)
    shifted = buf[D:].reshape(B, S, H, D)     # same buffer, one head later
    before = buf.copy()
    with pytest.raises(ValueError, match=r"^out overlaps an input without being exactly that input"):
        rope_forward(xa, cfg, out=shifted)
    np.testing.assert_array_equal(buf, before)  # nothing was written


def test_out_that_is_a_reordered_view_of_the_input_is_rejected(x, cfg):
    with pytest.raises(ValueError, match=r"^out overlaps an input"):
        rope_forward(x, cfg, out=x[:, ::-1])
    with pytest.raises(ValueError, match=r"^out overlaps an input"):
        rope_forward(x[:, :, :2], cfg, out=x[:, :, 1:])


def test_out_sharing_a_buffer_but_no_element_with_the_input_is_accepted(rng, cfg):
    # x and out interleave in one buffer (like q and k slices of a fused qkv tensor):
    # their byte ranges overlap but no element is shared, so this is not an overlap.
    buf = randn(rng, (B, S, H, 2, D))
    x, out = buf[:, :, :, 0, :], buf[:, :, :, 1, :]
    x0 = x.copy()
    assert rope_forward(x, cfg, out=out) is out
    np.testing.assert_array_equal(out, rope_forward(x0, cfg))
    np.testing.assert_array_equal(x, x0)
    # and q, k as disjoint interleaved views may be rotated in place together
    qkv = randn(rng, (B, S, 2, H, D))
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    want_q, want_k = rope_qk_forward(q.copy(), k.copy(), cfg)
    rope_qk_forward(q, k, cfg, inplace=True)
    np.testing.assert_array_equal(qkv[:, :, 0], want_q)
    np.testing.assert_array_equal(qkv[:, :, 1], want_k)


def test_qk_outputs_swapped_or_shared_are_rejected(x, cfg):
    q, k = x, x.copy()
    with pytest.raises(ValueError, match=r"^out overlaps an input"):
        rope_qk_forward(q, k, cfg, out=(k, q))
    o = np.empty_like(x)
    with pytest.raises(ValueError, match=r"^the two outputs overlap"):
        rope_qk_forward(q, k, cfg, out=(o, o))
    with pytest.raises(ValueError, match=r"overlap"):   # q is k, rotated in place twice
        rope_qk_forward(q, q, cfg, inplace=True)


@pytest.mark.parametrize("oshape", [(B, S, H, D + 2), (B, S, H), (S, B, H, D), (B, S, H + 1, D)])
def test_out_of_wrong_shape_is_rejected(x, cfg, oshape):
    with pytest.raises(ValueError, match=r"^out must have shape \(2, 5, 3, 8\) and dtype float32"):
        rope_forward(x, cfg, out=np.empty(oshape, np.float32))


@pytest.mark.parametrize("odtype", [np.float16, np.float64, ml_dtypes.bfloat16])
def test_out_of_wrong_dtype_is_rejected(x, cfg, odtype):
    with pytest.raises(ValueError, match=r"^out must have shape .* and dtype float32, got .* "):
        rope_forward(x, cfg, out=np.empty(x.shape, odtype))


def test_out_with_non_contiguous_last_dim_is_rejected(x, cfg):
    wide = np.empty(x.shape[:-1] + (2 * D,), np.float32)
    with pytest.raises(ValueError, match=r"^out: the last dim must be contiguous"):
        rope_forward(x, cfg, out=wide[..., ::2])


def test_out_that_is_not_an_array_or_pair_is_rejected(x, cfg):
    with pytest.raises(TypeError, match=r"^out must be an array"):
        rope_forward(x, cfg, out=x.tolist())
    with pytest.raises(TypeError, match=r"^out must be a \(q_out, k_out\) pair"):
        rope_qk_forward(x, x.copy(), cfg, out=np.empty_like(x))
    with pytest.raises(TypeError, match=r"^out must be a \(q_out, k_out\) pair"):
        rope_qk_forward(x, x.copy(), cfg, out=(np.empty_like(x),))


def test_out_together_with_inplace_is_rejected(x, cfg):
    with pytest.raises(ValueError, match=r"either out= or inplace=True, not both"):
        rope_forward(x, cfg, out=np.empty_like(x), inplace=True)
    with pytest.raises(ValueError, match=r"either out= or inplace=True, not both"):
        rope_qk_forward(x, x.copy(), cfg, out=(np.empty_like(x), np.empty_like(x)), inplace=True)


def test_read_only_out_or_inplace_target_is_rejected_before_anything_is_written(rng, cfg):
    q, k = randn(rng, (B, S, H, D)), randn(rng, (B, S, H, D))
    ro = np.empty_like(k)
    ro.setflags(write=False)
    q_out = np.full_like(q, 7.0)
    with pytest.raises(ValueError, match=r"\bout\b.*(writ|read-only)"):
        rope_qk_forward(q, k, cfg, out=(q_out, ro))
    assert np.all(q_out == 7.0), "q's output was written before k's was found read-only"
    frozen = q.copy()
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match=r"\bx\b.*(writ|read-only)"):
        rope_forward(frozen, cfg, inplace=True)


# --------------------------------------------------------------------------- config

@pytest.mark.parametrize("table_shape", [(D // 2 + 1,), (H, D // 2 - 1), (2, H, D // 2), ()])
def test_inv_freq_of_wrong_shape_is_rejected(table_shape):
    with pytest.raises(ValueError, match=r"^inv_freq must have shape \[R/2\] or \[H, R/2\] with R/2 = 4"):
        RopeConfig(D, inv_freq=np.ones(table_shape))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inv_freq_is_rejected(bad):
    t = np.ones(D // 2)
    t[1] = bad
    with pytest.raises(ValueError, match=r"^inv_freq must be finite"):
        RopeConfig(D, inv_freq=t)


def test_per_head_table_with_wrong_head_count_is_rejected(x):
    cfg = RopeConfig(D, inv_freq=np.ones((H + 1, D // 2)))
    with pytest.raises(ValueError, match=r"^x has 3 heads but the per-head inv_freq table has 4 rows"):
        rope_forward(x, cfg)
    # GQA: a table sized for q's heads does not fit k's
    cfg_q = RopeConfig(D, inv_freq=np.ones((H, D // 2)))
    with pytest.raises(ValueError, match=r"^k has 1 heads but the per-head inv_freq table has 3 rows"):
        rope_qk_forward(x, x[:, :, :1].copy(), cfg_q)
    bhsd = RopeConfig(D, inv_freq=np.ones((S, D // 2)), layout="bhsd")   # rows = S, not H
    with pytest.raises(ValueError, match=r"^x has 3 heads but the per-head inv_freq table has 5 rows"):
        rope_forward(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), bhsd)


@pytest.mark.parametrize("bad", ["BSHD", "sbhd", "", "bsh d", None])
def test_unknown_layout_name_is_rejected(bad):
    with pytest.raises(ValueError, match=r"^layout must be one of \('bshd', 'bhsd', 'thd'\)"):
        RopeConfig(D, layout=bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, np.inf, np.nan])
def test_non_positive_or_non_finite_base_is_rejected(bad):
    with pytest.raises(ValueError, match=r"^base must be a positive finite number"):
        RopeConfig(D, base=bad)


@pytest.mark.parametrize("smap", [[0, 1, 2], [0, 1, 1, 0, 0], [[0, 1], [1, 0]], [0.0, 1.0, 1.0, 0.0]])
def test_stream_map_of_wrong_shape_or_dtype_is_rejected(smap):
    with pytest.raises(ValueError, match=r"^stream_map must be an integer array of shape \[4\]"):
        RopeConfig(D, stream_map=np.asarray(smap))


def test_negative_stream_map_entry_is_rejected():
    with pytest.raises(ValueError, match=r"^stream_map entries must be >= 0"):
        RopeConfig(D, stream_map=[0, -1, 0, 0])


@pytest.mark.parametrize("bad", [None, {"rotary_dim": 8}, 8, "bshd"])
def test_config_that_is_not_a_rope_config_is_rejected(x, bad):
    with pytest.raises(TypeError, match=r"^config must be a cuprope.RopeConfig"):
        rope_forward(x, bad)
    with pytest.raises(TypeError, match=r"^config must be a cuprope.RopeConfig"):
        rope_qk_backward(x, x.copy(), bad)


# --------------------------------------------------------------------------- empty, NaN, Inf

EMPTY_SHAPES = {"bshd": [(0, S, H, D), (B, 0, H, D), (B, S, 0, D)],
                "bhsd": [(0, H, S, D), (B, H, 0, D), (B, 0, S, D)],
                "thd": [(0, H, D), (S, 0, D)]}


@pytest.mark.parametrize("layout,shape", [(lay, s) for lay, ss in EMPTY_SHAPES.items() for s in ss])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_empty_tensors_return_empty_results_of_same_shape_and_dtype(layout, shape, dtype):
    cfg = RopeConfig(D, layout=layout)
    e = np.empty(shape, dtype)
    kw = {"positions": np.arange(shape[0])} if layout == "thd" else {}
    y = rope_forward(e, cfg, **kw)
    assert isinstance(y, np.ndarray) and y.shape == shape and y.dtype == e.dtype
    gq, gk = rope_qk_backward(e, e.copy(), cfg, **kw)
    assert gq.shape == gk.shape == shape and gq.dtype == gk.dtype == e.dtype
    o = np.empty_like(e)
    assert rope_forward(e, cfg, out=o, **kw) is o
    assert rope_forward(e, cfg, inplace=True, **kw) is e


def test_empty_q_does_not_stop_a_non_empty_k_from_being_rotated(rng, cfg):
    q = np.empty((B, S, 0, D), np.float32)          # zero query heads
    k = randn(rng, (B, S, 2, D))
    _, kr = rope_qk_forward(q, k, cfg)
    want = rope_forward(k, cfg)
    np.testing.assert_array_equal(kr, want)
    ko = np.full_like(k, 7.0)
    rope_qk_forward(q, k, cfg, out=(np.empty_like(q), ko))
    np.testing.assert_array_equal(ko, want)


def _pair_partner(i, rotary_dim, interleaved):
    if interleaved:
        return i ^ 1
    h = rotary_dim // 2
    return i + h if i < h else i - h


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_nan_stays_nan_and_only_spoils_its_own_pair(rng, interleaved, dtype):
    r = 8
    cfg = RopeConfig(r, interleaved=interleaved)
    x = randn(rng, (B, S, H, 12), dtype)
    clean = rope_forward(x, cfg)
    i = 2
    j = _pair_partner(i, r, interleaved)
    xn = x.copy()
    xn[1, 3, 2, i] = np.nan        # a rotated dim, at position 3
    xn[0, 1, 0, 10] = np.nan       # a pass-through dim
    y = rope_forward(xn, cfg).astype(np.float64)
    assert np.isnan(y[1, 3, 2, i]) and np.isnan(y[1, 3, 2, j])
    assert np.isnan(y[0, 1, 0, 10])
    spoiled = np.zeros(y.shape, bool)
    spoiled[1, 3, 2, [i, j]] = True
    spoiled[0, 1, 0, 10] = True
    assert not np.isnan(y[~spoiled]).any()
    np.testing.assert_array_equal(y[~spoiled], clean.astype(np.float64)[~spoiled])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_inf_at_position_zero_stays_inf_and_other_pairs_are_untouched(rng, interleaved, dtype, sign):
    r = 8
    cfg = RopeConfig(r, interleaved=interleaved)
    x = randn(rng, (B, S, H, 12), dtype)
    clean = rope_forward(x, cfg).astype(np.float64)
    i = 5
    j = _pair_partner(i, r, interleaved)
    xi = x.copy()
    xi[0, 0, 1, i] = sign * np.inf      # position 0: every pair's angle is 0
    xi[1, 2, 0, 11] = sign * np.inf     # pass-through dim, position 2
    y = rope_forward(xi, cfg).astype(np.float64)
    assert y[0, 0, 1, i] == sign * np.inf
    assert y[1, 2, 0, 11] == sign * np.inf
    # the partner gets Inf·sin(0) = Inf·0 (NaN under IEEE) and is not checked;
    # everything outside the pair is exactly the clean result
    touched = np.zeros(y.shape, bool)
    touched[0, 0, 1, [i, j]] = True
    touched[1, 2, 0, 11] = True
    np.testing.assert_array_equal(y[~touched], clean[~touched])


# --------------------------------------------------------------------------- errors a layout explains
# A tensor in the other 4-dim layout than the config's cannot be told apart by its shape alone
# (one tensor, no positions: [B, H, S, D] read as [B, S, H, D] is a valid shape). Where another
# argument pins the sequence axis (positions, or q and k whose head counts differ), the error
# names layout= and the layout that fits.
def _other(layout):
    return "bhsd" if layout == "bshd" else "bshd"


def _as_layout(canon, layout):
    """A [B, S, H, D] array in ``layout`` (bshd or bhsd), contiguous."""
    return np.ascontiguousarray(canon if layout == "bshd" else canon.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("config_layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("per_batch", [False, True])
def test_positions_that_fit_the_other_layouts_sequence_axis_name_layout(rng, config_layout,
                                                                       per_batch):
    data_layout = _other(config_layout)           # the data is in the layout the config is not
    x = _as_layout(randn(rng, (B, S, H, D)), data_layout)
    pos = np.arange(S) if not per_batch else np.tile(np.arange(S), (B, 1))
    seq_axis, head_axis = (1, 2) if config_layout == "bshd" else (2, 1)
    dims = {"bshd": r"\[B, S, H, D\]", "bhsd": r"\[B, H, S, D\]"}
    want = (rf"^positions must have shape \[{H}\] or \[{B}, {H}\], got \[{'2, ' * per_batch}{S}\]; "
            rf"layout='{config_layout}' reads {dims[config_layout]} \(S = axis {seq_axis}, "
            rf"H = axis {head_axis}\) but positions fit axis {head_axis} \({S}\): "
            rf"for {dims[data_layout]} tensors use RopeConfig\(\.\.\., layout='{data_layout}'\)$")
    cfg = RopeConfig(D, layout=config_layout)
    with pytest.raises(ValueError, match=want):
        rope_forward(x, cfg, positions=pos)
    with pytest.raises(ValueError, match=want):
        rope_qk_forward(x, x.copy(), cfg, positions=pos)      # MHA: q and k agree on every axis
    rope_forward(x, RopeConfig(D, layout=data_layout), positions=pos)   # the hinted layout runs


def test_positions_that_fit_no_axis_do_not_suggest_a_layout(rng, x, cfg):
    for pshape in [(S + 1,), (B, S + 1), (H + 1,)]:
        with pytest.raises(ValueError, match=r"^positions must have shape") as e:
            rope_forward(x, cfg, positions=np.zeros(pshape, np.int64))
        assert "layout" not in str(e.value)


@pytest.mark.parametrize("config_layout", ["bshd", "bhsd"])
def test_gqa_q_and_k_in_the_other_layout_name_layout_without_positions(rng, config_layout):
    data_layout = _other(config_layout)
    q = _as_layout(randn(rng, (B, S, 4, D)), data_layout)
    k = _as_layout(randn(rng, (B, S, 2, D)), data_layout)
    seq_axis, head_axis = (1, 2) if config_layout == "bshd" else (2, 1)
    want = (rf"^q and k must have the same batch and sequence sizes, got \({B}, 4\) and \({B}, 2\); "
            rf"layout='{config_layout}' reads .* but q and k differ on axis {seq_axis} and agree on "
            rf"axis {head_axis}: for .* tensors use RopeConfig\(\.\.\., layout='{data_layout}'\)$")
    with pytest.raises(ValueError, match=want):
        rope_qk_forward(q, k, RopeConfig(D, layout=config_layout))
    rope_qk_forward(q, k, RopeConfig(D, layout=data_layout))


def test_q_and_k_with_different_sequence_lengths_do_not_suggest_a_layout(rng, cfg):
    q, k = randn(rng, (B, 5, H, D)), randn(rng, (B, 7, H, D))     # 5 heads vs 7: not GQA
    with pytest.raises(ValueError, match=r"^q and k must have the same batch") as e:
        rope_qk_forward(q, k, cfg)
    assert "layout" not in str(e.value)


@pytest.mark.parametrize("layout,shape,fits", [("bshd", (S, H, D), "'thd'"),
                                               ("thd", (B, S, H, D), "'bshd' or 'bhsd'")])
def test_wrong_rank_names_the_layout_that_reads_it(rng, layout, shape, fits):
    with pytest.raises(ValueError, match=rf"for layout '{layout}', got shape .*; "
                                         rf"RopeConfig\(\.\.\., layout={fits}\) reads a "
                                         rf"{len(shape)}-dim tensor$"):
        rope_forward(randn(rng, shape), RopeConfig(D, layout=layout))


def test_positions_hint_under_jax_jit(rng):
    jax = pytest.importorskip("jax")
    import cuprope.jax as cjax
    x = jax.numpy.asarray(_as_layout(randn(rng, (B, S, H, D)), "bhsd"))
    with pytest.raises(ValueError, match=r"fit axis 2 \(5\): for \[B, H, S, D\] tensors use "
                                         r"RopeConfig\(\.\.\., layout='bhsd'\)"):
        jax.jit(lambda a, p: cjax.rope(a, RopeConfig(D), positions=p))(x, jax.numpy.arange(S))


# --------------------------------------------------------------------------- kv_layout
T, HQ, HK, KD, PAGE = 3, 4, 2, 8, 16


def _append(rng, cache_shape, **kw):
    from cuprope.kvcache import rope_append_kv
    q, k, v = (randn(rng, (T, h, KD)) for h in (HQ, HK, HK))
    cache = np.zeros(cache_shape, np.float32)
    return rope_append_kv(q, k, v, RopeConfig(KD), np.arange(T), k_cache=cache,
                          v_cache=cache.copy(), slot_mapping=np.arange(T), **kw)


NHD = "[num_pages, page_size, Hk, D]"
HND = "[num_pages, Hk, page_size, D]"


@pytest.mark.parametrize("given,shape,other", [
    ("NHD", (4, HK, PAGE, KD), "HND"),   # an HND cache with the default kv_layout
    ("HND", (4, PAGE, HK, KD), "NHD"),
])
def test_cache_in_the_other_kv_layout_names_kv_layout_and_the_value_that_fits(rng, given, shape,
                                                                              other):
    dims = {"NHD": NHD, "HND": HND}
    want = (f"the cache holds {PAGE} heads of {KD} dims as kv_layout='{given}' ({dims[given]}) but "
            f"k and v have {HK} heads of {KD} dims; its shape {list(shape)} fits "
            f"kv_layout='{other}' ({dims[other]}): pass kv_layout='{other}'")
    kw = {} if given == "NHD" else {"kv_layout": given}
    with pytest.raises(ValueError) as e:
        _append(rng, shape, **kw)
    assert str(e.value) == want
    _append(rng, shape, kv_layout=other)          # the suggested value runs


def test_cache_that_fits_no_kv_layout_names_kv_layout_without_a_suggestion(rng):
    with pytest.raises(ValueError) as e:
        _append(rng, (4, PAGE, HK + 1, KD))
    assert str(e.value) == (f"the cache holds {HK + 1} heads of {KD} dims as kv_layout='NHD' "
                            f"({NHD}) but k and v have {HK} heads of {KD} dims")


# --------------------------------------------------------------------------- errors a user meets
# The mistakes a first user makes, each answered by one clear error (or accepted, where the
# intent is plain), never by a silent wrong result or an error from deep inside.

@pytest.mark.parametrize("bad", [0, 0.0, -0.0, -1.0, -1e-30, np.nan, np.inf, -np.inf])
def test_zero_negative_or_non_finite_scale_is_rejected(bad):
    with pytest.raises(ValueError, match=r"^scale must be a positive finite number"):
        RopeConfig(D, scale=bad)


def test_torch_tensor_on_another_device_is_rejected_naming_it():
    torch = pytest.importorskip("torch")
    x = torch.randn(B, S, H, D, device="meta")
    with pytest.raises(TypeError, match=r"^x is a torch tensor on device 'meta': cuprope takes "
                                        r"CUDA or CPU tensors$"):
        rope_forward(x, RopeConfig(D))
    q = torch.randn(B, S, H, D)
    with pytest.raises(TypeError, match=r"^k is a torch tensor on device 'meta'"):
        rope_qk_forward(q, x, RopeConfig(D))
    with pytest.raises(TypeError, match=r"^positions is a torch tensor on device 'meta'"):
        rope_forward(q, RopeConfig(D), positions=torch.arange(S, device="meta"))
    x.requires_grad_()
    with pytest.raises(TypeError, match=r"^x is a torch tensor on device 'meta'"):
        rope_forward(x, RopeConfig(D))


E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
CT, CHQ, CHK, CD, CR, CDC, CPAGES, CPS = 5, 4, 2, 16, 8, 16, 3, 4   # the cache ops' sizes


def _cache_call(op, rng, scales, **kw):
    """One call of a cache-writing op on NumPy arrays with fp8 caches (and an fp8 q output),
    ``scales`` its scale arguments. Returns (run, caches): ``run()`` makes the call."""
    slots = rng.permutation(CPAGES * CPS)[:CT].astype(np.int64)
    pos = rng.integers(0, 300, CT).astype(np.int64)
    if op == "mla":
        from cuprope.mla import rope_append_mla
        q, k, c = randn(rng, (CT, CHQ, CR)), randn(rng, (CT, CR)), randn(rng, (CT, CDC))
        cache = np.zeros((CPAGES, CPS, CDC + CR), E4M3)
        q_out = np.zeros((CT, CHQ, CR), E4M3)
        return (lambda: rope_append_mla(q, k, c, RopeConfig(CR, interleaved=True), pos,
                                        kv_cache=cache, slot_mapping=slots, q_pe_out=q_out,
                                        **scales, **kw)), (cache, q_out)
    q, k, v = (randn(rng, (CT, h, CD)) for h in (CHQ, CHK, CHK))
    kc, vc = (np.zeros((CPAGES, CPS, CHK, CD), E4M3) for _ in range(2))
    q_out = np.zeros((CT, CHQ, CD), E4M3)
    cfg = RopeConfig(CR, layout="thd")
    if op == "kv":
        from cuprope.kvcache import rope_append_kv as fn
    else:
        from cuprope.prologue import qk_norm_rope_append_kv as fn
    return (lambda: fn(q, k, v, cfg, pos, k_cache=kc, v_cache=vc, slot_mapping=slots,
                       q_out=q_out, **scales, **kw)), (kc, vc, q_out)


SCALE_NAMES = {"kv": ("q_scale", "k_scale", "v_scale"), "prologue": ("q_scale", "k_scale",
                                                                     "v_scale"),
               "mla": ("q_scale", "kv_scale")}


@pytest.mark.parametrize("op", list(SCALE_NAMES))
def test_numpy_scalar_fp8_scales_are_taken_as_0d_arrays(rng, op):
    """``k_scale=np.float32(0.05)`` on the NumPy backend: the same bytes as a 0-d array."""
    names = SCALE_NAMES[op]
    seed = int(rng.integers(1 << 30))
    values = {n: 0.02 + 0.01 * i for i, n in enumerate(names)}
    run_a, got = _cache_call(op, np.random.default_rng(seed),
                             {n: np.float32(x) for n, x in values.items()})
    run_b, want = _cache_call(op, np.random.default_rng(seed),
                              {n: np.array(x, np.float32) for n, x in values.items()})
    run_a()
    run_b()
    assert any(a.view(np.uint8).any() for a in got)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("op,name", [(op, n) for op, ns in SCALE_NAMES.items() for n in ns])
@pytest.mark.parametrize("bad", [0.0, -0.5, np.nan, np.inf])
def test_zero_negative_or_non_finite_fp8_scale_with_check_is_rejected(rng, op, name, bad):
    scales = {n: np.array(bad if n == name else 0.05, np.float32) for n in SCALE_NAMES[op]}
    run, caches = _cache_call(op, rng, scales, check=True)
    with pytest.raises(ValueError, match=rf"^{name} must be positive and finite \(x is stored as "
                                         rf"e4m3 of x \* \(1/{name}\)\), got "):
        run()
    assert not any(c.view(np.uint8).any() for c in caches)      # nothing written
    run, _ = _cache_call(op, rng, scales)                         # unchecked: not read first
    run()


@pytest.mark.parametrize("op", ["kv", "prologue"])
def test_one_bad_per_head_fp8_scale_with_check_is_rejected(rng, op):
    per_head = np.full(CHK, 0.05, np.float32)
    per_head[1] = 0.0
    scales = {"q_scale": np.array(0.05, np.float32), "k_scale": np.full(CHK, 0.05, np.float32),
              "v_scale": per_head}
    run, _ = _cache_call(op, rng, scales, check=True)
    with pytest.raises(ValueError, match=r"^v_scale must be positive and finite .*got 0\.0$"):
        run()


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_unchecked_zero_fp8_scale_saturates_as_documented(rng):
    scales = {"q_scale": np.array(0.05, np.float32), "k_scale": np.array(0.0, np.float32),
              "v_scale": np.array(0.05, np.float32)}
    run, (kc, _, _) = _cache_call("kv", rng, scales)
    run()
    written = kc.view(np.uint8)[kc.view(np.uint8) != 0]
    assert written.size and set(np.unique(written)) <= {0x7E, 0xFE}    # ±448


class _FakeJaxArray:
    """An object cuprope takes for a JAX array (its type's module is JAX's)."""


_FakeJaxArray.__module__ = "jax._src.array"


@pytest.mark.parametrize("op", ["kv", "prologue", "mla"])
@pytest.mark.parametrize("which", ["inputs", "cache"])
def test_cache_ops_refuse_jax_arrays_naming_donation(rng, op, which):
    """A JAX array anywhere a cache op writes or reads: the op is not offered for JAX."""
    from cuprope.kvcache import rope_append_kv
    from cuprope.mla import rope_append_mla
    from cuprope.prologue import qk_norm_rope_append_kv
    fake = _FakeJaxArray()
    pos, slots = np.arange(CT), np.arange(CT, dtype=np.int64)
    want = (r"^(rope_append_kv|qk_norm_rope_append_kv|rope_append_mla) is not offered for JAX "
            r"arrays \(immutable: a cache write needs donated buffers\)$")
    if op == "mla":
        q, k, c = randn(rng, (CT, CHQ, CR)), randn(rng, (CT, CR)), randn(rng, (CT, CDC))
        cache = np.zeros((CPAGES, CPS, CDC + CR), np.float32)
        args = (fake, k, c) if which == "inputs" else (q, k, c)
        kw = dict(kv_cache=cache if which == "inputs" else fake, slot_mapping=slots)
        with pytest.raises(TypeError, match=want.replace("(rope_append_kv|qk_norm_rope_append_kv|"
                                                         "rope_append_mla)", "rope_append_mla")):
            rope_append_mla(*args, RopeConfig(CR, interleaved=True), pos, **kw)
        return
    q, k, v = (randn(rng, (CT, h, CD)) for h in (CHQ, CHK, CHK))
    kc = np.zeros((CPAGES, CPS, CHK, CD), np.float32)
    args = (q, fake, v) if which == "inputs" else (q, k, v)
    kw = dict(k_cache=kc if which == "inputs" else fake, v_cache=kc.copy(), slot_mapping=slots)
    fn = rope_append_kv if op == "kv" else qk_norm_rope_append_kv
    with pytest.raises(TypeError, match=want.replace(
            "(rope_append_kv|qk_norm_rope_append_kv|rope_append_mla)", fn.__name__)):
        fn(*args, RopeConfig(CR, layout="thd"), pos, **kw)


@pytest.mark.parametrize("op", ["kv", "prologue", "mla"])
def test_cache_ops_refuse_real_jax_arrays(op):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    pos, slots = jnp.arange(CT), jnp.arange(CT)     # refused before any dtype is read
    if op == "mla":
        from cuprope.mla import rope_append_mla
        q, k, c = (jnp.asarray(randn(rng, s)) for s in ((CT, CHQ, CR), (CT, CR), (CT, CDC)))
        cache = jnp.zeros((CPAGES, CPS, CDC + CR), jnp.float32)
        with pytest.raises(TypeError, match=r"^rope_append_mla is not offered for JAX arrays"):
            rope_append_mla(q, k, c, RopeConfig(CR, interleaved=True), pos, kv_cache=cache,
                            slot_mapping=slots, q_pe_out=jnp.zeros_like(q))
        return
    from cuprope.kvcache import rope_append_kv
    from cuprope.prologue import qk_norm_rope_append_kv
    fn = rope_append_kv if op == "kv" else qk_norm_rope_append_kv
    q, k, v = (jnp.asarray(randn(rng, (CT, h, CD))) for h in (CHQ, CHK, CHK))
    kc = jnp.zeros((CPAGES, CPS, CHK, CD), jnp.float32)
    with pytest.raises(TypeError, match=rf"^{fn.__name__} is not offered for JAX arrays \("
                                        r"immutable: a cache write needs donated buffers\)$"):
        fn(q, k, v, RopeConfig(CR, layout="thd"), pos, k_cache=kc, v_cache=kc, slot_mapping=slots,
           q_out=jnp.zeros_like(q))


# --------------------------------------------------------------------------- thd takes positions
NT = B * S   # packed tokens
THD_WANT = (r"^layout 'thd' needs positions= \(\[T\]: each packed token's position in its own "
            r"sequence, e\.g\. cuprope\.positions\.packed_positions\(cu_seqlens\); "
            r"seq_offsets= \[1\] instead for one sequence\): packed tokens have no implicit "
            r"positions$")


def _thd_calls(q, k, cfg):
    from cuprope import qknorm
    return {"rope_forward": lambda **kw: rope_forward(q, cfg, **kw),
            "rope_backward": lambda **kw: rope_backward(q, cfg, **kw),
            "rope_qk_forward": lambda **kw: rope_qk_forward(q, k, cfg, **kw),
            "rope_qk_backward": lambda **kw: rope_qk_backward(q, k, cfg, **kw),
            "rope_qk_norm_forward": lambda **kw: qknorm.rope_qk_norm_forward(q, k, cfg, **kw),
            "rope_qk_norm_backward": lambda **kw: qknorm.rope_qk_norm_backward(
                q, k, q, k, cfg, **kw)}


@pytest.mark.parametrize("fn", list(_thd_calls(None, None, None)))
def test_thd_without_positions_is_rejected(rng, fn):
    q, k = randn(rng, (NT, H, D)), randn(rng, (NT, 1, D))
    call = _thd_calls(q, k, RopeConfig(D, layout="thd"))[fn]
    with pytest.raises(ValueError, match=THD_WANT):
        call()
    with pytest.raises(ValueError, match=THD_WANT):
        call(offset=7)
    pos = rng.integers(0, 1000, NT)
    explicit = call(positions=pos + 7)
    # one sequence from a start: seq_offsets [1] alone, or positions with an offset
    for got in (call(positions=pos, offset=7), call(seq_offsets=np.array([7]),
                                                    positions=pos)):
        for a, b in zip(got if isinstance(got, tuple) else (got,),
                        explicit if isinstance(explicit, tuple) else (explicit,)):
            np.testing.assert_array_equal(a, b)
    call(seq_offsets=np.array([7]))


def test_thd_without_positions_is_rejected_in_the_torch_adapters(rng):
    torch = pytest.importorskip("torch")
    import cuprope.torch as ctorch
    cfg = RopeConfig(D, layout="thd")
    q = torch.from_numpy(randn(rng, (NT, H, D))).requires_grad_()
    k = torch.from_numpy(randn(rng, (NT, 1, D))).requires_grad_()
    for call in (lambda: ctorch.rope(q, cfg), lambda: ctorch.rope_qk(q, k, cfg),
                 lambda: ctorch.rope_qk_norm(q, k, cfg), lambda: rope_forward(q, cfg)):
        with pytest.raises(ValueError, match=THD_WANT):
            call()
    ctorch.rope_qk(q, k, cfg, positions=torch.arange(NT))[0].sum().backward()
    assert q.grad is not None


def test_thd_without_positions_is_rejected_under_jax(rng):
    jax = pytest.importorskip("jax")
    import cuprope.jax as cjax
    cfg = RopeConfig(D, layout="thd")
    q, k = jax.numpy.asarray(randn(rng, (NT, H, D))), jax.numpy.asarray(randn(rng, (NT, 1, D)))
    want = THD_WANT[:-1]                       # JAX appends a note on its filtered traceback
    for call in (lambda q, k: cjax.rope(q, cfg), lambda q, k: cjax.rope_qk(q, k, cfg),
                 lambda q, k: cjax.rope_qk_norm(q, k, cfg)):
        with pytest.raises(ValueError, match=want):
            call(q, k)
        with pytest.raises(ValueError, match=want):
            jax.jit(call)(q, k)
    got = jax.jit(lambda q, p: cjax.rope(q, cfg, positions=p))(q, jax.numpy.arange(NT))
    # on a GPU JAX runs the kernels: within the fp32 budget of the NumPy backend's float64
    want = rope_forward(np.asarray(q), cfg, positions=np.arange(NT))
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_thd_cos_sin_tables_need_no_positions(rng):
    from cuprope import tables
    q, k = randn(rng, (NT, H, D)), randn(rng, (NT, 1, D))
    ang = rng.uniform(0, 6, (NT, D // 2))
    cos = np.cos(np.concatenate([ang, ang], -1)).astype(np.float32)
    sin = np.sin(np.concatenate([ang, ang], -1)).astype(np.float32)
    qo, ko = tables.rope_qk_table_forward(q, k, cos, sin, layout="thd")
    assert qo.shape == q.shape and not np.array_equal(qo, q)
