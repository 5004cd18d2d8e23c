"""Builds the kernel module: one CuPy ``RawModule`` per device, compiled lazily.

The ``.cu``/``.cuh`` sources ship inside the package (``cuprope.kernels``).
CuPy's on-disk cache keys on the source string and options but not on
``#include``d files, so a hash of every file in the kernel folder is passed as
a ``-D`` option: editing any header changes the key.
"""
from __future__ import annotations

import hashlib
import os
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


# Angle sources (kernels/rope.cuh kSrc*): the rope_kernel template's SRC.
SRC_SHARED, SRC_PER_HEAD, SRC_TABLE = 0, 1, 2


def kernel_name(dtype: str, interleaved: bool, vec: int, src: int = SRC_SHARED,
                act: int = 0, backward: bool = False) -> str:
    """Name expression of one ``rope_kernel`` instantiation. ``src``: the angle
    source (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE); ``act`` / ``backward`` select
    the LRPE dialect (kernels/rope.cuh ACT, BWD); the plain RoPE names leave
    them at their defaults."""
    if src not in (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE):
        raise ValueError(f"unknown angle source {src!r}")
    name = f"cuprope::rope_kernel<{DTYPE_CTYPES[dtype]}, {_b(interleaved)}, {vec}, {int(src)}"
    if act or backward:
        name += f", {act}, {_b(backward)}"
    return name + ">"


def seq_stats_kernel_name(dtype: str, backward: bool) -> str:
    """The LRPE sequence-softmax statistics pass (kernels/rope.cuh)."""
    return f"cuprope::lrpe_seq_stats_kernel<{DTYPE_CTYPES[dtype]}, {_b(backward)}>"


# LRPE activation codes (kernels/rope.cuh kAct*) and the lazily built family
# holding each one's kernels.
LRPE_ACTS = {"relu": 1, "sigmoid": 2, "silu": 3, "softmax": 4, "softmax_seq": 5}


def lrpe_vec_widths(dtype: str) -> tuple[int, ...]:
    """LRPE kernels exist for the widest width and for 1 pair (any alignment)."""
    return (vec_widths(dtype)[0], 1)


# Instantiations are grouped into modules compiled on first use, so a model
# with shared frequencies never pays for the per-head or cos/sin-table
# variants, and plain RoPE never compiles the LRPE dialect (one family per
# activation).
_PLAIN_FAMILIES = {SRC_SHARED: "shared", SRC_PER_HEAD: "per_head", SRC_TABLE: "table"}
FAMILIES = tuple(_PLAIN_FAMILIES.values()) + tuple(f"lrpe_{a}" for a in LRPE_ACTS)


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


def kernel_dir():
    """The folder holding the kernel sources: ``cuprope/kernels`` in an
    installed package, ``kernels/`` beside ``cuprope/`` in a source checkout."""
    try:
        return resources.files(KERNEL_PACKAGE)
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "kernels"


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


def tuning_defines() -> dict[str, str]:
    """``-D`` overrides from the CUPROPE_KERNEL_DEFINES environment variable, a
    tuning hook (benchmarks/tune.py), e.g. ``"CUPROPE_ROWS16=2 CUPROPE_MIN_BLOCKS=3"``."""
    out = {}
    for tok in os.environ.get("CUPROPE_KERNEL_DEFINES", "").split():
        name, _, value = tok.partition("=")
        out[name] = value
    return out


def compile_options() -> tuple[str, ...]:
    """NVRTC options (CuPy adds the arch and its own standard flags)."""
    extra = tuple(f"-D{k}={v}" if v else f"-D{k}" for k, v in tuning_defines().items())
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

        names = all_kernel_names(family)
        code = kernel_sources()[ENTRY]
        with cupy.cuda.Device(device_id):
            module = cupy.RawModule(code=code, options=compile_options(), name_expressions=names)
            return {n: module.get_function(n) for n in names}


MODULES = _Modules()
