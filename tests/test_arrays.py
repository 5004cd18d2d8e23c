"""cuprope._core.arrays: how arrays of each framework are described, and the
exact overlap test the output checks rely on."""
import numpy as np
import pytest

from cuprope._core.arrays import describe, empty_like, overlaps, wrap_like


def test_numpy_strides_are_in_elements_and_host_is_device_minus_one():
    a = np.zeros((4, 6, 8), np.float32)[:, ::2, 1:]
    info = describe(a, "x")
    assert info.kind == "numpy" and info.device == -1 and info.dtype == "float32"
    assert info.shape == (4, 3, 7) and info.strides == (48, 16, 1) and info.itemsize == 4
    assert info.ptr == a.ctypes.data and info.size == 84


def test_extent_covers_exactly_the_touched_bytes_for_negative_strides():
    base = np.zeros(10, np.float16)
    info = describe(base[8:1:-3], "x")   # elements 8, 5, 2
    lo, hi = info.extent()
    assert (lo - base.ctypes.data, hi - base.ctypes.data) == (2 * 2, 9 * 2)
    assert describe(base[:0], "x").extent()[0] == describe(base[:0], "x").extent()[1]


def test_overlaps_is_exact_for_interleaved_views():
    qkv = np.zeros((2, 5, 3, 4), np.float32)
    q, k = describe(qkv[:, :, 0], "q"), describe(qkv[:, :, 1], "k")
    assert q.extent()[0] < k.extent()[1] and k.extent()[0] < q.extent()[1]  # byte ranges meet
    assert not overlaps(q, k)                                             # no shared element
    assert overlaps(q, describe(qkv[:, 1:, 0], "q2"))
    assert not overlaps(q, describe(qkv[:0], "empty"))


def test_torch_tensors_are_read_directly_and_detached():
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    t = torch.zeros(3, 4, dtype=torch.bfloat16, requires_grad=True)
    info = describe(t, "q")
    assert info.kind == "torch" and info.dtype == "bfloat16" and info.device == -1
    assert info.obj is t and not info.array.requires_grad
    assert info.strides == (4, 1) and info.itemsize == 2
    new = empty_like(info)
    assert isinstance(new, torch.Tensor) and new.shape == t.shape and new.dtype == t.dtype


def test_jax_host_arrays_come_back_as_jax():
    jax = pytest.importorskip("jax", reason="needs jax: pip install jax")
    x = jax.device_put(np.arange(6, dtype=np.float32).reshape(2, 3), jax.devices("cpu")[0])
    info = describe(x, "x")
    assert info.kind == "jax" and info.device == -1 and info.dtype == "float32"
    back = wrap_like(info, np.asarray(x) * 2)
    assert type(back).__module__.startswith("jax") and float(back[1, 2]) == 10.0


@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, None, "x"])
def test_non_arrays_are_a_type_error_naming_the_argument(bad):
    with pytest.raises(TypeError, match=r"^seq_offsets must be an array"):
        describe(bad, "seq_offsets")
