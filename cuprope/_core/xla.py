"""The CUDA lowering machinery of ``cuprope.jax``: an aval read as an array
(``AvalInfo``), host tables as constant operands, and one launch as
jaxlib's GPU kernel call (:func:`kernel_call`), a flat call
(``launcher.flat_call``) resolved against a lowering's inputs (:func:`emit`).
Every word is fixed at lowering time; the pointers come from XLA when the
program runs.
"""
from __future__ import annotations

import zlib

import numpy as np

from . import kernels, launch, ptx

class AvalInfo:
    """An aval (anything with ``shape`` and ``dtype``) as the validation and
    launch layers read an array (``cuprope._core.arrays.ArrayInfo``'s fields):
    row-major, as XLA lays out the kernel call's buffers, on device 0, at
    address 0 (XLA passes the buffers when the program runs)."""

    kind, device, ptr = "jax", 0, 0

    def __init__(self, aval):
        self.shape = tuple(aval.shape)
        self.dtype = np.dtype(aval.dtype).name
        self.itemsize = np.dtype(aval.dtype).itemsize
        self.strides = row_major(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape))


def row_major(shape):
    """Element strides of a row-major array (XLA's layout for these operands)."""
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


def sm_count():
    """The GPU's multiprocessor count (the grid is sized for it, as the eager
    path sizes it from CuPy's device properties)."""
    import jax
    return int(getattr(jax.devices("cuda")[0], "core_count", 0) or launch.sm_count(0))


def layout_of(aval):
    """The row-major operand/result layout of an aval (minor-to-major dims)."""
    return list(reversed(range(len(aval.shape))))


def constant_operand(table):
    """A host table as a constant operand, bit for bit (float64 as uint32
    words: no x64 needed), and its layout."""
    from jax.interpreters import mlir
    table = np.ascontiguousarray(table)
    return mlir.ir_constant(np.frombuffer(table.tobytes(), dtype=np.uint32)), [0]


# jaxlib registers triton_kernel_call with XLA: a custom call whose opaque data
# names a PTX entry, its grid, block (warps), shared memory and flat
# parameters, each either an XLA buffer (taken in buffer order: operands, then
# results) or a scalar. cuprope's kernels take one argument struct, which no
# flat parameter list can carry, so each instantiation also has a flat entry
# (kernels/flat.cuh, an op's flat header; its parameters generated from the
# record's ArgStruct): the struct's pointers first, in XLA's buffer
# order, then its other words in struct order.
def kernel_call(name, *, entry, grid, warps, smem, params, operands, operand_layouts,
                result_avals, operand_output_aliases=None):
    """The results of one ``triton_kernel_call`` custom call launching the
    instantiation ``name`` (a name expression of translation unit
    ``entry``; PTX from NVRTC, compiled for the GPU's compute capability)
    on ``grid`` (3 ints) with blocks of ``warps`` warps in one dimension and
    ``smem`` bytes of dynamic shared memory. ``params``: ("array", align) /
    ("scalar", value, kind) in the kernel's parameter order, the array
    parameters taking ``operands`` then the results in order. Everything is
    fixed here; XLA only supplies the buffers. ``operand_output_aliases``
    ({operand index: result index}): results that are their operand's buffer
    (XLA's custom-call aliasing)."""
    from jax._src.interpreters import mlir as _mlir
    from jax._src.lib import gpu_triton as kc
    from jax._src.lib.mlir import ir
    from jax.interpreters import mlir

    cc = kc.get_compute_capability(0)
    text, lowered = ptx.compile_ptx(name, cc, entry)
    made = [kc.create_array_parameter(0, p[1]) if p[0] == "array"
            else kc.create_scalar_parameter(p[1], p[2]) for p in params]
    kernel = kc.TritonKernel(lowered, int(warps), 1, int(smem), text, "", cc)
    kcall = kc.TritonKernelCall(kernel, *[int(g) for g in grid], made)
    out_types = [ir.RankedTensorType.get(a.shape, mlir.dtype_to_ir_type(a.dtype))
                 for a in result_avals]
    return _mlir.custom_call(
        "triton_kernel_call", result_types=out_types, operands=list(operands),
        backend_config=zlib.compress(kcall.to_proto(lowered, b"")), api_version=2,
        operand_layouts=list(operand_layouts), operand_output_aliases=operand_output_aliases,
        result_layouts=[layout_of(a) for a in result_avals]).results


def emit(ctx, ins, fc, part=None, aliases=None):
    """The results of the flat call ``fc`` (launcher.FlatCall) in a lowering:
    its operand references resolved against the lowering's inputs ``ins``
    (``part``: the ir value an ("part",) reference reads), its results
    ``fc.results`` or, when empty, the context's; ``aliases``: as
    kernel_call's ``operand_output_aliases``."""
    operands, layouts = [], []
    for ref in fc.operands:
        if ref[0] == "operand":
            operands.append(ins[ref[1]])
            layouts.append(layout_of(ctx.avals_in[ref[1]]))
        elif ref[0] == "constant":  # a host table, bit for bit
            op, lay = constant_operand(ref[1])
            operands.append(op)
            layouts.append(lay)
        else:
            operands.append(part)
            layouts.append([0])
    import jax
    result_avals = ([jax.core.ShapedArray(s, d) for s, d in fc.results] if fc.results
                    else ctx.avals_out)
    return kernel_call(fc.name, entry=kernels.record_of(fc.family).entry, grid=fc.grid,
                       warps=fc.warps, smem=fc.smem, params=fc.params, operands=operands,
                       operand_layouts=layouts, result_avals=result_avals,
                       operand_output_aliases=aliases)
