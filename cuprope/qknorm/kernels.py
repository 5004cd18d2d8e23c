"""QK-norm's kernel record: the ``qknorm`` family (kernels/qknorm.cuh and
qknorm_flat.cuh, compiled from kernels/rope.cu), its name expressions, its
tuning values and its argument structs (and flat entry)."""
from __future__ import annotations

from .._core import kernels
from .._core.args import ArgStruct, declare_flat
from ..rope.args import ROPE_ARGS
from .._core.kernels import DTYPE_CTYPES, cbool, vec_widths

ENTRY = "rope.cu"
FAMILY = "qknorm"


def qknorm_kernel_name(dtype: str, interleaved: bool, backward: bool) -> str:
    """Name expression of one ``qknorm_kernel`` instantiation (kernels/qknorm.cuh)."""
    return f"cuprope::qknorm_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, {cbool(backward)}>"


def _model(model: bool) -> str:
    return ", true" if model else ""  # MODEL's default (false) left out of the name


def qknorm_rows_kernel_name(dtype: str, interleaved: bool, backward: bool,
                            model: bool = False) -> str:
    """Name expression of the fast path ``qknorm_rows_kernel`` (norm per head,
    R = D, the widest packs) for ``dtype``; ``model``: its model modes'
    instantiation (a model rounding, the caller's tables)."""
    return (f"cuprope::qknorm_rows_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, "
            f"{vec_widths(dtype)[0]}, {cbool(backward)}{_model(model)}>")


def qknorm_flat_kernel_name(dtype: str, interleaved: bool, vec: int, backward: bool,
                            model: bool = False) -> str:
    """Name expression of the flat entry (kernels/qknorm_flat.cuh) of
    ``qknorm_kernel`` (``vec`` 0) or of ``qknorm_rows_kernel`` at pack width
    ``vec`` (the widest of ``dtype``, as the fast path launches it; ``model``
    as there)."""
    return (f"cuprope::qknorm_flat_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, {int(vec)}, "
            f"{cbool(backward)}{_model(model)}>")


QKNORM_DW_KERNEL = "cuprope::qknorm_dw_kernel"
"""The QK-norm weight-gradient reduction (kernels/qknorm.cuh)."""


def qknorm_kernel_names(family: str = FAMILY) -> list[str]:
    """Every instantiation of the qknorm family."""
    return [fn(dt, il, bwd) for fn in (qknorm_kernel_name, qknorm_rows_kernel_name)
            for dt in DTYPE_CTYPES for il in (False, True)
            for bwd in (False, True)] + [
        qknorm_rows_kernel_name(dt, il, bwd, True) for dt in DTYPE_CTYPES
        for il in (False, True) for bwd in (False, True)] + [QKNORM_DW_KERNEL]


# Warps per block of every QK-norm kernel (their __launch_bounds__ are 32
# times it; the weight-gradient reduction sums this many slices of rows);
# the blocks that must fit an SM at once for the fast path
# (qknorm_rows_kernel and its flat entry), forward and backward; the floats
# of padding after each head row of dw terms in the fast backward's shared
# memory (whole float4s; 4 spreads a warp's float4 accesses over all banks:
# kernels kDwPad); the rows kernel's load ring, in units (a warp's step) per
# warp, forward and backward (0: the next unit in registers; at 8 warps a
# block the backward's ring does not fit 48 KB beside its dw rows).
TUNING = {"CUPROPE_QKNORM_WARPS": 8, "CUPROPE_QKNORM_MIN_BLOCKS": 3,
          "CUPROPE_QKNORM_MIN_BLOCKS_BWD": 2, "CUPROPE_QKNORM_DW_PAD": 4,
          "CUPROPE_QKNORM_STAGES": 3, "CUPROPE_QKNORM_STAGES_BWD": 0}

# struct QkNormArgs (kernels/qknorm.cuh): a RopeArgs, then the norm's fields;
# its flat entry's parameters (kernels/qknorm_flat.cuh) are generated from it.
QKNORM_ARGS = ArgStruct("QkNormArgs", ROPE_ARGS.fields + (
    ("x_ptr", 2, "q"), ("x_sb", 2, "q"), ("x_ss", 2, "q"), ("x_sh", 2, "q"), ("w_ptr", 2, "q"),
    ("w_dtype", 2, "q"), ("w_col", 2, "q"), ("part_ptr", 1, "q"), ("part_cols", 1, "q"),
    ("norm_token", 1, "q"), ("rope_first", 1, "q"), ("rounding", 1, "q"), ("table", 1, "q"),
    ("step_groups", 1, "q"), ("eps", 1, "d"), ("weight_offset", 1, "d"),
), pointers=("in_ptr0", "in_ptr1", "x_ptr0", "x_ptr1", "pos_ptr", "seq_off_ptr", "w_ptr0",
             "w_ptr1", "inv_freq_ptr", "stream_map_ptr", "out_ptr0", "out_ptr1", "part_ptr"),
    outputs=("out_ptr0", "out_ptr1", "part_ptr"))

# qknorm_dw_kernel's parameters (kernels/qknorm.cuh), one scalar each.
DW_ARGS = ArgStruct("qknorm_dw_kernel", tuple((n, 1, "q") for n in (
    "part_ptr", "rows", "stride", "col0", "cols", "out_ptr", "out_dtype")), spread=True)

kernels.register(ENTRY, (FAMILY,), qknorm_kernel_names, TUNING)
declare_flat("CUPROPE_FLAT_QKNORM", QKNORM_ARGS)
