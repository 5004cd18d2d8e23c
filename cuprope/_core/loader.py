"""Builds the kernel module: one CuPy ``RawModule`` per device, compiled lazily.

The ``.cu``/``.cuh`` sources ship inside the package (``cuprope.kernels``).
CuPy's on-disk cache keys on the source string and options but not on
``#include``d files, so a hash of every file in the kernel folder is passed as
a ``-D`` option: editing any header changes the key. The constants the kernels
share with the host and their tuning values (each record's, gathered in
constants.py) are passed as ``-D`` options too. Which
translation unit a family is compiled from, and its instantiations, come
from the family's record (kernels.py): the loader names no kernel.
"""
from __future__ import annotations

import hashlib
import threading
from importlib import resources
from pathlib import Path

KERNEL_PACKAGE = "cuprope.kernels"

# The name-building pieces and the registry (kernels.py), re-exported.
from .kernels import DTYPE_CTYPES, ITEMSIZE, all_kernel_names, family_names, vec_widths  # noqa: F401

# The codes and tuning values the records declared (constants.py),
# re-exported: the loader's callers and the kernels' -D options read the same
# objects.
from .constants import CODES, TUNING, TUNING_DEFAULTS, _overrides, tuning  # noqa: F401


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
