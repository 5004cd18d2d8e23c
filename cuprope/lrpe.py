"""LRPE rotate-1d (seed 000): RoPE after an activation, with per-head θ and an offset.

    O = rotate(act(X, dim))

for the linear-attention research that xopes (``ops/lrpe/rotate/_1d``) serves.
Every head of token t splits at D/2 into X = [X1, X2]; pair i = (X1[i], X2[i])
rotates by the angle (t + offset)·θ[h, i]:

    O1 = X̄1 ⊙ cos − X̄2 ⊙ sin,   O2 = X̄1 ⊙ sin + X̄2 ⊙ cos,   X̄ = act(X, dim)

and the backward passes through the rotation (Rᵀ: sin → −sin) and the
activation: dX = act'(X) ⊙ Rᵀ dO for the elementwise activations and
dX = s ⊙ (g − <g, s>) with g = Rᵀ dO, s = softmax(X) for the softmaxes.

Shapes
------
x, do : ``[B, N, H, D]`` or ``[B, N, D]`` (one head), D even. float32,
    float16 or bfloat16 (math in fp32, angles formed in float64). Any stride
    for B, N and H; the last dim contiguous. NumPy, CuPy, PyTorch, JAX or any
    DLPack array; the result comes back in the caller's type (GPU arrays run
    the CUDA kernels on the caller's current stream, host arrays the float64
    reference below, rounded once to the dtype).
theta : angles per pair, any array-like (read on the host once per call; a
    host array avoids a device sync). With P = D/2:

    ``[H, E]``  one row per head, E <= P: pairs i < E rotate, pairs i >= E pass through
    ``[1, E]``  one row shared by all heads
    ``[E]``     the same as ``[1, E]``
    ``[H]``     one angle per head for every pair; the same as ``[H, 1]``
    ``[H, 1]``, ``[1, 1]``: a last dim of 1 always means "this angle for every
                pair" (as in xopes); to rotate only pair 0, pad the row with zeros.

    A 1-D theta whose length equals H is read as ``[H]`` (per head); otherwise
    as ``[E]``. When its length is both H and P (and H > 1) the call cannot be
    read one way: a ValueError asks for ``theta[:, None]`` (per head) or
    ``theta[None, :]`` (shared). An angle of 0 leaves a pair unchanged exactly.
offset : int >= 0, added to every position t = 0 … N−1 (a runtime value: no
    recompilation per offset).
act : ``"none"``, ``"relu"``, ``"sigmoid"``, ``"silu"`` or ``"softmax"``; it
    applies to the whole head vector, pass-through dims included.
dim : ``None`` or ``-1`` (softmax over the head dim D) or ``1`` (softmax over
    the sequence N). Ignored by the elementwise activations.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from . import reference as _ref
from ._core.arrays import FLOAT_DTYPES, describe, empty_like, overlaps, wrap_like
from ._core.loader import lrpe_vec_widths
from .config import RopeConfig, _host

__all__ = ["rotate_1d_forward", "rotate_1d_backward", "normalize_theta", "activation",
           "rotate", "forward_reference", "backward_reference", "ACTS"]

ACTS = ("none", "relu", "sigmoid", "silu", "softmax")
DIMS = (None, -1, 1)
MAX_TOKENS = 2 ** 31 - 1

# kernels/rope.cuh activation codes; softmax over the sequence is its own mode.
_CODES = {"none": 0, "relu": 1, "sigmoid": 2, "silu": 3, "softmax": 4}
_SOFTMAX_SEQ = 5


# --------------------------------------------------------------------------- reference (float64)

def normalize_theta(theta, heads: int, head_dim: int) -> np.ndarray:
    """θ as float64 ``[1 or H, E]``, the shape rules of the module docstring
    applied; a last dim of 1 is expanded to every pair (E = D/2)."""
    half = head_dim // 2
    t = np.asarray(_host(theta))
    if t.dtype == np.bool_ or t.dtype.kind not in "fiu":
        raise TypeError(f"theta must hold real numbers, got dtype {t.dtype}")
    t = t.astype(np.float64)
    if t.ndim == 1:
        n = t.shape[0]
        if n == heads and n == half and heads > 1:
            raise ValueError(
                f"theta of shape [{n}] is ambiguous: H = D/2 = {n}, so it could be one angle per "
                f"head ([H], the same as theta[:, None] of shape [{n}, 1]) or one angle per pair "
                f"shared by all heads ([E], the same as theta[None, :] of shape [1, {n}]); "
                f"pass the 2-D shape you mean")
        if n != heads and not 1 <= n <= half:
            raise ValueError(f"theta of shape [{n}] matches neither [H] with H = {heads} heads nor "
                             f"[E] with 1 <= E <= D/2 = {half}")
        t = t[:, None] if n == heads else t[None, :]
    elif t.ndim != 2:
        raise ValueError(f"theta must be [H, E], [1, E], [E], [H] or [H, 1], got shape "
                         f"{list(t.shape)}")
    rows, e = t.shape
    if rows not in (1, heads):
        raise ValueError(f"theta has {rows} rows but x has {heads} heads: theta must have 1 "
                         f"(shared) or {heads} (per head) rows")
    if not 1 <= e <= half:
        raise ValueError(f"theta's last dim E = {e} must be between 1 and D/2 = {half}")
    if not np.all(np.isfinite(t)):
        raise ValueError("theta must be finite")
    if e == 1:
        t = np.repeat(t, half, axis=1)
    return t


def activation(x, act: str, dim=None) -> np.ndarray:
    """act(x) in float64 over canonical ``[B, N, H, D]``: elementwise, or a
    softmax over the head dim (dim None / -1) or the sequence (dim 1)."""
    x = np.asarray(x, dtype=np.float64)
    if act == "none":
        return x.copy()
    if act == "relu":
        return np.where(x < 0, 0.0, x)
    if act == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if act == "silu":
        return x / (1.0 + np.exp(-x))
    if act == "softmax":
        axis = 1 if dim == 1 else -1
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(x - np.max(x, axis=axis, keepdims=True))
            return e / np.sum(e, axis=axis, keepdims=True)
    raise ValueError(f"act must be one of {ACTS}, got {act!r}")


def rotate(x, theta2, offset: int = 0, *, inverse: bool = False) -> np.ndarray:
    """The seed's rotation in float64 over canonical ``[B, N, H, D]``.

    theta2: ``[1 or H, E]`` (normalize_theta). Pair i = (x[i], x[i + D/2]) with
    i < E rotates by (t + offset)·θ[h, i]: (x1 cos − x2 sin, x1 sin + x2 cos);
    ``inverse`` uses −sin (Rᵀ). Pairs i >= E are returned unchanged."""
    x = np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    e = theta2.shape[1]
    t = np.arange(x.shape[1], dtype=np.int64) + np.int64(offset)
    ang = t.astype(np.float64)[:, None, None] * theta2[None, :, :]  # [N, 1 or H, E]
    cos, sin = np.cos(ang), np.sin(ang) * (-1.0 if inverse else 1.0)
    x1, x2 = x[..., :e], x[..., half:half + e]
    out = x.copy()
    out[..., :e] = x1 * cos - x2 * sin
    out[..., half:half + e] = x1 * sin + x2 * cos
    return out


def forward_reference(x, theta2, offset: int = 0, act: str = "none", dim=None) -> np.ndarray:
    """O = rotate(act(x, dim)) in float64 (canonical ``[B, N, H, D]``)."""
    return rotate(activation(x, act, dim), theta2, offset)


def backward_reference(x, do, theta2, offset: int = 0, act: str = "none", dim=None) -> np.ndarray:
    """dX in float64: g = Rᵀ dO, then act'(x) ⊙ g, or s ⊙ (g − Σ g ⊙ s) for a
    softmax s over its dim."""
    g = rotate(do, theta2, offset, inverse=True)
    if act == "none":
        return g
    x = np.asarray(x, dtype=np.float64)
    if act == "relu":
        return np.where(x > 0, g, 0.0)
    if act == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-x))
        return g * s * (1.0 - s)
    if act == "silu":
        s = 1.0 / (1.0 + np.exp(-x))
        return g * s * (1.0 + x * (1.0 - s))
    if act == "softmax":
        s = activation(x, "softmax", dim)
        axis = 1 if dim == 1 else -1
        return s * (g - np.sum(g * s, axis=axis, keepdims=True))
    raise ValueError(f"act must be one of {ACTS}, got {act!r}")


# --------------------------------------------------------------------------- public API

def rotate_1d_forward(x, theta, *, offset: int = 0, act: str = "none", dim=None, out=None):
    """LRPE rotate-1d forward: ``O = rotate(act(x, dim))``.

    Parameters
    ----------
    x : ``[B, N, H, D]`` or ``[B, N, D]`` array (float32, float16, bfloat16)
    theta : ``[H, E]``, ``[1, E]``, ``[E]``, ``[H]`` or ``[H, 1]`` angles, E <= D/2
        (see the module docstring for how each shape reads)
    offset : int >= 0, added to the positions 0 … N−1
    act : "none", "relu", "sigmoid", "silu" or "softmax"
    dim : None or -1 (softmax over D) or 1 (softmax over N)
    out : optional array like ``x`` (same framework, shape, dtype, device) to
        write into; it may be ``x`` itself, but must not otherwise overlap it

    Returns
    -------
    O, the shape and dtype of ``x``, in the caller's framework (``out`` when given).
    """
    return _call(False, x, None, theta, offset, act, dim, out)


def rotate_1d_backward(x, do, theta, *, offset: int = 0, act: str = "none", dim=None, out=None):
    """Gradient of ``rotate_1d_forward`` w.r.t. ``x``: ``dX = act'(x) ⊙ Rᵀ dO``
    (softmax: ``s ⊙ (g − <g, s>)`` with ``g = Rᵀ dO`` and ``s = softmax(x)``
    over ``dim``), fused in one pass (softmax over N: a statistics pass first).

    Parameters
    ----------
    x : the forward's input, ``[B, N, H, D]`` or ``[B, N, D]``; may be None
        when ``act="none"`` (not read then)
    do : gradient of the output, the shape, dtype and framework of ``x``
    theta, offset, act, dim : as in the forward
    out : optional array like ``do`` to write into; it may be ``do`` or ``x``
        itself, but must not otherwise overlap them

    Returns
    -------
    dX, the shape and dtype of ``do``, in the caller's framework.
    """
    return _call(True, x, do, theta, offset, act, dim, out)


# --------------------------------------------------------------------------- validation

def _check_act_dim(act, dim):
    if not isinstance(act, str) or act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    if dim is not None and (isinstance(dim, (bool, np.bool_))
                            or not isinstance(dim, (int, np.integer)) or int(dim) not in (-1, 1)):
        raise ValueError(f"dim must be None, -1 (the head dim) or 1 (the sequence dim), got {dim!r}")
    return None if dim is None else int(dim)


def _check_x(info, name):
    if info.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float32, float16 or bfloat16, got {info.dtype}")
    if len(info.shape) not in (3, 4):
        raise ValueError(f"{name} must be [B, N, H, D] or [B, N, D], got shape {tuple(info.shape)}")
    d = info.shape[-1]
    if d < 2 or d % 2:
        raise ValueError(f"{name}: the head dim D must be even and >= 2 (pairs (i, i + D/2)), "
                         f"got D = {d}")
    if info.strides[-1] != 1 and info.size > 0:
        raise ValueError(f"{name}: the last (head) dim must be contiguous (stride 1), "
                         f"got stride {info.strides[-1]}")


def _bnhd(shape):
    if len(shape) == 3:
        return shape[0], shape[1], 1, shape[2]
    return tuple(shape)


def _canon_strides(info):
    st = info.strides
    return (st[0], st[1], 0) if len(info.shape) == 3 else (st[0], st[1], st[2])


# RopeConfig per θ table: it keeps the device copy of the padded table and the
# launch plans. Keyed by the table's bytes; a bounded LRU.
_CONFIGS: OrderedDict = OrderedDict()
_CONFIGS_LOCK = threading.Lock()
_MAX_CONFIGS = 64


def _config_for(theta2, head_dim):
    half = head_dim // 2
    table = np.zeros((theta2.shape[0], half), dtype=np.float64)
    table[:, :theta2.shape[1]] = theta2  # angle 0: cos 1, sin 0, the pair passes through exactly
    key = (head_dim, table.shape, table.tobytes())
    with _CONFIGS_LOCK:
        cfg = _CONFIGS.get(key)
        if cfg is not None:
            _CONFIGS.move_to_end(key)
            return cfg
        cfg = RopeConfig(head_dim, inv_freq=table[0] if table.shape[0] == 1 else table)
        _CONFIGS[key] = cfg
        if len(_CONFIGS) > _MAX_CONFIGS:
            _, old = _CONFIGS.popitem(last=False)
            _retire(old)
    return cfg


def _retire(cfg):
    """A table leaving the cache may still be read by queued kernels: wait for
    its devices before its memory can be reused."""
    if not cfg._device_tables:
        return
    import cupy
    for dev in cfg._device_tables:
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.deviceSynchronize()


def _call(backward, x, do, theta, offset, act, dim, out):
    from . import api

    dim = _check_act_dim(act, dim)
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset must be an int, got {type(offset).__name__}")
    offset = int(offset)
    if not 0 <= offset < 2 ** 62:
        raise ValueError(f"offset must be an integer >= 0 (and < 2**62), got {offset}")
    if backward:
        dinfo = describe(do, "do")
        _check_x(dinfo, "do")
        xinfo = None
        if x is None:
            if act != "none":
                raise ValueError(f"x is needed for the backward of act={act!r} (only act='none' "
                                 f"may pass x=None)")
        else:
            xinfo = describe(x, "x")
            _check_x(xinfo, "x")
            if xinfo.kind != dinfo.kind:
                raise TypeError(f"x and do must come from the same framework, got {xinfo.kind} "
                                f"and {dinfo.kind}")
            if tuple(xinfo.shape) != tuple(dinfo.shape):
                raise ValueError(f"x and do must have the same shape, got {tuple(xinfo.shape)} "
                                 f"and {tuple(dinfo.shape)}")
            if xinfo.dtype != dinfo.dtype:
                raise TypeError(f"x and do must share a dtype, got {xinfo.dtype} and {dinfo.dtype}")
            if xinfo.device != dinfo.device:
                raise ValueError(f"x and do are on different devices ({xinfo.device} and "
                                 f"{dinfo.device})")
        main = dinfo
        inputs = [i for i in (dinfo, xinfo) if i is not None]
    else:
        xinfo = describe(x, "x")
        _check_x(xinfo, "x")
        main = xinfo
        inputs = [xinfo]
    b, n, h, d = _bnhd(main.shape)
    theta2 = normalize_theta(theta, h, d)
    if b * n > MAX_TOKENS:
        raise ValueError(f"at most {MAX_TOKENS} tokens (B*N) per call, got {b * n}")
    if act == "none":
        xinfo = None  # not read
    out_info = None
    if out is not None:
        out_info = describe(out, "out")
        api._check_out(out_info, main, "out")
        api._check_writable(out_info, "out")
        for src in inputs:
            if overlaps(out_info, src) and not api._same_view(out_info, src):
                raise ValueError("out overlaps an input without being exactly that input")
    if main.size == 0:
        return out_info.obj if out_info is not None else wrap_like(main, empty_like(main))
    if main.device < 0:
        return _numpy_backend(backward, main, xinfo, out_info, theta2, offset, act, dim)
    return _gpu_backend(backward, main, xinfo, out_info, _config_for(theta2, d), offset,
                        act, dim, (b, n, h, d))


# --------------------------------------------------------------------------- NumPy backend

def _numpy_backend(backward, main, xinfo, out_info, theta2, offset, act, dim):
    from .api import _from_numpy, _to_numpy

    def canon(info):
        a = _to_numpy(info)
        return (a[:, :, None, :] if a.ndim == 3 else a).astype(np.float64)

    if backward:
        x64 = canon(xinfo) if xinfo is not None else None
        y = backward_reference(x64, canon(main), theta2, offset, act, dim)
    else:
        y = forward_reference(canon(main), theta2, offset, act, dim)
    if len(main.shape) == 3:
        y = y[:, :, 0, :]
    y = _ref.round_to_dtype(y, _to_numpy(main).dtype)
    if out_info is None:
        return _from_numpy(main, y)
    _to_numpy(out_info)[...] = y
    return out_info.obj


# --------------------------------------------------------------------------- GPU backend

def _scratch(info, n):
    """A float32 buffer of n elements on info's device, from the caller's
    framework so its reuse is ordered on the stream the kernels run on."""
    if info.kind == "torch":
        import torch
        t = torch.empty(n, dtype=torch.float32, device=info.array.device)
        return t, t.data_ptr()
    import cupy
    with cupy.cuda.Device(info.device):
        a = cupy.empty(n, dtype=cupy.float32)
    return a, a.data.ptr


def _fresh_copy(info):
    """A new C-contiguous, freshly allocated (so 256-byte aligned) copy in the
    array's own framework, on the caller's stream."""
    a = info.array
    if info.kind == "torch":
        import torch
        return describe(a.clone(memory_format=torch.contiguous_format), "x")
    import cupy
    with cupy.cuda.Device(info.device):
        return describe(cupy.array(a, copy=True, order="C"), "x")


def _softmax_rows_fit(main, xinfo, out_info, d):
    """True when a head-dim softmax row fits one chunk per lane (at most 32
    lanes of VEC pairs) for these pointers and strides: the fused kernel's
    row reduction handles exactly that case."""
    from ._core.launch import TensorPlan, pick_vec
    plans = [TensorPlan(i.ptr, i.ptr, _canon_strides(i), _canon_strides(i), _bnhd(i.shape)[2])
             for i in (main, xinfo, out_info) if i is not None]
    b, n = _bnhd(main.shape)[:2]
    vec = pick_vec(main.dtype, plans, d // 2, 0, b, n, lrpe_vec_widths(main.dtype))
    return (d // 2) // vec <= 32


def _gpu_backend(backward, main, xinfo, out_info, cfg, offset, act, dim, bnhd):
    if act == "softmax" and dim != 1 and not _softmax_rows_fit(main, xinfo, out_info, bnhd[3]):
        # Misaligned or strided rows would need several chunks per lane: run on
        # aligned contiguous copies instead (one extra read and write).
        widest = lrpe_vec_widths(main.dtype)[0]
        if bnhd[3] // 2 > 32 * widest:
            raise ValueError(f"act='softmax' over the head dim supports head dims up to "
                             f"{64 * widest} for {main.dtype}, got {bnhd[3]}")
        res = _gpu_backend(backward, _fresh_copy(main), None if xinfo is None else _fresh_copy(xinfo),
                           None, cfg, offset, act, dim, bnhd)
        if out_info is None:
            if main.kind == "jax":
                import cupy
                cupy.cuda.get_current_stream().synchronize()
            return wrap_like(main, res)
        _copy_into(out_info, res)
        return out_info.obj
    return _gpu_backend_fused(backward, main, xinfo, out_info, cfg, offset, act, dim, bnhd)


def _copy_into(out_info, res):
    if out_info.kind == "torch":
        out_info.array.copy_(res)
    else:
        out_info.array[...] = describe(res, "res").array


def _gpu_backend_fused(backward, main, xinfo, out_info, cfg, offset, act, dim, bnhd):
    import cupy

    from ._core.launch import TensorPlan, make_plan
    from .api import _stream_ptr

    b, n, h, d = bnhd
    device = main.device
    code = _SOFTMAX_SEQ if act == "softmax" and dim == 1 else _CODES[act]
    fused_x = backward and code != 0  # the kernel reads x beside dO
    stream_ptr = _stream_ptr(None, main)
    if out_info is None:
        out_info = describe(empty_like(main), "out")
    ms, os_ = _canon_strides(main), _canon_strides(out_info)
    xs = _canon_strides(xinfo) if fused_x else None
    key = ("L", threading.get_ident(), backward, code, device, main.dtype, (b, n, h, d),
           ms, main.ptr % 16, os_, out_info.ptr % 16,
           None if xs is None else (xs, xinfo.ptr % 16))
    plan = cfg._plans.get(key)
    if plan is None:
        inv_freq, _ = cfg.device_tables(device)
        aux = TensorPlan(xinfo.ptr, xinfo.ptr, xs, xs, h) if fused_x else None
        plan = make_plan(
            device=device, dtype=main.dtype, interleaved=False,
            plans=[TensorPlan(main.ptr, out_info.ptr, ms, os_, h)], n_batch=b, n_seq=n,
            head_dim=d, rot_dim=d, copy_rest=False, pos=None, seq_off=None,
            inv_freq_ptr=inv_freq.data.ptr, freq_sh=d // 2 if cfg.per_head else 0,
            stream_map_ptr=0, scale=1.0, sin_sign=-1.0 if backward else 1.0,
            act=code, backward_act=fused_x, aux=aux)
        cfg._plans[key] = plan
    stats = stats_ptr = None
    if code == _SOFTMAX_SEQ:
        stats, stats_ptr = _scratch(main, (3 if backward else 2) * b * h * d)
    args = (stream_ptr, main.ptr, out_info.ptr, xinfo.ptr if fused_x else 0, stats_ptr or 0,
            offset)
    if cupy.cuda.runtime.getDevice() != device:
        with cupy.cuda.Device(device):
            plan.run_lrpe(*args)
    else:
        plan.run_lrpe(*args)
    if main.kind == "jax":
        # JAX reads the result on its own stream; make it complete first.
        cupy.cuda.runtime.streamSynchronize(stream_ptr)
    del stats
    return wrap_like(main, out_info.obj)
