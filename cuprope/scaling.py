"""RoPE frequency schemes as tables: every scheme is an ``inv_freq`` table, an
optional ``stream_map`` and a ``scale`` on a :class:`~cuprope.RopeConfig`.

The per-scheme functions follow HF transformers (``modeling_rope_utils.py``,
Qwen2-VL / Qwen3-VL modelling) and return ``(inv_freq, attention_scale)``:
``inv_freq`` is float64 ``[dim/2]`` (θ_j for pair j) and ``attention_scale``
is the factor HF multiplies into cos and sin (``RopeConfig.scale``). They are
computed in float64; HF computes them in float32, so tables agree to float32
rounding.

=========  ===================================================================
scheme     inv_freq (i = 0 … dim/2 − 1, θ_i = base^(−2i/dim))
=========  ===================================================================
default    θ_i
linear     θ_i / factor
dynamic    base' = base·(factor·L/max_pos − (factor − 1))^(dim/(dim−2)), L = max(seq_len, max_pos)
yarn       ramp mix of θ_i (extrapolation) and θ_i/factor (interpolation); scale = attention factor
longrope   θ_i / ext_i, ext = long_factor if seq_len > original else short_factor; scale = attention factor
llama3     θ_i, θ_i/factor, or a smooth mix, by wavelength 2π/θ_i against original/high_ff, original/low_ff
prop.      whole head: θ_i (i < partial·dim/2, exponent over dim = head_dim), 0 for the rest; /factor
=========  ===================================================================

Multimodal (positions gain a leading stream axis, ``[n_streams, S]`` or
``[n_streams, B, S]``, or ``[n_streams, T]`` for ``"thd"``):

* :func:`mrope_config` — Qwen2-VL MRoPE: ``mrope_section`` counts pairs and
  sums to R/2; pairs of section k use stream k (0 = T, 1 = H, 2 = W); the
  frequency index runs on across sections; half split, so dims j and j + R/2
  share pair j's stream.
* :func:`interleaved_mrope_config` — Qwen3-VL: pairs 1, 4, 7, … below 3·s_h
  use H, pairs 2, 5, 8, … below 3·s_w use W, the rest T.
* :func:`vision2d_config` — Qwen2-VL vision 2-D RoPE: pairs (j, j + D/2) over
  the whole head; the first D/4 pairs use the h stream, the next D/4 the w
  stream; the frequency index restarts at the second half:
  θ = base^(−2k/(D/2)), k = j mod D/4.

:func:`rope_config_from_hf` reads a model's ``config.json`` dict (or a
``transformers`` config object) and returns the matching ``RopeConfig``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ._core.checks import as_float, as_int
from .config import RopeConfig

__all__ = [
    "ROPE_TYPES",
    "default_table",
    "linear_table",
    "dynamic_ntk_table",
    "yarn_table",
    "yarn_get_mscale",
    "longrope_table",
    "llama3_table",
    "proportional_table",
    "hf_rope_parameters",
    "hf_table",
    "rope_config_from_hf",
    "mrope_stream_map",
    "interleaved_mrope_stream_map",
    "mrope_config",
    "interleaved_mrope_config",
    "vision2d_tables",
    "vision2d_config",
]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
# legacy / model-specific names HF maps onto the schemes above
_ALIASES = {"mrope": "default", "su": "longrope"}


# --------------------------------------------------------------------------- checks

def _check_dim(dim, name="dim"):
    dim = as_int(dim, name)
    if dim <= 0 or dim % 2:
        raise ValueError(f"{name} must be a positive even integer, got {dim}")
    return dim


def _positive(value, name):
    return as_float(value, name, positive=True)


def _scaling_factor(factor, max_position_embeddings, orig, missing):
    """``factor``, or max_position_embeddings / orig when it is None (``missing``:
    the error when neither is given)."""
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError(missing)
        factor = _positive(max_position_embeddings, "max_position_embeddings") / orig
    return _positive(factor, "factor")


def _exponents(dim):
    """2i/dim for i = 0 … dim/2 − 1 (HF: ``arange(0, dim, 2) / dim``), float64."""
    return np.arange(0, dim, 2, dtype=np.float64) / dim


# --------------------------------------------------------------------------- 1-D schemes

def default_table(dim: int, base: float = 10000.0):
    """Original RoPE: ``inv_freq[i] = base^(−2i/dim)``. Returns (float64 ``[dim/2]``, 1.0)."""
    dim = _check_dim(dim)
    base = _positive(base, "base")
    return 1.0 / base ** _exponents(dim), 1.0


def linear_table(dim: int, base: float, factor: float):
    """Linear (position interpolation): the default table divided by ``factor``.
    Returns (float64 ``[dim/2]``, 1.0)."""
    inv, _ = default_table(dim, base)
    return inv / _positive(factor, "factor"), 1.0


def dynamic_ntk_table(dim: int, base: float, factor: float, max_position_embeddings: int,
                      seq_len: int | None = None):
    """Dynamic NTK: the base is recomputed from the sequence length the caller gives.

    ``L = max(seq_len, max_position_embeddings)`` (``seq_len=None``: L =
    max_position_embeddings) and
    ``base' = base · (factor·L/max_position_embeddings − (factor − 1))^(dim/(dim − 2))``;
    so up to the original context the table is the default one. Returns
    (float64 ``[dim/2]``, 1.0)."""
    dim = _check_dim(dim)
    if dim <= 2:
        raise ValueError(f"dynamic NTK needs dim > 2 (the exponent is dim/(dim-2)), got {dim}")
    base = _positive(base, "base")
    factor = _positive(factor, "factor")
    max_pos = _positive(max_position_embeddings, "max_position_embeddings")
    length = max_pos if seq_len is None else max(float(seq_len), max_pos)
    new_base = base * ((factor * length / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / new_base ** _exponents(dim), 1.0


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN magnitude: 1 when scale <= 1, else 0.1·mscale·ln(scale) + 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_table(dim: int, base: float, factor: float | None = None, *,
               original_max_position_embeddings: int, max_position_embeddings: int | None = None,
               beta_fast: float = 32.0, beta_slow: float = 1.0, mscale: float | None = None,
               mscale_all_dim: float | None = None, attention_factor: float | None = None,
               truncate: bool = True):
    """YaRN (HF ``_compute_yarn_parameters``).

    corr(r) = dim·ln(orig/(2π·r)) / (2·ln base); low = corr(beta_fast),
    high = corr(beta_slow), floored/ceiled when ``truncate``; low = max(low, 0),
    high = min(high, dim − 1); ramp_j = clamp((j − low)/(high − low), 0, 1)
    (high += 0.001 when low == high); inv_freq = θ/factor·ramp + θ·(1 − ramp).

    ``factor=None``: max_position_embeddings / original_max_position_embeddings.
    Attention scale: ``attention_factor`` when given; else
    get_mscale(factor, mscale)/get_mscale(factor, mscale_all_dim) when both are
    given (non-zero); else get_mscale(factor) = 0.1·ln(factor) + 1 (1 for
    factor <= 1). Returns (float64 ``[dim/2]``, attention scale)."""
    dim = _check_dim(dim)
    base = _positive(base, "base")
    if base == 1.0:
        raise ValueError("yarn: base must not be 1 (the correction range divides by ln(base))")
    orig = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    factor = _scaling_factor(factor, max_position_embeddings, orig,
                             "yarn: give factor, or max_position_embeddings so that factor = "
                             "max_position_embeddings / original_max_position_embeddings")
    beta_fast = _positive(beta_fast, "beta_fast")
    beta_slow = _positive(beta_slow, "beta_slow")

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, float(mscale)) / yarn_get_mscale(
                factor, float(mscale_all_dim))
        else:
            attention_factor = yarn_get_mscale(factor)
    attention_factor = float(attention_factor)
    if not math.isfinite(attention_factor):
        raise ValueError(f"yarn: attention_factor must be finite, got {attention_factor}")

    def corr(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent the singularity
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = 1.0 - ramp  # weight of the unscaled frequency
    pos_freqs = base ** _exponents(dim)
    inv = (1.0 / (factor * pos_freqs)) * (1.0 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, attention_factor


def longrope_table(dim: int, base: float, short_factor, long_factor, *,
                   original_max_position_embeddings: int, max_position_embeddings: int | None = None,
                   factor: float | None = None, attention_factor: float | None = None,
                   seq_len: int | None = None):
    """LongRoPE (HF ``_compute_longrope_parameters``; Phi-3, Phi-3.5).

    ``inv_freq[i] = 1/(ext_i · base^(2i/dim))`` with ext = ``long_factor`` when
    ``seq_len > original_max_position_embeddings``, else ``short_factor`` (both
    ``[dim/2]``). ``factor=None``: max_position_embeddings / original. Attention
    scale: ``attention_factor`` when given, else 1 for factor <= 1, else
    sqrt(1 + ln(factor)/ln(original)). Returns (float64 ``[dim/2]``, scale)."""
    dim = _check_dim(dim)
    base = _positive(base, "base")
    orig = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    use_long = bool(seq_len) and seq_len > orig
    ext = np.asarray(long_factor if use_long else short_factor, dtype=np.float64)
    which = "long_factor" if use_long else "short_factor"
    if ext.shape != (dim // 2,):
        raise ValueError(f"longrope: {which} must have dim/2 = {dim // 2} entries, got shape {ext.shape}")
    if not np.all(np.isfinite(ext)) or np.any(ext <= 0):
        raise ValueError(f"longrope: {which} entries must be positive and finite")
    if attention_factor is None:
        factor = _scaling_factor(
            factor, max_position_embeddings, orig,
            "longrope: give factor, attention_factor, or max_position_embeddings "
            "(factor = max_position_embeddings / original_max_position_embeddings)")
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(orig))
    attention_factor = float(attention_factor)
    return 1.0 / (ext * base ** _exponents(dim)), attention_factor


def llama3_table(dim: int, base: float, factor: float, low_freq_factor: float,
                 high_freq_factor: float, original_max_position_embeddings: int):
    """Llama 3.1 (HF ``_compute_llama3_parameters``).

    wavelen = 2π/θ_i. wavelen < orig/high_freq_factor: θ_i kept;
    wavelen > orig/low_freq_factor: θ_i/factor; in between (the smooth band)
    s = (orig/wavelen − low_ff)/(high_ff − low_ff) and θ' = (1 − s)·θ/factor + s·θ.
    With low_freq_factor == high_freq_factor the band is empty (HF would give
    0/0 for a wavelength exactly on the boundary; here that one keeps θ).
    Returns (float64 ``[dim/2]``, 1.0)."""
    inv, _ = default_table(dim, base)
    factor = _positive(factor, "factor")
    low_ff = _positive(low_freq_factor, "low_freq_factor")
    high_ff = _positive(high_freq_factor, "high_freq_factor")
    if high_ff < low_ff:
        raise ValueError(f"llama3: high_freq_factor ({high_freq_factor}) must be >= "
                         f"low_freq_factor ({low_freq_factor})")
    orig = _positive(original_max_position_embeddings, "original_max_position_embeddings")
    low_freq_wavelen = orig / low_ff
    high_freq_wavelen = orig / high_ff
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_freq_wavelen, inv / factor, inv)
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    if high_ff > low_ff and medium.any():
        smooth = (orig / wavelen - low_ff) / (high_ff - low_ff)
        out = np.where(medium, (1 - smooth) * out / factor + smooth * out, out)
    return out, 1.0


def proportional_table(head_dim: int, base: float, partial_rotary_factor: float,
                       factor: float = 1.0):
    """Proportional RoPE (HF ``_compute_proportional_rope_parameters``, Gemma 4):
    over the whole head, n = int(partial_rotary_factor·head_dim // 2) pairs get
    θ_i = base^(−2i/head_dim) and the other head_dim/2 − n pairs θ = 0 (they do
    not turn); all divided by ``factor``. Returns (float64 ``[head_dim/2]``, 1.0)."""
    head_dim = _check_dim(head_dim, "head_dim")
    base = _positive(base, "base")
    prf = float(partial_rotary_factor)
    if not 0.0 <= prf <= 1.0:
        raise ValueError(f"partial_rotary_factor must be in [0, 1], got {partial_rotary_factor}")
    n = int(prf * head_dim // 2)
    inv = np.zeros(head_dim // 2)
    inv[:n] = 1.0 / base ** (np.arange(0, 2 * n, 2, dtype=np.float64) / head_dim)
    return inv / _positive(factor, "factor"), 1.0


# --------------------------------------------------------------------------- HF configs

def _as_dict(config) -> dict:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise TypeError(f"config must be a dict (config.json) or a transformers config, "
                    f"got {type(config).__name__}")


_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "rotary_emb_base")


def _text_part(d: dict) -> dict:
    """Multimodal configs (Qwen3-VL, …) keep the language model in text_config."""
    tc = d.get("text_config")
    if isinstance(tc, Mapping) and not any(d.get(k) is not None for k in _ROPE_KEYS):
        tc = _as_dict(tc)
        merged = {k: v for k, v in d.items() if k not in ("text_config", "vision_config")}
        merged.update(tc)
        return merged
    return d


def hf_rope_parameters(config, *, layer_type: str | None = None, head_dim: int | None = None,
                       max_position_embeddings: int | None = None) -> dict:
    """The standardized RoPE parameters of an HF config, as HF v5 reads them.

    ``config``: a ``config.json`` dict (``rope_scaling`` or ``rope_parameters``,
    legacy key ``type`` or ``rope_type``), a ``transformers`` config object, or
    a bare rope dict (``{"rope_type": ..., ...}``, then ``head_dim`` is required).
    Returns a dict with ``rope_type`` (one of :data:`ROPE_TYPES`), ``rope_theta``,
    ``partial_rotary_factor``, ``head_dim``, ``dim`` (rotated dims),
    ``max_position_embeddings`` and the scheme's own keys. Per-layer-type
    parameters (``{"full_attention": {...}, "sliding_attention": {...}}``) need
    ``layer_type``."""
    d = _text_part(_as_dict(config))
    if "rope_type" in d or ("type" in d and "model_type" not in d):
        rp, top = dict(d), {}  # a bare rope dict
    else:
        rp = d.get("rope_scaling") or d.get("rope_parameters") or {}
        rp = _as_dict(rp) if rp else {}
        top = d
    labels = set(top.get("layer_types") or ())
    nested = bool(rp) and (
        any(k in labels for k in rp)
        or (all(v is None or isinstance(v, Mapping) for v in rp.values())
            and any(isinstance(v, Mapping) for v in rp.values())))
    if nested:
        if layer_type is None:
            raise ValueError(f"this config has RoPE parameters per layer type {sorted(rp)}; "
                             f"pass layer_type=")
        if not isinstance(rp.get(layer_type), Mapping):
            raise ValueError(f"layer_type {layer_type!r} has no RoPE parameters in this config "
                             f"(it has {sorted(k for k, v in rp.items() if v is not None)})")
        rp = _as_dict(rp[layer_type])

    out = dict(rp)
    rope_type = rp.get("rope_type", rp.get("type", "default")) or "default"
    rope_type = _ALIASES.get(rope_type, rope_type)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; supported: {', '.join(ROPE_TYPES)} "
                         f"(and the aliases {sorted(_ALIASES)})")
    out["rope_type"] = rope_type
    out.pop("type", None)
    theta = rp.get("rope_theta")
    if theta is None:
        theta = top.get("rope_theta", top.get("rotary_emb_base"))  # GPT-NeoX's legacy name
    out["rope_theta"] = float(10000.0 if theta is None else theta)
    prf = rp.get("partial_rotary_factor")
    if prf is None:
        prf = top.get("partial_rotary_factor", top.get("rotary_pct"))  # rotary_pct: GPT-NeoX's name
    out["partial_rotary_factor"] = float(1.0 if prf is None else prf)

    hd = head_dim
    if hd is None:
        hd = top.get("head_dim") or top.get("qk_rope_head_dim")
    if hd is None and top.get("hidden_size") and top.get("num_attention_heads"):
        hd = top["hidden_size"] // top["num_attention_heads"]
    if hd is None:
        raise ValueError("cannot tell the head dim: the config has no head_dim (or qk_rope_head_dim) "
                         "nor hidden_size and num_attention_heads; pass head_dim=")
    out["head_dim"] = int(hd)
    if rope_type == "proportional":
        dim = out["head_dim"]  # rotates over the whole head; pairs past the proportion get θ = 0
        if dim % 2:
            raise ValueError(f"proportional RoPE needs an even head_dim, got {dim}")
    elif top.get("rotary_dim") and prf is None:
        dim = int(top["rotary_dim"])  # GPT-J / CodeGen state the rotated dims directly
        if not 0 < dim <= out["head_dim"] or dim % 2:
            raise ValueError(f"rotary_dim ({dim}) must be a positive even integer <= head_dim "
                             f"({out['head_dim']})")
    else:
        dim = int(out["head_dim"] * out["partial_rotary_factor"])
        if dim <= 0 or dim % 2:
            raise ValueError(f"rotated dims int(head_dim * partial_rotary_factor) = "
                             f"int({out['head_dim']} * {out['partial_rotary_factor']}) = {dim} "
                             f"must be a positive even integer")
    out["dim"] = dim
    max_pos = max_position_embeddings
    if max_pos is None:
        max_pos = top.get("max_position_embeddings", rp.get("max_position_embeddings"))
    out["max_position_embeddings"] = max_pos
    # Qwen3-VL states it in rope_scaling; HF's Qwen3-VL model interleaves regardless
    out["mrope_interleaved"] = bool(rp.get("mrope_interleaved")) or str(
        top.get("model_type", "")).startswith("qwen3_vl")
    if rope_type in ("llama3", "yarn", "longrope"):
        # HF: a top-level original_max_position_embeddings (Phi-3) takes priority
        orig = top.get("original_max_position_embeddings")
        if orig is None:
            orig = rp.get("original_max_position_embeddings")
        if orig is None:
            orig = max_pos
        if orig is None:
            raise ValueError(f"{rope_type}: the config has neither original_max_position_embeddings "
                             f"nor max_position_embeddings")
        out["original_max_position_embeddings"] = orig
    return out


def _require(p, key):
    if p.get(key) is None:
        raise ValueError(f"{p['rope_type']} RoPE needs {key!r} in the config's rope parameters")
    return p[key]


def hf_table(config, *, head_dim: int | None = None, seq_len: int | None = None,
             layer_type: str | None = None, max_position_embeddings: int | None = None):
    """(inv_freq float64 ``[dim/2]``, attention scale) of an HF config, for a
    sequence length ``seq_len`` (used by dynamic and longrope only)."""
    p = hf_rope_parameters(config, layer_type=layer_type, head_dim=head_dim,
                           max_position_embeddings=max_position_embeddings)
    return _table_from_params(p, seq_len)


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
        return longrope_table(dim, base, _require(p, "short_factor"), _require(p, "long_factor"),
                              original_max_position_embeddings=p["original_max_position_embeddings"],
                              max_position_embeddings=p["max_position_embeddings"],
                              factor=p.get("factor"), attention_factor=p.get("attention_factor"),
                              seq_len=seq_len)
    if t == "proportional":
        return proportional_table(dim, base, p["partial_rotary_factor"], p.get("factor") or 1.0)
    # llama3
    return llama3_table(dim, base, _require(p, "factor"), _require(p, "low_freq_factor"),
                        _require(p, "high_freq_factor"), p["original_max_position_embeddings"])


def rope_config_from_hf(config, *, head_dim: int | None = None, seq_len: int | None = None,
                        layout: str = "bshd", interleaved: bool = False,
                        layer_type: str | None = None,
                        max_position_embeddings: int | None = None) -> RopeConfig:
    """The ``RopeConfig`` of a HF model, from its ``config.json`` dict as it is.

    Reads ``rope_theta``, ``rope_scaling`` or ``rope_parameters`` (``rope_type``
    or the legacy ``type``), ``partial_rotary_factor``, ``head_dim`` (else
    ``qk_rope_head_dim``, else hidden_size // num_attention_heads),
    ``max_position_embeddings`` and ``original_max_position_embeddings``;
    multimodal configs' ``text_config`` is used when the top level has no RoPE
    keys. ``mrope_section`` in the rope parameters gives a Qwen2-VL MRoPE config
    (positions ``[3, ...]``), with ``mrope_interleaved: true`` the Qwen3-VL
    interleaved one. ``seq_len``: the sequence length for dynamic NTK and
    LongRoPE (None: the original context). ``interleaved``: pairs (2i, 2i+1)
    instead of HF's half split (i, i + R/2).

    Returns ``RopeConfig(rotary_dim=dim, inv_freq=..., scale=attention scale,
    stream_map=None or the MRoPE map)``."""
    p = hf_rope_parameters(config, layer_type=layer_type, head_dim=head_dim,
                           max_position_embeddings=max_position_embeddings)
    inv, scale = _table_from_params(p, seq_len)
    section = p.get("mrope_section")
    if section is not None:
        build = interleaved_mrope_config if p["mrope_interleaved"] else mrope_config
        return build(section, inv, scale=scale, layout=layout, interleaved=interleaved)
    return RopeConfig(p["dim"], inv_freq=inv, scale=scale, layout=layout, interleaved=interleaved)


# --------------------------------------------------------------------------- multimodal

def _sections(section, n=3, name="mrope_section"):
    try:
        s = [int(v) for v in section]
    except TypeError:
        raise TypeError(f"{name} must be a sequence of {n} ints, got {section!r}") from None
    if len(s) != n or any(v < 0 for v in s) or sum(s) == 0:
        raise ValueError(f"{name} must be {n} non-negative ints with a positive sum, got {list(section)}")
    return s


def mrope_stream_map(mrope_section) -> np.ndarray:
    """Qwen2-VL: stream per pair, int32 ``[sum(section)]``: section k's pairs use
    stream k (0 = T, 1 = H, 2 = W), e.g. [16, 24, 24] → 16×0, 24×1, 24×2."""
    s = _sections(mrope_section)
    return np.repeat(np.arange(3, dtype=np.int32), s)


def interleaved_mrope_stream_map(mrope_section) -> np.ndarray:
    """Qwen3-VL: stream per pair, int32 ``[sum(section)]``: pair j uses H when
    j % 3 == 1 and j < 3·s_h, W when j % 3 == 2 and j < 3·s_w, T otherwise."""
    s = _sections(mrope_section)
    j = np.arange(sum(s))
    smap = np.zeros(len(j), dtype=np.int32)
    smap[(j % 3 == 1) & (j < 3 * s[1])] = 1
    smap[(j % 3 == 2) & (j < 3 * s[2])] = 2
    return smap


def _mm_config(smap, inv_freq, base, scale, layout, interleaved, what):
    n_pairs = len(smap)
    if inv_freq is None:
        inv_freq, _ = default_table(2 * n_pairs, base)
    inv = np.asarray(inv_freq, dtype=np.float64)
    if inv.shape != (n_pairs,):
        raise ValueError(f"{what}: inv_freq must have sum(mrope_section) = {n_pairs} entries "
                         f"(the section counts pairs and sums to R/2), got shape {inv.shape}")
    return RopeConfig(2 * n_pairs, inv_freq=inv, scale=scale, layout=layout,
                      interleaved=interleaved, stream_map=smap)


def mrope_config(mrope_section, inv_freq=None, *, base: float = 10000.0, scale: float = 1.0,
                 layout: str = "bshd", interleaved: bool = False) -> RopeConfig:
    """Qwen2-VL MRoPE: R = 2·sum(mrope_section); ``inv_freq`` ``[R/2]`` (default:
    base^(−2i/R)); stream_map from :func:`mrope_stream_map`. Positions
    ``[3, S]``, ``[3, B, S]`` or ``[3, T]`` (T, H, W position ids)."""
    return _mm_config(mrope_stream_map(mrope_section), inv_freq, base, scale, layout,
                      interleaved, "mrope_config")


def interleaved_mrope_config(mrope_section, inv_freq=None, *, base: float = 10000.0,
                             scale: float = 1.0, layout: str = "bshd",
                             interleaved: bool = False) -> RopeConfig:
    """Qwen3-VL interleaved MRoPE: as :func:`mrope_config` with the stream map of
    :func:`interleaved_mrope_stream_map`."""
    return _mm_config(interleaved_mrope_stream_map(mrope_section), inv_freq, base, scale, layout,
                      interleaved, "interleaved_mrope_config")


def vision2d_tables(head_dim: int, base: float = 10000.0):
    """Qwen2-VL vision 2-D RoPE tables: (inv_freq float64 ``[D/2]``, stream_map
    int32 ``[D/2]``). Pair j < D/4 uses stream 0 (h, the row) with frequency
    index j; pair j >= D/4 uses stream 1 (w, the column) with index j − D/4;
    θ_k = base^(−2k/(D/2)) (HF ``VisionRotaryEmbedding(D/2)``)."""
    d = _check_dim(head_dim, "head_dim")
    if d % 4:
        raise ValueError(f"vision 2-D RoPE needs head_dim divisible by 4, got {d}")
    quarter = d // 4
    inv_half, _ = default_table(d // 2, base)  # [D/4]
    inv = np.concatenate([inv_half, inv_half])
    smap = np.repeat(np.arange(2, dtype=np.int32), quarter)
    return inv, smap


def vision2d_config(head_dim: int, *, base: float = 10000.0, scale: float = 1.0,
                    layout: str = "bshd", interleaved: bool = False) -> RopeConfig:
    """Qwen2-VL vision 2-D RoPE over the whole head (rotary_dim = head_dim, half
    split: pairs (j, j + D/2)). Positions ``[2, T]`` (or ``[2, S]`` /
    ``[2, B, S]``): row 0 the h (row) index of each patch, row 1 the w
    (column) index. See :func:`vision2d_tables`."""
    inv, smap = vision2d_tables(head_dim, base)
    return RopeConfig(int(head_dim), inv_freq=inv, scale=scale, layout=layout,
                      interleaved=interleaved, stream_map=smap)
