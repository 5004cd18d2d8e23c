"""PyTorch adapter: autograd and torch.compile over cuprope's explicit
forward/backward. The core (``cuprope.api``) stays free of framework code; this
module is imported only by users who want it.

* ``rope_qk(q, k, config, ...)`` / ``rope(x, config, ...)`` — differentiable.
  In eager mode they run an ``autograd.Function`` (lowest overhead); under
  ``torch.compile`` they dispatch to the custom ops ``cuprope::rope_qk`` and
  ``cuprope::rope``, which carry a fake implementation and a registered
  autograd formula, so ``torch.compile(fullgraph=True)`` traces through them.
* Gradients: the transposed rotation with the same positions, table and scale.
* CUDA graphs: warm up once per (config, device) before capture, so the
  frequency table is already on the device; calls then allocate only outputs
  through torch's (graph-aware) allocator.

Tensors on the CPU run the NumPy backend (float64 reference), which is how the
adapter's tests run without a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import api
from .config import RopeConfig, config_by_key

__all__ = ["rope_qk", "rope", "RopeQKFunction"]

# Custom ops take only tensors and scalars: configs travel as their integer key.


def _key(config: RopeConfig) -> int:
    if not isinstance(config, RopeConfig):
        raise TypeError(f"config must be a cuprope.RopeConfig, got {type(config).__name__}")
    return config.key


def _config(key: int) -> RopeConfig:
    try:
        return config_by_key(key)
    except KeyError:
        raise RuntimeError("the RopeConfig behind this cuprope op was garbage-collected") from None


def _zeros_if_none(g, like_meta):
    """A usable incoming gradient: zeros for a missing one; a copy when autograd
    hands over a broadcast view (stride 0 in the last dim, e.g. from .sum())."""
    if g is None:
        shape, dtype, device = like_meta
        return torch.zeros(shape, dtype=dtype, device=device)
    return g if g.stride(-1) == 1 else g.contiguous()


# ---------------------------------------------------------------- eager autograd


class RopeQKFunction(torch.autograd.Function):
    """autograd.Function: forward = rope_qk_forward, backward = rope_qk_backward."""

    @staticmethod
    def forward(ctx, q, k, config, positions, offset, seq_offsets):
        ctx.config, ctx.offset = config, offset
        ctx.save_for_backward(positions, seq_offsets)
        ctx.meta = ((q.shape, q.dtype, q.device), (k.shape, k.dtype, k.device))
        return api.rope_qk_forward(q.detach(), k.detach(), config, positions=positions,
                                   offset=offset, seq_offsets=seq_offsets)

    @staticmethod
    def backward(ctx, gq, gk):
        positions, seq_offsets = ctx.saved_tensors
        gq = _zeros_if_none(gq, ctx.meta[0])
        gk = _zeros_if_none(gk, ctx.meta[1])
        dq, dk = api.rope_qk_backward(gq, gk, ctx.config, positions=positions, offset=ctx.offset,
                                      seq_offsets=seq_offsets)
        return dq, dk, None, None, None, None


class _RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, config, positions, offset, seq_offsets):
        ctx.config, ctx.offset = config, offset
        ctx.save_for_backward(positions, seq_offsets)
        return api.rope_forward(x.detach(), config, positions=positions, offset=offset,
                                seq_offsets=seq_offsets)

    @staticmethod
    def backward(ctx, g):
        positions, seq_offsets = ctx.saved_tensors
        g = g if g.stride(-1) == 1 else g.contiguous()
        return (api.rope_backward(g, ctx.config, positions=positions, offset=ctx.offset,
                                  seq_offsets=seq_offsets), None, None, None, None)


# ---------------------------------------------------------------- custom ops


@torch.library.custom_op("cuprope::rope_qk", mutates_args=())
def _rope_qk_op(q: torch.Tensor, k: torch.Tensor, config_key: int,
                positions: Optional[torch.Tensor], seq_offsets: Optional[torch.Tensor],
                offset: int, inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fn = api.rope_qk_backward if inverse else api.rope_qk_forward
    return fn(q, k, _config(config_key), positions=positions, offset=offset,
              seq_offsets=seq_offsets)


@_rope_qk_op.register_fake
def _(q, k, config_key, positions, seq_offsets, offset, inverse):
    return torch.empty_like(q), torch.empty_like(k)


def _qk_setup(ctx, inputs, output):
    q, k, config_key, positions, seq_offsets, offset, inverse = inputs
    ctx.save_for_backward(positions, seq_offsets)
    ctx.args = (config_key, offset, inverse)
    ctx.meta = ((q.shape, q.dtype, q.device), (k.shape, k.dtype, k.device))


def _qk_backward(ctx, gq, gk):
    positions, seq_offsets = ctx.saved_tensors
    config_key, offset, inverse = ctx.args
    dq, dk = _rope_qk_op(_zeros_if_none(gq, ctx.meta[0]), _zeros_if_none(gk, ctx.meta[1]),
                         config_key, positions, seq_offsets, offset, not inverse)
    return dq, dk, None, None, None, None, None


_rope_qk_op.register_autograd(_qk_backward, setup_context=_qk_setup)


@torch.library.custom_op("cuprope::rope", mutates_args=())
def _rope_op(x: torch.Tensor, config_key: int, positions: Optional[torch.Tensor],
             seq_offsets: Optional[torch.Tensor], offset: int, inverse: bool) -> torch.Tensor:
    fn = api.rope_backward if inverse else api.rope_forward
    return fn(x, _config(config_key), positions=positions, offset=offset, seq_offsets=seq_offsets)


@_rope_op.register_fake
def _(x, config_key, positions, seq_offsets, offset, inverse):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, config_key, positions, seq_offsets, offset, inverse = inputs
    ctx.save_for_backward(positions, seq_offsets)
    ctx.args = (config_key, offset, inverse)


def _backward(ctx, g):
    positions, seq_offsets = ctx.saved_tensors
    config_key, offset, inverse = ctx.args
    g = g if g.stride(-1) == 1 else g.contiguous()
    return _rope_op(g, config_key, positions, seq_offsets, offset, not inverse), None, None, None, None, None


_rope_op.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------- public


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def rope_qk(q: torch.Tensor, k: torch.Tensor, config: RopeConfig, *,
            positions: Optional[torch.Tensor] = None, offset: int = 0,
            seq_offsets: Optional[torch.Tensor] = None):
    """Differentiable fused q/k RoPE (shapes as ``cuprope.rope_qk_forward``).
    Returns (q_rot, k_rot) as new tensors."""
    if _compiling():
        return _rope_qk_op(q, k, _key(config), positions, seq_offsets, int(offset), False)
    return RopeQKFunction.apply(q, k, config, positions, int(offset), seq_offsets)


def rope(x: torch.Tensor, config: RopeConfig, *, positions: Optional[torch.Tensor] = None,
         offset: int = 0, seq_offsets: Optional[torch.Tensor] = None):
    """Differentiable single-tensor RoPE (shapes as ``cuprope.rope_forward``)."""
    if _compiling():
        return _rope_op(x, _key(config), positions, seq_offsets, int(offset), False)
    return _RopeFunction.apply(x, config, positions, int(offset), seq_offsets)
