"""RopeConfig: what a config holds after construction (errors: test_errors.py)."""
import gc

import numpy as np
import pytest

import cuprope
from cuprope.config import config_by_key


def test_default_table_is_the_seed_formula_in_float64_and_read_only():
    cfg = cuprope.RopeConfig(64, base=500000.0)
    i = np.arange(32, dtype=np.float64)
    np.testing.assert_array_equal(cfg.inv_freq, 500000.0 ** (-2.0 * i / 64))
    assert cfg.inv_freq.dtype == np.float64 and cfg.inv_freq.shape == (32,)
    with pytest.raises(ValueError):
        cfg.inv_freq[0] = 1.0
    assert not cfg.per_head and cfg.n_streams == 1 and cfg.stream_map is None


def test_inv_freq_from_lists_and_torch_is_held_as_float64_copies():
    torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
    src = np.linspace(1.0, 0.01, 8).astype(np.float32)
    for given in (src.tolist(), torch.from_numpy(src), src):
        cfg = cuprope.RopeConfig(16, inv_freq=given)
        np.testing.assert_array_equal(cfg.inv_freq, src.astype(np.float64))
    src[0] = 7.0  # the config kept its own copy
    assert cfg.inv_freq[0] == 1.0


def test_per_head_table_and_stream_map():
    table = np.arange(12, dtype=np.float64).reshape(3, 4) / 10
    cfg = cuprope.RopeConfig(8, inv_freq=table, stream_map=np.array([0, 2, 2, 1], np.int64))
    assert cfg.per_head and cfg.inv_freq.shape == (3, 4)
    assert cfg.stream_map.dtype == np.int32 and cfg.n_streams == 3
    assert "per_head" in repr(cfg) and "n_streams=3" in repr(cfg)


def test_settings_are_normalised_to_python_types():
    cfg = cuprope.RopeConfig(np.int32(32), interleaved=np.bool_(True), scale=np.float32(0.5))
    assert type(cfg.rotary_dim) is int and cfg.interleaved is True and type(cfg.scale) is float
    assert cfg.layout == "bshd" and cfg.layout in cuprope.LAYOUTS


def test_keys_are_unique_and_resolve_while_the_config_lives():
    a, b = cuprope.RopeConfig(8), cuprope.RopeConfig(8)
    assert a.key != b.key
    assert config_by_key(a.key) is a and config_by_key(b.key) is b
    key = b.key
    del b
    gc.collect()
    with pytest.raises(KeyError):
        config_by_key(key)
