"""The serving engines' cos/sin cache (exported as ``cuprope.cos_sin_cache``):
building it from a RopeConfig, and rotating by it in place, vLLM's
``rotary_embedding`` op::

    cache = build_cos_sin_cache(config, max_position, like=query)
    rotary_embedding(positions, query, key, head_size, cache, is_neox=not config.interleaved)
"""
from __future__ import annotations

import numpy as np

from . import reference as kref
from .._core.arrays import describe
from .._core.torch_guard import engaged_any
from .launch import angle_table
from ..config import RopeConfig
from ..reference import round_to_dtype
from .rotary import rotate_by_cache

__all__ = ["build_cos_sin_cache", "rotary_embedding"]


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True,
                     rope_dim_offset=0, inverse=False, *, check=False, stream=None,
                     enable_pdl=False):
    """Rotate query and key in place by the rows ``positions`` of
    ``cos_sin_cache``: vLLM's ``rotary_embedding`` op.

    Parameters
    ----------
    positions : int32 or int64 array
        ``[T]`` or ``[B, S]``, contiguous, on query's device.
    query : array
        ``[T, Hq·D]`` or ``[T, Hq, D]`` with positions ``[T]``;
        ``[B, S, Hq·D]`` or ``[B, S, Hq, D]`` with positions ``[B, S]``
        (D = head_size). float32, float16 or bfloat16; the batch, token and
        head strides free, each head contiguous. Rotated in place.
    key : array or None
        As query, with its own head count Hk, in query's dtype.
    head_size : int
        D.
    cos_sin_cache : array ``[max_position, R]``
        R even, ``rope_dim_offset + R <= D``; row p holds the cos of pairs
        0 … R/2 − 1, then their sin (:func:`build_cos_sin_cache`). float32,
        float16 or bfloat16, whatever query's dtype (on the GPU a cache in
        neither float32 nor query's dtype is read through a float32 copy,
        exact, kept per tensor version: ``cuprope.kvcache.cache_copy``); the
        last dim contiguous.
    is_neox : bool
        Pairs (j, j + R/2) (NeoX, half split); False: (2j, 2j + 1) (GPT-J),
        counted from the first rotated dim.
    rope_dim_offset : int
        The rotated dims are ``[rope_dim_offset, rope_dim_offset + R)`` of
        each head (0: the first R; D − R: the last R, as vLLM's DeepSeek V4
        rope places them); the other dims are not touched.
    inverse : bool
        Rotate by −angle (sin negated): undoes the rotation by the same rows.
    check : bool
        Read the positions on the host first (a device sync) and raise
        ValueError for one outside ``[0, max_position)``.
    stream : optional
        The CUDA stream; default the caller's current one.
    enable_pdl : bool
        A programmatic dependent launch (CUDA, compute capability 9.0+;
        False by default): the kernel may start while the stream's previous
        kernel still runs, reads positions and its cos_sin_cache rows first,
        then waits for that kernel before it loads query and key and stores.
        So positions and the cache must be complete when the previous kernel
        starts; query and key may be written by it (the QKV GEMM). Opt-in:
        cuprope cannot know who wrote the positions. Same bits; ValueError on
        a GPU before sm_90, RuntimeError with a driver before CUDA 12; no
        effect on the NumPy backend.

    Returns
    -------
    tuple
        ``(query, key)``, rotated in place.

    Notes
    -----
    The arguments follow vLLM's ``_C.rotary_embedding`` schema
    ``rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int
    head_size, Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0,
    bool inverse=False)`` (csrc/pos_encoding_kernels.cu, which also
    dispatches the cache's dtype apart from the query's); vLLM's schema
    without the last two arguments is its prefix.

    Each pair (x1, x2) becomes (x1·cos − x2·sin, x2·cos + x1·sin), evaluated
    in fp32 with each cache value widened to fp32, as vLLM's kernel does (the
    core's rotation, ``rotate_chunk``), and rounded once to the dtype; the
    NumPy backend evaluates it in float64 and rounds once (within one unit
    in the last place of the GPU's result). A token whose position lies
    outside ``[0, max_position)`` is not read past the table: its q and k
    are left as they are (``check=True`` raises instead). The kernel is the
    KV-cache dialect's (``kernels/kvcache.cuh``) with the cos_sin_cache
    angle source and no cache.

    A repeated call (check=False, no stream=) whose arrays match a previous
    validated call's in dtype, shape, strides, device and alignment reuses
    its packed launch (cuprope/_core/fastpath.py; the call itself is
    ``cuprope.kvcache.rotary``).

    Torch tensors (``cuprope._core.torch_guard``): an inference op, not
    differentiable. With grad mode on, query, key or cos_sin_cache requiring
    grad is a TypeError (query or key a leaf: RuntimeError, as torch's
    in-place ops); under ``torch.compile`` the call is the custom op
    ``cuprope::rotary_embedding`` (``cuprope.torch.rotary_embedding``)."""
    def core():
        return rotate_by_cache(positions, query, key, head_size, cos_sin_cache, is_neox, check,
                               stream, rope_dim_offset, inverse, enable_pdl)
    if engaged_any(query, key, cos_sin_cache):
        from .torch import route_rotation
        return route_rotation(positions, query, key, head_size, cos_sin_cache, is_neox,
                              rope_dim_offset, inverse, stream, core, enable_pdl)
    return core()


_CACHE_DTYPES = ("float32", "float16", "bfloat16")
_HOST_ROWS = 1 << 15  # rows per block of the host build (bounds its float64 temporaries)


def build_cos_sin_cache(config, max_position: int, *, dtype=None, device=None, like=None):
    """The ``[max_position, R]`` cos/sin cache of ``config`` that vLLM's
    ``rotary_embedding`` op (and :func:`rotary_embedding` here) reads.

    Row p holds ``cos(p·θ_j)·scale`` for the pairs j = 0 … R/2 − 1, then
    ``sin(p·θ_j)·scale``: θ = ``config.inv_freq`` (every scheme a RopeConfig
    carries — linear, dynamic NTK, YaRN, LongRoPE, Llama 3, …) and scale =
    ``config.scale`` (YaRN's / LongRoPE's attention factor, folded into cos and
    sin as vLLM's YaRN and LongRoPE caches fold their mscale). The pairing
    (``config.interleaved``) is not part of the table: pass
    ``is_neox=not config.interleaved`` to the op. A stream map (MRoPE) is not
    part of it either: every pair's row at position p, as vLLM's
    ``MRotaryEmbedding`` cache holds it (the op picks each section's stream).
    Per-head frequency tables have no such cache (``ValueError``).

    Parameters
    ----------
    config : RopeConfig
        Shared frequencies (``[R/2]``).
    max_position : int
        The table's rows, ``0 <= max_position <= 2**31``.
    dtype : str or dtype, optional
        "float32" (default), "float16" or "bfloat16" (a NumPy, torch or JAX
        dtype works too). The op reads float32 or query's dtype.
    device : int, optional
        A GPU ordinal: the cache is a CuPy array there.
    like : array, optional
        NumPy, CuPy, PyTorch or JAX: the cache comes back in its framework
        on its device. Not with ``device``; with neither, a NumPy array.

    Returns
    -------
    array ``[max_position, R]``
        ``dtype``, where ``device`` / ``like`` put it.

    Notes
    -----
    Values. Angles are formed in float64 (p·θ_j rounded once). A float32 cache
    on a GPU is built there by the kernels' own cos/sin function (the table
    ``RopeConfig.cache_angles`` builds), so its values are the bits
    ``rope_forward`` rotates with: fp32 cos/sin within 1e-7, times the scale
    in fp32 (within 2.5e-7·scale of the exact values);
    every other cache (a host one, or 16-bit) is NumPy's float64 cos/sin times
    scale, correctly rounded once to the dtype, then moved to the device.
    """
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a RopeConfig, got {type(config).__name__}")
    if config.per_head:
        raise ValueError("a per-head frequency table ([H, R/2]) has no [max_position, R] "
                         "cos/sin cache: every head would need its own")
    if isinstance(max_position, bool) or not isinstance(max_position, (int, np.integer)):
        raise TypeError(f"max_position must be an int, got {type(max_position).__name__}")
    if not 0 <= max_position <= 2 ** 31:
        raise ValueError(f"max_position must be in [0, 2**31], got {max_position}")
    name = _dtype_name(dtype)
    if like is not None and device is not None:
        raise ValueError("pass device= or like=, not both")
    kind, dev = "numpy", -1
    if like is not None:
        info = describe(like, "like")
        kind, dev = info.kind, info.device
    elif device is not None:
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or device < 0:
            raise TypeError(f"device must be a GPU ordinal (int >= 0), got {device!r}")
        kind, dev = "cupy", int(device)
    if dev >= 0 and name == "float32":
        return _to_framework(_gpu_float32(config, int(max_position), dev), kind, dev, like)
    return _to_framework(_host_cache(config, int(max_position), name), kind, dev, like)


def _dtype_name(dtype) -> str:
    if dtype is None:
        return "float32"
    if isinstance(dtype, str):
        name = dtype
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype).replace("torch.", "")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = repr(dtype)
    if name not in _CACHE_DTYPES:
        raise TypeError(f"dtype must be one of {_CACHE_DTYPES}, got {dtype!r}")
    return name


def _host_cache(config, rows, name):
    """NumPy: float64 angles and cos/sin, times scale, rounded once to ``name``."""
    npairs = config.rotary_dim // 2
    out = np.empty((rows, 2 * npairs), dtype=kref.np_dtype(name))
    inv = config.inv_freq
    for start in range(0, rows, _HOST_ROWS):
        p = np.arange(start, min(rows, start + _HOST_ROWS), dtype=np.float64)
        ang = p[:, None] * inv[None, :]
        out[start:start + p.size, :npairs] = round_to_dtype(np.cos(ang) * config.scale, out.dtype)
        out[start:start + p.size, npairs:] = round_to_dtype(np.sin(ang) * config.scale, out.dtype)
    return out


def _gpu_float32(config, rows, device):
    """CuPy float32 on ``device``: the kernels' angle table of a private
    config with ``config``'s frequencies and scale (``cache_angles``)."""
    import cupy
    if rows == 0:
        with cupy.cuda.Device(device):
            return cupy.empty((0, config.rotary_dim), dtype=cupy.float32)
    twin = RopeConfig(config.rotary_dim, inv_freq=config.inv_freq, scale=config.scale)
    return angle_table(twin.cache_angles(rows), device)


def _to_framework(table, kind, device, like):
    """``table`` (NumPy, or CuPy on ``device``) in the framework ``kind`` on ``device``."""
    on_gpu = type(table).__module__.startswith("cupy")
    bf16 = table.dtype.name == "bfloat16"
    if kind == "torch":
        import torch
        if on_gpu:
            return torch.from_dlpack(table)
        t = torch.from_numpy(table.view(np.int16) if bf16 else table)
        t = t.view(torch.bfloat16) if bf16 else t
        return t if device < 0 else t.to(f"cuda:{device}")
    if kind == "jax":
        import jax
        import jax.dlpack
        if on_gpu:
            return jax.dlpack.from_dlpack(table)
        target = list(like.devices())[0] if hasattr(like, "devices") else None
        return jax.device_put(table, target)
    if device < 0:
        return table
    if on_gpu:
        return table
    import cupy
    with cupy.cuda.Device(device):
        try:
            return cupy.asarray(table)
        except (TypeError, ValueError) as e:
            raise TypeError(f"CuPy cannot hold a {table.dtype.name} cache ({e}); ask for "
                            "dtype='float32', which rotary_embedding reads too") from e
