"""ggml's rope op (``ggml_rope_ext``, ``ggml_rope_multi`` and ``rope_back``) as
a dialect of the rope op, exported as ``cuprope.ggml``: :func:`rope` takes
ggml's arguments and rotates through the ``RopeConfig`` that
:func:`rope_config` derives from them, with no kernel of its own. Shapes are
in NumPy order (ggml's ``ne`` reversed).
"""
from __future__ import annotations

import math

import numpy as np

from .._core.arrays import describe
from .._core.cache import ConfigCache
from .._core.checks import as_float, as_int
from .._core.torch_guard import engaged
from ..config import RopeConfig, host_array
from .api import rope_backward, rope_forward

__all__ = ["NORMAL", "NEOX", "MROPE", "VISION", "IMROPE", "MODES", "rope", "rope_config",
           "yarn_corr_dims", "pair_streams"]

NORMAL = 0   # GGML_ROPE_TYPE_NORMAL
NEOX = 2     # GGML_ROPE_TYPE_NEOX
MROPE = 8    # GGML_ROPE_TYPE_MROPE  (ggml_rope_multi)
VISION = 24  # GGML_ROPE_TYPE_VISION (MROPE | 16)
IMROPE = 40  # GGML_ROPE_TYPE_IMROPE (MROPE | 32)
MODES = {NORMAL: "normal", NEOX: "neox", MROPE: "mrope", VISION: "vision", IMROPE: "imrope"}


def _cmax(a, b):
    """C's MAX(a, b): ((a) > (b) ? (a) : (b)) (differs from max() on NaN)."""
    return a if a > b else b


def _cmin(a, b):
    return a if a < b else b


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float):
    """ggml_rope_yarn_corr_dims: (low, high) as float64.

    corr(r) = n_dims·ln(n_ctx_orig/(2π·r)) / (2·ln freq_base);
    low = MAX(0, floor(corr(beta_fast))), high = MIN(n_dims − 1, ceil(corr(beta_slow)))."""
    with np.errstate(divide="ignore", invalid="ignore"):
        def corr(rot):
            return (np.float64(n_dims) * np.log(np.float64(n_ctx_orig) / (np.float64(rot) * 2 * np.pi))
                    / (2 * np.log(np.float64(freq_base))))
        start = float(np.floor(corr(beta_fast)))
        end = float(np.ceil(corr(beta_slow)))
    return _cmax(0.0, start), _cmin(float(n_dims - 1), end)


def pair_streams(mode: int, n_pairs: int, sections=(0, 0, 0, 0)):
    """Position stream and frequency index of each pair, as ggml's cache builders walk them.

    Returns (stream int32 ``[n_pairs]`` (0 t, 1 h, 2 w, 3 e), k int64
    ``[n_pairs]``): pair i is turned by pos[stream]·base^(−2k/n_dims). Single
    stream modes: stream 0 and k = i. Multi modes: sector = i % Σsections picks
    the stream (mrope: by section; imrope: h on sectors 1, 4, … below 3·s_h, w
    on 2, 5, … below 3·s_w, t on 0, 3, … below 3·s_t, else e); vision resets
    the stream's θ when its section starts (``indep_sects``)."""
    if not mode & MROPE:
        return np.zeros(n_pairs, np.int32), np.arange(n_pairs, dtype=np.int64)
    s0, s1, s2, s3 = (int(v) for v in sections)
    sect_dims = s0 + s1 + s2 + s3
    sec_w = s0 + s1
    sec_e = sec_w + s2
    indep = mode == VISION
    imrope = mode == IMROPE
    counter = [0, 0, 0, 0]  # theta_x = p_x · theta_scale^counter[x]
    stream = np.empty(n_pairs, np.int32)
    k = np.empty(n_pairs, np.int64)
    for i in range(n_pairs):
        sector = i % sect_dims
        if indep:
            if sector == 0:
                counter[0] = 0
            elif sector == s0:
                counter[1] = 0
            elif sector == sec_w:
                counter[2] = 0
            elif sector == sec_e:
                counter[3] = 0
        st = 0
        if imrope:
            if sector % 3 == 1 and sector < 3 * s1:
                st = 1
            elif sector % 3 == 2 and sector < 3 * s2:
                st = 2
            elif sector % 3 == 0 and sector < 3 * s0:
                st = 0
            else:
                st = 3
        else:
            if s0 <= sector < sec_w:
                st = 1
            elif sec_w <= sector < sec_w + s2:
                st = 2
            elif sector >= sec_w + s2:
                st = 3
        stream[i] = st
        k[i] = counter[st]
        for j in range(4):
            counter[j] += 1
    return stream, k


def _int(v, name):
    return as_int(v, name, "ggml rope: ")


def _float(v, name):
    return as_float(v, name, "ggml rope: ")


def _check_params(head_dim, n_dims, mode, sections):
    n_dims = _int(n_dims, "n_dims")
    mode = _int(mode, "mode")
    if mode not in MODES:
        raise ValueError(f"ggml rope: unknown mode {mode}; supported: "
                         + ", ".join(f"{v} ({n})" for v, n in MODES.items()))
    if n_dims <= 0 or n_dims % 2:
        raise ValueError(f"ggml rope: n_dims must be a positive even integer, got {n_dims}")
    if n_dims > head_dim:
        raise ValueError(f"ggml rope: n_dims ({n_dims}) must be <= the head dim D ({head_dim})")
    if mode == VISION and 2 * n_dims != head_dim:
        raise ValueError(f"ggml rope: vision mode needs n_dims = D/2, got n_dims={n_dims}, D={head_dim}")
    secs = (0, 0, 0, 0)
    if mode & MROPE:
        try:
            secs = tuple(_int(v, "sections[i]") for v in sections)
        except TypeError:
            raise TypeError(f"ggml rope: sections must be 4 ints, got {sections!r}") from None
        if len(secs) != 4:
            raise ValueError(f"ggml rope: sections must have 4 entries (t, h, w, e), got {len(secs)}")
        if any(v < 0 for v in secs):
            raise ValueError(f"ggml rope: sections must be >= 0, got {list(secs)}")
        if not (secs[0] > 0 or secs[1] > 0 or secs[2] > 0):
            raise ValueError(f"ggml rope: {MODES[mode]} mode needs sections with sections[0], [1] "
                             f"or [2] > 0, got {list(secs)}")
        if sum(secs) > head_dim:
            raise ValueError(f"ggml rope: sum(sections) ({sum(secs)}) must be <= the head dim "
                             f"({head_dim})")
    return n_dims, mode, secs


_CONFIGS = ConfigCache(64)


def rope_config(head_dim: int, freq_factors=None, *, n_dims: int, mode: int, n_ctx_orig: int = 0,
                freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
                attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
                sections=(0, 0, 0, 0), layout: str = "bshd") -> RopeConfig:
    """The ``RopeConfig`` equivalent to ggml's rope op on heads of ``head_dim`` (D).

    Parameters
    ----------
    head_dim : int
        D.
    freq_factors : float array, optional
        As :func:`rope`'s.
    n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
    beta_fast, beta_slow, sections
        ggml's rope parameters of those names (``mode``: one of
        :data:`MODES`; ``sections``: four ints, the multi modes' t/h/w/e
        sections). freq_base, freq_scale and attn_factor must be > 0.
    layout : {"bshd", "bhsd", "thd"}
        The config's layout.

    Returns
    -------
    RopeConfig
        rotary_dim = n_dims (vision: D, pairs (i, i + n_dims)); interleaved
        for NORMAL, half split otherwise; stream_map from
        :func:`pair_streams` for the multi modes (positions
        ``[n_streams, S]``, n_streams <= 4). Cached per parameter set
        (ValueError for parameters that give non-finite angles).

    Notes
    -----
    Angles: θ_ext = p·base^(−2k/n_dims)/ff[i] (k = i, or the index within the
    section for VISION); θ_int = freq_scale·θ_ext. With ``ext_factor != 0``:
    mix = (1 − clamp((i − low)/max(0.001, high − low), 0, 1))·ext_factor,
    θ = θ_int·(1 − mix) + θ_ext·mix and mscale = attn_factor·(1 + 0.1·ln(1/freq_scale));
    else θ = θ_int and mscale = attn_factor ((low, high): :func:`yarn_corr_dims`).
    cos and sin are multiplied by mscale (the config's ``scale``). Angles are
    float64 products where ggml forms them in float32, so results agree with
    ggml to ggml's own float32 rounding (better at long context)."""
    head_dim = _int(head_dim, "head dim")
    n_dims, mode, secs = _check_params(head_dim, n_dims, mode, sections)
    n_ctx_orig = _int(n_ctx_orig, "n_ctx_orig")
    params = [_float(v, n) for v, n in ((freq_base, "freq_base"), (freq_scale, "freq_scale"),
                                         (ext_factor, "ext_factor"), (attn_factor, "attn_factor"),
                                         (beta_fast, "beta_fast"), (beta_slow, "beta_slow"))]
    if params[0] <= 0:
        raise ValueError(f"ggml rope: freq_base must be > 0, got {freq_base}")
    if params[1] <= 0:
        raise ValueError(f"ggml rope: freq_scale must be > 0, got {freq_scale}")
    if params[3] <= 0:
        raise ValueError(f"ggml rope: attn_factor must be > 0 (it scales cos and sin), got "
                         f"{attn_factor}")
    n_pairs = n_dims if mode == VISION else n_dims // 2
    ff = None
    if freq_factors is not None:
        ff = np.asarray(host_array(freq_factors, "freq_factors"))
        if ff.ndim != 1 or ff.dtype.kind != "f":
            raise ValueError(f"ggml rope: freq_factors must be a 1-D float array, got "
                             f"{ff.dtype} {ff.shape}")
        if ff.shape[0] < n_pairs:
            need = "n_dims (vision reads one per pair of the whole head)" if mode == VISION \
                else "n_dims/2"
            raise ValueError(f"ggml rope: freq_factors must have at least {need} = {n_pairs} "
                             f"entries, got {ff.shape[0]}")
        ff = ff[:n_pairs].astype(np.float32).astype(np.float64)
        if not np.all(np.isfinite(ff)) or np.any(ff == 0):
            raise ValueError("ggml rope: freq_factors must be finite and non-zero")
    key = (head_dim, n_dims, mode, secs, n_ctx_orig, tuple(params), layout,
           None if ff is None else ff.tobytes())
    return _CONFIGS.get(key, lambda: _build(n_pairs, n_dims, mode, secs, n_ctx_orig, *params, ff,
                                            layout))


def _build(n_pairs, n_dims, mode, secs, n_ctx_orig, freq_base, freq_scale, ext_factor,
           attn_factor, beta_fast, beta_slow, ff, layout):
    stream, k = pair_streams(mode, n_pairs, secs)
    theta = np.power(freq_base, -2.0 * k.astype(np.float64) / n_dims)
    if ff is not None:
        theta = theta / ff
    mscale = attn_factor
    mix = np.zeros(n_pairs)
    if ext_factor != 0.0:
        low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        with np.errstate(invalid="ignore", divide="ignore"):
            for i in range(n_pairs):  # rope_yarn_ramp(low, high, i0) with i0 / 2 == i
                y = (i - low) / _cmax(0.001, high - low)
                mix[i] = (1 - _cmin(1.0, _cmax(0.0, y))) * ext_factor
        mscale = attn_factor * (1.0 + 0.1 * math.log(1.0 / freq_scale))
    inv = theta * (freq_scale * (1 - mix) + mix)
    if not np.all(np.isfinite(inv)) or not math.isfinite(mscale):
        raise ValueError("ggml rope: these parameters give non-finite angles or magnitude "
                         "(check freq_base, freq_scale, ext_factor, beta_fast, beta_slow)")
    multi = bool(mode & MROPE)
    return RopeConfig(2 * n_pairs, inv_freq=inv, interleaved=(mode == NORMAL), layout=layout,
                      scale=mscale, stream_map=stream if multi else None)


def rope(src0, pos, freq_factors=None, *, n_dims: int, mode: int, n_ctx_orig: int = 0,
         freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
         attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
         sections=(0, 0, 0, 0), forward: bool = True, out=None, inplace: bool = False,
         stream=None):
    """ggml's rope op; ``forward=False`` is ``rope_back``, the transposed
    rotation (−sin) by the same tables and magnitude.

    * ``src0``: ``[B, S, N, D]`` (ggml ``[D, N, S, B]``) or ``[S, N, D]``;
      float32, float16 or bfloat16 (an extra over ggml), any framework cuprope
      accepts (GPU arrays run the CUDA kernel, host arrays the float64
      reference); the last dim must be contiguous.
    * ``pos``: int32 ``[S]`` on the same device; for the multi-stream modes
      (``mode & MROPE``: mrope, vision, imrope) ``[4·S]`` laid out as ggml's:
      t₀…t_{S−1}, h₀…, w₀…, e₀… .
    * ``freq_factors``: optional float ``[≥ n_dims/2]`` (``[≥ n_dims]`` for
      vision, one per pair of the whole head); θ of pair i is divided by
      ``freq_factors[i]``, rounded to float32 as ggml stores it.

    =========  =====  ===============================================
    mode       value  pairs
    =========  =====  ===============================================
    NORMAL     0      (2i, 2i+1), i < n_dims/2; dims >= n_dims copied
    NEOX       2      (i, i + n_dims/2); dims >= n_dims copied
    MROPE      8      as NEOX; pair i uses stream t/h/w/e by sector = i % Σsections
    VISION     24     (i, i + n_dims) over the whole head, n_dims = D/2;
                      sections [y, x]: θ restarts at each section
    IMROPE     40     as NEOX; interleaved streams (Qwen3-VL), else e
    =========  =====  ===============================================

    The other keyword arguments are :func:`rope_config`'s (angles and
    magnitude there). ``out``/``inplace``/``stream`` as in
    :func:`cuprope.rope_forward`. Returns the rotated array, src0's shape and
    dtype (``src0`` itself when ``inplace``, ``out`` when given). Torch
    tensors: as ``cuprope.rope_forward`` / ``rope_backward`` (differentiable
    with grad mode on), but under ``torch.compile`` a graph break (it runs
    eagerly)."""
    if engaged(src0, None, out):
        from .._core.torch_route import untraceable
        return untraceable(lambda: _rope(src0, pos, freq_factors, n_dims, mode, n_ctx_orig,
                                         freq_base, freq_scale, ext_factor, attn_factor,
                                         beta_fast, beta_slow, sections, forward, out, inplace,
                                         stream))
    return _rope(src0, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, sections, forward, out, inplace,
                 stream)


def _rope(src0, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
          attn_factor, beta_fast, beta_slow, sections, forward, out, inplace, stream):
    info = describe(src0, "src0")
    if len(info.shape) not in (3, 4):
        raise ValueError(f"ggml rope: src0 must be [B, S, N, D] or [S, N, D], got shape "
                         f"{tuple(info.shape)}")
    layout = "bshd" if len(info.shape) == 4 else "thd"
    s, d = info.shape[-3], info.shape[-1]
    mode_i = _int(mode, "mode")
    if mode_i not in MODES:
        _check_params(d, n_dims, mode_i, sections)  # raises the unknown-mode error
    multi = bool(mode_i & MROPE)
    pinfo = describe(pos, "pos")
    if pinfo.dtype != "int32":
        raise TypeError(f"ggml rope: pos must be int32, got {pinfo.dtype}")
    want = 4 * s if multi else s
    if len(pinfo.shape) != 1 or pinfo.shape[0] != want:
        what = "4*S (t, h, w, e positions of each token)" if multi else "S"
        raise ValueError(f"ggml rope: pos must be 1-D with {what} = {want} entries for "
                         f"src0 of shape {tuple(info.shape)}, got shape {tuple(pinfo.shape)}")
    cfg = rope_config(d, freq_factors, n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig,
                      freq_base=freq_base, freq_scale=freq_scale, ext_factor=ext_factor,
                      attn_factor=attn_factor, beta_fast=beta_fast, beta_slow=beta_slow,
                      sections=sections, layout=layout)
    positions = pos
    if multi:  # the streams the config uses; one stream takes the plain [S] form
        streams = pos.reshape(4, s)
        positions = streams[0] if cfg.n_streams == 1 else streams[: cfg.n_streams]
    fn = rope_forward if forward else rope_backward
    return fn(src0, cfg, positions=positions, out=out, inplace=inplace, stream=stream)
