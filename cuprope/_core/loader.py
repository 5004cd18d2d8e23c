"""Builds the kernel module: one CuPy ``RawModule`` per device, compiled lazily.

The ``.cu``/``.cuh`` sources ship inside the package (``cuprope.kernels``).
CuPy's on-disk cache keys on the source string and options but not on
``#include``d files, so a hash of every file in the kernel folder is passed as
a ``-D`` option: editing any header changes the key. The constants the kernels
share with the host are defined here and passed as ``-D`` options too.
"""
from __future__ import annotations

import hashlib
import threading
from importlib import resources
from pathlib import Path

KERNEL_PACKAGE = "cuprope.kernels"
ENTRY = "rope.cu"

DTYPE_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def vec_widths(dtype: str) -> tuple[int, ...]:
    """Pairs per thread that a kernel is instantiated for, widest first.

    The widest gives 16-byte loads (8 half/bf16 or 4 float elements)."""
    widest = 16 // ITEMSIZE[dtype]
    return tuple(v for v in (8, 4, 2, 1) if v <= widest)


def _b(flag: bool) -> str:
    return "true" if flag else "false"


# The constants and tuning values (constants.py), re-exported: the loader's
# callers and the kernels' -D options read the same objects.
from .constants import (CODES, KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T, KV_FP8_CACHE,  # noqa: F401
                        KV_FP8_Q, LRPE_ACTS, SEQ_SLICES, SRC_PER_HEAD, SRC_SHARED, SRC_TABLE,
                        TUNING, TUNING_DEFAULTS, _overrides, tuning)


def kernel_name(dtype: str, interleaved: bool, vec: int, src: int = SRC_SHARED,
                act: int = 0, backward: bool = False) -> str:
    """Name expression of one ``rope_kernel`` instantiation. ``src``: the angle
    source (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE); ``act`` / ``backward`` select
    the LRPE dialect (the kernel's ACT, BWD); the plain RoPE names leave
    them at their defaults."""
    if src not in (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE):
        raise ValueError(f"unknown angle source {src!r}")
    name = f"cuprope::rope_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, {vec}, {int(src)}"
    if act or backward:
        name += f", {act}, {_b(backward)}"
    return name + ">"


def flat_kernel_name(dtype: str, interleaved: bool, vec: int, src: int = SRC_SHARED,
                     act: int = 0, backward: bool = False) -> str:
    """Name expression of the flat entry (kernels/flat.cuh) of the
    ``rope_kernel`` instantiation with these parameters."""
    return kernel_name(dtype, interleaved, vec, src, act, backward).replace(
        "cuprope::rope_kernel<", "cuprope::rope_flat_kernel<", 1)


def seq_stats_kernel_name(dtype: str, backward: bool) -> str:
    """The LRPE sequence-softmax statistics pass."""
    return f"cuprope::lrpe_seq_stats_kernel<{DTYPE_CTYPES[dtype]}, {_b(backward)}>"


def qknorm_kernel_name(dtype: str, interleaved: bool, backward: bool) -> str:
    """Name expression of one ``qknorm_kernel`` instantiation (kernels/qknorm.cuh)."""
    return f"cuprope::qknorm_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, {_b(backward)}>"


def _model(model: bool) -> str:
    return ", true" if model else ""  # MODEL's default (false) left out of the name


def qknorm_rows_kernel_name(dtype: str, interleaved: bool, backward: bool,
                            model: bool = False) -> str:
    """Name expression of the fast path ``qknorm_rows_kernel`` (norm per head,
    R = D, the widest packs) for ``dtype``; ``model``: its model modes'
    instantiation (a model rounding, the caller's tables)."""
    return (f"cuprope::qknorm_rows_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, "
            f"{vec_widths(dtype)[0]}, {_b(backward)}{_model(model)}>")


def qknorm_flat_kernel_name(dtype: str, interleaved: bool, vec: int, backward: bool,
                            model: bool = False) -> str:
    """Name expression of the flat entry (kernels/qknorm_flat.cuh) of
    ``qknorm_kernel`` (``vec`` 0) or of ``qknorm_rows_kernel`` at pack width
    ``vec`` (the widest of ``dtype``, as the fast path launches it; ``model``
    as there)."""
    return (f"cuprope::qknorm_flat_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, {int(vec)}, "
            f"{_b(backward)}{_model(model)}>")


QKNORM_DW_KERNEL = "cuprope::qknorm_dw_kernel"
"""The QK-norm weight-gradient reduction (kernels/qknorm.cuh)."""


def lrpe_vec_widths(dtype: str) -> tuple[int, ...]:
    """LRPE kernels exist for the widest width and for 1 pair (any alignment)."""
    return (vec_widths(dtype)[0], 1)


# Instantiations are grouped into modules compiled on first use, so a model
# with shared frequencies never pays for the per-head or cos/sin-table
# variants, and plain RoPE never compiles the LRPE dialect (one family per
# activation).
_PLAIN_FAMILIES = {SRC_SHARED: "shared", SRC_PER_HEAD: "per_head", SRC_TABLE: "table"}
FAMILIES = (tuple(_PLAIN_FAMILIES.values()) + tuple(f"lrpe_{a}" for a, c in LRPE_ACTS.items() if c)
            + ("qknorm",))


def family_of(act: int, src: int) -> str:
    """The family holding the rope_kernel instantiation for ``act`` (0: plain)
    and angle source ``src``."""
    if act == 0:
        return _PLAIN_FAMILIES[src]
    for name, code in LRPE_ACTS.items():
        if code == act:
            return f"lrpe_{name}"
    raise ValueError(f"unknown LRPE activation code {act}")


def _family_names(family: str) -> list[str]:
    if family == "qknorm":
        return [fn(dt, il, bwd) for fn in (qknorm_kernel_name, qknorm_rows_kernel_name)
                for dt in DTYPE_CTYPES for il in (False, True)
                for bwd in (False, True)] + [
            qknorm_rows_kernel_name(dt, il, bwd, True) for dt in DTYPE_CTYPES
            for il in (False, True) for bwd in (False, True)] + [QKNORM_DW_KERNEL]
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


def all_kernel_names(family: str | None = None) -> list[str]:
    """Every instantiation the Python side can launch (of one family, or all)."""
    fams = FAMILIES if family is None else (family,)
    return [n for fam in fams for n in _family_names(fam)]


# The KV-cache dialect's families (kernels/kvcache.cu, a translation unit of
# its own): computed angles with every fp8 combination, and the cos_sin_cache
# source (no fp8). Widths: the widest and 1 (any alignment).
KV_ENTRY = "kvcache.cu"
# computed angles; the cos_sin_cache sources; the computed angles' WIDE
# instantiations (widest packs, held to more resident warps: many-wave grids),
# compiled only when a launch first takes one; the decode rows
# (rope_decode_kernel, kernels/decode.cuh: the core's and rotary_embedding's
# launches of few tokens) with the angle table's builder
KV_FAMILIES = ("kvcache", "kvcache_cos_sin", "kvcache_wide", "decode")


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
    return (f"cuprope::kv_rope_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, {vec}, "
            f"{int(src)}, {int(fp8)}, {_b(wide)}>")


KV_ANGLE_TABLE_KERNEL = "cuprope::kv_angle_table_kernel"


def decode_kernel_name(dtype: str, interleaved: bool, src: int = KV_ANGLES) -> str:
    """Name expression of one ``rope_decode_kernel`` instantiation (the
    widest packs of ``dtype``): ``src`` KV_ANGLES (the angle table, float64
    past it), KV_COS_SIN_F32 or KV_COS_SIN_T (a cos_sin_cache; T: 16-bit
    dtypes only)."""
    if src not in (KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T) or (
            src == KV_COS_SIN_T and dtype == "float32"):
        raise ValueError(f"no rope_decode_kernel for {dtype}, src={src!r}")
    return (f"cuprope::rope_decode_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, "
            f"{vec_widths(dtype)[0]}, {int(src)}>")


def kv_family_of(src: int, wide: bool = False) -> str:
    """The family holding kv_rope_kernel's instantiations for angle source
    ``src`` (``wide``: the WIDE ones)."""
    if wide:
        return KV_FAMILIES[2]
    return KV_FAMILIES[0] if src == KV_ANGLES else KV_FAMILIES[1]


def kv_kernel_names(family: str | None = None) -> list[str]:
    """Every kv_rope_kernel instantiation (of one KV family, or all), the
    decode rows' and the angle table's builder (in the decode family)."""
    names = [KV_ANGLE_TABLE_KERNEL] if family in (None, KV_FAMILIES[3]) else []
    for dt in DTYPE_CTYPES:
        for il in (False, True):
            if family in (None, KV_FAMILIES[3]):
                names += [decode_kernel_name(dt, il, src)
                          for src in (KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T)
                          if not (src == KV_COS_SIN_T and dt == "float32")]
            for v in lrpe_vec_widths(dt):
                if family in (None, KV_FAMILIES[0]):
                    names += [kv_kernel_name(dt, il, v, KV_ANGLES, f) for f in range(4)]
                if family in (None, KV_FAMILIES[1]):
                    srcs = (KV_COS_SIN_F32,) if dt == "float32" else (KV_COS_SIN_F32, KV_COS_SIN_T)
                    names += [kv_kernel_name(dt, il, v, src) for src in srcs]
                if family in (None, KV_FAMILIES[2]) and v == lrpe_vec_widths(dt)[0]:
                    names += [kv_kernel_name(dt, il, v, KV_ANGLES, f, True) for f in range(4)]
    return names


# DeepSeek MLA's rope + latent-cache append (kernels/mla.cu, a translation
# unit of its own): 3 dtypes x 2 pairings x the widest width and 1 x the four
# fp8 combinations (KV_FP8_Q: q's outputs, KV_FP8_CACHE: the cache).
MLA_ENTRY = "mla.cu"
MLA_FAMILY = "mla"


def mla_kernel_name(dtype: str, interleaved: bool, vec: int, fp8: int = 0) -> str:
    """Name expression of one ``mla_rope_kernel`` instantiation."""
    if fp8 not in range(4):
        raise ValueError(f"no mla_rope_kernel for fp8={fp8!r}")
    return (f"cuprope::mla_rope_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, {vec}, "
            f"{int(fp8)}>")


def mla_kernel_names() -> list[str]:
    """Every mla_rope_kernel instantiation (the mla family)."""
    return [mla_kernel_name(dt, il, v, f) for dt in DTYPE_CTYPES for il in (False, True)
            for v in lrpe_vec_widths(dt) for f in range(4)]


# The decode prologue (kernels/prologue.cu, a translation unit of its own):
# one family per dtype and fp8 combination (a call compiles only its own),
# prologue_kernel for the general QK-norm body (vec 0) and the head-rows fast
# path (the widest packs), both pairings.
PROLOGUE_ENTRY = "prologue.cu"
PROLOGUE_FAMILIES = tuple(f"prologue_{dt}_{f}" for dt in DTYPE_CTYPES for f in range(4))


def prologue_family_of(dtype: str, fp8: int) -> str:
    """The family holding the prologue kernels of ``dtype`` and ``fp8``."""
    return f"prologue_{dtype}_{int(fp8)}"


def prologue_kernel_name(dtype: str, interleaved: bool, vec: int, fp8: int = 0) -> str:
    """Name expression of one ``prologue_kernel`` instantiation: ``vec`` 0
    (qknorm_kernel's body) or the widest width of ``dtype`` (the head rows'),
    ``fp8`` a sum of KV_FP8_Q and KV_FP8_CACHE."""
    if vec not in (0, vec_widths(dtype)[0]) or fp8 not in range(4):
        raise ValueError(f"no prologue_kernel for vec={vec!r}, fp8={fp8!r}")
    return (f"cuprope::prologue_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, {int(vec)}, "
            f"{int(fp8)}>")


def prologue_kernel_names(family: str | None = None) -> list[str]:
    """Every prologue_kernel instantiation (of one prologue family, or all)."""
    return [prologue_kernel_name(dt, il, v, f) for dt in DTYPE_CTYPES for f in range(4)
            if family in (None, prologue_family_of(dt, f)) for il in (False, True)
            for v in (0, vec_widths(dt)[0])]


def kernel_dir():
    """The folder holding the kernel sources: ``cuprope/kernels`` in an
    installed package, ``kernels/`` beside ``cuprope/`` in a source checkout."""
    try:
        return resources.files(KERNEL_PACKAGE)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "kernels"


def family_names(family: str) -> tuple[list[str], str]:
    """A kernel family's instantiations and the translation unit holding them."""
    if family == MLA_FAMILY:
        return mla_kernel_names(), MLA_ENTRY
    if family in PROLOGUE_FAMILIES:
        return prologue_kernel_names(family), PROLOGUE_ENTRY
    if family in KV_FAMILIES:
        return kv_kernel_names(family), KV_ENTRY
    return all_kernel_names(family), ENTRY


def kernel_sources() -> dict[str, str]:
    """All ``.cu``/``.cuh`` files of the kernel folder, by name."""
    folder = kernel_dir()
    return {p.name: p.read_text() for p in sorted(folder.iterdir(), key=lambda p: p.name)
            if p.name.endswith((".cu", ".cuh"))}


def source_hash() -> str:
    h = hashlib.sha256()
    for name, text in kernel_sources().items():
        h.update(name.encode())
        h.update(b"\0")
        h.update(text.encode())
    return h.hexdigest()[:16]


def compile_options() -> tuple[str, ...]:
    """NVRTC options (CuPy adds the arch and its own standard flags): the
    include path, the source hash (the cache key) and every kernel constant."""
    defines = {**CODES, **TUNING}
    extra = tuple(f"-D{k}={v}" if v != "" else f"-D{k}" for k, v in defines.items())
    return (f"-I{kernel_dir()}", f"-DCUPROPE_SOURCE_HASH=0x{source_hash()}ULL") + extra


class _Modules:
    """Per-(device, family) cache of the compiled module and its functions."""

    def __init__(self):
        self._lock = threading.Lock()
        self._built: dict[tuple[int, str], dict[str, object]] = {}

    def functions(self, device_id: int, family: str = "shared") -> dict[str, object]:
        key = (device_id, family)
        fns = self._built.get(key)
        if fns is None:
            with self._lock:
                fns = self._built.get(key)
                if fns is None:
                    fns = self._build(device_id, family)
                    self._built[key] = fns
        return fns

    @staticmethod
    def _build(device_id: int, family: str) -> dict[str, object]:
        import cupy

        names, entry = family_names(family)
        code = kernel_sources()[entry]
        with cupy.cuda.Device(device_id):
            module = cupy.RawModule(code=code, options=compile_options(), name_expressions=names)
            return {n: module.get_function(n) for n in names}


MODULES = _Modules()
