"""cuprope._core's small pieces: layouts in canonical terms and the config cache."""
import numpy as np
import pytest

from cuprope._core.cache import ConfigCache
from cuprope._core.layout import canon_sizes, canon_strides, from_canon, to_canon

# layout: (shape, canonical (B, S, H), canonical (batch, seq, head) element strides;
# 0 for a dim the layout lacks)
CASES = {"bshd": ((2, 5, 3, 4), (2, 5, 3), (60, 12, 4)),
         "bhsd": ((2, 3, 5, 4), (2, 5, 3), (60, 4, 20)),
         "thd": ((5, 3, 4), (1, 5, 3), (0, 12, 4)),
         "bsd": ((2, 5, 4), (2, 5, 1), (20, 4, 0))}


@pytest.mark.parametrize("layout", list(CASES))
def test_canonical_sizes_strides_and_views(layout):
    shape, sizes, strides = CASES[layout]
    a = np.arange(np.prod(shape)).reshape(shape)
    assert canon_sizes(a.shape, layout) == sizes
    assert canon_strides(tuple(s // a.itemsize for s in a.strides), layout) == strides
    c = to_canon(a, layout)
    assert c.shape == sizes + (4,)
    b, s, h = 1, 3, 2 if layout != "bsd" else 0
    assert c[b if sizes[0] > 1 else 0, s, h, 1] == a.reshape(-1)[
        (b if sizes[0] > 1 else 0) * strides[0] + s * strides[1] + h * strides[2] + 1]
    np.testing.assert_array_equal(from_canon(c, layout), a)


def test_cache_builds_once_per_key_and_evicts_the_least_recently_used():
    built = []

    class Cfg:
        _device_tables = {}

        def __init__(self, k):
            built.append(k)

    cache = ConfigCache(2)
    a = cache.get("a", lambda: Cfg("a"))
    assert cache.get("a", lambda: Cfg("a")) is a and built == ["a"]
    cache.get("b", lambda: Cfg("b"))
    cache.get("a", lambda: Cfg("a"))            # a is now the most recent
    cache.get("c", lambda: Cfg("c"))            # evicts b
    assert len(cache) == 2 and built == ["a", "b", "c"]
    assert cache.get("a", lambda: Cfg("a2")) is a
    cache.get("b", lambda: Cfg("b"))
    assert built == ["a", "b", "c", "b"]
    cache.clear()
    assert len(cache) == 0
