"""DeepSeek MLA's kernel record: rope + latent-cache append (kernels/mla.cu,
a translation unit of its own): 3 dtypes x 2 pairings x the widest width
and 1 x the four fp8 combinations (KV_FP8_Q: q's outputs, KV_FP8_CACHE: the
cache), one family."""
from __future__ import annotations

from .._core import kernels
from .._core.args import ArgStruct
from .._core.kernels import DTYPE_CTYPES, cbool
from ..rope.kernels import lrpe_vec_widths

ENTRY = "mla.cu"
FAMILY = "mla"


def mla_kernel_name(dtype: str, interleaved: bool, vec: int, fp8: int = 0) -> str:
    """Name expression of one ``mla_rope_kernel`` instantiation."""
    if fp8 not in range(4):
        raise ValueError(f"no mla_rope_kernel for fp8={fp8!r}")
    return (f"cuprope::mla_rope_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, {vec}, "
            f"{int(fp8)}>")


def mla_kernel_names(family: str = FAMILY) -> list[str]:
    """Every mla_rope_kernel instantiation (the mla family)."""
    return [mla_kernel_name(dt, il, v, f) for dt in DTYPE_CTYPES for il in (False, True)
            for v in lrpe_vec_widths(dt) for f in range(4)]


# The pass-through packs (q_nope, ckv) and the rotated chunks a lane loads
# before it stores, so each warp keeps that many loads in flight; the blocks
# of CUPROPE_THREADS threads that must fit an SM at once (__launch_bounds__;
# 4: 64 registers, small spills, faster than 1 from T 256 up); the warps per
# SM the host fills before a warp takes more than one row of a token (host
# only; 48 the best compromise over T 1 .. 16k); CUPROPE_MLA_ROWS_PER_WARP > 0
# fixes the rows per warp instead (host only, for sweeps).
TUNING = {"CUPROPE_MLA_UNROLL": 4, "CUPROPE_MLA_ROT_UNROLL": 1, "CUPROPE_MLA_MIN_BLOCKS": 4,
          "CUPROPE_MLA_WARPS_PER_SM": 48, "CUPROPE_MLA_ROWS_PER_WARP": 0}

# struct MlaArgs (kernels/mla.cuh), the kernel's third argument (all int64).
MLA_ARGS = ArgStruct("MlaArgs", tuple((name, 1, "q") for name in (
    "qn_ptr", "qn_st", "qn_sh", "qno_ptr", "qno_st", "qno_sh", "nope_dim", "ckv_dim")))

kernels.register(ENTRY, (FAMILY,), mla_kernel_names, TUNING)
