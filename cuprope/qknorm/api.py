"""Fused QK-norm + RoPE: the per-head (or per-token) norm of q and k that
Qwen3, Gemma 3 and OLMo 2 apply right before RoPE, and Llama 4 right after
it, forward and backward, q and k in one launch; the public functions with
their torch guard. Shapes, semantics and roundings:
:func:`rope_qk_norm_forward`.
"""
from __future__ import annotations

from .._core import validate
from .._core.torch_guard import engaged
from .call import QkNormCall, backward_call, forward_call

__all__ = ["rope_qk_norm_forward", "rope_qk_norm_backward", "QkNormCall"]



def rope_qk_norm_forward(q, k, config, *, q_weight=None, k_weight=None, eps=1e-6, norm="rms",
                         weight_offset=0.0, order="norm_then_rope", norm_over="head",
                         rounding="exact", tables=None, positions=None, offset=0,
                         seq_offsets=None, out=None, inplace=False, stream=None):
    """q and k normalised and rotated, in one launch.

    Per row v (one head's D values, or with ``norm_over="token"`` all H·D
    values of one token of one tensor)::

        N(v) = v · rsqrt(mean(v²) + eps) · w',   w' = weight_offset + weight

    (w' = 1 without a weight). ``order="norm_then_rope"``: y = R(N(x))
    (dims ≥ R: N(x)); ``"rope_then_norm"``: y = N(R(x)). R is ``config``'s
    rotation (every frequency scheme, per-head tables, stream maps, partial
    rotary, positions, offsets, ``seq_offsets``), or HF's own cos/sin
    ``tables``.

    Parameters
    ----------
    q, k : arrays
        By ``config.layout``: q ``[B, S, Hq, D]`` (``"bshd"``),
        ``[B, Hq, S, D]`` (``"bhsd"``) or ``[T, Hq, D]`` (``"thd"``:
        positions, seq_offsets or tables required), k the same with Hk heads
        (GQA/MQA); float32, float16 or bfloat16, one dtype; any batch,
        sequence and head strides, a contiguous last dim.
    config : RopeConfig
    q_weight, k_weight : arrays, optional
        1-D contiguous, ``[D]`` for ``norm_over="head"``, ``[H·D]`` (that
        tensor's heads) for ``norm_over="token"``; any float dtype (the
        tensors' own with ``rounding="cast_then_weight"``), on q's device.
    eps : float
        >= 0.
    norm : {"rms", "l2"}
        ``"rms"`` takes weights (Qwen3: offset 0, Gemma 3: offset 1);
        ``"l2"`` is Llama 4's ``Llama4TextL2Norm``, the same formula with no
        weight (a weight is a ValueError).
    weight_offset : float
    order : {"norm_then_rope", "rope_then_norm"}
    norm_over : {"head", "token"}
    rounding : {"exact", "cast_then_weight", "weight_then_cast"}
        ``"exact"``: fp32 from float64 angles, rounded once.
        ``"cast_then_weight"`` (Qwen3RMSNorm / LlamaRMSNorm): v·r rounded to
        the dtype, times the weight in the dtype. ``"weight_then_cast"``
        (Gemma3RMSNorm, Olmo2RMSNorm, Llama4TextL2Norm): v·r·(offset + w) in
        fp32, rounded once. In the two model modes the norm's output is
        rounded to the dtype before the rotation (the rotation's before the
        norm for ``rope_then_norm``).
    tables : (cos, sin), optional
        HF's own tables, shapes as :func:`cuprope.tables.rope_table_forward`
        (``[B, S, R]``, ``[1, S, R]``, ``[S, R]`` or ``[T, R]``, q's dtype,
        R = ``config.rotary_dim``): the rotation is then HF's
        ``q·cos + rotate_half(q)·sin`` with PyTorch's roundings. They take
        ``order="norm_then_rope"`` and a model rounding, and no positions,
        offset or seq_offsets.
    positions, offset, seq_offsets
        As :func:`cuprope.rope_qk_forward`.
    out : pair of arrays, optional
        ``(q_out, k_out)``, as in :func:`cuprope.rope_qk_forward`.
    inplace : bool
        Write into q and k.
    stream : optional
        The CUDA stream; default the caller's current one.

    Returns
    -------
    tuple
        ``(q_out, k_out)``, of the caller's type.

    Notes
    -----
    With ``tables`` and a model rounding a Qwen3 or Gemma 3 attention block
    gets HF's q and k bit for bit (the fp32 sums aside: their order is
    PyTorch's own; bf16 squares and products are exact in fp32).

    PyTorch (``cuprope._core.torch_guard``), with grad mode on: a forward
    whose q, k or weights require grad goes through
    ``cuprope.torch.rope_qk_norm`` (differentiable in q, k and the weights;
    the result requires grad); cos/sin tables that require grad, ``out=`` or
    ``stream=`` then raise a TypeError naming it. In place into a leaf that
    requires grad: RuntimeError. Under ``torch.compile`` the forward is the
    custom op ``cuprope::rope_qk_norm``.

    A repeated call (no out=, no stream=) whose arrays and settings match a
    previous validated call's reuses its launch (cuprope/_core/fastpath.py)."""
    kw = dict(q_weight=q_weight, k_weight=k_weight, eps=eps, norm=norm,
              weight_offset=weight_offset, order=order, norm_over=norm_over, rounding=rounding,
              tables=tables, positions=positions, offset=offset, seq_offsets=seq_offsets)
    if engaged(q, k, out) or engaged(q_weight, k_weight) or _tables_engaged(tables):
        from .torch import route_forward
        return route_forward("rope_qk_norm_forward", q, k, config, kw, validate.pair(out),
                             inplace, stream,
                             lambda: forward_call(q, k, config, out, inplace, stream, **kw))
    return forward_call(q, k, config, out, inplace, stream, **kw)


def rope_qk_norm_backward(q, k, grad_q, grad_k, config, *, q_weight=None, k_weight=None,
                          eps=1e-6, norm="rms", weight_offset=0.0, order="norm_then_rope",
                          norm_over="head", rounding="exact", tables=None, positions=None,
                          offset=0, seq_offsets=None, out=None, stream=None):
    """(dq, dk, dq_weight, dk_weight) of ``rope_qk_norm_forward`` with the same
    arguments, from the saved inputs ``q``, ``k`` (before the norm) and the
    incoming ``grad_q``, ``grad_k`` (shaped like q, k, in their dtype). The
    other parameters are :func:`rope_qk_norm_forward`'s; ``out=(dq, dk)``.
    Returns ``(dq, dk, dq_weight, dk_weight)``: dq and dk shaped like q and
    k; the weight gradients (None without a weight) sum over every token and
    head in a fixed order (the same bits on every run), in the weight's
    dtype.

    The backward is the exact gradient with ``rounding="exact"``; in the
    model modes it is the gradient autograd forms for HF's modules, op by op
    in their dtypes (``cuprope.qknorm.reference.model_backward``).

    PyTorch, with grad mode on: this explicit backward on tensors that
    require grad is a TypeError naming ``cuprope.torch.rope_qk_norm`` (it
    has no gradient of its own). Under ``torch.compile`` it is the custom op
    ``cuprope::rope_qk_norm_backward`` (``out=`` or ``stream=``: a graph
    break).

    A repeated call (no out=, no stream=) whose arrays and settings match a
    previous validated call's reuses its launches (cuprope/_core/fastpath.py)."""
    kw = dict(q_weight=q_weight, k_weight=k_weight, eps=eps, norm=norm,
              weight_offset=weight_offset, order=order, norm_over=norm_over, rounding=rounding,
              tables=tables, positions=positions, offset=offset, seq_offsets=seq_offsets)
    if (engaged(q, k, out) or engaged(grad_q, grad_k) or engaged(q_weight, k_weight)
            or _tables_engaged(tables)):
        from .torch import route_backward
        return route_backward("rope_qk_norm_backward", q, k, grad_q, grad_k, config, kw,
                              validate.pair(out), stream,
                              lambda: backward_call(q, k, grad_q, grad_k, config, out, stream,
                                                    **kw))
    return backward_call(q, k, grad_q, grad_k, config, out, stream, **kw)


def _tables_engaged(tables):
    return isinstance(tables, (tuple, list)) and len(tables) == 2 and engaged(*tables)
