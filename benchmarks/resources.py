"""The compiler's resource report (registers, spills) for one kernel family,
with no GPU: NVRTC compiles it for a real architecture with ptxas's verbose
report in the program log.

    python benchmarks/resources.py [--arch sm_90] [--family shared] [--defines "CUPROPE_MIN_BLOCKS=3"]

Needs cuda-bindings / cuda-pathfinder (the test extra)."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--family", default="shared", help="a kernel family: a rope family, kvcache / kvcache_cos_sin, mla, prologue_*")
    ap.add_argument("--defines", default="", help="CUPROPE_KERNEL_DEFINES for this report")
    args = ap.parse_args()
    os.environ["CUPROPE_KERNEL_DEFINES"] = args.defines
    import test_kernel_compile as tkc  # NVRTC driver shared with the compile test

    from cuprope._core import loader as _loader
    names, entry = _loader.family_names(args.family)
    from cuda.bindings import nvrtc
    src = _loader.kernel_sources()[entry].encode()
    prog = tkc._check(nvrtc.nvrtcCreateProgram(src, entry.encode(), 0, [], []))
    for n in names:
        tkc._check(nvrtc.nvrtcAddNameExpression(prog, n.encode()))
    import cuda.pathfinder as pf
    opts = [o.encode() for o in _loader.compile_options()] + [
        f"-I{pf.find_nvidia_header_directory('cudart')}".encode(), b"--std=c++17", b"-ftz=true",
        f"--gpu-architecture={args.arch}".encode(), b"--ptxas-options=-v"]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    size = tkc._check(nvrtc.nvrtcGetProgramLogSize(prog))
    log = b" " * size
    tkc._check(nvrtc.nvrtcGetProgramLog(prog, log))
    rep = log.decode(errors="replace")
    if os.environ.get("RESOURCES_RAW"):
        print(rep)
    if rc != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        sys.exit(f"NVRTC failed:\n{rep}")
    lowered = {tkc._check(nvrtc.nvrtcGetLoweredName(prog, n.encode())).decode(): n for n in names}
    fn = None
    print(f"{'kernel':58s} {'regs':>5s} {'spill st/ld':>12s}")
    for line in rep.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            fn = lowered.get(m.group(1), m.group(1))
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = f"{m.group(1)}/{m.group(2)}"
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            short = re.sub(r"^cuprope::\w+_kernel", "", fn)
            print(f"{short:58s} {m.group(1):>5s} {spill:>12s}")


if __name__ == "__main__":
    main()
