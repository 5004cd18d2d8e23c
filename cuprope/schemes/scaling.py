"""RoPE frequency schemes as tables (exported, with ``hf_config``'s names, as
``cuprope.scaling``): each scheme is an ``inv_freq`` table, an optional
``stream_map`` and a ``scale`` on a :class:`~cuprope.RopeConfig`. The
per-scheme functions follow HF transformers (``modeling_rope_utils.py``,
Qwen2-VL / Qwen3-VL modelling) and return ``(inv_freq, attention_scale)``:
θ_j per pair, float64 ``[dim/2]``, and the factor HF multiplies into cos and
sin (``RopeConfig.scale``). HF computes them in float32, these in float64,
so tables agree to float32 rounding.
"""
from __future__ import annotations

import math

import numpy as np

from .._core.checks import as_float, as_int
from ..config import RopeConfig

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
    "mrope_stream_map",
    "interleaved_mrope_stream_map",
    "mrope_config",
    "interleaved_mrope_config",
    "vision2d_tables",
    "vision2d_config",
]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
# legacy / model-specific names HF maps onto the schemes above
ROPE_TYPE_ALIASES = {"mrope": "default", "su": "longrope"}


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
    ``[3, S]``, ``[3, B, S]`` or ``[3, T]`` (T, H, W position ids).

    ``mrope_section`` counts pairs and sums to R/2; pairs of section k use
    stream k (0 = T, 1 = H, 2 = W); the frequency index runs on across
    sections; half split (the default), so dims j and j + R/2 share pair
    j's stream. ``scale``, ``layout`` and ``interleaved`` go to the
    RopeConfig. Returns the RopeConfig."""
    return _mm_config(mrope_stream_map(mrope_section), inv_freq, base, scale, layout,
                      interleaved, "mrope_config")


def interleaved_mrope_config(mrope_section, inv_freq=None, *, base: float = 10000.0,
                             scale: float = 1.0, layout: str = "bshd",
                             interleaved: bool = False) -> RopeConfig:
    """Qwen3-VL interleaved MRoPE: as :func:`mrope_config` with the stream map of
    :func:`interleaved_mrope_stream_map` (pairs 1, 4, 7, … below 3·s_h use
    H, pairs 2, 5, 8, … below 3·s_w use W, the rest T). Returns the
    RopeConfig."""
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
    (column) index. See :func:`vision2d_tables`. Returns the RopeConfig."""
    inv, smap = vision2d_tables(head_dim, base)
    return RopeConfig(int(head_dim), inv_freq=inv, scale=scale, layout=layout,
                      interleaved=interleaved, stream_map=smap)
