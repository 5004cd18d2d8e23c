"""The functions a patched model calls in place of transformers' own, each
built for one module with the signature of the function it replaces
(``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``, Llama 4's
``apply_rotary_emb(xq, xk, freqs_cis)``, a rotary embedding's
``forward(x, position_ids)``). Where the fused call does not apply, each runs
transformers' own norm and rotation instead, so the result is HF's.
"""
from __future__ import annotations

import torch

from ..config import RopeConfig
from ..qknorm.torch import rope_qk_norm
from ..rope.torch import apply_rotary_pos_emb, rope_qk

__all__ = ["table_config", "rope_only", "norm_rope", "llama4_rope", "identity",
           "rotary_positions", "eps_of"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_TABLE_CONFIGS: dict = {}


def table_config(rotary_dim: int) -> RopeConfig:
    """The config of a table call rotating ``rotary_dim`` dims of ``[B, H, S, D]``
    q and k (the tables give the angles), one per width, kept alive here."""
    cfg = _TABLE_CONFIGS.get(rotary_dim)
    if cfg is None:
        cfg = _TABLE_CONFIGS[rotary_dim] = RopeConfig(rotary_dim, layout="bhsd")
    return cfg


def identity(x):
    """A patched norm's forward: the fused call applies the norm."""
    return x


def eps_of(norm) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def rotary_positions(hf_rotary, always):
    """The forward of a patched rotary embedding, which hands on the positions
    instead of cos/sin or freqs_cis: the positions (``always``:
    in place of freqs_cis), or a (positions, positions) pair in place of
    (cos, sin) where ``x`` is not fp32; transformers' own (``hf_rotary``)
    for fp32."""
    def forward(x, position_ids):
        if always:
            return position_ids
        if x.dtype == torch.float32:
            return hf_rotary(x, position_ids)
        return position_ids, position_ids
    return forward


def _pair_fits(q, k):
    return (q.dtype in _FLOATS and k.dtype == q.dtype and q.stride(-1) == 1
            and k.stride(-1) == 1 and k.device == q.device)


def _tables_fit(q, k, cos, sin, unsqueeze_dim, rotary_dim):
    return (unsqueeze_dim == 1 and _pair_fits(q, k) and cos.dtype == q.dtype
            and sin.dtype == q.dtype and not (cos.requires_grad or sin.requires_grad)
            and cos.shape[-1] == rotary_dim and q.shape[-1] >= rotary_dim
            and cos.device == q.device)


def _is_positions(t):
    return not (t.is_floating_point() or t.is_complex())


def _positions(pos, b):
    """Positions ``[S]`` or ``[B, S]`` for the core call, from HF's position_ids."""
    if pos.dim() == 2 and pos.shape[0] == 1 and b != 1:
        pos = pos[0]
    return pos if pos.is_contiguous() else pos.contiguous()


def rope_only(hf_apply, rotary_dim):
    """``apply_rotary_pos_emb`` for a family without a q/k norm:
    ``cuprope.torch.apply_rotary_pos_emb`` (HF's tables, HF's roundings: bit
    for bit), or ``hf_apply`` where the tables do not fit (tables in another
    dtype than q, tables that require grad, another rotated width than
    ``rotary_dim``)."""
    def apply_rotary_pos_emb_cuprope(q, k, cos, sin, unsqueeze_dim=1):
        if _tables_fit(q, k, cos, sin, unsqueeze_dim, rotary_dim):
            # partial rotary (Phi-3's partial_rotary_factor): the first R dims turn
            return apply_rotary_pos_emb(q, k, cos, sin, partial_rotary=True)
        return hf_apply(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    return apply_rotary_pos_emb_cuprope


def _hf_norm(norm, x, over):
    """transformers' own norm module on ``x`` ``[B, H, S, D]`` (``over="token"``:
    over each token's H·D values, as OLMo 2 norms the projection)."""
    forward = type(norm).forward
    if over == "head":
        return forward(norm, x)
    b, h, s, d = x.shape
    return forward(norm, x.transpose(1, 2).reshape(b, s, h * d)).view(b, s, h, d).transpose(1, 2)


def norm_rope(qn, kn, spec, hf_apply, rotary_dim, exact=None, hf_rotary=None):
    """``apply_rotary_pos_emb`` for a family that norms q and k first with the
    modules ``qn`` and ``kn`` (identities while patched). ``exact``: the
    layer's RopeConfig (layout bhsd) for positions handed on in place of cos
    and sin; ``hf_rotary(x, position_ids)``: transformers' (cos, sin) then.

    The norms and the rotation run as one ``cuprope.torch.rope_qk_norm``
    call in the norm's rounding mode, by HF's tables or, where the rotary
    embedding hands on positions (OLMo 2 below fp32), by exact angles. Where
    the fused call does not apply (tables or weights in another dtype than
    q, as under autocast with fp32 weights; tables that require grad;
    another rotated width), transformers' own norm and ``hf_apply`` run."""
    cfg = table_config(rotary_dim)
    kw = dict(eps=eps_of(qn), weight_offset=spec.offset, norm_over=spec.over,
              rounding=spec.rounding)
    cast_first = spec.rounding == "cast_then_weight"

    def apply_rotary_pos_emb_cuprope(q, k, cos, sin, unsqueeze_dim=1):
        wq, wk = qn.weight, kn.weight
        weights_fit = (wq.device == q.device and wk.device == q.device
                       and (not cast_first or (wq.dtype == q.dtype and wk.dtype == q.dtype)))
        if _is_positions(cos):
            if exact is not None and _pair_fits(q, k) and weights_fit and cos.device == q.device:
                return rope_qk_norm(q, k, exact, q_weight=wq, k_weight=wk,
                                    positions=_positions(cos, q.shape[0]), **kw)
            cos, sin = hf_rotary(q, cos)
        elif _tables_fit(q, k, cos, sin, unsqueeze_dim, rotary_dim) and weights_fit:
            return rope_qk_norm(q, k, cfg, q_weight=wq, k_weight=wk, tables=(cos, sin), **kw)
        return hf_apply(_hf_norm(qn, q, spec.over), _hf_norm(kn, k, spec.over), cos, sin,
                        unsqueeze_dim=unsqueeze_dim)
    return apply_rotary_pos_emb_cuprope


def llama4_rope(norm, hf_apply, hf_rotary, config):
    """``apply_rotary_emb`` of a Llama 4 layer that uses RoPE: ``freqs_cis``
    arrives as the positions (the patched rotary embedding's doing); rotation
    by ``config`` (exact angles, rounded once as HF rounds its fp32 complex
    product once), then the layer's L2 ``qk_norm`` (``norm``; None: the layer
    has none), one call. ``hf_rotary(x, position_ids)``: transformers'
    freqs_cis, for the fallback (transformers' own rotation and norm)."""
    def apply_rotary_emb_cuprope(xq, xk, freqs_cis):
        pos = freqs_cis
        if _is_positions(pos) and _pair_fits(xq, xk) and pos.device == xq.device:
            pos = _positions(pos, xq.shape[0])
            if norm is None:
                return rope_qk(xq, xk, config, positions=pos)
            return rope_qk_norm(xq, xk, config, eps=eps_of(norm), norm="l2",
                                order="rope_then_norm", rounding="weight_then_cast",
                                positions=pos)
        if _is_positions(pos):
            pos = hf_rotary(xq, pos).to(xq.device)
        q, k = hf_apply(xq, xk, pos)
        if norm is not None:
            q, k = type(norm).forward(norm, q), type(norm).forward(norm, k)
        return q, k
    return apply_rotary_emb_cuprope
