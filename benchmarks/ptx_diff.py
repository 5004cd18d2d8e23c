"""Is every kernel instantiation's PTX the same in a git revision and in the
working tree, up to register and label names? No GPU needed (NVRTC compiles
on the CPU):

    PYTHONPATH=. python benchmarks/ptx_diff.py [--rev c1caac3] [--arch compute_90]
                                               [--family shared ...]

Both trees compile every registered family's names (the working tree's
lists, ``loader.family_names``, each family from its own translation unit) with the working tree's options (``loader.compile_options()``:
its tuning defines, which the headers of older revisions also accepted, as
overrides of their own defaults) and CuPy's standard flags; the revision's
``kernels/`` come from ``git show REV:kernels/FILE``. Each ``.entry`` body is
compared after renaming registers (``%r12``, ``%rd3``, ``%f7``, ``%p1``, ...)
and labels (``$L__BB0_12``) in order of first use, so two bodies match when
one is the other with its names changed. Prints one line per instantiation
(and a short diff where they differ; "new" where the revision's sources do
not define its kernel or cannot form that instantiation); exits 1 if any
differs.
"""
from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cuprope  # noqa: E402,F401  (registers every op's kernels)
from cuprope._core import kernels, loader  # noqa: E402

STANDARD_FLAGS = ("--std=c++17", "-ftz=true")  # what CuPy adds (tests/test_kernel_compile.py)


def revision_kernels(rev: str, dest: Path) -> Path:
    """Write the revision's kernels/ files into ``dest``."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:kernels"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in files:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:kernels/{name}"],
                              check=True, capture_output=True, text=True).stdout
        (dest / name).write_text(text)
    return dest


def nvrtc():
    from cuda.bindings import nvrtc as mod
    return mod


def _ok(result):
    err = result[0]
    if err != nvrtc().nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC: {err}")
    return result[1] if len(result) == 2 else None


def family_names(family: str) -> list[str]:
    """The instantiations of a registered kernel family."""
    return loader.family_names(family)[0]


def compile_ptx(folder: str, names: list[str], arch: str,
                entry: str) -> dict[str, str]:
    """PTX entry bodies of ``names`` compiled from ``folder``'s ``entry``, by name."""
    from cuda import pathfinder
    nv = nvrtc()
    src = (Path(folder) / entry).read_bytes()
    prog = _ok(nv.nvrtcCreateProgram(src, entry.encode(), 0, [], []))
    for n in names:
        _ok(nv.nvrtcAddNameExpression(prog, n.encode()))
    options = [f"-I{folder}"] + [o for o in loader.compile_options() if not o.startswith("-I")]
    cudart = pathfinder.find_nvidia_header_directory("cudart")
    options += [f"-I{cudart}", *STANDARD_FLAGS, f"--gpu-architecture={arch}"]
    rc = nv.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])[0]
    if rc != nv.nvrtcResult.NVRTC_SUCCESS:
        log = b" " * _ok(nv.nvrtcGetProgramLogSize(prog))
        _ok(nv.nvrtcGetProgramLog(prog, log))
        raise RuntimeError(f"{folder}: {log.decode(errors='replace')}")
    lowered = {n: _ok(nv.nvrtcGetLoweredName(prog, n.encode())).decode() for n in names}
    ptx = b" " * _ok(nv.nvrtcGetPTXSize(prog))
    _ok(nv.nvrtcGetPTX(prog, ptx))
    nv.nvrtcDestroyProgram(prog)
    bodies = entry_bodies(ptx.decode().rstrip("\0 "))
    return {n: bodies[lowered[n]] for n in names}


def entry_bodies(ptx: str) -> dict[str, str]:
    """Each ``.entry``'s text, from its header to its closing brace."""
    out = {}
    for m in re.finditer(r"\.entry (\w+)\(.*?\n\}\n", ptx, re.S):
        out[m.group(1)] = m.group(0)
    return out


_NAME = re.compile(r"%[a-z]+\d+|\$L__\w+|__local_depot\d+")
_PARAM = re.compile(r"\b_Z\w+_param_(\d+)")
_ENTRY = re.compile(r"^\.entry \w+\(")


def normalise(body: str) -> list[str]:
    """The body's lines without comments, register counts or blank lines, with
    registers and labels renamed in order of first use."""
    seen: dict[str, str] = {}
    count: dict[str, int] = {}

    def rename(m):
        name = m.group(0)
        if name not in seen:
            kind = "$L" if name.startswith("$") else re.sub(r"\d+$", "", name)
            count[kind] = count.get(kind, 0) + 1
            seen[name] = f"{kind}{count[kind]}"
        return seen[name]

    lines = []
    for line in body.splitlines():
        line = line.split("//")[0].rstrip()
        if not line.strip():
            continue
        if line.lstrip().startswith(".reg "):
            line = re.sub(r"<\d+>", "<>", line)
        line = _PARAM.sub(r"param_\1", _ENTRY.sub(".entry ENTRY(", line))  # its own name
        lines.append(_NAME.sub(rename, line))
    return lines


def defined_in(folder: str, name: str) -> bool:
    """Whether the kernel template or function of a name expression
    (``cuprope::rope_decode_kernel<...>``) is defined in ``folder``'s sources."""
    base = name.split("<")[0].split("::")[-1]
    pattern = re.compile(rf"\b{re.escape(base)}\s*\(")
    return any(pattern.search(p.read_text()) for p in Path(folder).iterdir()
               if p.suffix in (".cu", ".cuh"))


_UNPARSED = re.compile(r'Input name expression was: "\s*(.*?)\s*"')


def _job(args):
    folder, family, arch = args
    names, entry = loader.family_names(family)
    names = [n for n in names if defined_in(folder, n)]
    try:
        return compile_ptx(folder, names, arch, entry) if names else {}
    except RuntimeError as e:  # an instantiation the revision's template cannot form
        bad = {re.sub(r"\s+", "", m) for m in _UNPARSED.findall(str(e))}
        names = [n for n in names if re.sub(r"\s+", "", n) not in bad]
        if not bad or not names:
            raise
        return compile_ptx(folder, names, arch, entry)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="c1caac3", help="git revision to compare against")
    ap.add_argument("--arch", default="compute_90")
    ap.add_argument("--context", type=int, default=3, help="diff lines shown per difference (x10)")
    ap.add_argument("--family", action="append", choices=kernels.families(),
                    help="compare only this family (repeatable; default: all)")
    args = ap.parse_args(argv)
    tree = str(loader.kernel_dir())
    families = args.family or kernels.families()
    with tempfile.TemporaryDirectory() as tmp:
        old = str(revision_kernels(args.rev, Path(tmp)))
        # one job per (tree, family): independent compiles, two at a time or more
        jobs = [(folder, fam, args.arch) for folder in (old, tree) for fam in families]
        with ProcessPoolExecutor() as pool:
            results = list(pool.map(_job, jobs))
    half = len(families)
    before = {k: v for r in results[:half] for k, v in r.items()}
    after = {k: v for r in results[half:] for k, v in r.items()}
    differ = new = 0
    for name in (n for fam in families for n in family_names(fam)):
        if name not in before:  # its kernel is not in the revision
            new += 1
            print(f"new        {name}")
            continue
        a, b = normalise(before[name]), normalise(after[name])
        if a == b:
            print(f"identical  {name}")
            continue
        differ += 1
        print(f"DIFFERENT  {name}")
        diff = list(difflib.unified_diff(a, b, args.rev, "working tree", n=args.context, lineterm=""))
        print("\n".join(diff[:10 * args.context + 3]))
    total = len(before)
    print(f"{total - differ} of {total} instantiations identical ({args.arch}, against {args.rev})"
          + (f"; {new} new" if new else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
