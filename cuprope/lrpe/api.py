"""LRPE rotate-1d: RoPE after an activation, with per-head θ and an offset,
``O = rotate(act(X, dim))``, for the linear-attention research that xopes
(``ops/lrpe/rotate/_1d``) serves. :func:`rotate_1d_forward` and
:func:`rotate_1d_backward` (shapes and formulas in their docstrings),
:func:`normalize_theta` (θ's accepted shapes), and their NumPy and GPU
backends (the core's rope kernel with an activation).
"""
from __future__ import annotations

import threading

import numpy as np

from .._core import engine, host, validate
from .._core.arrays import describe, empty_like, wrap_like
from .._core.cache import ConfigCache
from .._core.launch import TensorPlan, pick_vec, sm_count
from .._core import launcher
from .._core.launcher import on_device
from .._core.layout import canon_sizes, canon_strides
from .._core.torch_guard import engaged
from ..rope.kernels import LRPE_ACTS, lrpe_vec_widths
from ..rope.launch import LRPE_CALLS, rope_spec
from ..config import RopeConfig, host_array
from .reference import ACTS, activation, backward_reference, forward_reference, rotate

__all__ = ["rotate_1d_forward", "rotate_1d_backward", "normalize_theta", "activation",
           "rotate", "forward_reference", "backward_reference", "ACTS"]

DIMS = (None, -1, 1)


def normalize_theta(theta, heads: int, head_dim: int) -> np.ndarray:
    """θ as float64 ``[1 or H, E]``; a last dim of 1 is expanded to every
    pair (E = D/2).

    ``theta`` holds angles per pair, any array-like (read on the host once
    per call; a host array avoids a device sync). With P = D/2 it reads as:

    ``[H, E]``  one row per head, E <= P: pairs i < E rotate, pairs i >= E pass through
    ``[1, E]``  one row shared by all heads
    ``[E]``     the same as ``[1, E]``
    ``[H]``     one angle per head for every pair; the same as ``[H, 1]``
    ``[H, 1]``, ``[1, 1]``: a last dim of 1 always means "this angle for every
                pair" (as in xopes); to rotate only pair 0, pad the row with zeros.

    A 1-D theta whose length equals H is read as ``[H]`` (per head);
    otherwise as ``[E]``. When its length is both H and P (and H > 1) the
    call cannot be read one way: a ValueError asks for ``theta[:, None]``
    (per head) or ``theta[None, :]`` (shared). An angle of 0 leaves a pair
    unchanged exactly. theta must be real (TypeError) and finite
    (ValueError).

    Parameters
    ----------
    theta : array-like
    heads : int
        H, x's head count (1 for ``[B, N, D]``).
    head_dim : int
        D.
    """
    half = head_dim // 2
    t = np.asarray(host_array(theta, "theta"))
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


# --------------------------------------------------------------------------- public API

def rotate_1d_forward(x, theta, *, offset: int = 0, act: str = "none", dim=None, out=None):
    """LRPE rotate-1d forward: ``O = rotate(act(x, dim))``.

    Every head of token t splits at D/2 into X = [X1, X2]; pair i =
    (X1[i], X2[i]) rotates by the angle (t + offset)·θ[h, i]::

        O1 = X̄1 ⊙ cos − X̄2 ⊙ sin,   O2 = X̄1 ⊙ sin + X̄2 ⊙ cos,   X̄ = act(X, dim)

    Parameters
    ----------
    x : array ``[B, N, H, D]`` or ``[B, N, D]`` (one head)
        D even; float32, float16 or bfloat16 (math in fp32, angles formed in
        float64). Any stride for B, N and H; the last dim contiguous. NumPy,
        CuPy, PyTorch, JAX or any DLPack array: GPU arrays run the CUDA
        kernels on the caller's current stream, host arrays the float64
        reference (``cuprope.lrpe.reference``), rounded once to the dtype.
    theta : array-like
        ``[H, E]``, ``[1, E]``, ``[E]``, ``[H]`` or ``[H, 1]`` angles,
        E <= D/2 (:func:`normalize_theta` says how each shape reads).
    offset : int
        >= 0, added to the positions 0 … N−1 (a runtime value: no
        recompilation per offset); offset + N − 1 <= 2**31 − 1.
    act : str
        ``"none"``, ``"relu"``, ``"sigmoid"``, ``"silu"`` or ``"softmax"``
        (:data:`ACTS`); it applies to the whole head vector, pass-through
        dims included.
    dim : {None, -1, 1}
        None or -1: softmax over the head dim D; 1: softmax over the
        sequence N. Ignored by the elementwise activations.
    out : array, optional
        Like ``x`` (same framework, shape, dtype, device) to write into; it
        may be ``x`` itself, but must not otherwise overlap it.

    Returns
    -------
    array
        O, the shape and dtype of ``x``, in the caller's framework (``out``
        when given).

    Notes
    -----
    PyTorch (``cuprope._core.torch_guard``): ``cuprope.torch`` has no LRPE
    adapter, so with grad mode on a tensor argument that requires grad (x,
    do, theta or out) is a TypeError (wrap the pair in your own
    ``torch.autograd.Function``, or call under ``torch.no_grad()``), and
    ``out=`` a leaf that requires grad a RuntimeError as torch's in-place
    ops; under ``torch.compile`` a call is a graph break (it runs eagerly).
    The JAX adapter is ``cuprope.jax.rotate_1d``.
    """
    if engaged(x, theta, out):
        return _torch("rotate_1d_forward", (x, theta), out,
                      lambda: _call(False, x, None, theta, offset, act, dim, out))
    return _call(False, x, None, theta, offset, act, dim, out)


def rotate_1d_backward(x, do, theta, *, offset: int = 0, act: str = "none", dim=None, out=None):
    """Gradient of :func:`rotate_1d_forward` w.r.t. ``x``: through the
    rotation (Rᵀ: sin → −sin) and the activation, ``dX = act'(x) ⊙ Rᵀ dO``
    for the elementwise activations (softmax: ``s ⊙ (g − <g, s>)`` with
    ``g = Rᵀ dO`` and ``s = softmax(x)`` over ``dim``), fused in one pass
    (softmax over N: a statistics pass first). PyTorch rules as the
    forward's.

    Parameters
    ----------
    x : the forward's input, ``[B, N, H, D]`` or ``[B, N, D]``; may be None
        when ``act="none"`` (not read then)
    do : gradient of the output, the shape, dtype and framework of ``x``
        (``[B, N, H, D]`` or ``[B, N, D]``; float32, float16, bfloat16)
    theta, offset, act, dim : as in the forward
    out : optional array like ``do`` to write into; it may be ``do`` or ``x``
        itself, but must not otherwise overlap them

    Returns
    -------
    dX, the shape and dtype of ``do``, in the caller's framework.
    """
    if engaged(do, x, out) or engaged(theta):
        return _torch("rotate_1d_backward", (x, do, theta), out,
                      lambda: _call(True, x, do, theta, offset, act, dim, out))
    return _call(True, x, do, theta, offset, act, dim, out)


def _torch(name, tensors, out, core):
    """A call on torch tensors that torch_guard.engaged sent to cuprope._core.torch_route."""
    from .._core.torch_route import no_adapter
    return no_adapter(name, tensors, () if out is None else (out,),
                      None if out is None else "out", core,
                      "your own torch.autograd.Function over rotate_1d_forward and "
                      "rotate_1d_backward (cuprope.torch has no LRPE adapter)")


# --------------------------------------------------------------------------- validation

def _check_act_dim(act, dim):
    if not isinstance(act, str) or act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    if dim is not None and (isinstance(dim, (bool, np.bool_))
                            or not isinstance(dim, (int, np.integer)) or int(dim) not in (-1, 1)):
        raise ValueError(f"dim must be None, -1 (the head dim) or 1 (the sequence dim), got {dim!r}")
    return None if dim is None else int(dim)


def _layout(info):
    """``[B, N, H, D]`` or one head ``[B, N, D]`` (cuprope._core.layout's "bsd")."""
    return "bsd" if len(info.shape) == 3 else "bshd"


def _bnhd(info):
    return canon_sizes(info.shape, _layout(info)) + (info.shape[-1],)


def _strides(info):
    return canon_strides(info.strides, _layout(info))


# RopeConfig per θ table: it keeps the device copy of the padded table and the
# launches (RopeConfig._launches). Keyed by the table's bytes.
_CONFIGS = ConfigCache(64)


def _config_for(theta2, head_dim):
    half = head_dim // 2
    table = np.zeros((theta2.shape[0], half), dtype=np.float64)
    table[:, :theta2.shape[1]] = theta2  # angle 0: cos 1, sin 0, the pair passes through exactly
    key = (head_dim, table.shape, table.tobytes())
    return _CONFIGS.get(key, lambda: RopeConfig(
        head_dim, inv_freq=table[0] if table.shape[0] == 1 else table))


def _call(backward, x, do, theta, offset, act, dim, out):
    dim = _check_act_dim(act, dim)
    offset = validate.as_offset(offset)
    if offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset}")
    if backward:
        dinfo = describe(do, "do")
        validate.check_bnhd(dinfo, "do")
        xinfo = None
        if x is None:
            if act != "none":
                raise ValueError(f"x is needed for the backward of act={act!r} (only act='none' "
                                 f"may pass x=None)")
        else:
            xinfo = describe(x, "x")
            validate.check_bnhd(xinfo, "x")
            validate.check_same_kind(xinfo, dinfo, "x", "do")
            if tuple(xinfo.shape) != tuple(dinfo.shape):
                raise ValueError(f"x and do must have the same shape, got {tuple(xinfo.shape)} "
                                 f"and {tuple(dinfo.shape)}")
        main = dinfo
        inputs = [i for i in (dinfo, xinfo) if i is not None]
    else:
        xinfo = describe(x, "x")
        validate.check_bnhd(xinfo, "x")
        main = xinfo
        inputs = [xinfo]
    b, n, h, d = _bnhd(main)
    theta2 = normalize_theta(theta, h, d)
    validate.check_tokens(b * n, "B*N")
    if n and offset + n - 1 > validate.MAX_POSITION:
        raise ValueError(f"offset + N - 1 = {offset + n - 1}: positions are exact for "
                         f"|position| <= 2**31 - 1")
    if act == "none":
        xinfo = None  # not read
    out_info = None
    if out is not None:
        out_info = describe(out, "out")
        validate.check_out(out_info, main, "out")
        validate.check_overlaps([out_info], inputs, any_input=True)
    if main.size == 0:
        return out_info.obj if out_info is not None else wrap_like(main, empty_like(main))
    if main.device < 0:
        return _numpy_backend(backward, main, xinfo, out_info, theta2, offset, act, dim)
    return _gpu_backend(backward, main, xinfo, out_info, _config_for(theta2, d), offset,
                        act, dim, (b, n, h, d))


# --------------------------------------------------------------------------- NumPy backend

def _numpy_backend(backward, main, xinfo, out_info, theta2, offset, act, dim):
    layout = _layout(main)
    if backward:
        x64 = host.canon64(xinfo, layout) if xinfo is not None else None
        y = backward_reference(x64, host.canon64(main, layout), theta2, offset, act, dim)
    else:
        y = forward_reference(host.canon64(main, layout), theta2, offset, act, dim)
    return host.finish([main], None if out_info is None else [out_info], [y], layout)[0]


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
    plans = [TensorPlan(i.ptr, i.ptr, _strides(i), _strides(i), _bnhd(i)[2])
             for i in (main, xinfo, out_info) if i is not None]
    b, n = _bnhd(main)[:2]
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
    b, n, h, d = bnhd
    device = main.device
    code = LRPE_ACTS["softmax_seq"] if act == "softmax" and dim == 1 else LRPE_ACTS.get(act, 0)
    fused_x = backward and code != 0  # the kernel reads x beside dO
    stream_ptr = engine.stream_handle(None, main)
    if out_info is None:
        out_info = describe(empty_like(main), "out")
    ms, os_ = _strides(main), _strides(out_info)
    xs = _strides(xinfo) if fused_x else None
    key = ("L", threading.get_ident(), backward, code, device, main.dtype, (b, n, h, d),
           ms, main.ptr % 16, os_, out_info.ptr % 16,
           None if xs is None else (xs, xinfo.ptr % 16))
    plan = cfg._launches.plans.get(key)
    if plan is None:
        inv_freq, _ = cfg.device_tables(device)
        aux = TensorPlan(xinfo.ptr, xinfo.ptr, xs, xs, h) if fused_x else None
        plan = launcher.cached_plan(cfg._launches, key, lambda: rope_spec(
            sms=sm_count(device), dtype=main.dtype, interleaved=False,
            plans=[TensorPlan(main.ptr, out_info.ptr, ms, os_, h)], n_batch=b, n_seq=n,
            head_dim=d, rot_dim=d, copy_rest=False, pos=None, seq_off=None,
            inv_freq_ptr=inv_freq.data.ptr, freq_sh=d // 2 if cfg.per_head else 0,
            stream_map_ptr=0, scale=1.0, sin_sign=-1.0 if backward else 1.0,
            act=code, backward_act=fused_x, aux=aux, calls=LRPE_CALLS), device)
    stats = stats_ptr = None
    if code == LRPE_ACTS["softmax_seq"]:
        stats, stats_ptr = _scratch(main, (3 if backward else 2) * b * h * d)
    on_device(device, plan.run, stream_ptr, main.ptr, out_info.ptr, xinfo.ptr if fused_x else 0,
              stats_ptr or 0, offset)
    del stats  # the framework's allocator orders its reuse after the launch on this stream
    return engine.hand_back([main], [out_info], stream_ptr)[0]
