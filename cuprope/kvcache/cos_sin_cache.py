"""The cos/sin cache of the serving engines: building it from a RopeConfig,
and rotating by it in place (vLLM's ``rotary_embedding`` op).

    cache = build_cos_sin_cache(config, max_position, like=query)
    rotary_embedding(positions, query, key, head_size, cache, is_neox=not config.interleaved)

build_cos_sin_cache : ``[max_position, R]``, row p = cos(p·θ_j)·scale for
    j < R/2, then sin(p·θ_j)·scale (vLLM's ``_compute_cos_sin_cache`` layout,
    with YaRN's / LongRoPE's attention factor folded in as vLLM folds it).
    Details in its docstring.

positions : int32/int64 ``[T]``, contiguous.
query : ``[T, Hq·D]`` or ``[T, Hq, D]`` (D = head_size); key likewise with Hk
    heads, or None. float32, float16 or bfloat16 (one dtype); the token and
    head strides free, each head contiguous. Rotated in place.
cos_sin_cache : ``[max_position, R]``, R even and <= D: row p holds cos of
    pairs 0 … R/2 − 1, then their sin; float32 or query's dtype; last dim
    contiguous. Dims ``[R, D)`` of each head are not touched.
is_neox : pairs (j, j + R/2) (NeoX, half split); False: (2j, 2j + 1) (GPT-J).

Each pair (x1, x2) becomes (x1·cos − x2·sin, x2·cos + x1·sin), evaluated in
fp32 (the core's rotation, ``rotate_chunk``) and rounded once to the dtype;
the NumPy backend evaluates it in float64 and rounds once (within one unit in
the last place of the GPU's result). A token whose position lies outside
``[0, max_position)`` is not read past the table: its q and k are left as
they are (``check=True`` raises ``ValueError`` instead, after reading the
positions on the host). The kernel is the KV-cache dialect's
(``kernels/kvcache.cuh``) with the cos_sin_cache angle source and no cache.
"""
from __future__ import annotations

import numpy as np

from . import kvcache_reference as kref
from ._core import engine, fastpath, validate
from ._core.arrays import describe, overlaps
from ._core import launcher
from ._core.kvlaunch import angle_table, kv_spec, pick_kv_vec
from ._core.loader import KV_COS_SIN_F32, KV_COS_SIN_T
from .config import RopeConfig
from .kvcache_arrays import index_info, np_view, to_host
from .reference import round_to_dtype
from .torch_guard import engaged

__all__ = ["build_cos_sin_cache", "rotary_embedding"]

# The fast path's launches (cuprope/_core/fastpath.py), by call signature;
# rotary_embedding's arrays are (positions, query, key, cos_sin_cache), and
# the general path checks query against key for overlap.
_LAUNCHES = launcher.LaunchCache()
_PAIRS = ((1, 2),)


def _heads(info, name, t, head_size):
    """(heads, (token stride, head stride)) of ``[T, H·D]`` or ``[T, H, D]``."""
    shp, st = tuple(info.shape), tuple(info.strides)
    validate.check_float(info, name)
    validate.check_last_dim(info, name)
    if len(shp) == 2 and shp[0] == t and shp[1] % head_size == 0:
        return shp[1] // head_size, (st[0], head_size)
    if len(shp) == 3 and shp[0] == t and shp[2] == head_size:
        return shp[1], (st[0], st[1])
    raise ValueError(f"{name} must be [T, H*head_size] or [T, H, head_size] with T = {t}, "
                     f"head_size = {head_size}, got shape {list(shp)}")


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True, *,
                     check=False, stream=None):
    """Rotate query and key in place by the rows ``positions`` of
    ``cos_sin_cache`` (module docstring). Returns (query, key).

    A repeated call (check=False, no stream=) whose arrays match a previous
    validated call's in dtype, shape, strides, device and alignment reuses
    its packed launch (cuprope/_core/fastpath.py).

    Torch tensors (``cuprope.torch_guard``): an inference op, not
    differentiable. With grad mode on, query or key requiring grad is a
    TypeError (a leaf: RuntimeError, as torch's in-place ops); under
    ``torch.compile`` the call is the custom op ``cuprope::rotary_embedding``
    (``cuprope.torch.rotary_embedding``)."""
    if engaged(query, key):
        from .torch_route import cos_sin_rotation
        return cos_sin_rotation(positions, query, key, head_size, cos_sin_cache, is_neox, stream,
                                lambda: _rotate(positions, query, key, head_size, cos_sin_cache,
                                                is_neox, check, stream))
    return _rotate(positions, query, key, head_size, cos_sin_cache, is_neox, check, stream)


def _rotate(positions, query, key, head_size, cos_sin_cache, is_neox, check, stream):
    arrays = (positions, query, key, cos_sin_cache)
    fast = not check and stream is None and type(head_size) is int and type(is_neox) is bool
    if fast:
        header = ("cs", fastpath.get_ident(), head_size, is_neox)
        if fastpath.fast_call(_LAUNCHES.fast, fastpath.adapter_of(query), header, arrays):
            return query, key
    if isinstance(head_size, bool) or not isinstance(head_size, (int, np.integer)) \
            or head_size <= 0:
        raise TypeError(f"head_size must be a positive int, got {head_size!r}")
    if not isinstance(is_neox, (bool, np.bool_)):
        raise TypeError(f"is_neox must be a bool, got {type(is_neox).__name__}")
    head_size = int(head_size)
    qi = describe(query, "query")
    pi = describe(positions, "positions")
    if len(pi.shape) != 1:
        raise ValueError(f"positions must be [T], got shape {list(pi.shape)}")
    t = pi.shape[0]
    pos = index_info(positions, "positions", qi.device, [(t,)])
    hq, qst = _heads(qi, "query", t, head_size)
    ki, hk, kst = None, 0, (0, 0)
    if key is not None:
        ki = describe(key, "key")
        validate.check_same_kind(qi, ki, "query", "key")
        hk, kst = _heads(ki, "key", t, head_size)
        if overlaps(qi, ki):
            raise ValueError("query and key overlap")
    ci = describe(cos_sin_cache, "cos_sin_cache")
    if ci.dtype not in ("float32", qi.dtype):
        raise TypeError(f"cos_sin_cache must be float32 or query's dtype ({qi.dtype}), got "
                        f"{ci.dtype}")
    if len(ci.shape) != 2 or ci.shape[1] % 2 or not 0 < ci.shape[1] <= head_size:
        raise ValueError(f"cos_sin_cache must be [max_position, R] with R even and <= head_size "
                         f"({head_size}), got shape {list(ci.shape)}")
    if ci.device != qi.device:
        raise ValueError(f"cos_sin_cache is on device {ci.device} but query is on {qi.device}")
    validate.check_last_dim(ci, "cos_sin_cache")
    for info, name in ((qi, "query"), (ki, "key")):
        if info is not None:
            if info.kind == "jax":
                raise TypeError("JAX arrays are immutable: rotary_embedding works in place")
            validate.check_writable(info, name)
    if check and t:
        p = to_host(pos).astype(np.int64)
        bad = np.flatnonzero((p < 0) | (p >= ci.shape[0]))
        if bad.size:
            raise ValueError(f"positions[{bad[0]}] = {p[bad[0]]} is outside the cos_sin_cache's "
                             f"{ci.shape[0]} rows")
    if t == 0:
        return query, key
    if qi.device < 0:
        _host(pos, qi, ki, ci, head_size, is_neox)
        return query, key
    r = ci.shape[1]
    vec = pick_kv_vec(qi.dtype, [(qi.ptr, qi.itemsize, qst)] + (
        [(ki.ptr, ki.itemsize, kst)] if ki is not None else []), r // 2, 0)
    kp = ki.ptr if ki is not None else 0
    rope = dict(in_ptr=(qi.ptr, kp), out_ptr=(qi.ptr, kp), in_ss=(qst[0], kst[0]),
                in_sh=(qst[1], kst[1]), out_ss=(qst[0], kst[0]), out_sh=(qst[1], kst[1]),
                heads=(hq, hk), n_batch=1, n_seq=t, head_dim=head_size, rot_dim=r,
                pos_ptr=pos.ptr, pos_is64=int(pos.dtype == "int64"), pos_ss=1, scale=1.0,
                sin_sign=1.0)
    kv = dict(cs_ptr=ci.ptr, cs_st=ci.strides[0], cs_rows=ci.shape[0])
    src = KV_COS_SIN_F32 if ci.dtype == "float32" else KV_COS_SIN_T
    calls = [("pos_ptr", 0, 0), ("in_ptr0", 1, 0), ("out_ptr0", 1, 0), ("cs_ptr", 3, 0)]
    if ki is not None:
        calls += [("in_ptr1", 2, 0), ("out_ptr1", 2, 0)]
    plan = launcher.plan(kv_spec(qi.device, dtype=qi.dtype, interleaved=not is_neox, vec=vec,
                                 src=src, fp8=0, rope=rope, kv=kv, calls=calls), qi.device)
    stream_ptr = engine.stream_handle(stream, qi)
    launcher.on_device(qi.device, plan.run, stream_ptr, pi.ptr, qi.ptr, kp, ci.ptr)
    if fast:
        tkt = fastpath.ticket(fastpath.fast_adapter(qi.kind), header, arrays, _PAIRS)
        fastpath.remember(_LAUNCHES.fast, tkt,
                          [None, fastpath.span(qi), fastpath.span(ki), None], plan)
    return query, key


def _host(pos, qi, ki, ci, head_size, is_neox):
    """The NumPy backend: float64, rounded once; tokens outside the table skipped."""
    p = np_view(pos).astype(np.int64)
    table = np_view(ci).astype(np.float64)
    ok = (p >= 0) & (p < table.shape[0])
    for info in (qi, ki):
        if info is None:
            continue
        view = np_view(info)
        if view.ndim == 2:  # [T, H*D] as a [T, H, D] view (never a copy: it is written)
            st = view.strides
            view = np.lib.stride_tricks.as_strided(
                view, (view.shape[0], view.shape[1] // head_size, head_size),
                (st[0], head_size * st[1], st[1]))
        r = table.shape[1]
        y = kref.rotate_cos_sin_cache(view[ok, :, :r], p[ok], table, interleaved=not is_neox)
        view[ok, :, :r] = kref.encode(y, info.dtype)


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

    dtype : "float32" (default), "float16" or "bfloat16" (a NumPy, torch or
        JAX dtype works too). The op reads float32 or query's dtype.
    device, like : where the cache lives. Neither: a NumPy array. ``device``:
        an int GPU ordinal, a CuPy array. ``like``: an array (NumPy, CuPy,
        PyTorch, JAX): the cache comes back in its framework on its device.

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
