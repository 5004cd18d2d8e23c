"""PyTorch adapter of the KV-cache family's in-place op: vLLM's
``rotary_embedding`` (over :mod:`cuprope.kvcache.cos_sin_cache`) as the
custom op ``cuprope::rotary_embedding`` under ``torch.compile``, re-exported
by :mod:`cuprope.torch`, so an engine switches by one line. ``route_rotation``
is where ``cos_sin_cache.rotary_embedding`` sends torch tensors its guard
stopped; both run ``cuprope.kvcache.rotary.rotate_by_cache`` beneath.
"""
from __future__ import annotations

from typing import Optional

import torch

from .._core import torch_route
from .._core.torch_guard import engaged_any
from .._core.validate import check_flag
from .rotary import rotate_by_cache

__all__ = ["rotary_embedding"]


@torch.library.custom_op("cuprope::rotary_embedding", mutates_args=("query", "key"))
def _rotary_embedding_op(positions: torch.Tensor, query: torch.Tensor,
                         key: Optional[torch.Tensor], head_size: int,
                         cos_sin_cache: torch.Tensor, is_neox: bool, rope_dim_offset: int = 0,
                         inverse: bool = False, enable_pdl: bool = False) -> None:
    _in_place(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse,
              enable_pdl)


@_rotary_embedding_op.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
      inverse=False, enable_pdl=False):
    return None


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor],
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True,
                     rope_dim_offset: int = 0, inverse: bool = False, *,
                     enable_pdl: bool = False) -> None:
    """vLLM's ``rotary_embedding`` op, with its schema's arguments (vLLM's
    csrc/pos_encoding_kernels.cu): rotate ``query`` and ``key`` (or None) in
    place by the rows ``positions`` of ``cos_sin_cache`` ``[max_position,
    R]`` (cos half, then sin half).

    Parameters
    ----------
    positions : torch.Tensor
        int32/int64, ``[T]`` or ``[B, S]``, contiguous.
    query : torch.Tensor
        ``[T, Hq*D]`` or ``[T, Hq, D]`` with positions ``[T]``;
        ``[B, S, Hq*D]`` or ``[B, S, Hq, D]`` with positions ``[B, S]``
        (D = head_size); float32, float16 or bfloat16, each head contiguous.
    key : torch.Tensor or None
        As query, with its own head count.
    head_size : int
    cos_sin_cache : torch.Tensor ``[max_position, R]``
        float32, float16 or bfloat16 whatever query's dtype (the rotation is
        evaluated in fp32, each cache value widened to it, as vLLM's kernel
        does).
    is_neox : bool
        NeoX pairs (j, j + R/2), or with False GPT-J pairs (2j, 2j + 1), over
        the dims ``[rope_dim_offset, rope_dim_offset + R)`` of each head; the
        rest untouched.
    rope_dim_offset : int
    inverse : bool
        Rotate by minus the angle (sin negated).
    enable_pdl : bool
        A programmatic dependent launch: positions and the cache must be
        complete when the stream's previous kernel starts; query and key may
        be written by it.

    Returns
    -------
    None
        query and key are rotated in place.

    Notes
    -----
    Not differentiable (an inference op). Under ``torch.compile`` it is the
    custom op ``cuprope::rotary_embedding`` (mutating query and key). The
    details (bounds, rounding, PDL): :func:`cuprope.cos_sin_cache.rotary_embedding`.
    """
    if not engaged_any(query, key, cos_sin_cache):  # the common case first: no grad, not traced
        rotate_by_cache(positions, query, key, head_size, cos_sin_cache, is_neox, False, None,
                        rope_dim_offset, inverse, enable_pdl)
    elif torch.compiler.is_compiling():
        _rotary_embedding_op(positions, query, key, int(head_size), cos_sin_cache, bool(is_neox),
                             int(rope_dim_offset), bool(inverse),
                             check_flag(enable_pdl, "enable_pdl"))
    else:
        _in_place(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset,
                  inverse, enable_pdl)


def _in_place(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset,
              inverse, enable_pdl=False):
    """As ``cuprope.cos_sin_cache.rotary_embedding`` rotates (check=False, no
    stream): the call itself, or ``route_rotation`` where the guard says so."""
    def core():
        return rotate_by_cache(positions, query, key, head_size, cos_sin_cache, is_neox, False,
                               None, rope_dim_offset, inverse, enable_pdl)
    if engaged_any(query, key, cos_sin_cache):
        route_rotation(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset,
                       inverse, None, core, enable_pdl)
    else:
        core()


def route_rotation(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset,
                   inverse, stream, core, enable_pdl=False):
    """``cuprope.cos_sin_cache.rotary_embedding`` on torch tensors the guard
    stopped (in place, an inference op): under torch.compile, without
    autograd, the custom op ``cuprope::rotary_embedding``; otherwise as
    ``torch_route.inference_op``."""
    written = (query,) if key is None else (query, key)
    read = written + (cos_sin_cache,)
    grad = torch.is_grad_enabled() and any(torch_route.requires_grad(t) for t in read)
    if torch.compiler.is_compiling() and stream is None and not grad:
        rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox,
                         rope_dim_offset, inverse, enable_pdl=enable_pdl)
        return query, key
    return torch_route.inference_op("rotary_embedding", read, written, core)
