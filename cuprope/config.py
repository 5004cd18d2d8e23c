"""RopeConfig: a model's RoPE settings, stated once and reused for every call."""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from .reference import default_inv_freq

# The public layouts of q, k and x (``RopeConfig.layout``); cuprope._core.layout
# gives each in canonical [B, S, H, D] terms.
LAYOUTS = ("bshd", "bhsd", "thd")

_KEYS = itertools.count(1)
_REGISTRY: "weakref.WeakValueDictionary[int, RopeConfig]" = weakref.WeakValueDictionary()


class LaunchCache:
    """The launch caches of one owner (a RopeConfig, a table source, a
    module's calls). ``fast`` maps a fast-path key to its ``fastpath.Entry``
    (whose variants are Plans); every op registers its launches there.
    ``plans`` maps a general-path call signature to its Plan
    (``launcher.cached_plan``), for the ops whose general path repeats
    (the rotation, LRPE, HF's tables: JAX arrays and ``stream=`` calls never
    take the fast path); the others plan each general-path call anew.

    The thread rule: a Plan belongs to one thread (it rewrites its own
    parameter buffer at each launch), so every key of both maps starts with
    the op's tag and ``threading.get_ident()``. A Plan's per-call words are
    its pointers and offsets, written by ``Plan.run``; everything else is in
    the key."""

    __slots__ = ("plans", "fast")

    def __init__(self):
        self.plans: dict = {}
        self.fast: dict = {}

    def clear(self):
        self.plans.clear()
        self.fast.clear()


def config_by_key(key: int) -> "RopeConfig":
    """The live RopeConfig with this ``key`` (KeyError if it was collected)."""
    return _REGISTRY[key]


class RopeConfig:
    """A model's rotary embedding settings.

    Parameters
    ----------
    rotary_dim : int
        R, the number of leading dims of each head that rotate (even). Dims
        ``[R, D)`` pass through: copied unchanged out-of-place, never touched
        in-place.
    base : float
        Frequency base for the default table θ_i = base^(−2i/R). Ignored when
        ``inv_freq`` is given.
    inv_freq : array-like, optional
        Inverse frequency per rotated pair, ``[R/2]`` shared by all heads or
        ``[H, R/2]`` one row per head. Held in float64.
    interleaved : bool
        Pairs (2i, 2i+1) (RoFormer, GPT-J) when True; half split (i, i + R/2)
        (GPT-NeoX, LLaMA, HF ``rotate_half``) when False.
    layout : {"bshd", "bhsd", "thd"}
        Tensor layout: ``[B, S, H, D]``, ``[B, H, S, D]`` or packed ``[T, H, D]``.
    scale : float
        Multiplies cos and sin (YaRN's attention factor, ggml's mscale):
        positive and finite (0, negative, NaN or inf is a ValueError).
    stream_map : array-like of int, optional
        Position stream per pair, ``[R/2]`` (multimodal RoPE). Positions then
        carry a leading stream axis.
    """

    __slots__ = ("rotary_dim", "interleaved", "layout", "scale", "inv_freq",
                 "stream_map", "n_streams", "_device_tables", "angle_rows", "angle_tables",
                 "_launches", "key", "__weakref__")

    def __init__(self, rotary_dim: int, *, base: float = 10000.0, inv_freq=None,
                 interleaved: bool = False, layout: str = "bshd", scale: float = 1.0,
                 stream_map=None):
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, (int, np.integer)):
            raise TypeError(f"rotary_dim must be an int, got {type(rotary_dim).__name__}")
        rotary_dim = int(rotary_dim)
        if rotary_dim <= 0 or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even integer, got {rotary_dim}")
        if not isinstance(interleaved, (bool, np.bool_)):
            raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive finite number (it multiplies cos and "
                             f"sin), got {scale}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if inv_freq is None:
            if not np.isfinite(base) or base <= 0:
                raise ValueError(f"base must be a positive finite number, got {base}")
            table = default_inv_freq(rotary_dim, base)
        else:
            table = np.array(host_array(inv_freq, "inv_freq"), dtype=np.float64)
            if table.ndim not in (1, 2) or table.shape[-1] != rotary_dim // 2:
                raise ValueError(
                    f"inv_freq must have shape [R/2] or [H, R/2] with R/2 = {rotary_dim // 2}, "
                    f"got {table.shape}")
            if not np.all(np.isfinite(table)):
                raise ValueError("inv_freq must be finite")
        table.setflags(write=False)
        smap = None
        n_streams = 1
        if stream_map is not None:
            smap = np.array(host_array(stream_map, "stream_map"))
            if smap.shape != (rotary_dim // 2,) or smap.dtype.kind not in "iu":
                raise ValueError(
                    f"stream_map must be an integer array of shape [{rotary_dim // 2}], "
                    f"got {smap.dtype} {smap.shape}")
            if smap.min() < 0:
                raise ValueError("stream_map entries must be >= 0")
            smap = smap.astype(np.int32)
            smap.setflags(write=False)
            n_streams = int(smap.max()) + 1
        self.rotary_dim = rotary_dim
        self.interleaved = bool(interleaved)
        self.layout = layout
        self.scale = float(scale)
        self.inv_freq = table
        self.stream_map = smap
        self.n_streams = n_streams
        self._device_tables = {}
        self.angle_rows = None   # cache_angles: positions with a float32 cos/sin table
        self.angle_tables = {}  # device -> that table, or None (cuprope.rope.decode.angle_table)
        self._launches = LaunchCache()  # plans and fast-path entries (cuprope._core fills them)
        self.key = next(_KEYS)  # stable integer handle (custom ops pass configs by key)
        _REGISTRY[self.key] = self

    @property
    def per_head(self) -> bool:
        """True when the frequency table has one row per head."""
        return self.inv_freq.ndim == 2

    def device_tables(self, device_id: int):
        """(inv_freq, stream_map or None) as CuPy arrays on ``device_id``.

        Built on first use per device and kept, so later calls (and CUDA graph
        capture) allocate nothing."""
        tables = self._device_tables.get(device_id)
        if tables is None:
            import cupy
            with cupy.cuda.Device(device_id):
                f = cupy.asarray(self.inv_freq)
                m = None if self.stream_map is None else cupy.asarray(self.stream_map)
                cupy.cuda.get_current_stream().synchronize()
            tables = (f, m)
            self._device_tables[device_id] = tables
        return tables

    def cache_angles(self, max_position: int) -> "RopeConfig":
        """Size the angle table: on each GPU, on first use, the cos/sin of
        positions ``[0, max_position)`` are computed once by the kernels' own
        exact function and kept as float32 ``[max_position, R]``
        (``max_position · R · 4`` bytes per device). A token whose position
        lies in the table then reads its row instead of evaluating the
        trigonometry; any other token computes as before. Results are the
        same bits either way.

        Without this call the rotation's launches of few tokens (decode:
        ``rope_qk_forward`` and friends, ``cuprope.rope.decode``) still read a
        table, of 16 MiB (``CUPROPE_ANGLE_TABLE_BYTES``: 32768 positions at
        R 128), built on the first such launch; the fused KV-cache append
        (``cuprope.kvcache.rope_append_kv``) reads one only after this call.
        Applies to shared frequencies (not per-head tables, not multi-stream
        maps, where the table is not used). ``max_position`` 0 turns the
        table off. Call it before capturing CUDA graphs: it drops the
        previous table, which a captured launch would still read. Returns
        the config."""
        if isinstance(max_position, bool) or not isinstance(max_position, (int, np.integer)):
            raise TypeError(f"max_position must be an int, got {type(max_position).__name__}")
        if not 0 <= max_position <= 2 ** 31:
            raise ValueError(f"max_position must be in [0, 2**31], got {max_position}")
        self.angle_rows = int(max_position)
        self.angle_tables = {}
        self._launches.clear()  # cached launches may hold the old table's address
        return self

    def __repr__(self):
        extra = ", per_head" if self.per_head else ""
        if self.stream_map is not None:
            extra += f", n_streams={self.n_streams}"
        return (f"RopeConfig(rotary_dim={self.rotary_dim}, interleaved={self.interleaved}, "
                f"layout={self.layout!r}, scale={self.scale}{extra})")


def host_array(a, name="an array"):
    """Array-like on the host (accepts NumPy, lists, CuPy/torch tensors).
    These are constants to cuprope: a torch tensor that requires grad, with
    grad mode on, is a TypeError (``name`` in it), not a silent detach."""
    if hasattr(a, "get") and type(a).__module__.startswith("cupy"):
        return a.get()
    if type(a).__module__.startswith("torch"):
        if a.requires_grad:
            import torch
            if torch.is_grad_enabled():
                raise TypeError(f"{name} requires grad, but cuprope reads it as constant host "
                                f"values (no gradient reaches it): pass {name}.detach(), or "
                                f"call under torch.no_grad()")
        return a.detach().cpu().numpy()
    return np.asarray(a)
