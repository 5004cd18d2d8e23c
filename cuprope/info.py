"""``python -m cuprope info``: versions, devices, and the kernel compile cache."""
from __future__ import annotations

import importlib
import os
import platform


def _version(mod):
    try:
        return importlib.import_module(mod).__version__
    except Exception:
        return "not installed"


def cache_dir() -> str:
    """CuPy's on-disk kernel cache (where cuprope's compiled kernels live)."""
    return os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache"))


def _dir_size(path):
    total = n = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
                n += 1
            except OSError:
                pass
    return total, n


def report() -> str:
    from . import __version__, gpu_available
    from ._core import loader as _loader
    lines = [f"cuprope {__version__} (kernel sources {_loader.source_hash()} in {_loader.kernel_dir()})",
             f"python {platform.python_version()}, numpy {_version('numpy')}, cupy {_version('cupy')}, "
             f"torch {_version('torch')}, jax {_version('jax')}, ml_dtypes {_version('ml_dtypes')}"]
    if gpu_available():
        import cupy
        for d in range(cupy.cuda.runtime.getDeviceCount()):
            p = cupy.cuda.runtime.getDeviceProperties(d)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            lines.append(f"GPU {d}: {name}, sm_{p['major']}{p['minor']}, {p['multiProcessorCount']} SMs, "
                         f"{p['totalGlobalMem'] / 2**30:.0f} GiB")
        lines.append(f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, "
                     f"driver {cupy.cuda.runtime.driverGetVersion()}")
    else:
        lines.append("GPU: none visible (CuPy missing or no CUDA device): the NumPy backend runs")
    path = cache_dir()
    size, n = _dir_size(path) if os.path.isdir(path) else (0, 0)
    lines.append(f"kernel compile cache: {path} ({n} files, {size / 2**20:.1f} MiB; set CUPY_CACHE_DIR "
                 f"to move it)")
    lines.append(f"to clear it: rm -rf {path}  (kernels recompile on next use, ~10-20 s per family)")
    return "\n".join(lines)
