"""Time kernel variants (compile-time defines) side by side, one process each.

    python benchmarks/tune.py "CUPROPE_MIN_BLOCKS=1" "CUPROPE_ROWS16=2 CUPROPE_MIN_BLOCKS=3"

Each variant compiles with CUPROPE_KERNEL_DEFINES set (a separate CuPy cache
entry) and runs ``benchmarks/bench_suite.py --only rotation --quick`` on the
cases in TUNE_SHAPES (default llama3-8b,mha-d64) and the dtypes in TUNE_DTYPES
(default bf16,fp32); TUNE_DECODE=1 adds the decode family; TUNE_ONLY names
the families instead (e.g. ``TUNE_ONLY=mla,prologue TUNE_SHAPES=decode,prefill``)."""
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
variants = sys.argv[1:] or [""]
for v in variants:
    env = dict(os.environ, CUPROPE_KERNEL_DEFINES=v)
    print(f"=== variant: {v or 'default'}", flush=True)
    only = os.environ.get("TUNE_ONLY") or (
        "rotation,decode" if os.environ.get("TUNE_DECODE") else "rotation")
    out = os.path.join(tempfile.mkdtemp(prefix="cuprope-tune-"), "results.csv")
    cmd = [sys.executable, os.path.join(here, "bench_suite.py"), "--quick", "--only", only,
           "--cases", os.environ.get("TUNE_SHAPES", "llama3-8b,mha-d64"),
           "--dtypes", os.environ.get("TUNE_DTYPES", "bf16,fp32"), "--out", out]
    if os.environ.get("FI_BIN"):
        cmd += ["--fi-bin", os.environ["FI_BIN"]]
    subprocess.run(cmd, env=env, check=False)
