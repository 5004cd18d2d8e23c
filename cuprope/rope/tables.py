"""Rotation by the caller's own cos/sin tables: HF's ``apply_rotary_pos_emb``.

Hugging Face models compute ``cos`` and ``sin`` once per forward (their rotary
embedding module, any scaling scheme folded in) and rotate with

    q_embed = q * cos + rotate_half(q) * sin

These functions evaluate exactly that on the GPU with the same kernel family
as the rest of cuprope (angle source: the tables), rounding every product and
the sum in the tensors' dtype as PyTorch's eager kernels do, so the result is
bit for bit HF's. Host arrays run a NumPy emulation of the same rounding.

Shapes (``layout`` as in ``cuprope.api``):
  * x: ``[B, S, H, D]`` (``"bshd"``), ``[B, H, S, D]`` (``"bhsd"``) or
    ``[T, H, D]`` (``"thd"``); q and k may differ in H.
  * cos, sin: ``[B, S, R]``, ``[1, S, R]`` or ``[S, R]`` (``[T, R]`` for
    ``"thd"``) in x's dtype with a contiguous last dim; R even, R <= D. Dims
    [R, D) pass through (partial rotary). cos and sin share shape and strides.
  * ``interleaved``: pairs (2j, 2j+1) and HF's rotate_every_two (tables
    repeat-interleaved), else halves (j, j + R/2) and rotate_half.
The backward is the gradient autograd forms for HF's expression,
``g * cos + rotate_halfᵀ(g * sin)``, rounded the same way.

PyTorch (``cuprope.torch_guard``), with grad mode on: q and k that require
grad (``rope_qk_table_*``) go through ``cuprope.torch``'s differentiable table
op (the result requires grad); the single-tensor functions, and cos/sin that
require grad, have no adapter here: TypeError naming
``cuprope.torch.apply_rotary_pos_emb``. In place into a leaf that requires
grad: RuntimeError. Under ``torch.compile`` the q/k functions are the custom
op ``cuprope::rope_qk_table``; the single-tensor ones a graph break.
"""
from __future__ import annotations

import threading

from . import reference
from ._core import engine, fastpath, host, validate
from ._core.arrays import describe, overlaps
from ._core.launch import rope_spec, sm_count
from ._core.launcher import LaunchCache
from ._core.layout import LAYOUTS, to_canon
from .torch_guard import engaged

__all__ = ["rope_table_forward", "rope_table_backward", "rope_qk_table_forward",
           "rope_qk_table_backward"]


def rope_table_forward(x, cos, sin, *, layout: str = "bshd", interleaved: bool = False,
                       out=None, inplace: bool = False, stream=None):
    """``x * cos + rotate_half(x) * sin`` on the first R = cos.shape[-1] dims.
    Returns the rotated array (``x`` itself when ``inplace``; ``out`` when given)."""
    return _guarded("rope_table_forward", (x,), ("x",), cos, sin, layout, interleaved, False,
                    None if out is None else (out,), inplace, stream)[0]


def rope_table_backward(grad_out, cos, sin, *, layout: str = "bshd", interleaved: bool = False,
                        out=None, inplace: bool = False, stream=None):
    """Gradient of ``rope_table_forward`` w.r.t. x (as autograd forms it for HF)."""
    return _guarded("rope_table_backward", (grad_out,), ("grad_out",), cos, sin, layout,
                    interleaved, True, None if out is None else (out,), inplace, stream)[0]


def rope_qk_table_forward(q, k, cos, sin, *, layout: str = "bshd", interleaved: bool = False,
                          out=None, inplace: bool = False, stream=None):
    """q and k in one launch, each table value read once per token for every
    head of both. Returns (q_rotated, k_rotated)."""
    return _guarded("rope_qk_table_forward", (q, k), ("q", "k"), cos, sin, layout, interleaved,
                    False, validate.pair(out), inplace, stream)


def rope_qk_table_backward(grad_q, grad_k, cos, sin, *, layout: str = "bshd",
                           interleaved: bool = False, out=None, inplace: bool = False,
                           stream=None):
    """Gradients of ``rope_qk_table_forward`` w.r.t. q and k, in one launch."""
    return _guarded("rope_qk_table_backward", (grad_q, grad_k), ("grad_q", "grad_k"), cos, sin,
                    layout, interleaved, True, validate.pair(out), inplace, stream)


def _guarded(name, xs, names, cos, sin, layout, interleaved, inverse, outs, inplace, stream):
    """The call, through cuprope.torch_route when torch_guard.engaged says so."""
    if (engaged(xs[0], xs[-1], outs) or getattr(cos, "requires_grad", False)
            or getattr(sin, "requires_grad", False)):
        from .torch_route import tables

        def core():
            return _table_rope(xs, names, cos, sin, layout, interleaved, inverse, outs,
                               inplace, stream)
        res = tables(name, xs, cos, sin, layout, interleaved, inverse, outs, inplace, stream,
                     core)
        return (res,) if len(xs) == 1 and not isinstance(res, tuple) else res
    return _table_rope(xs, names, cos, sin, layout, interleaved, inverse, outs, inplace, stream)


class _TableSource:
    """The owner of table calls' launches (one per layout and pairing),
    where core calls keep theirs on the RopeConfig."""

    def __init__(self, layout, interleaved):
        self.layout, self.interleaved = layout, interleaved
        self._launches = LaunchCache()


_SOURCES = {(lay, il): _TableSource(lay, il) for lay in LAYOUTS for il in (False, True)}


def _table_rope(xs, names, cos, sin, layout, interleaved, inverse, outs, inplace, stream):
    src = _SOURCES.get((layout, bool(interleaved)))
    if src is None:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if outs is None and not inplace:  # the fast path: new outputs only (nothing can overlap)
        res = fastpath.fast_path(xs, src, inverse, cos, 0, sin, None, False, stream)
        if res is not None:
            return res
    cinfo, sinfo = describe(cos, "cos"), describe(sin, "sin")
    validate.check_float(cinfo, "cos")
    r = validate.table_rotary_dim(cinfo)
    infos, out_infos, (b, s, d) = validate.validate_call(xs, names, layout, r, outs, inplace)
    tstrides = validate.check_tables(cinfo, sinfo, infos[0], b, s, layout)
    for o in out_infos or ():
        for t, name in ((cinfo, "cos"), (sinfo, "sin")):
            if overlaps(o, t):
                raise ValueError(f"an output overlaps {name}")
    if all(i.size == 0 for i in infos):
        return engine.empty_result(infos, out_infos)
    if infos[0].device < 0:
        return _numpy_backend(infos, out_infos, cinfo, sinfo, layout, interleaved, inverse)
    key = (fastpath.fast_key(infos[0].kind, xs, src, inverse, cos, sin, None, False, stream)
           if outs is None and not inplace else None)
    return _gpu_backend(src, infos, out_infos, cinfo, sinfo, tstrides, r, inverse, (b, s, d),
                        stream, key)


def _numpy_backend(infos, out_infos, cinfo, sinfo, layout, interleaved, inverse):
    """HF's formula in float64 with PyTorch's roundings (reference.rotate_with_tables)."""
    def table(info):
        t = host.to_numpy(info)
        t = t[None] if t.ndim == 2 else t   # [S, R] / [T, R] -> [1, S, R]
        return t[:, :, None, :]             # [B or 1, S, 1, R]

    cos, sin = table(cinfo), table(sinfo)
    results = []
    for info in infos:
        x = host.to_numpy(info)
        results.append(reference.rotate_with_tables(to_canon(x, layout), cos, sin,
                                                    interleaved=interleaved, inverse=inverse,
                                                    dtype=x.dtype))
    return host.finish(infos, out_infos, results, layout)


def _gpu_backend(src, infos, out_infos, cinfo, sinfo, tstrides, r, inverse, bsd, stream,
                 cache_key):
    b, s, d = bsd
    device = infos[0].device
    stream_ptr = engine.stream_handle(stream, infos[0])
    copy_rest, out_infos = engine.outputs(infos, out_infos)
    gkey = ("T", threading.get_ident(), inverse, copy_rest, device, tuple(cinfo.shape), tstrides,
            cinfo.ptr % 16, sinfo.ptr % 16,
            tuple((i.dtype, tuple(i.shape), i.strides, i.ptr % 16) for i in infos),
            tuple((o.strides, o.ptr % 16) for o in out_infos))
    plan = src._launches.get(gkey, lambda: rope_spec(
        sms=sm_count(device), dtype=infos[0].dtype, interleaved=src.interleaved,
        plans=engine.tensor_plans(infos, out_infos, src.layout), n_batch=b, n_seq=s,
        head_dim=d, rot_dim=r, copy_rest=copy_rest, pos=None, seq_off=None, inv_freq_ptr=0,
        freq_sh=0, stream_map_ptr=0, scale=1.0, sin_sign=-1.0 if inverse else 1.0,
        table=(cinfo.ptr, sinfo.ptr) + tstrides), device)
    return engine.run_plan(plan, src, infos, out_infos, stream_ptr, cinfo.ptr,
                           sinfo.ptr, 0, cache_key)
