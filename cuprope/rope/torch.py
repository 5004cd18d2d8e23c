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
* ``rotary_embedding(positions, query, key, head_size, cos_sin_cache,
  is_neox=True)`` — vLLM's op of that name (in place, returns None), over
  ``cuprope.cos_sin_cache``: an engine switches by one line.
* ``rope_qk_norm(q, k, config, *, q_weight=None, k_weight=None, ...)`` — the
  fused QK-norm + RoPE (``cuprope.qknorm``), differentiable in q, k and the
  weights, with its custom ops (``cuprope/torch_qknorm.py``).
* ``apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)``
  — a drop-in for Hugging Face's function of that name: it reads the model's
  own cos/sin tensors (``cuprope.tables``) and returns HF's result bit for bit,
  with HF's gradients. One line switches a Llama-style model::

      transformers.models.llama.modeling_llama.apply_rotary_pos_emb = \
          cuprope.torch.apply_rotary_pos_emb

Tensors on the CPU run the NumPy backend (float64 reference), which is how the
adapter's tests run without a GPU.

The core functions (``cuprope.rope_qk_forward`` and the others) come here by
themselves for torch tensors that require grad (grad mode on) and under
``torch.compile`` (``cuprope.torch_guard``): ``rotate`` and ``table_rotate``
below are the entries they use (the forward or, ``inverse=True``, the
transposed rotation, both differentiable).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import api, tables
from .cos_sin_cache import rotary_embedding as _rotary_embedding
from .config import RopeConfig, config_by_key

__all__ = ["rope_qk", "rope", "rotate", "table_rotate", "RopeQKFunction",
           "apply_rotary_pos_emb", "rotary_embedding", "rope_qk_norm", "RopeQKNormFunction"]

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
    """autograd.Function: forward = rope_qk_forward, backward = rope_qk_backward.
    ``apply(q, k, config, positions, offset, seq_offsets[, inverse])``:
    ``inverse=True`` swaps the two (rope_qk_backward, differentiable)."""

    @staticmethod
    def forward(ctx, q, k, config, positions, offset, seq_offsets, *inverse):
        ctx.config, ctx.offset = config, offset
        ctx.inverse, ctx.n_extra = bool(inverse and inverse[0]), len(inverse)
        ctx.save_for_backward(positions, seq_offsets)
        ctx.meta = ((q.shape, q.dtype, q.device), (k.shape, k.dtype, k.device))
        fn = api.rope_qk_backward if ctx.inverse else api.rope_qk_forward
        return fn(q.detach(), k.detach(), config, positions=positions, offset=offset,
                  seq_offsets=seq_offsets)

    @staticmethod
    def backward(ctx, gq, gk):
        positions, seq_offsets = ctx.saved_tensors
        gq = _zeros_if_none(gq, ctx.meta[0])
        gk = _zeros_if_none(gk, ctx.meta[1])
        fn = api.rope_qk_forward if ctx.inverse else api.rope_qk_backward
        dq, dk = fn(gq, gk, ctx.config, positions=positions, offset=ctx.offset,
                    seq_offsets=seq_offsets)
        return (dq, dk, None, None, None, None) + (None,) * ctx.n_extra


class _RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, config, positions, offset, seq_offsets, inverse):
        ctx.config, ctx.offset, ctx.inverse = config, offset, inverse
        ctx.save_for_backward(positions, seq_offsets)
        fn = api.rope_backward if inverse else api.rope_forward
        return fn(x.detach(), config, positions=positions, offset=offset, seq_offsets=seq_offsets)

    @staticmethod
    def backward(ctx, g):
        positions, seq_offsets = ctx.saved_tensors
        g = g if g.stride(-1) == 1 else g.contiguous()
        fn = api.rope_forward if ctx.inverse else api.rope_backward
        return (fn(g, ctx.config, positions=positions, offset=ctx.offset,
                   seq_offsets=seq_offsets), None, None, None, None, None)


# ---------------------------------------------------------------- custom ops


def _register_qk_autograd(op):
    """Autograd for a custom op ``op(q, k, *args, inverse) -> (q', k')`` whose
    gradient is the same op with ``inverse`` flipped: tensor arguments (or
    None) are saved for the backward, the others kept as they are."""
    def setup(ctx, inputs, output):
        q, k, *args, inverse = inputs
        ctx.tensor_at = [i for i, a in enumerate(args) if a is None or isinstance(a, torch.Tensor)]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_at))
        ctx.args = [None if i in ctx.tensor_at else a for i, a in enumerate(args)]
        ctx.inverse = inverse
        ctx.meta = ((q.shape, q.dtype, q.device), (k.shape, k.dtype, k.device))

    def backward(ctx, gq, gk):
        args = list(ctx.args)
        for i, t in zip(ctx.tensor_at, ctx.saved_tensors):
            args[i] = t
        dq, dk = op(_zeros_if_none(gq, ctx.meta[0]), _zeros_if_none(gk, ctx.meta[1]), *args,
                    not ctx.inverse)
        return (dq, dk) + (None,) * (len(args) + 1)

    op.register_autograd(backward, setup_context=setup)


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


_register_qk_autograd(_rope_qk_op)


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
    return rotate((q, k), config, False, positions, offset, seq_offsets)


def rope(x: torch.Tensor, config: RopeConfig, *, positions: Optional[torch.Tensor] = None,
         offset: int = 0, seq_offsets: Optional[torch.Tensor] = None):
    """Differentiable single-tensor RoPE (shapes as ``cuprope.rope_forward``)."""
    return rotate((x,), config, False, positions, offset, seq_offsets)[0]


def rotate(xs, config: RopeConfig, inverse: bool, positions=None, offset: int = 0,
           seq_offsets=None):
    """``xs`` (x, or q and k) rotated, differentiably, as new tensors (a
    tuple like ``xs``): the forward rotation, or with ``inverse`` the
    transposed one (``rope_backward``; its gradient is the forward). The
    custom op under torch.compile, the autograd.Function eagerly. The core
    functions route here for tensors that require grad (cuprope.torch_guard)."""
    inverse, offset = bool(inverse), int(offset)
    if len(xs) == 2:
        if _compiling():
            return _rope_qk_op(xs[0], xs[1], _key(config), positions, seq_offsets, offset, inverse)
        return RopeQKFunction.apply(xs[0], xs[1], config, positions, offset, seq_offsets, inverse)
    if _compiling():
        return (_rope_op(xs[0], _key(config), positions, seq_offsets, offset, inverse),)
    return (_RopeFunction.apply(xs[0], config, positions, offset, seq_offsets, inverse),)


# ---------------------------------------------------------------- HF drop-in (cos/sin tables)


class _TableQKFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, layout, interleaved, inverse=False):
        ctx.save_for_backward(cos, sin)
        ctx.args = (layout, interleaved, inverse)
        ctx.meta = ((q.shape, q.dtype, q.device), (k.shape, k.dtype, k.device))
        fn = tables.rope_qk_table_backward if inverse else tables.rope_qk_table_forward
        return fn(q.detach(), k.detach(), cos.detach(), sin.detach(), layout=layout,
                  interleaved=interleaved)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        layout, interleaved, inverse = ctx.args
        fn = tables.rope_qk_table_forward if inverse else tables.rope_qk_table_backward
        dq, dk = fn(_zeros_if_none(gq, ctx.meta[0]), _zeros_if_none(gk, ctx.meta[1]), cos, sin,
                    layout=layout, interleaved=interleaved)
        return dq, dk, None, None, None, None, None


def table_rotate(q, k, cos, sin, layout: str, interleaved: bool, inverse: bool):
    """q and k rotated by HF-style cos/sin tables (``cuprope.tables``),
    differentiably in q and k, as new tensors: the forward, or with
    ``inverse`` its gradient (whose own gradient is the forward). The custom
    op under torch.compile, an autograd.Function eagerly."""
    if _compiling():
        return _rope_qk_table_op(q, k, cos, sin, layout, bool(interleaved), bool(inverse))
    return _TableQKFunction.apply(q, k, cos, sin, layout, bool(interleaved), bool(inverse))


@torch.library.custom_op("cuprope::rope_qk_table", mutates_args=())
def _rope_qk_table_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      layout: str, interleaved: bool,
                      inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fn = tables.rope_qk_table_backward if inverse else tables.rope_qk_table_forward
    return fn(q, k, cos, sin, layout=layout, interleaved=interleaved)


@_rope_qk_table_op.register_fake
def _(q, k, cos, sin, layout, interleaved, inverse):
    return torch.empty_like(q), torch.empty_like(k)


_register_qk_autograd(_rope_qk_table_op)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _hf_formula(q, k, cos, sin, unsqueeze_dim):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids: Optional[torch.Tensor] = None, unsqueeze_dim: int = 1):
    """Drop-in for Hugging Face's ``apply_rotary_pos_emb`` (Llama and the many
    models that copy it): ``q * cos + rotate_half(q) * sin``, same for k.

    q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` with ``unsqueeze_dim=1`` (HF's
    default), or ``[B, S, H, D]`` with ``unsqueeze_dim=2``; cos, sin
    ``[B, S, R]`` (or ``[1, S, R]``) as the model's rotary embedding returns
    them, in q's dtype. R = D is HF's case; R < D rotates the first R dims and
    passes the rest through. ``position_ids`` is ignored, as in HF.

    The result and the gradients equal HF's bit for bit (every product and sum
    rounded in q's dtype as PyTorch's eager kernels round them). Where the
    kernel does not apply, HF's own formula runs instead, so nothing changes
    but speed: cos/sin that need gradients, or cos/sin in another dtype than q
    (HF would type-promote). Host tensors run cuprope's NumPy emulation of the
    same rounding.
    """
    del position_ids  # unused by HF since transformers 4.38
    if unsqueeze_dim not in (1, 2, -3, -2):
        raise ValueError(f"unsqueeze_dim must be 1 ([B, H, S, D]) or 2 ([B, S, H, D]), "
                         f"got {unsqueeze_dim}")
    layout = "bhsd" if unsqueeze_dim in (1, -3) else "bshd"
    if (cos.requires_grad or sin.requires_grad or cos.dtype != q.dtype
            or sin.dtype != q.dtype):
        return _hf_formula(q, k, cos, sin, unsqueeze_dim)
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    if _compiling():
        return _rope_qk_table_op(q, k, cos, sin, layout, False, False)
    if not (q.requires_grad or k.requires_grad):
        return tables.rope_qk_table_forward(q, k, cos, sin, layout=layout)
    return _TableQKFunction.apply(q, k, cos, sin, layout, False, False)


@torch.library.custom_op("cuprope::rotary_embedding", mutates_args=("query", "key"))
def _rotary_embedding_op(positions: torch.Tensor, query: torch.Tensor,
                         key: Optional[torch.Tensor], head_size: int,
                         cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    _rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


@_rotary_embedding_op.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox):
    return None


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor],
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """vLLM's ``rotary_embedding`` op: rotate ``query`` ``[T, Hq*D]`` (or
    ``[T, Hq, D]``) and ``key`` (likewise, or None) in place by the rows
    ``positions`` ``[T]`` of ``cos_sin_cache`` ``[max_position, R]`` (cos
    half, then sin half; float32 or query's dtype), NeoX pairs (j, j + R/2)
    or, ``is_neox=False``, GPT-J pairs (2j, 2j + 1). Not differentiable (an
    inference op). See ``cuprope.cos_sin_cache`` for the semantics. Under
    ``torch.compile`` it is the custom op ``cuprope::rotary_embedding``
    (mutating query and key)."""
    if _compiling():
        _rotary_embedding_op(positions, query, key, int(head_size), cos_sin_cache, bool(is_neox))
        return
    _rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


from .torch_qknorm import RopeQKNormFunction, rope_qk_norm  # noqa: E402  (re-exported)
