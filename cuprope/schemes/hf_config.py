"""A model's HF ``config.json`` → cuprope's RoPE settings, the way transformers
reads it: :func:`rope_config_from_hf` (what is read, which layer, the
defaults and the pair layout are in its docstring), :func:`hf_rope_parameters`,
:func:`hf_table` and :func:`layer_types`, built on the tables of
:mod:`cuprope.schemes.scaling`.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping

from .._core.checks import as_int
from ..config import RopeConfig
from .hf_families import GENERIC, family_of
from .scaling import (ROPE_TYPES, ROPE_TYPE_ALIASES, default_table, dynamic_ntk_table,
                      interleaved_mrope_config, linear_table, llama3_table, longrope_table,
                      mrope_config, proportional_table, yarn_table)

__all__ = ["hf_rope_parameters", "hf_table", "rope_config_from_hf", "layer_types",
           "ROPE_PARAMETER_KEYS", "OTHER_ROPE_KEYS"]

_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "rotary_emb_base")
# The keys of a rope parameters dict (``rope_scaling`` / ``rope_parameters``) this reader uses
ROPE_PARAMETER_KEYS = frozenset({
    "rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
    "original_max_position_embeddings", "max_position_embeddings", "attention_factor",
    "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate", "short_factor",
    "long_factor", "short_mscale", "long_mscale", "low_freq_factor", "high_freq_factor",
    "mrope_section", "mrope_interleaved"})
# Keys some families keep there that are no part of the rotation: the attention reads them
OTHER_ROPE_KEYS = {
    "llama_4_scaling_beta": "Ministral 3 / Mistral 4 scale the query by a function of the "
                            "position after RoPE (get_llama_4_attn_scale)",
}


def _as_dict(config) -> dict:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise TypeError(f"config must be a dict (config.json) or a transformers config, "
                    f"got {type(config).__name__}")


def _text_part(d: dict) -> dict:
    """Multimodal configs (Gemma 3, Llama 4, Qwen3-VL, …) keep the language model in text_config."""
    tc = d.get("text_config")
    if isinstance(tc, Mapping) or hasattr(tc, "to_dict"):
        if not any(d.get(k) is not None for k in _ROPE_KEYS):
            merged = {k: v for k, v in d.items() if k not in ("text_config", "vision_config")}
            merged.update(_as_dict(tc))
            return merged
    return d


def _fail(model_type, fields, hint):
    raise ValueError(f"model_type {model_type!r} is not in cuprope's family table "
                     f"(cuprope.schemes.hf_families), and the config does not state {', '.join(fields)}; "
                     f"its family may default {'them' if len(fields) > 1 else 'it'} to anything. "
                     f"{hint}, or drop model_type to get transformers' generic defaults")


def layer_types(config) -> list | None:
    """The config's ``layer_types``, or the list its model class derives (Gemma 3/4:
    every ``sliding_window_pattern``-th layer is full attention; Qwen3-Next / Qwen3.5:
    every ``full_attention_interval``-th, the others ``linear_attention``; Llama 4:
    NoPE layers are ``full_attention``, RoPE layers ``chunked_attention``); None when
    neither."""
    d = _text_part(_as_dict(config))
    return _layer_types(d, family_of(d.get("model_type")) or GENERIC)


def _n_layers(d, fam):
    n = d.get("num_hidden_layers", fam.num_hidden_layers)
    return None if n is None else int(n)


def _nope_flags(d, fam):
    """Per layer: True for a NoPE layer (Llama 4), or None for families without them."""
    if fam.nope_interval is None:
        return None
    flags = d.get("no_rope_layers")
    if not flags:  # HF: None or [] → a NoPE layer every no_rope_layer_interval layers
        interval = int(d.get("no_rope_layer_interval") or fam.nope_interval)
        flags = [int((i + 1) % interval != 0) for i in range(_n_layers(d, fam))]
    return [not bool(f) for f in flags]


def _layer_types(d, fam):
    if d.get("layer_types"):
        return list(d["layer_types"])
    nope = _nope_flags(d, fam)
    if nope is not None:
        return ["full_attention" if n else "chunked_attention" for n in nope]
    if fam.full_attention_interval is not None and _n_layers(d, fam):
        every = int(d.get("full_attention_interval") or fam.full_attention_interval)
        return ["linear_attention" if (i + 1) % every else "full_attention"
                for i in range(_n_layers(d, fam))]
    if fam.sliding_window_pattern is not None and _n_layers(d, fam):
        pattern = int((fam.pattern_key and d.get(fam.pattern_key)) or fam.sliding_window_pattern)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(_n_layers(d, fam))]
        if fam.last_layer_full:
            types[-1] = "full_attention"
        return types
    return None


def _select_layer(d, fam, layer_type, layer_idx):
    """(layer_type, is_nope) for the caller's layer_type / layer_idx."""
    types, nope = _layer_types(d, fam), _nope_flags(d, fam)
    if layer_idx is not None:
        idx = as_int(layer_idx, "layer_idx")
        n = len(types) if types else (len(nope) if nope else _n_layers(d, fam))
        if idx < 0 or (n is not None and idx >= n):
            raise ValueError(f"layer_idx {idx} is out of range for {n} layers")
        if types:
            if layer_type is not None and layer_type != types[idx]:
                raise ValueError(f"layer_type {layer_type!r} contradicts layer_types[{idx}] = "
                                 f"{types[idx]!r}")
            layer_type = types[idx]
        return layer_type, bool(nope and nope[idx])
    if nope and layer_type is not None and types:
        kinds = {nope[i] for i, t in enumerate(types) if t == layer_type}
        if len(kinds) > 1:
            raise ValueError(f"layers of type {layer_type!r} differ in whether they use RoPE; "
                             f"pass layer_idx=")
        return layer_type, kinds == {True}
    return layer_type, False


def _per_type(rp, top, fam):
    """Legacy single parameters as per-layer-type ones where the model class splits them
    (Gemma3TextConfig / Olmo3Config.convert_rope_params_to_dict): rope_scaling and
    rope_theta for full attention, default RoPE with the local base for sliding attention."""
    if fam.local_rope_theta is None:
        return rp
    full = dict(rp) if rp else {"rope_type": "default"}
    if top.get("rope_theta") is not None:
        full.setdefault("rope_theta", top["rope_theta"])
    local = top.get(fam.local_theta_key) if fam.local_theta_key else None
    sliding = {"rope_type": "default",
               "rope_theta": fam.local_rope_theta if local is None else local}
    return {"full_attention": full, "sliding_attention": sliding}


def _is_nested(rp, top):
    labels = set(top.get("layer_types") or ()) | {"full_attention", "sliding_attention"}
    return bool(rp) and (
        any(k in labels and (v is None or isinstance(v, Mapping)) for k, v in rp.items())
        or (all(v is None or isinstance(v, Mapping) for v in rp.values())
            and any(isinstance(v, Mapping) for v in rp.values())))


def hf_rope_parameters(config, *, layer_type: str | None = None, layer_idx: int | None = None,
                       head_dim: int | None = None,
                       max_position_embeddings: int | None = None) -> dict | None:
    """The standardized RoPE parameters of one layer of an HF config, or None
    for a layer without RoPE.

    ``config``: a ``config.json`` dict, a ``transformers`` config object, or a
    bare rope dict (``{"rope_type": ..., ...}``; then ``head_dim`` is
    required). Returns a dict with ``rope_type`` (one of
    :data:`~cuprope.scaling.ROPE_TYPES`), ``rope_theta``,
    ``partial_rotary_factor``, ``head_dim``, ``dim`` (rotated dims),
    ``max_position_embeddings``, ``interleaved`` (None: unknown family),
    ``mrope_interleaved``, ``layer_type`` and the scheme's own keys."""
    d = _text_part(_as_dict(config))
    if "rope_type" in d or ("type" in d and "model_type" not in d):
        rp, top = dict(d), {}  # a bare rope dict
    else:
        rp = d.get("rope_scaling") or d.get("rope_parameters") or {}
        rp = _as_dict(rp) if rp else {}
        top = d
    model_type = top.get("model_type")
    fam = family_of(model_type)
    known = fam or GENERIC
    layer_type, nope = _select_layer(top, known, layer_type, layer_idx)
    if nope or (layer_type is not None and layer_type in known.rope_free_types):
        return None
    if not rp and known.default_rope_parameters:
        rp = copy.deepcopy(known.default_rope_parameters)
    if not _is_nested(rp, top):
        rp = _per_type(rp, top, known)
    if _is_nested(rp, top):
        if layer_type is None:
            raise ValueError(f"this config has RoPE parameters per layer type {sorted(rp)}; "
                             f"pass layer_type= or layer_idx=")
        if layer_type not in rp:
            raise ValueError(f"layer_type {layer_type!r} has no RoPE parameters in this config "
                             f"(it has {sorted(k for k, v in rp.items() if v is not None)})")
        if rp[layer_type] is None:
            return None  # HF: a null entry is a layer type without RoPE
        rp = _as_dict(rp[layer_type])

    out = dict(rp)
    rope_type = rp.get("rope_type", rp.get("type", "default")) or "default"
    rope_type = ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; supported: {', '.join(ROPE_TYPES)} "
                         f"(and the aliases {sorted(ROPE_TYPE_ALIASES)})")
    out["rope_type"] = rope_type
    out["layer_type"] = layer_type
    out.pop("type", None)
    missing = []

    theta = rp.get("rope_theta")
    if theta is None:
        theta = top.get("rope_theta", top.get("rotary_emb_base"))  # GPT-NeoX's legacy name
    if theta is None and top:
        if fam is None:
            missing.append("rope_theta")
        theta = known.rope_theta
    out["rope_theta"] = float(10000.0 if theta is None else theta)

    prf = rp.get("partial_rotary_factor")
    if prf is None:
        prf = top.get("partial_rotary_factor", top.get("rotary_pct"))  # rotary_pct: GPT-NeoX's name
    stated_prf = prf is not None
    if prf is None and fam is None and top and not top.get("rotary_dim"):
        missing.append("partial_rotary_factor")
    out["partial_rotary_factor"] = float(known.partial_rotary_factor if prf is None else prf)

    hd = head_dim
    if hd is None and known.global_head_dim and layer_type == "full_attention":
        hd = top.get("global_head_dim") or known.global_head_dim  # Gemma 4's full-attention heads
    if hd is None:
        hd = (top.get(known.head_dim_key) or top.get("head_dim") or top.get("qk_rope_head_dim")
              or known.head_dim)
    if hd is None and fam is None and top:
        missing.append("head_dim")
    if missing:
        _fail(model_type, missing, "set them in the dict (head_dim= also works)")
    if hd is None and top.get("hidden_size") and top.get("num_attention_heads"):
        hd = top["hidden_size"] // top["num_attention_heads"]
    if hd is None:
        raise ValueError("cannot tell the head dim: the config has no head_dim (or qk_rope_head_dim) "
                         "nor hidden_size and num_attention_heads; pass head_dim=")
    out["head_dim"] = int(hd)
    out["dim"] = _rotated_dims(out, top, stated_prf)

    max_pos = max_position_embeddings
    if max_pos is None:
        max_pos = top.get("max_position_embeddings", rp.get("max_position_embeddings"))
    out["max_position_embeddings"] = max_pos
    out["mrope_interleaved"] = bool(rp.get("mrope_interleaved")) or known.mrope_interleaved
    out["mrope_section"] = rp.get("mrope_section") or known.mrope_section
    pairs = known.interleaved if fam is not None else None
    if isinstance(pairs, tuple):  # a config field chooses (DeepSeek-V3 rope_interleave)
        key, default = pairs
        pairs = bool(default if top.get(key) is None else top[key])
    out["interleaved"] = pairs
    if rope_type in ("llama3", "yarn", "longrope"):
        # HF: a top-level original_max_position_embeddings (Phi-3) takes priority
        orig = top.get("original_max_position_embeddings")
        if orig is None:
            orig = rp.get("original_max_position_embeddings")
        if orig is None:
            orig = known.original_max_position_embeddings or max_pos
        if orig is None:
            raise ValueError(f"{rope_type}: the config has neither original_max_position_embeddings "
                             f"nor max_position_embeddings")
        out["original_max_position_embeddings"] = orig
    return out


def _rotated_dims(p, top, stated_prf):
    if p["rope_type"] == "proportional":
        dim = p["head_dim"]  # rotates over the whole head; pairs past the proportion get θ = 0
        if dim % 2:
            raise ValueError(f"proportional RoPE needs an even head_dim, got {dim}")
        return dim
    if top.get("rotary_dim") and not stated_prf:
        dim = int(top["rotary_dim"])  # GPT-J / CodeGen state the rotated dims directly
        if not 0 < dim <= p["head_dim"] or dim % 2:
            raise ValueError(f"rotary_dim ({dim}) must be a positive even integer <= head_dim "
                             f"({p['head_dim']})")
        return dim
    dim = int(p["head_dim"] * p["partial_rotary_factor"])
    if dim <= 0 or dim % 2:
        raise ValueError(f"rotated dims int(head_dim * partial_rotary_factor) = "
                         f"int({p['head_dim']} * {p['partial_rotary_factor']}) = {dim} "
                         f"must be a positive even integer")
    return dim


def _require(p, key):
    if p.get(key) is None:
        raise ValueError(f"{p['rope_type']} RoPE needs {key!r} in the config's rope parameters")
    return p[key]


def hf_table(config, *, head_dim: int | None = None, seq_len: int | None = None,
             layer_type: str | None = None, layer_idx: int | None = None,
             max_position_embeddings: int | None = None):
    """(inv_freq float64 ``[dim/2]``, attention scale) of an HF config for a
    sequence length ``seq_len`` (used by dynamic and longrope only), or None
    for a layer without RoPE. The parameters are :func:`rope_config_from_hf`'s."""
    p = hf_rope_parameters(config, layer_type=layer_type, layer_idx=layer_idx, head_dim=head_dim,
                           max_position_embeddings=max_position_embeddings)
    return None if p is None else _table_from_params(p, seq_len)


def _longrope(p, dim, base, seq_len):
    inv, scale = longrope_table(
        dim, base, _require(p, "short_factor"), _require(p, "long_factor"),
        original_max_position_embeddings=p["original_max_position_embeddings"],
        max_position_embeddings=p["max_position_embeddings"], factor=p.get("factor"),
        attention_factor=p.get("attention_factor"), seq_len=seq_len)
    # Phi-3.5-MoE: short_mscale / long_mscale are the scale (HF PhimoeRotaryEmbedding)
    long = bool(seq_len) and seq_len > float(p["original_max_position_embeddings"])
    mscale = p.get("long_mscale" if long else "short_mscale")
    return inv, scale if mscale is None else float(mscale)


def _table_from_params(p, seq_len):
    t, dim, base = p["rope_type"], p["dim"], p["rope_theta"]
    if t == "default":
        return default_table(dim, base)
    if t == "linear":
        return linear_table(dim, base, _require(p, "factor"))
    if t == "dynamic":
        if p["max_position_embeddings"] is None:
            raise ValueError("dynamic RoPE needs max_position_embeddings in the config")
        return dynamic_ntk_table(dim, base, _require(p, "factor"), p["max_position_embeddings"],
                                 seq_len)
    if t == "yarn":
        return yarn_table(dim, base, p.get("factor"),
                          original_max_position_embeddings=p["original_max_position_embeddings"],
                          max_position_embeddings=p["max_position_embeddings"],
                          beta_fast=p.get("beta_fast") or 32, beta_slow=p.get("beta_slow") or 1,
                          mscale=p.get("mscale"), mscale_all_dim=p.get("mscale_all_dim"),
                          attention_factor=p.get("attention_factor"),
                          truncate=bool(p.get("truncate", True)))
    if t == "longrope":
        return _longrope(p, dim, base, seq_len)
    if t == "proportional":
        return proportional_table(dim, base, p["partial_rotary_factor"], p.get("factor") or 1.0)
    # llama3
    return llama3_table(dim, base, _require(p, "factor"), _require(p, "low_freq_factor"),
                        _require(p, "high_freq_factor"), p["original_max_position_embeddings"])


def rope_config_from_hf(config, *, head_dim: int | None = None, seq_len: int | None = None,
                        layout: str = "bshd", interleaved: bool | None = None,
                        layer_type: str | None = None, layer_idx: int | None = None,
                        max_position_embeddings: int | None = None) -> RopeConfig | None:
    """The ``RopeConfig`` of one layer of an HF model, from its ``config.json``
    dict as it is, or None when that layer has no RoPE.

    Parameters
    ----------
    config : dict or transformers config
        A ``config.json`` dict, a ``transformers`` config object, or a bare
        rope dict (``{"rope_type": ..., ...}``; then ``head_dim`` is
        required). Multimodal configs are read through their
        ``text_config``.
    head_dim : int, optional
        Overrides the config's head dim.
    seq_len : int, optional
        The sequence length for dynamic NTK and LongRoPE (None: the original
        context).
    layout : {"bshd", "bhsd", "thd"}
        The RopeConfig's layout.
    interleaved : bool, optional
        None takes the pair layout from the config/family (DeepSeek-V3
        ``rope_interleave``, GLM, Llama 4, Cohere, GPT-J: pairs (2i, 2i+1);
        the rest HF's half split). True (pairs (2i, 2i+1)) or False (half
        split (i, i + R/2)) wins over the config: it states how the caller's
        q/k are laid out (e.g. weights permuted at load time).
    layer_type : str, optional
        Picks per-layer-type parameters (``rope_parameters`` keyed by layer
        type; Gemma 3's ``rope_scaling`` for ``full_attention`` and
        ``rope_local_base_freq`` for ``sliding_attention``; Gemma 4's
        ``global_head_dim`` for ``full_attention``).
    layer_idx : int, optional
        Picks a layer; its ``layer_type`` is ``layer_types[layer_idx]``
        (listed in the config, or derived as the model class derives it). A
        config with per-type parameters and neither argument raises.
    max_position_embeddings : int, optional
        Overrides the config's.

    Returns
    -------
    RopeConfig or None
        ``RopeConfig(rotary_dim=dim, inv_freq=..., scale=attention scale,
        interleaved=..., stream_map=None or the MRoPE map)``: ``inv_freq``
        float64 ``[R/2]``, ``scale`` the factor HF multiplies into cos and
        sin. ``mrope_section`` gives a Qwen2-VL MRoPE config (a
        ``stream_map`` ``[R/2]``; positions ``[3, S]`` / ``[3, B, S]``), the
        Qwen3-VL interleaved one with ``mrope_interleaved``. None for a layer
        without RoPE: Llama 4's NoPE layers, a layer type whose parameters
        are ``null``, a layer type the family runs without RoPE (Qwen3-Next
        and Qwen3.5's ``linear_attention``).

    Notes
    -----
    What is read: ``rope_scaling`` / ``rope_parameters`` (legacy ``type``),
    ``rope_theta`` (``rotary_emb_base``), ``partial_rotary_factor``
    (``rotary_pct``), ``rotary_dim``, ``head_dim`` (DeepSeek
    ``qk_rope_head_dim``), ``max_position_embeddings``,
    ``original_max_position_embeddings`` (top level wins, as in HF),
    LongRoPE's ``short_mscale`` / ``long_mscale`` (the scale, chosen by
    ``seq_len`` like the factors), ``mrope_section`` / ``mrope_interleaved``,
    ``text_config`` of multimodal configs, ``no_rope_layers`` /
    ``no_rope_layer_interval`` (1 = RoPE, 0 = NoPE), ``rope_interleave``.

    Defaults: a field the config leaves out takes the default of the
    family's config class (:mod:`cuprope.schemes.hf_families`, keyed by
    ``model_type``). For a ``model_type`` outside that table nothing is
    guessed: a missing field that families default differently
    (``rope_theta``, ``head_dim``, ``partial_rotary_factor``) raises naming
    it, and so does the pair layout unless the caller passes
    ``interleaved``. A dict with no ``model_type`` at all gets transformers'
    generic defaults (θ base 10000, head_dim = hidden_size //
    num_attention_heads, partial factor 1, half split).
    """
    p = hf_rope_parameters(config, layer_type=layer_type, layer_idx=layer_idx, head_dim=head_dim,
                           max_position_embeddings=max_position_embeddings)
    if p is None:
        return None
    inv, scale = _table_from_params(p, seq_len)
    if interleaved is None:
        interleaved = p["interleaved"]
        if interleaved is None:
            mt = _text_part(_as_dict(config)).get("model_type")
            raise ValueError(f"model_type {mt!r} is not in cuprope's family table, so its pair "
                             f"layout is unknown: pass interleaved=True (pairs (2i, 2i+1)) or "
                             f"False (half split (i, i + R/2), HF's rotate_half)")
    section = p["mrope_section"]
    if section is not None:
        build = interleaved_mrope_config if p["mrope_interleaved"] else mrope_config
        return build(section, inv, scale=scale, layout=layout, interleaved=interleaved)
    return RopeConfig(p["dim"], inv_freq=inv, scale=scale, layout=layout, interleaved=interleaved)
