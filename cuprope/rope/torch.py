"""PyTorch adapter of the core rotation and the cos/sin-table rotation:
autograd, ``torch.compile`` custom ops and HF's ``apply_rotary_pos_emb``
drop-in (re-exported by :mod:`cuprope.torch`). CPU tensors run the NumPy
backend (float64 reference), which is how the adapter's tests run without a
GPU. The core functions route torch tensors that require grad here
(``route_rope``, ``route_tables`` at the end of the module).
"""
from __future__ import annotations

from typing import Optional

import torch

from .._core import torch_route
from .engine import rope_call
from .._core.torch_guard import engaged
from .._core.validate import check_flag
from ..config import RopeConfig, config_by_key
from .table_call import table_call

__all__ = ["rope_qk", "rope", "rotate", "table_rotate", "RopeQKFunction",
           "apply_rotary_pos_emb"]

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
    ``apply(q, k, config, positions, offset, seq_offsets[, inverse[, enable_pdl]])``:
    ``inverse=True`` swaps the two (rope_qk_backward, differentiable);
    ``enable_pdl`` makes both launches programmatic dependent ones."""

    @staticmethod
    def forward(ctx, q, k, config, positions, offset, seq_offsets, *extra):
        ctx.config, ctx.offset = config, offset
        ctx.inverse, ctx.n_extra = bool(extra and extra[0]), len(extra)
        ctx.pdl = bool(extra[1]) if len(extra) > 1 else False
        ctx.save_for_backward(positions, seq_offsets)
        ctx.meta = ((q.shape, q.dtype, q.device), (k.shape, k.dtype, k.device))
        return _rotation((q.detach(), k.detach()), config, ctx.inverse, positions, offset,
                         seq_offsets, ctx.pdl)

    @staticmethod
    def backward(ctx, gq, gk):
        positions, seq_offsets = ctx.saved_tensors
        gq = _zeros_if_none(gq, ctx.meta[0])
        gk = _zeros_if_none(gk, ctx.meta[1])
        dq, dk = _rotation((gq, gk), ctx.config, not ctx.inverse, positions, ctx.offset,
                           seq_offsets, ctx.pdl)
        return (dq, dk, None, None, None, None) + (None,) * ctx.n_extra


class _RopeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, config, positions, offset, seq_offsets, inverse, enable_pdl=False):
        ctx.config, ctx.offset, ctx.inverse, ctx.pdl = config, offset, inverse, enable_pdl
        ctx.save_for_backward(positions, seq_offsets)
        return _rotation((x.detach(),), config, inverse, positions, offset, seq_offsets,
                         enable_pdl)[0]

    @staticmethod
    def backward(ctx, g):
        positions, seq_offsets = ctx.saved_tensors
        g = g if g.stride(-1) == 1 else g.contiguous()
        return (_rotation((g,), ctx.config, not ctx.inverse, positions, ctx.offset,
                          seq_offsets, ctx.pdl)[0], None, None, None, None, None, None)


# ---------------------------------------------------------------- custom ops


def _register_qk_autograd(op, tail=0):
    """Autograd for a custom op ``op(q, k, *args, inverse, *rest) -> (q', k')``
    (``tail`` arguments after ``inverse``, passed on as they are) whose
    gradient is the same op with ``inverse`` flipped: tensor arguments (or
    None) are saved for the backward, the others kept as they are."""
    def setup(ctx, inputs, output):
        q, k, *args = inputs
        args, inverse, ctx.rest = args[:len(args) - 1 - tail], args[len(args) - 1 - tail], \
            tuple(args[len(args) - tail:])
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
                    not ctx.inverse, *ctx.rest)
        return (dq, dk) + (None,) * (len(args) + 1 + len(ctx.rest))

    op.register_autograd(backward, setup_context=setup)


@torch.library.custom_op("cuprope::rope_qk", mutates_args=())
def _rope_qk_op(q: torch.Tensor, k: torch.Tensor, config_key: int,
                positions: Optional[torch.Tensor], seq_offsets: Optional[torch.Tensor],
                offset: int, inverse: bool,
                enable_pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _rotation((q, k), _config(config_key), inverse, positions, offset, seq_offsets,
                     enable_pdl)


@_rope_qk_op.register_fake
def _(q, k, config_key, positions, seq_offsets, offset, inverse, enable_pdl=False):
    return torch.empty_like(q), torch.empty_like(k)


_register_qk_autograd(_rope_qk_op, tail=1)


@torch.library.custom_op("cuprope::rope", mutates_args=())
def _rope_op(x: torch.Tensor, config_key: int, positions: Optional[torch.Tensor],
             seq_offsets: Optional[torch.Tensor], offset: int, inverse: bool,
             enable_pdl: bool = False) -> torch.Tensor:
    return _rotation((x,), _config(config_key), inverse, positions, offset, seq_offsets,
                     enable_pdl)[0]


@_rope_op.register_fake
def _(x, config_key, positions, seq_offsets, offset, inverse, enable_pdl=False):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    x, config_key, positions, seq_offsets, offset, inverse, *pdl = inputs
    ctx.save_for_backward(positions, seq_offsets)
    ctx.args = (config_key, offset, inverse, bool(pdl and pdl[0]))


def _backward(ctx, g):
    positions, seq_offsets = ctx.saved_tensors
    config_key, offset, inverse, pdl = ctx.args
    g = g if g.stride(-1) == 1 else g.contiguous()
    return (_rope_op(g, config_key, positions, seq_offsets, offset, not inverse, pdl),
            None, None, None, None, None, None)


_rope_op.register_autograd(_backward, setup_context=_setup)


# ---------------------------------------------------------------- public


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def rope_qk(q: torch.Tensor, k: torch.Tensor, config: RopeConfig, *,
            positions: Optional[torch.Tensor] = None, offset: int = 0,
            seq_offsets: Optional[torch.Tensor] = None, enable_pdl: bool = False):
    """Differentiable fused q/k RoPE.

    Parameters
    ----------
    q, k : torch.Tensor
        Shapes, dtypes and strides as :func:`cuprope.rope_qk_forward`
        (``config.layout`` ``"bshd"``: q ``[B, S, Hq, D]``, k
        ``[B, S, Hk, D]``; ``"bhsd"``: ``[B, H, S, D]``; ``"thd"``:
        ``[T, H, D]``); float32, float16 or bfloat16, one dtype. CUDA
        tensors, or CPU tensors (NumPy backend).
    config : RopeConfig
    positions : torch.Tensor, optional
        int32/int64, ``[S]``, ``[B, S]`` or ``[T]`` (a leading stream axis
        under a stream map), as :func:`cuprope.rope_qk_forward`.
    offset : int
    seq_offsets : torch.Tensor, optional
        int32/int64 ``[B]``.
    enable_pdl : bool
        Programmatic dependent launches, the gradient's too (rules:
        :func:`cuprope.rope_forward`).

    Returns
    -------
    tuple of torch.Tensor
        ``(q_rot, k_rot)``, new tensors.

    Notes
    -----
    Gradients: the transposed rotation with the same positions, table and
    scale. Eagerly an ``autograd.Function`` (:class:`RopeQKFunction`, the
    lowest overhead); under ``torch.compile`` the custom op
    ``cuprope::rope_qk``, which carries a fake implementation and a
    registered autograd formula, so ``torch.compile(fullgraph=True)`` traces
    through it.

    CUDA graphs: warm up once per (config, device) before capture, so the
    frequency table is already on the device; calls then allocate only
    their outputs, through torch's (graph-aware) allocator.
    """
    return rotate((q, k), config, False, positions, offset, seq_offsets, enable_pdl)


def rope(x: torch.Tensor, config: RopeConfig, *, positions: Optional[torch.Tensor] = None,
         offset: int = 0, seq_offsets: Optional[torch.Tensor] = None, enable_pdl: bool = False):
    """Differentiable single-tensor RoPE.

    Parameters
    ----------
    x : torch.Tensor
        ``[B, S, H, D]``, ``[B, H, S, D]`` or ``[T, H, D]`` by
        ``config.layout``; float32, float16 or bfloat16 (as
        :func:`cuprope.rope_forward`).
    config, positions, offset, seq_offsets, enable_pdl
        As :func:`rope_qk`.

    Returns
    -------
    torch.Tensor
        The rotated tensor, new. Gradient, ``torch.compile`` (the custom op
        ``cuprope::rope``) and CUDA graphs as :func:`rope_qk`.
    """
    return rotate((x,), config, False, positions, offset, seq_offsets, enable_pdl)[0]


def rotate(xs, config: RopeConfig, inverse: bool, positions=None, offset: int = 0,
           seq_offsets=None, enable_pdl: bool = False):
    """``xs`` rotated differentiably: the forward rotation, or with
    ``inverse`` the transposed one (``rope_backward``; its gradient is the
    forward). The custom op under torch.compile, the autograd.Function
    eagerly. The core functions route here for tensors that require grad
    (``cuprope._core.torch_guard``).

    Parameters
    ----------
    xs : tuple of torch.Tensor
        ``(x,)`` or ``(q, k)``, shapes and dtypes as :func:`rope` /
        :func:`rope_qk`.
    config : RopeConfig
    inverse : bool
    positions, offset, seq_offsets, enable_pdl
        As :func:`rope_qk` (``enable_pdl``: the gradient's launches too).

    Returns
    -------
    tuple of torch.Tensor
        New tensors, a tuple like ``xs``.
    """
    inverse, offset = bool(inverse), int(offset)
    pdl = check_flag(enable_pdl, "enable_pdl")
    if len(xs) == 2:
        if _compiling():
            return _rope_qk_op(xs[0], xs[1], _key(config), positions, seq_offsets, offset, inverse,
                               pdl)
        return RopeQKFunction.apply(xs[0], xs[1], config, positions, offset, seq_offsets, inverse,
                                    pdl)
    if _compiling():
        return (_rope_op(xs[0], _key(config), positions, seq_offsets, offset, inverse, pdl),)
    return (_RopeFunction.apply(xs[0], config, positions, offset, seq_offsets, inverse, pdl),)


# ---------------------------------------------------------------- HF drop-in (cos/sin tables)


class _TableQKFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, layout, interleaved, inverse=False):
        ctx.save_for_backward(cos, sin)
        ctx.args = (layout, interleaved, inverse)
        ctx.meta = ((q.shape, q.dtype, q.device), (k.shape, k.dtype, k.device))
        return _table_rotation(q.detach(), k.detach(), cos.detach(), sin.detach(), layout,
                               interleaved, inverse)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        layout, interleaved, inverse = ctx.args
        dq, dk = _table_rotation(_zeros_if_none(gq, ctx.meta[0]), _zeros_if_none(gk, ctx.meta[1]),
                                 cos, sin, layout, interleaved, not inverse)
        return dq, dk, None, None, None, None, None


def table_rotate(q, k, cos, sin, layout: str, interleaved: bool, inverse: bool):
    """q and k rotated by HF-style cos/sin tables, differentiably in q and k:
    the forward, or with ``inverse`` its gradient (whose own gradient is the
    forward). The custom op ``cuprope::rope_qk_table`` under torch.compile,
    an autograd.Function eagerly.

    Parameters
    ----------
    q, k : torch.Tensor
        ``[B, S, H, D]``, ``[B, H, S, D]`` or ``[T, H, D]`` by ``layout``;
        their head counts may differ.
    cos, sin : torch.Tensor
        ``[B, S, R]``, ``[1, S, R]`` or ``[S, R]`` (``[T, R]`` for
        ``"thd"``) in q's dtype (as :func:`cuprope.tables.rope_table_forward`).
    layout : {"bshd", "bhsd", "thd"}
    interleaved : bool
        Pairs (2j, 2j+1) when True, halves (j, j + R/2) when False.
    inverse : bool

    Returns
    -------
    tuple of torch.Tensor
        ``(q_rot, k_rot)``, new tensors.
    """
    if _compiling():
        return _rope_qk_table_op(q, k, cos, sin, layout, bool(interleaved), bool(inverse))
    return _TableQKFunction.apply(q, k, cos, sin, layout, bool(interleaved), bool(inverse))


@torch.library.custom_op("cuprope::rope_qk_table", mutates_args=())
def _rope_qk_table_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      layout: str, interleaved: bool,
                      inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _table_rotation(q, k, cos, sin, layout, interleaved, inverse)


@_rope_qk_table_op.register_fake
def _(q, k, cos, sin, layout, interleaved, inverse):
    return torch.empty_like(q), torch.empty_like(k)


_register_qk_autograd(_rope_qk_table_op)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _hf_formula(q, k, cos, sin, unsqueeze_dim):
    r = cos.shape[-1]
    if r < q.shape[-1]:  # partial_rotary: the first R dims, the rest concatenated back
        qr, kr = _hf_formula(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim)
        return torch.cat((qr, q[..., r:]), dim=-1), torch.cat((kr, k[..., r:]), dim=-1)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _check_width(q, k, cos, partial_rotary):
    """RuntimeError (Llama's broadcasting error, named) when cos/sin do not
    cover q's and k's heads exactly (or, with ``partial_rotary``, are wider)."""
    r = cos.shape[-1] if cos.dim() else 0
    for x, name in ((q, "q"), (k, "k")):
        d = x.shape[-1] if x.dim() else 0
        if r == d or (partial_rotary and r < d):
            continue
        hint = (" (for partial rotary, where only the first R dims turn, pass "
                "partial_rotary=True)" if r < d else "")
        raise RuntimeError(f"cos and sin have {r} dims but {name}'s head has {d}: HF's "
                           f"apply_rotary_pos_emb rotates the whole head{hint}")


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids: Optional[torch.Tensor] = None, unsqueeze_dim: int = 1, *,
                         partial_rotary: bool = False):
    """Drop-in for Hugging Face's ``apply_rotary_pos_emb`` (Llama and the many
    models that copy it): ``q * cos + rotate_half(q) * sin``, same for k.

    Parameters
    ----------
    q, k : torch.Tensor
        q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` with ``unsqueeze_dim=1``
        (HF's default), or ``[B, S, H, D]`` with ``unsqueeze_dim=2``;
        float32, float16 or bfloat16.
    cos, sin : torch.Tensor
        ``[B, S, R]`` (or ``[1, S, R]``) as the model's rotary embedding
        returns them, in q's dtype. R = D is Llama's case.
    position_ids : ignored, as in HF.
    unsqueeze_dim : int
        1 (or -3) for ``[B, H, S, D]``, 2 (or -2) for ``[B, S, H, D]``;
        anything else is a ValueError.
    partial_rotary : bool
        Take R < D: the first R dims rotate and the rest pass through, as
        GPT-NeoX's own ``apply_rotary_pos_emb`` does (and Phi's attention
        around Llama's). Without it cos/sin of another width than D are a
        RuntimeError, as Llama's broadcasting raises.

    Returns
    -------
    tuple of torch.Tensor
        ``(q_embed, k_embed)``, new tensors.

    Notes
    -----
    The result and the gradients equal HF's bit for bit (every product and
    sum rounded in q's dtype as PyTorch's eager kernels round them). Where
    the kernel does not apply, HF's own formula runs instead, so nothing
    changes but speed: cos/sin that need gradients, or cos/sin in another
    dtype than q (HF would type-promote). Host tensors run cuprope's NumPy
    emulation of the same rounding. Under ``torch.compile``: the custom op
    ``cuprope::rope_qk_table``.

    One line switches a Llama-style model::

        transformers.models.llama.modeling_llama.apply_rotary_pos_emb = \\
            cuprope.torch.apply_rotary_pos_emb
    """
    del position_ids  # unused by HF since transformers 4.38
    if unsqueeze_dim not in (1, 2, -3, -2):
        raise ValueError(f"unsqueeze_dim must be 1 ([B, H, S, D]) or 2 ([B, S, H, D]), "
                         f"got {unsqueeze_dim}")
    layout = "bhsd" if unsqueeze_dim in (1, -3) else "bshd"
    _check_width(q, k, cos, partial_rotary)
    if (cos.requires_grad or sin.requires_grad or cos.dtype != q.dtype
            or sin.dtype != q.dtype):
        return _hf_formula(q, k, cos, sin, unsqueeze_dim)
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    if _compiling():
        return _rope_qk_table_op(q, k, cos, sin, layout, False, False)
    if not (q.requires_grad or k.requires_grad):
        return _table_rotation(q, k, cos, sin, layout, False, False)
    return _TableQKFunction.apply(q, k, cos, sin, layout, False, False)


# ---------------------------------------------------------------- the core beneath, and the routes
#
# The core functions (cuprope.rope_qk_forward and the others, cuprope.tables)
# send torch tensors that require grad (grad mode on), and every call under
# torch.compile, to route_rope / route_tables (cuprope._core.torch_guard), and
# import this module only then; their adapters are rotate and table_rotate.
# This module does not import those public functions: it runs the same core
# beneath them (engine.rope_call, table_call) through _rotation /
# _table_rotation, which repeat their guard, so a gradient that itself
# requires grad (create_graph=True) is differentiable again.

_ROPE_NAMES = {(1, False): ("rope_forward", ("x",)), (1, True): ("rope_backward", ("grad_out",)),
               (2, False): ("rope_qk_forward", ("q", "k")),
               (2, True): ("rope_qk_backward", ("grad_q", "grad_k"))}


def _rotation(xs, config, inverse, positions, offset, seq_offsets, enable_pdl=False):
    """``xs`` rotated as ``cuprope.rope.api``'s function of that direction
    rotates them (new outputs; a tuple like ``xs``): the core call, or, where
    ``torch_guard.engaged`` says so, ``route_rope`` as that function would."""
    name, names = _ROPE_NAMES[(len(xs), bool(inverse))]

    def core():
        return rope_call(xs, names, config, inverse, positions, offset, seq_offsets, None, False,
                         None, enable_pdl)
    if engaged(xs[0], xs[1] if len(xs) == 2 else None, None):
        return route_rope(name, xs, config, inverse, positions, offset, seq_offsets, None, False,
                          None, core, enable_pdl)
    return core()


def _table_rotation(q, k, cos, sin, layout, interleaved, inverse):
    """(q', k') as ``cuprope.rope.tables.rope_qk_table_forward`` (or, with
    ``inverse``, ``_backward``) computes them: the core call, or, where the
    guard says so, ``route_tables`` as that function would."""
    name = "rope_qk_table_backward" if inverse else "rope_qk_table_forward"
    names = ("grad_q", "grad_k") if inverse else ("q", "k")

    def core():
        return table_call((q, k), names, cos, sin, layout, interleaved, inverse, None, False,
                          None)
    if engaged(q, k, None) or cos.requires_grad or sin.requires_grad:
        return route_tables(name, (q, k), cos, sin, layout, interleaved, inverse, None, False,
                            None, core)
    return core()


def route_rope(name, xs, config, inverse, positions, offset, seq_offsets, outs, inplace, stream,
               core, enable_pdl=False):
    """``cuprope.rope.api``'s four functions on torch tensors the guard
    stopped: the adapter is ``rotate`` (``cuprope.torch.rope`` / ``rope_qk``,
    with the inverse rotation for the backward functions, whose own gradient
    is the forward rotation). Returns a tuple like ``xs``."""
    targets, kind = torch_route.targets_of(xs, outs, inplace)

    def adapter():
        return rotate(xs, config, inverse, positions, offset, seq_offsets, enable_pdl)

    return torch_route.call(name, xs, targets, kind, core, adapter,
                            "cuprope.torch.rope_qk(q, k, config, ...)" if len(xs) == 2
                            else "cuprope.torch.rope(x, config, ...)", stream)


def route_tables(name, xs, cos, sin, layout, interleaved, inverse, outs, inplace, stream, core):
    """``cuprope.tables`` on torch tensors the guard stopped: q and k go to
    ``table_rotate`` (HF's gradient); a single tensor, or tables that require
    grad, have no adapter."""
    targets, kind = torch_route.targets_of(xs, outs, inplace)
    adapter = None
    if len(xs) == 2 and not (torch_route.requires_grad(cos) or torch_route.requires_grad(sin)):
        def adapter():
            return table_rotate(xs[0], xs[1], cos, sin, layout, interleaved, inverse)
    return torch_route.call(name, xs + (cos, sin), targets, kind, core, adapter,
                            "cuprope.torch.apply_rotary_pos_emb(q, k, cos, sin) (differentiable "
                            "in q, k, and in cos/sin through HF's formula)", stream)
