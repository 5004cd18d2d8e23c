"""Time kernel variants (compile-time defines) side by side, one process each.

    python benchmarks/tune.py "CUPROPE_MIN_BLOCKS=1" "CUPROPE_ROWS16=2 CUPROPE_MIN_BLOCKS=3"

Each variant compiles with CUPROPE_KERNEL_DEFINES set (a separate CuPy cache
entry) and runs benchmarks/quick_bench.py on the large shapes."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
variants = sys.argv[1:] or [""]
for v in variants:
    env = dict(os.environ, CUPROPE_KERNEL_DEFINES=v)
    print(f"=== variant: {v or 'default'}", flush=True)
    cmd = [sys.executable, os.path.join(here, "quick_bench.py"),
           "--shapes", os.environ.get("TUNE_SHAPES", "llama,d64"),
           "--dtypes", os.environ.get("TUNE_DTYPES", "bf16,fp32"), "--tag", v]
    if os.environ.get("TUNE_DECODE"):  # also the decode B 1 kernel time
        cmd.append("--decode")
    subprocess.run(cmd, env=env, check=False)
