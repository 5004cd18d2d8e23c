"""PTX of single kernel instantiations, for launchers that load PTX themselves
(jaxlib's GPU kernel call, which ``cuprope.jax`` lowers to).

Each instantiation is compiled alone by NVRTC (through CuPy's bindings, the
compiler cuprope already uses) with the package's options, so the launcher
assembles only what it launches. Results are kept in memory and on disk
(``CUPROPE_CACHE_DIR``, default ``~/.cache/cuprope``), keyed by the kernel
sources' hash, the options, the architecture and NVRTC's version.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from . import args, loader

_LOCK = threading.Lock()
_MEMORY: dict = {}


def cache_dir() -> Path:
    return Path(os.environ.get("CUPROPE_CACHE_DIR", Path.home() / ".cache" / "cuprope"))


def _include_dirs():
    """Where cuda_fp16.h and cuda_bf16.h live: the CUDA path CuPy uses, else
    the NVIDIA runtime wheel's headers."""
    dirs = []
    try:
        import cupy
        path = cupy.cuda.get_cuda_path()
        if path:
            dirs.append(os.path.join(path, "include"))
    except Exception:  # no CuPy, or no CUDA path known to it
        pass
    try:
        from cuda import pathfinder
        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            dirs.append(found)
    except Exception:
        pass
    return [d for d in dict.fromkeys(dirs) if os.path.isfile(os.path.join(d, "cuda_fp16.h"))]


def options(arch: int) -> list[str]:
    """NVRTC options: the package's, the flat entries' generated parameter
    lists (args.flat_defines), CuPy's standard ones, the arch."""
    return (list(loader.compile_options()) + list(args.flat_defines())
            + ["--std=c++17", "-ftz=true", f"-arch=compute_{arch}"]
            + [f"-I{d}" for d in _include_dirs()])


def compile_ptx(name: str, arch: int, entry: str) -> tuple[str, str]:
    """(PTX text, lowered entry name) of the instantiation ``name`` (a name
    expression such as ``cuprope::rope_flat_kernel<float, false, 4, 0>``) of
    the translation unit ``entry`` (a kernel record's, e.g. ``rope.cu``)."""
    from cupy_backends.cuda.libs import nvrtc

    opts = options(arch)
    key = hashlib.sha256("\0".join([entry, name, str(arch), str(nvrtc.getVersion())] + opts)
                         .encode()).hexdigest()[:32]
    with _LOCK:
        hit = _MEMORY.get(key)
        if hit is not None:
            return hit
        path = cache_dir() / "ptx" / f"{key}.ptx"
        if path.exists():
            text = path.read_text()
            lowered, _, ptx = text.partition("\n")
            _MEMORY[key] = (ptx, lowered)
            return ptx, lowered
        src = loader.kernel_sources()[entry]
        prog = nvrtc.createProgram(src, entry, [], [])
        try:
            nvrtc.addNameExpression(prog, name)
            try:
                nvrtc.compileProgram(prog, opts)
            except nvrtc.NVRTCError as e:
                raise RuntimeError(f"NVRTC failed on {name}:\n{nvrtc.getProgramLog(prog)}") from e
            ptx = nvrtc.getPTX(prog)
            ptx = (ptx.decode() if isinstance(ptx, bytes) else ptx).rstrip("\0")
            lowered = nvrtc.getLoweredName(prog, name)
        finally:
            nvrtc.destroyProgram(prog)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(lowered + "\n" + ptx)
        tmp.replace(path)
        _MEMORY[key] = (ptx, lowered)
        return ptx, lowered
