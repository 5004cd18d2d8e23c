"""The rotation's kernel records (its launches: ``launch.py``,
``decode.py``): rope_kernel's plain and LRPE families and the
sequence-softmax statistics pass (kernels/rope.cu), and the decode rows with
the angle table's builder (kernels/kvcache.cu)."""
from __future__ import annotations

from .._core import kernels
from .._core.constants import (KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T, KV_TABLES_T, LRPE_ACTS,
                                SRC_PER_HEAD, SRC_SHARED, SRC_TABLE)
from .._core.kernels import DTYPE_CTYPES, cbool, vec_widths

ENTRY = "rope.cu"


def kernel_name(dtype: str, interleaved: bool, vec: int, src: int = SRC_SHARED,
                act: int = 0, backward: bool = False) -> str:
    """Name expression of one ``rope_kernel`` instantiation. ``src``: the angle
    source (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE); ``act`` / ``backward`` select
    the LRPE dialect (the kernel's ACT, BWD); the plain RoPE names leave
    them at their defaults."""
    if src not in (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE):
        raise ValueError(f"unknown angle source {src!r}")
    name = f"cuprope::rope_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, {vec}, {int(src)}"
    if act or backward:
        name += f", {act}, {cbool(backward)}"
    return name + ">"


def flat_kernel_name(dtype: str, interleaved: bool, vec: int, src: int = SRC_SHARED,
                     act: int = 0, backward: bool = False) -> str:
    """Name expression of the flat entry (kernels/flat.cuh) of the
    ``rope_kernel`` instantiation with these parameters."""
    return kernel_name(dtype, interleaved, vec, src, act, backward).replace(
        "cuprope::rope_kernel<", "cuprope::rope_flat_kernel<", 1)


def seq_stats_kernel_name(dtype: str, backward: bool) -> str:
    """The LRPE sequence-softmax statistics pass."""
    return f"cuprope::lrpe_seq_stats_kernel<{DTYPE_CTYPES[dtype]}, {cbool(backward)}>"


def lrpe_vec_widths(dtype: str) -> tuple[int, ...]:
    """LRPE kernels exist for the widest width and for 1 pair (any alignment)."""
    return (vec_widths(dtype)[0], 1)


# Instantiations are grouped into modules compiled on first use, so a model
# with shared frequencies never pays for the per-head or cos/sin-table
# variants, and plain RoPE never compiles the LRPE dialect (one family per
# activation).
_PLAIN_FAMILIES = {SRC_SHARED: "shared", SRC_PER_HEAD: "per_head", SRC_TABLE: "table"}
FAMILIES = tuple(_PLAIN_FAMILIES.values()) + tuple(f"lrpe_{a}" for a, c in LRPE_ACTS.items() if c)


def family_of(act: int, src: int) -> str:
    """The family holding the rope_kernel instantiation for ``act`` (0: plain)
    and angle source ``src``."""
    if act == 0:
        return _PLAIN_FAMILIES[src]
    for name, code in LRPE_ACTS.items():
        if code == act:
            return f"lrpe_{name}"
    raise ValueError(f"unknown LRPE activation code {act}")


def family_names(family: str) -> list[str]:
    """A plain or LRPE family's instantiations."""
    for src, name in _PLAIN_FAMILIES.items():
        if family == name:
            return [kernel_name(dt, il, v, src)
                    for dt in DTYPE_CTYPES for il in (False, True) for v in vec_widths(dt)]
    act = LRPE_ACTS[family[len("lrpe_"):]]
    names = [kernel_name(dt, False, v, src, act, bwd)
             for dt in DTYPE_CTYPES for v in lrpe_vec_widths(dt)
             for src in (SRC_SHARED, SRC_PER_HEAD) for bwd in (False, True)]
    if act == LRPE_ACTS["softmax_seq"]:
        names += [seq_stats_kernel_name(dt, bwd) for dt in DTYPE_CTYPES for bwd in (False, True)]
    return names


# The decode rows (rope_decode_kernel, kernels/decode.cuh: the core's and
# rotary_embedding's launches of few tokens) with the angle table's builder,
# compiled from the KV-cache translation unit.
DECODE_ENTRY = "kvcache.cu"
DECODE_FAMILY = "decode"
KV_ANGLE_TABLE_KERNEL = "cuprope::kv_angle_table_kernel"


def decode_kernel_name(dtype: str, interleaved: bool, src: int = KV_ANGLES) -> str:
    """Name expression of one ``rope_decode_kernel`` instantiation (the
    widest packs of ``dtype``): ``src`` KV_ANGLES (the angle table, float64
    past it), KV_COS_SIN_F32 or KV_COS_SIN_T (a cos_sin_cache; T: 16-bit
    dtypes only), KV_TABLES_T (the caller's [B, S, R] cos/sin tables)."""
    if src not in _DECODE_SOURCES or (
            src == KV_COS_SIN_T and dtype == "float32"):
        raise ValueError(f"no rope_decode_kernel for {dtype}, src={src!r}")
    return (f"cuprope::rope_decode_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, "
            f"{vec_widths(dtype)[0]}, {int(src)}>")


_DECODE_SOURCES = (KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T, KV_TABLES_T)


def decode_kernel_names(family: str = DECODE_FAMILY) -> list[str]:
    """The angle table's builder and every decode rows instantiation."""
    return [KV_ANGLE_TABLE_KERNEL] + [
        decode_kernel_name(dt, il, src) for dt in DTYPE_CTYPES for il in (False, True)
        for src in _DECODE_SOURCES
        if not (src == KV_COS_SIN_T and dt == "float32")]


kernels.register(ENTRY, FAMILIES, family_names)
kernels.register(DECODE_ENTRY, (DECODE_FAMILY,), decode_kernel_names)
