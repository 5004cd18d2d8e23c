"""The KV-cache dialect's kernel record (kernels/kvcache.cu, a translation
unit of its own): computed angles with every fp8 combination, and the
cos_sin_cache source (no fp8). Widths: the widest and 1 (any alignment).
The decode rows, compiled from the same unit, are the core's
(``cuprope.rope.kernels``)."""
from __future__ import annotations

from .._core import kernels
from .._core.kernels import DTYPE_CTYPES, cbool
from ..rope.kernels import KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T, lrpe_vec_widths

ENTRY = "kvcache.cu"
# The bits of kv_rope_kernel's FP8 parameter: q's output, the k/v caches in
# e4m3 (kernels kKvFp8*; the prologue and MLA kernels read them too).
KV_FP8_Q, KV_FP8_CACHE = 1, 2
CODES = {"CUPROPE_KV_FP8_Q": KV_FP8_Q, "CUPROPE_KV_FP8_CACHE": KV_FP8_CACHE}
# computed angles; the cos_sin_cache sources; the computed angles' WIDE
# instantiations (widest packs, held to more resident warps: many-wave grids),
# compiled only when a launch first takes one
FAMILIES = ("kvcache", "kvcache_cos_sin", "kvcache_wide")


def kv_kernel_name(dtype: str, interleaved: bool, vec: int, src: int = KV_ANGLES,
                   fp8: int = 0, wide: bool = False) -> str:
    """Name expression of one ``kv_rope_kernel`` instantiation: ``src`` one of
    KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T; ``fp8`` a sum of KV_FP8_Q and
    KV_FP8_CACHE; ``wide`` (computed angles at the widest ``vec`` only) the
    instantiation held to CUPROPE_KV_WIDE_MIN_BLOCKS blocks per SM."""
    if src not in (KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T) or fp8 not in range(4):
        raise ValueError(f"no kv_rope_kernel for src={src!r}, fp8={fp8!r}")
    if wide and (src != KV_ANGLES or vec != lrpe_vec_widths(dtype)[0]):
        raise ValueError(f"no wide kv_rope_kernel for src={src!r}, vec={vec!r}")
    return (f"cuprope::kv_rope_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, {vec}, "
            f"{int(src)}, {int(fp8)}, {cbool(wide)}>")


def kv_family_of(src: int, wide: bool = False) -> str:
    """The family holding kv_rope_kernel's instantiations for angle source
    ``src`` (``wide``: the WIDE ones)."""
    if wide:
        return FAMILIES[2]
    return FAMILIES[0] if src == KV_ANGLES else FAMILIES[1]


def kv_kernel_names(family: str | None = None) -> list[str]:
    """Every kv_rope_kernel instantiation (of one KV family, or all three)."""
    names = []
    for dt in DTYPE_CTYPES:
        for il in (False, True):
            for v in lrpe_vec_widths(dt):
                if family in (None, FAMILIES[0]):
                    names += [kv_kernel_name(dt, il, v, KV_ANGLES, f) for f in range(4)]
                if family in (None, FAMILIES[1]):
                    srcs = (KV_COS_SIN_F32,) if dt == "float32" else (KV_COS_SIN_F32, KV_COS_SIN_T)
                    names += [kv_kernel_name(dt, il, v, src) for src in srcs]
                if family in (None, FAMILIES[2]) and v == lrpe_vec_widths(dt)[0]:
                    names += [kv_kernel_name(dt, il, v, KV_ANGLES, f, True) for f in range(4)]
    return names


# Blocks of CUPROPE_THREADS threads that must fit an SM at once
# (kv_rope_kernel's __launch_bounds__; 0: none stated, the compiler's own
# choice, 80 registers for the bf16 width-8 kernels); the same for its WIDE
# instantiations (4: 64 registers, 36-52 bytes spilled, 32 warps per SM: the
# 16k prefill 1.29x faster, decode 0.2-0.3 us slower), and the grid's warps
# per SM from which a launch takes them (host only).
TUNING = {"CUPROPE_KV_MIN_BLOCKS": 0, "CUPROPE_KV_WIDE_MIN_BLOCKS": 4,
          "CUPROPE_KV_WIDE_WARPS_PER_SM": 64}

kernels.register(ENTRY, FAMILIES, kv_kernel_names, TUNING, CODES)
