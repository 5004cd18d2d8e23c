"""``python -m cuprope bench``: the short suite over ``bench_cases``' cases (a
table, and one decode token's host and kernel time), or ``--suite``, which
hands over to benchmarks/bench_suite.py in a source checkout. ``HELP`` is the
command's help text."""
from __future__ import annotations

import sys
import time

from . import bench_cases

HELP = """\
Time cuprope's fused q/k RoPE on this machine's GPU: a few minutes at most.
Needs a CUDA GPU and PyTorch built for CUDA; with no GPU it says why and
exits 0 without timing anything. The full suite (CSV and plot) is
benchmarks/bench_suite.py.

What it times, q and k [B, S, H, D], cfg = RopeConfig(D) (R = D, half split):
  qk_fwd      rope_qk_forward(q, k, cfg, out=(q_out, k_out)): out of place
  qk_inplace  rope_qk_forward(q, k, cfg, inplace=True)
  qkv_slices  qk_fwd on q and k that are slices of one packed qkv buffer
on llama3-8b (B 4, S 4096, 32 q heads, 8 k heads, D 128) for all three and
mha-d64 (B 8, S 2048, 16/16 heads, D 64) for qk_fwd; in bfloat16, plus
llama3-8b qk_fwd in float32 (or every case in the one --dtype).

Against what (the impl column), on the same inputs:
  copy               a device-to-device copy of the bytes the op must move
                     (the roofline: no RoPE can beat it)
  cuprope            the call above
  torch-eager        the HF transformers formula (rotate_half with cos/sin
                     tables) in eager PyTorch
  torch-compile      the same formula under torch.compile
  cuprope-hf-tables  cuprope's kernel reading those cos/sin tables
The last three on qk_fwd and qkv_slices only, and not with --no-peers;
Liger, flash-attention and FlashInfer are noted as skipped, not timed.

Columns: us = the median of --reps CUDA-event timings after warm-up (the
host's launch overhead kept outside the interval); TB/s = the fewest bytes
the op must move (each input read once, each output written once; cos/sin
tables not counted) / time; /copy = copy time / op time (1.00: as fast as
copying the same bytes). The last line (unless --no-decode): one decode
token (B 1, S 1, 32/8 heads, D 128, in place), host us per call in a Python
loop and kernel us per call in a CUDA graph replay.
"""


def decode_host_and_kernel(dtype_name="bf16", batch=1, calls=2000):
    """Host µs per call (wall loop: the median of 10 blocks of calls / 10, so a
    burst of host noise moves one block, not the figure) and kernel µs per call
    (CUDA graph replay)."""
    import cuprope
    torch = bench_cases.torch_module()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    _, _, hq, hk, d, r = bench_cases.DECODE
    cfg = cuprope.RopeConfig(r)
    q = torch.randn(batch, 1, hq, d, device="cuda", dtype=dt)
    k = torch.randn(batch, 1, hk, d, device="cuda", dtype=dt)
    pos = torch.full((batch, 1), 1234, device="cuda", dtype=torch.int32)
    for _ in range(20):
        cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
    per_block = max(1, calls // 10)
    blocks = []
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per_block):
            cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - t0) / per_block)
    host_us = sorted(blocks)[len(blocks) // 2] * 1e6
    g = torch.cuda.CUDAGraph()
    n = 100
    with torch.cuda.graph(g):
        for _ in range(n):
            cuprope.rope_qk_forward(q, k, cfg, positions=pos, inplace=True)
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        g.replay()
    b.record()
    b.synchronize()
    kernel_us = a.elapsed_time(b) * 1e3 / (10 * n)
    return host_us, kernel_us


SHORT_CASES = (("llama3-8b", "qk_fwd"), ("llama3-8b", "qk_inplace"), ("mha-d64", "qk_fwd"),
               ("llama3-8b", "qkv_slices"))


def short_suite(progress=True, dtype=None, reps=15, peers=True):
    """A few minutes at most: the main shapes, forward q+k, against copy and
    torch. ``dtype`` ("bf16", "fp16" or "fp32") times only that dtype; None
    (default) bf16 for every case plus llama3-8b qk_fwd in fp32."""
    if dtype is None:
        cases = [(shape, op, "bf16") for shape, op in SHORT_CASES]
        cases.insert(2, ("llama3-8b", "qk_fwd", "fp32"))
    else:
        cases = [(shape, op, dtype) for shape, op in SHORT_CASES]
    rows = []
    for n, (shape, op, dt) in enumerate(cases):
        if progress:
            _progress(n, len(cases), f"{shape} {op} {dt}")
        rows += bench_cases.run_case(shape, bench_cases.SHAPES[shape], op, dt, peers=peers,
                                     reps=reps)
    if progress:
        _progress(len(cases), len(cases), "done")
        print(file=sys.stderr)
    return rows


def _progress(i, n, label):
    width = 30
    fill = int(width * i / n)
    print(f"\r[{'#' * fill}{'.' * (width - fill)}] {i}/{n} {label:<40}", end="", file=sys.stderr,
          flush=True)


def format_table(rows):
    lines = [f"{'case':<12} {'op':<11} {'dtype':<5} {'impl':<14} {'us':>9} {'TB/s':>6} {'/copy':>6}"]
    for r in rows:
        lines.append(f"{r.case:<12} {r.op:<11} {r.dtype:<5} {r.impl:<14} {r.seconds * 1e6:9.1f} "
                     f"{r.tbps:6.2f} {r.ratio:6.3f}")
    return "\n".join(lines)


def main_short(dtype=None, reps=15, peers=True, decode=True):
    """``python -m cuprope bench`` (see HELP): 0 after timing, or with no GPU
    (it says why, times nothing); 1 when a GPU is there but PyTorch cannot
    use it."""
    from .info import cuda_state
    state = cuda_state()
    if not state.usable:
        print(f"cuprope bench: no CUDA GPU visible ({state.reason}); nothing to time (the NumPy "
              f"backend is a reference, not a benchmark target)")
        return 0
    try:
        torch = bench_cases.torch_module()
    except ImportError:
        print("cuprope bench: needs PyTorch (its CUDA events, tensors and the torch peers): "
              "pip install torch", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print(f"cuprope bench: PyTorch {torch.__version__} does not see the GPU (a CPU-only "
              f"build?); install a CUDA build of torch", file=sys.stderr)
        return 1
    print(f"cuprope bench on {torch.cuda.get_device_name()} (fused q+k, ratios to a device copy)")
    rows = short_suite(dtype=dtype, reps=reps, peers=peers)
    print(format_table(rows))
    if decode:
        dt = dtype or "bf16"
        host, kern = decode_host_and_kernel(dt)
        print(f"decode (B 1, 32/8 heads, D 128, {dt}, in-place): host {host:.1f} us/call, "
              f"kernel {kern:.2f} us/call (graph replay)")
    return 0


def suite_path():
    """``benchmarks/bench_suite.py`` of the source checkout this package runs
    from, or None (an installed wheel ships no benchmarks)."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_suite.py"
    return path if path.is_file() else None


def run_suite(argv) -> int:
    """``python -m cuprope bench --suite ARGS``: the full suite, in a child
    interpreter (its exit status is returned)."""
    import subprocess
    import sys
    path = suite_path()
    if path is None:
        print("python -m cuprope bench: error: --suite needs a source checkout (the suite is "
              "benchmarks/bench_suite.py there; an installed package ships no benchmarks)",
              file=sys.stderr)
        return 2
    return subprocess.run([sys.executable, str(path), *argv]).returncode
