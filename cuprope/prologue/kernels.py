"""The decode prologue's kernel record (kernels/prologue.cu, a translation
unit of its own): one family per dtype and fp8 combination (a call compiles
only its own), prologue_kernel for the general QK-norm body (vec 0) and the
head-rows fast path (the widest packs), both pairings."""
from __future__ import annotations

from .._core import kernels
from .._core.kernels import DTYPE_CTYPES, cbool, vec_widths

ENTRY = "prologue.cu"
FAMILIES = tuple(f"prologue_{dt}_{f}" for dt in DTYPE_CTYPES for f in range(4))


def prologue_family_of(dtype: str, fp8: int) -> str:
    """The family holding the prologue kernels of ``dtype`` and ``fp8``."""
    return f"prologue_{dtype}_{int(fp8)}"


def prologue_kernel_name(dtype: str, interleaved: bool, vec: int, fp8: int = 0) -> str:
    """Name expression of one ``prologue_kernel`` instantiation: ``vec`` 0
    (qknorm_kernel's body) or the widest width of ``dtype`` (the head rows'),
    ``fp8`` a sum of KV_FP8_Q and KV_FP8_CACHE."""
    if vec not in (0, vec_widths(dtype)[0]) or fp8 not in range(4):
        raise ValueError(f"no prologue_kernel for vec={vec!r}, fp8={fp8!r}")
    return (f"cuprope::prologue_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, {int(vec)}, "
            f"{int(fp8)}>")


def prologue_kernel_names(family: str | None = None) -> list[str]:
    """Every prologue_kernel instantiation (of one prologue family, or all)."""
    return [prologue_kernel_name(dt, il, v, f) for dt in DTYPE_CTYPES for f in range(4)
            if family in (None, prologue_family_of(dt, f)) for il in (False, True)
            for v in (0, vec_widths(dt)[0])]


# Blocks of the QK-norm kernels' threads (32 x CUPROPE_QKNORM_WARPS) that
# must fit an SM at once. 3 (the QK-norm head-rows forward's) spills 16-88
# bytes in the 16-bit head-rows instantiations (80 registers) and, on an
# H200, took a 16k prefill from 160 to 144 us but decode B 1024 from 14.8 to
# 16.1 us; 2 spills none (96-112 registers).
TUNING = {"CUPROPE_PROLOGUE_MIN_BLOCKS": 2}

kernels.register(ENTRY, FAMILIES, prologue_kernel_names, TUNING)
