"""Rotation by the caller's own cos/sin tables: HF's ``apply_rotary_pos_emb``.

Hugging Face models compute ``cos`` and ``sin`` once per forward (their rotary
embedding module, any scaling scheme folded in) and rotate with

    q_embed = q * cos + rotate_half(q) * sin

These functions evaluate exactly that on the GPU with the same kernel family
as the rest of cuprope (angle source: the tables), rounding every product and
the sum in the tensors' dtype as PyTorch's eager kernels do, so the result is
bit for bit HF's. Host arrays run a NumPy emulation of the same rounding.

Shapes (``layout`` as in ``cuprope.rope.api``):
  * x: ``[B, S, H, D]`` (``"bshd"``), ``[B, H, S, D]`` (``"bhsd"``) or
    ``[T, H, D]`` (``"thd"``); q and k may differ in H.
  * cos, sin: ``[B, S, R]``, ``[1, S, R]`` or ``[S, R]`` (``[T, R]`` for
    ``"thd"``) in x's dtype with a contiguous last dim; R even, R <= D. Dims
    [R, D) pass through (partial rotary). cos and sin share shape and strides.
  * ``interleaved``: pairs (2j, 2j+1) and HF's rotate_every_two (tables
    repeat-interleaved), else halves (j, j + R/2) and rotate_half.
The backward is the gradient autograd forms for HF's expression,
``g * cos + rotate_halfᵀ(g * sin)``, rounded the same way.

PyTorch (``cuprope._core.torch_guard``), with grad mode on: q and k that require
grad (``rope_qk_table_*``) go through ``cuprope.torch``'s differentiable table
op (the result requires grad); the single-tensor functions, and cos/sin that
require grad, have no adapter here: TypeError naming
``cuprope.torch.apply_rotary_pos_emb``. In place into a leaf that requires
grad: RuntimeError. Under ``torch.compile`` the q/k functions are the custom
op ``cuprope::rope_qk_table``; the single-tensor ones a graph break.
"""
from __future__ import annotations

from .._core import validate
from .._core.torch_guard import engaged
from .table_call import table_call

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
    """The call, through ``cuprope.rope.torch.route_tables`` when
    ``torch_guard.engaged`` says so (that module is imported only then)."""
    if (engaged(xs[0], xs[-1], outs) or getattr(cos, "requires_grad", False)
            or getattr(sin, "requires_grad", False)):
        from .torch import route_tables

        def core():
            return table_call(xs, names, cos, sin, layout, interleaved, inverse, outs, inplace,
                              stream)
        res = route_tables(name, xs, cos, sin, layout, interleaved, inverse, outs, inplace,
                           stream, core)
        return (res,) if len(xs) == 1 and not isinstance(res, tuple) else res
    return table_call(xs, names, cos, sin, layout, interleaved, inverse, outs, inplace, stream)
