"""``python -m cuprope info``: versions, devices (or why none is used), and
the kernel compile cache."""
from __future__ import annotations

import importlib
import os
import platform
from typing import NamedTuple

# cudaError_t values (CUDA runtime API) that say why no device is usable
ERR_STUB_LIBRARY = 34          # cudaErrorStubLibrary: libcuda is the toolkit's stub, not a driver
ERR_INSUFFICIENT_DRIVER = 35   # cudaErrorInsufficientDriver: no driver, or one too old
ERR_NO_DEVICE = 100            # cudaErrorNoDevice: a driver, but no device visible


class CudaState(NamedTuple):
    """Whether cuprope's GPU kernels can run here, and if not why.

    kind: "gpu", "no-cupy", "no-driver", "old-driver", "no-gpu" or
    "cuda-error"; reason: a few words ("no CUDA driver"); detail: one
    sentence with the evidence and what to do; devices: the device count."""
    kind: str
    reason: str
    detail: str
    devices: int = 0

    @property
    def usable(self) -> bool:
        return self.kind == "gpu"


def cuda_version(v: int) -> str:
    """A CUDA version number as text: 13020 -> "13.2"."""
    return f"{v // 1000}.{v % 1000 // 10}"


def cuda_state() -> CudaState:
    """Import CuPy and ask its CUDA runtime (never raises)."""
    try:
        import cupy
    except ImportError as e:
        return CudaState("no-cupy", "CuPy not installed",
                         f"CuPy not installed ({e}): pip install cupy-cuda13x (or cupy-cuda12x for "
                         f"a CUDA 12 driver), e.g. pip install \"cuprope[cuda13]\"")
    except Exception as e:  # a broken install: a missing shared library, etc.
        return CudaState("no-cupy", "CuPy failed to import",
                         f"CuPy failed to import: {type(e).__name__}: {e}")
    return runtime_state(cupy.cuda.runtime)


def runtime_state(rt) -> CudaState:
    """The state a CUDA runtime module (``cupy.cuda.runtime``) reports:
    ``driverGetVersion()`` is 0 where no driver is installed, and
    ``getDeviceCount()`` raises cudaErrorInsufficientDriver (no driver, or
    one too old for the runtime) or cudaErrorNoDevice (no GPU)."""
    try:
        driver = int(rt.driverGetVersion())
    except Exception:
        driver = 0
    try:
        runtime = f"CUDA runtime {cuda_version(int(rt.runtimeGetVersion()))}"
    except Exception:
        runtime = "its CUDA runtime"
    try:
        n = int(rt.getDeviceCount())
    except Exception as e:
        status = getattr(e, "status", None)
        if driver == 0 or status == ERR_STUB_LIBRARY:
            return CudaState("no-driver", "no CUDA driver",
                             f"no CUDA driver: CuPy is installed (with {runtime}) but no NVIDIA "
                             f"driver was found ({e})")
        if status == ERR_INSUFFICIENT_DRIVER:
            return CudaState("old-driver", "CUDA driver too old",
                             f"the CUDA driver (CUDA {cuda_version(driver)}) is older than CuPy's "
                             f"{runtime} ({e}): update the driver, or install the CuPy wheel for "
                             f"the driver's CUDA major version (cupy-cuda12x / cupy-cuda13x)")
        if status == ERR_NO_DEVICE:
            return _no_gpu(driver, str(e))
        return CudaState("cuda-error", "CUDA error", f"CUDA error while counting devices: {e}")
    if n == 0:
        return _no_gpu(driver, "0 devices")
    return CudaState("gpu", f"{n} GPU{'s' if n > 1 else ''}", f"CUDA driver "
                     f"{cuda_version(driver)}, {runtime}", n)


def _no_gpu(driver, evidence):
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hint = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return CudaState("no-gpu", "no GPU", f"no GPU: the CUDA driver (CUDA {cuda_version(driver)}) "
                     f"is installed but sees no device ({evidence}{hint})")


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
    from .. import __version__
    from .._core import loader as _loader
    lines = [f"cuprope {__version__} (kernel sources {_loader.source_hash()} in {_loader.kernel_dir()})",
             f"python {platform.python_version()}, numpy {_version('numpy')}, cupy {_version('cupy')}, "
             f"torch {_version('torch')}, jax {_version('jax')}, ml_dtypes {_version('ml_dtypes')}"]
    state = cuda_state()
    if state.usable:
        import cupy
        for d in range(state.devices):
            p = cupy.cuda.runtime.getDeviceProperties(d)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            lines.append(f"GPU {d}: {name}, sm_{p['major']}{p['minor']}, {p['multiProcessorCount']} SMs, "
                         f"{p['totalGlobalMem'] / 2**30:.0f} GiB")
        lines.append(state.detail)
    else:
        lines.append(f"GPU: none used: {state.detail}")
        lines.append("the NumPy backend runs (float64 on the host: a reference, far slower than "
                     "the GPU kernels)")
    path = cache_dir()
    size, n = _dir_size(path) if os.path.isdir(path) else (0, 0)
    lines.append(f"kernel compile cache: {path} ({n} files, {size / 2**20:.1f} MiB; set CUPY_CACHE_DIR "
                 f"to move it)")
    lines.append(f"to clear it: rm -rf {path}  (kernels recompile on next use, ~10-20 s per family)")
    return "\n".join(lines)
