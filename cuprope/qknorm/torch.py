"""PyTorch adapter of the fused QK-norm + RoPE (``cuprope.qknorm``): autograd
(:class:`RopeQKNormFunction`) and the ``torch.compile`` custom ops
``cuprope::rope_qk_norm`` / ``cuprope::rope_qk_norm_backward``, re-exported
by ``cuprope.torch``; ``route_forward`` / ``route_backward`` take the
public functions' torch tensors that their guard stopped.
"""
from __future__ import annotations

from typing import Optional

import torch

from .._core import torch_route
from .call import backward_call, forward_call
from ..config import RopeConfig, config_by_key

__all__ = ["rope_qk_norm", "RopeQKNormFunction", "rope_qk_norm_backward_op"]

_Opt = Optional[torch.Tensor]


def _key(config):
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    return config.key


def _settings(config_key, offset, eps, norm, weight_offset, order, norm_over, rounding):
    """The keyword arguments of a qknorm call from the ops' scalars."""
    try:
        config = config_by_key(config_key)
    except KeyError:
        raise RuntimeError("the RopeConfig behind this cuprope op was garbage-collected") from None
    return config, dict(offset=offset, eps=eps, norm=norm, weight_offset=weight_offset,
                        order=order, norm_over=norm_over, rounding=rounding)


def _call_kw(q_weight, k_weight, cos, sin, positions, seq_offsets):
    return dict(q_weight=q_weight, k_weight=k_weight,
                tables=None if cos is None else (cos, sin), positions=positions,
                seq_offsets=seq_offsets)


def _grad(g, like):
    if g is None:
        return torch.zeros_like(like)
    return g if g.stride(-1) == 1 else g.contiguous()


@torch.library.custom_op("cuprope::rope_qk_norm", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, q_weight: _Opt, k_weight: _Opt, cos: _Opt,
            sin: _Opt, positions: _Opt, seq_offsets: _Opt, config_key: int, offset: int,
            eps: float, norm: str, weight_offset: float, order: str, norm_over: str,
            rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    config, kw = _settings(config_key, offset, eps, norm, weight_offset, order, norm_over,
                           rounding)
    oq, ok = forward_call(q, k, config, None, False, None, **kw,
                          **_call_kw(q_weight, k_weight, cos, sin, positions, seq_offsets))
    return _strided_like(oq, q), _strided_like(ok, k)


def _strided_like(x, ref):
    """``x`` with the strides ``torch.empty_like(ref)`` has (what the fake
    kernels below promise inductor, which asserts them): ``x`` itself where
    they match, else a copy."""
    if _same_strides(x, ref.stride()):
        return x
    y = torch.empty_like(ref)
    return x if _same_strides(x, y.stride()) else y.copy_(x)


def _same_strides(x, strides):
    """``x``'s strides are ``strides`` wherever a dim has more than one
    element (the others' strides address nothing; inductor ignores them too)."""
    return all(n < 2 or a == b for n, a, b in zip(x.shape, x.stride(), strides))


@_fwd_op.register_fake
def _(q, k, q_weight, k_weight, cos, sin, positions, seq_offsets, *scalars):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("cuprope::rope_qk_norm_backward", mutates_args=())
def _bwd_op(q: torch.Tensor, k: torch.Tensor, grad_q: torch.Tensor, grad_k: torch.Tensor,
            q_weight: _Opt, k_weight: _Opt, cos: _Opt, sin: _Opt, positions: _Opt,
            seq_offsets: _Opt, config_key: int, offset: int, eps: float, norm: str,
            weight_offset: float, order: str, norm_over: str,
            rounding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dq_weight, dk_weight); a missing weight's gradient is an empty tensor."""
    config, kw = _settings(config_key, offset, eps, norm, weight_offset, order, norm_over,
                           rounding)
    dq, dk, dwq, dwk = backward_call(
        q, k, grad_q, grad_k, config, None, None, **kw,
        **_call_kw(q_weight, k_weight, cos, sin, positions, seq_offsets))
    # a fresh empty tensor each: a custom op's outputs may not alias one another
    dq, dk = _strided_like(dq, grad_q), _strided_like(dk, grad_k)
    return (dq, dk, q.new_empty(0) if dwq is None else dwq,
            q.new_empty(0) if dwk is None else dwk)


@_bwd_op.register_fake
def _(q, k, grad_q, grad_k, q_weight, k_weight, *rest):
    def like(w):
        return q.new_empty(0) if w is None else torch.empty_like(w)
    return torch.empty_like(grad_q), torch.empty_like(grad_k), like(q_weight), like(k_weight)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:8])
    ctx.scalars = inputs[8:]


def _backward(ctx, gq, gk):
    q, k, qw, kw, cos, sin, pos, seq = ctx.saved_tensors
    dq, dk, dwq, dwk = _bwd_op(q, k, _grad(gq, q), _grad(gk, k), qw, kw, cos, sin, pos, seq,
                               *ctx.scalars)
    return ((dq, dk, None if qw is None else dwq, None if kw is None else dwk)
            + (None,) * (4 + len(ctx.scalars)))


_fwd_op.register_autograd(_backward, setup_context=_setup)


class RopeQKNormFunction(torch.autograd.Function):
    """autograd.Function: forward = rope_qk_norm_forward, backward =
    rope_qk_norm_backward (q, k and the weights saved). No gradient for
    cos/sin tables: ``apply`` refuses tables that require grad."""

    @classmethod
    def apply(cls, *args):
        _check_tables(*args[4:6])
        return super().apply(*args)

    @staticmethod
    def forward(ctx, q, k, q_weight, k_weight, cos, sin, positions, seq_offsets, *scalars):
        tensors = (q, k, q_weight, k_weight, cos, sin, positions, seq_offsets)
        detached = [None if t is None else t.detach() for t in tensors]
        ctx.save_for_backward(*detached)
        ctx.scalars = scalars
        ctx.config = config_by_key(scalars[0])  # alive until the backward
        return _fwd_op(*detached, *scalars)

    @staticmethod
    def backward(ctx, gq, gk):
        return _backward(ctx, gq, gk)


def rope_qk_norm(q: torch.Tensor, k: torch.Tensor, config: RopeConfig, *, q_weight: _Opt = None,
                 k_weight: _Opt = None, eps: float = 1e-6, norm: str = "rms",
                 weight_offset: float = 0.0, order: str = "norm_then_rope",
                 norm_over: str = "head", rounding: str = "exact", tables=None,
                 positions: _Opt = None, offset: int = 0, seq_offsets: _Opt = None):
    """Differentiable fused QK-norm + RoPE.

    Parameters
    ----------
    q, k : torch.Tensor
    config : RopeConfig
    q_weight, k_weight, eps, norm, weight_offset, order, norm_over, rounding,
    tables, positions, offset, seq_offsets
        :func:`cuprope.qknorm.rope_qk_norm_forward`'s arguments, shapes,
        dtypes and semantics (no ``out``/``inplace``/``stream``).

    Returns
    -------
    tuple of torch.Tensor
        ``(q_out, k_out)``, new tensors; gradients reach q, k, q_weight and
        k_weight. cos/sin ``tables`` that require grad (grad mode on) are a
        TypeError: there is no gradient for them.

    Notes
    -----
    Eager calls run an ``autograd.Function``; under ``torch.compile`` it
    dispatches to the custom ops ``cuprope::rope_qk_norm`` /
    ``cuprope::rope_qk_norm_backward`` (fake implementations, registered
    autograd), so ``fullgraph=True`` traces through. The backward saves q, k
    (before the norm) and the weights, and recomputes the norm from them.
    """
    cos, sin = (None, None) if tables is None else tuple(tables)
    args = (q, k, q_weight, k_weight, cos, sin, positions, seq_offsets)
    scalars = (_key(config), int(offset), float(eps), norm, float(weight_offset), order,
               norm_over, rounding)
    _check_tables(cos, sin)
    if torch.compiler.is_compiling():
        return _fwd_op(*args, *scalars)
    return RopeQKNormFunction.apply(*args, *scalars)


def _check_tables(cos, sin):
    """TypeError when grad mode is on and a cos/sin table requires grad (the
    backward has no gradient for them: never a silently missing one)."""
    if torch.is_grad_enabled() and (torch_route.requires_grad(cos)
                                    or torch_route.requires_grad(sin)):
        raise TypeError("rope_qk_norm() has no gradient for cos/sin tables, but a table "
                        "requires grad: pass detached tables, or norm in torch and rotate with "
                        "cuprope.torch.apply_rotary_pos_emb (differentiable in cos/sin)")


def rope_qk_norm_backward_op(q: torch.Tensor, k: torch.Tensor, grad_q: torch.Tensor,
                             grad_k: torch.Tensor, config: RopeConfig, *, q_weight: _Opt = None,
                             k_weight: _Opt = None, eps: float = 1e-6, norm: str = "rms",
                             weight_offset: float = 0.0, order: str = "norm_then_rope",
                             norm_over: str = "head", rounding: str = "exact", tables=None,
                             positions: _Opt = None, offset: int = 0, seq_offsets: _Opt = None):
    """``cuprope.qknorm.rope_qk_norm_backward`` as the custom op
    ``cuprope::rope_qk_norm_backward`` (traceable by torch.compile, not
    differentiable itself): (dq, dk, dq_weight or None, dk_weight or None).
    ``cuprope.qknorm.rope_qk_norm_backward`` comes here under torch.compile.
    With grad mode on, a tensor argument requiring grad is a TypeError."""
    cos, sin = (None, None) if tables is None else tuple(tables)
    tensors = (q, k, grad_q, grad_k, q_weight, k_weight, cos, sin)
    if torch.is_grad_enabled() and any(torch_route.requires_grad(t) for t in tensors):
        raise TypeError("rope_qk_norm_backward_op() is not differentiable by autograd, but a "
                        f"tensor argument requires grad: use {_DIFFERENTIABLE}, or call it under "
                        "torch.no_grad()")
    dq, dk, dwq, dwk = _bwd_op(q, k, _grad(grad_q, q), _grad(grad_k, k), q_weight, k_weight,
                               cos, sin, positions, seq_offsets, _key(config), int(offset),
                               float(eps), norm, float(weight_offset), order, norm_over,
                               rounding)
    return dq, dk, None if q_weight is None else dwq, None if k_weight is None else dwk


# ---------------------------------------------------------------- the routes


def route_forward(name, q, k, config, kw, outs, inplace, stream, core):
    """``cuprope.qknorm.rope_qk_norm_forward`` on torch tensors the guard
    stopped: the adapter is ``rope_qk_norm`` (gradients for q, k and the
    weights; none for cos/sin tables, so tables that require grad have no
    adapter)."""
    targets, kind = torch_route.targets_of((q, k), outs, inplace)
    tabs = kw.get("tables") or ()
    tensors = (q, k, kw.get("q_weight"), kw.get("k_weight"), *tabs)
    adapter = None
    if not any(torch_route.requires_grad(t) for t in tabs):
        def adapter():  # in place: on copies, as the backward reads the saved q and k
            return rope_qk_norm(*((q.clone(), k.clone()) if inplace else (q, k)), config, **kw)
    return torch_route.call(name, tensors, targets, kind, core, adapter,
                            "cuprope.torch.rope_qk_norm(q, k, config, ...) (cos/sin tables must "
                            "not require grad)", stream)


def route_backward(name, q, k, grad_q, grad_k, config, kw, outs, stream, core):
    """``cuprope.qknorm.rope_qk_norm_backward`` on torch tensors the guard
    stopped: not differentiable itself (TypeError under autograd); under
    torch.compile the custom op ``cuprope::rope_qk_norm_backward``."""
    targets, kind = torch_route.targets_of((grad_q, grad_k), outs, False)
    tensors = (q, k, grad_q, grad_k, kw.get("q_weight"), kw.get("k_weight"),
               *(kw.get("tables") or ()))
    adapter = None
    if not targets and not (torch.is_grad_enabled()
                            and any(torch_route.requires_grad(t) for t in tensors)):
        def adapter():
            return rope_qk_norm_backward_op(q, k, grad_q, grad_k, config, **kw)
    return torch_route.call(name, tensors, targets, kind, core, adapter, _DIFFERENTIABLE, stream)


_DIFFERENTIABLE = ("cuprope.torch.rope_qk_norm(q, k, config, ...) and .backward() (the explicit "
                   "backward has no gradient of its own)")
