"""Rotation by the caller's own cos/sin tables (exported as ``cuprope.tables``).

Hugging Face models compute ``cos`` and ``sin`` once per forward (any scaling
scheme folded in) and rotate with ``q * cos + rotate_half(q) * sin``. These
functions evaluate exactly that with cuprope's kernels, bit for bit as HF
rounds it. Shapes and rules: :func:`rope_table_forward`.
"""
from __future__ import annotations

from .._core import validate
from .._core.torch_guard import engaged
from .table_call import table_call

__all__ = ["rope_table_forward", "rope_table_backward", "rope_qk_table_forward",
           "rope_qk_table_backward"]


def rope_table_forward(x, cos, sin, *, layout: str = "bshd", interleaved: bool = False,
                       out=None, inplace: bool = False, stream=None):
    """``x * cos + rotate_half(x) * sin`` on the first R = ``cos.shape[-1]`` dims.

    Every product and the sum are rounded in x's dtype as PyTorch's eager
    kernels round them, so the result is bit for bit HF's; host arrays run a
    NumPy emulation of the same rounding.

    Parameters
    ----------
    x : array
        Any framework's array (as :func:`cuprope.rope_forward`); float32,
        float16 or bfloat16. ``[B, S, H, D]`` (``"bshd"``), ``[B, H, S, D]``
        (``"bhsd"``) or ``[T, H, D]`` (``"thd"``); the last dim contiguous.
    cos, sin : arrays
        ``[B, S, R]``, ``[1, S, R]`` or ``[S, R]`` (``[T, R]`` for
        ``"thd"``), in x's dtype, with a contiguous last dim; R even,
        R <= D; dims ``[R, D)`` pass through (partial rotary). cos and sin
        share shape and strides.
    layout : {"bshd", "bhsd", "thd"}
    interleaved : bool
        Pairs (2j, 2j+1) and HF's ``rotate_every_two`` (tables
        repeat-interleaved) when True, else halves (j, j + R/2) and
        ``rotate_half``.
    out, inplace, stream
        As :func:`cuprope.rope_forward`.

    Returns
    -------
    array
        The rotated array: ``x`` itself when ``inplace``, ``out`` when given.

    Notes
    -----
    PyTorch (``cuprope._core.torch_guard``), with grad mode on: the
    single-tensor functions, and cos/sin that require grad, have no adapter:
    TypeError naming ``cuprope.torch.apply_rotary_pos_emb``. In place into a
    leaf that requires grad: RuntimeError. Under ``torch.compile`` a graph
    break.
    """
    return _guarded("rope_table_forward", (x,), ("x",), cos, sin, layout, interleaved, False,
                    None if out is None else (out,), inplace, stream)[0]


def rope_table_backward(grad_out, cos, sin, *, layout: str = "bshd", interleaved: bool = False,
                        out=None, inplace: bool = False, stream=None):
    """Gradient of :func:`rope_table_forward` w.r.t. x, as autograd forms it
    for HF's expression: ``g * cos + rotate_halfᵀ(g * sin)``, rounded the
    same way.

    Parameters
    ----------
    grad_out : array
        x's shape, layout and dtype.
    cos, sin, layout, interleaved, out, inplace, stream
        As :func:`rope_table_forward`.

    Returns
    -------
    array
        The gradient w.r.t. x (``grad_out`` when ``inplace``, ``out`` when
        given).
    """
    return _guarded("rope_table_backward", (grad_out,), ("grad_out",), cos, sin, layout,
                    interleaved, True, None if out is None else (out,), inplace, stream)[0]


def rope_qk_table_forward(q, k, cos, sin, *, layout: str = "bshd", interleaved: bool = False,
                          out=None, inplace: bool = False, stream=None):
    """q and k by the tables in one launch, each table value read once per
    token for every head of both.

    Parameters
    ----------
    q, k : arrays
        As x of :func:`rope_table_forward`; they share everything but the
        head count.
    cos, sin, layout, interleaved, inplace, stream
        As :func:`rope_table_forward`.
    out : pair of arrays, optional
        ``(q_out, k_out)``.

    Returns
    -------
    tuple
        ``(q_rotated, k_rotated)``.

    Notes
    -----
    PyTorch, with grad mode on: q and k that require grad go through
    ``cuprope.torch``'s differentiable table op (the result requires grad);
    cos/sin that require grad are a TypeError naming
    ``cuprope.torch.apply_rotary_pos_emb``. Under ``torch.compile`` the
    custom op ``cuprope::rope_qk_table``.
    """
    return _guarded("rope_qk_table_forward", (q, k), ("q", "k"), cos, sin, layout, interleaved,
                    False, validate.pair(out), inplace, stream)


def rope_qk_table_backward(grad_q, grad_k, cos, sin, *, layout: str = "bshd",
                           interleaved: bool = False, out=None, inplace: bool = False,
                           stream=None):
    """Gradients of :func:`rope_qk_table_forward` w.r.t. q and k, in one launch.

    Parameters
    ----------
    grad_q, grad_k : arrays
        q's and k's shapes, layout and dtype.
    cos, sin, layout, interleaved, out, inplace, stream
        As :func:`rope_qk_table_forward`.

    Returns
    -------
    tuple
        ``(dq, dk)``.
    """
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
