"""Every op of cuprope against its peers in one process, into ONE CSV.

    python benchmarks/bench_suite.py [--out benchmarks/results.csv] [--quick]
        [--only rotation,qknorm,kv,...] [--fi-bin PATH] [--cases llama3-8b,mha-d64]
        [--dtypes bf16,fp32]
    python benchmarks/report.py benchmarks/results.csv   # one figure per family + targets

Families (``suite_rows.FAMILIES``) and what each times beside cuprope:

* ``rotation``: the core forward / backward / in place / single tensor / qkv
  slices at the D 64, D 128 and D 256 prefill shapes (``cuprope.cli.bench_cases.SHAPES``),
  and the HF cos/sin-table source (``cuprope-hf-tables``); copy, torch eager and
  torch.compile of HF's formula, Liger's RoPE, FlashInfer's two kernels;
* ``schemes`` (YaRN, MRoPE) and ``lrpe`` (SiLU + per-head θ); ``ggml``
  (``cuprope.ggml.rope``, NORMAL and NEOX): copy;
* ``qknorm``: fused QK-norm + RoPE fwd / bwd (copy), and under autograd
  against torch.compile of HF's Qwen3 block, Liger and the unfused pair
  (``qknorm_bench.measure``);
* ``kv``: RoPE + KV-cache append, bf16 / fp8 k-v / fp8 q-k-v, decode B 1 / 64 /
  256 / 1024 and a 16k prefill: copy, the unfused sequence, FlashInfer's
  ``RopeQuantizeAppendPagedKVCache`` (``kvcache_bench.run_case``);
* ``prologue``: the decode prologue in one launch (QK-norm + RoPE + fp8 +
  paged append), decode B 1 / 64 / 256 / 1024 and 16k prefill: copy, today's
  two cuprope launches, the unfused chain, FlashInfer's append (no norm)
  (``prologue_bench.run_case``);
* ``mla``: DeepSeek MLA's RoPE + fp8 + paged latent-cache append, T 1 / 64 /
  256 / 1024 and 16k: copy, the unfused torch sequence, FlashInfer's
  ``RopeQuantizeAppendPagedMLACache`` (``mla_bench.run_case``);
* ``decode``: plain RoPE in place at decode, the angle table and
  ``rotary_embedding`` (cos/sin cache): copy, FlashInfer (``decode_bench``);
* ``pdl``: every decode op behind the matmul that writes its q/k, a graph of
  32 layers, with and without ``enable_pdl`` and the matmuls alone
  (``pdl_bench``);
* ``host``: host µs per call against one torch ``mul_`` (``host_overhead``);
* ``jax``: ``cuprope.jax`` under ``jax.jit`` (rope_qk, rope_qk_norm) against
  XLA's fusion, forward and value_and_grad (``jax_bench``, ``jax_qknorm_bench``);
* ``startup``: the first call's NVRTC compile, and a second process's;
* ``models``: whole transformers models (Qwen3-0.6B, Llama-3.2-1B, Gemma-3-1B)
  with ``cuprope.torch.patch_hf`` against transformers and Liger's RoPE-only
  patch, eager and compiled: training step, prefill, decode step, and the
  time in position encoding + q/k norm (``models_bench``).

Timing is each measuring module's own: CUDA events after warm-up, median of many
runs (``cuprope.cli.bench_cases.time_gpu``) for prefill shapes; CUDA-graph replay for the
KV append and decode; wall-clock host loops for host time and ``jax.jit``.
FlashInfer runs as ``fi_bench_bin`` (../shared/peers/README.md builds it) in its
own process beside its own copy; without the binary its rows are skipped with
a note. A family that fails is reported on stderr, the others still run, and
the exit status is 1.

The families with prefill cases (``REPEATED``) run ``--repeats`` times in the
process (3 by default, 1 with ``--quick``), FlashInfer's binary again each
time, and each row is the median of the passes, its note giving the spread
(``suite_rows.combine``): a committed figure is one a rerun reproduces.
"""
import argparse
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (HERE, ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

import suite_rows  # noqa: E402  (no GPU or torch needed)

DTYPES = ("bf16", "fp16", "fp32")
ROT_OPS = ("qk_fwd", "qk_bwd", "qk_inplace", "fwd", "qkv_slices")
QUICK_CASES = ("llama3-8b", "mha-d64", "d256")  # D 128, D 64, D 256
PEER_CASES = {("llama3-8b", "bf16"), ("llama3-8b", "fp32"), ("llama3-8b", "fp16"),
              ("seq32k", "bf16"), ("mha-d64", "bf16"), ("d256", "bf16")}


class Ctx:
    """What every family needs: quick mode, filters, FlashInfer's lines, notes."""

    def __init__(self, args):
        self.quick = args.quick
        self.cases = [c for c in (args.cases or "").split(",") if c]
        self.dtypes = [d for d in (args.dtypes or "").split(",") if d]
        self.fi_bin = args.fi_bin
        self._fi = None

    def want_case(self, name):
        return not self.cases or any(c in name for c in self.cases)

    def dts(self, default, allowed=("bf16", "fp16", "fp32")):
        """--dtypes where given (quick or not), else ``default``."""
        return [d for d in allowed if d in self.dtypes] if self.dtypes else list(default)

    def fi_lines(self):
        """fi_bench_bin's JSON lines (run once), [] without the binary."""
        if self._fi is None:
            from kvcache_bench import flashinfer_lines
            progress(f"FlashInfer: running {self.fi_bin}")
            try:
                lines = flashinfer_lines(self.fi_bin)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                self._why = f"fi_bench_bin failed: {str(e)[:200]}"
                lines = []
            else:
                self._why = (f"no fi_bench_bin at {self.fi_bin!r} (build it as "
                             "../shared/peers/README.md says, pass --fi-bin)")
            bad = [x for x in lines if x.get("err", "no error") != "no error" or "error" in x]
            for x in bad:
                note(f"FlashInfer line dropped (CUDA error): {x}")
            self._fi = [x for x in lines if x not in bad]
            if not self._fi:
                note(f"FlashInfer rows skipped: {self._why}")
        return self._fi

    note = staticmethod(lambda msg: note(msg))
    progress = staticmethod(lambda msg: progress(msg))

    def fi_note(self):
        return "" if self.fi_lines() else f"FlashInfer not run ({self._why})"


_NOTES = []


def note(msg):
    if msg not in _NOTES:
        _NOTES.append(msg)
        print(f"note: {msg}", file=sys.stderr, flush=True)


def _shape(b, s, hq, hk, d, r=None):
    return f"B {b} S {s} Hq {hq} Hk {hk} D {d}" + (f" R {r}" if r is not None and r != d else "")


def rotation(ctx):
    """Core ops (cuprope.cli.bench_cases.run_case) plus Liger and FlashInfer on the peer cases."""
    from cuprope.cli.bench_cases import SHAPES, run_case
    ops = ("qk_fwd", "qk_bwd") if ctx.quick else ROT_OPS
    pool = QUICK_CASES if ctx.quick and not ctx.cases else SHAPES  # --cases: any of SHAPES
    cases = [c for c in pool if ctx.want_case(c)]
    reps = 10 if ctx.quick else 30
    rows = []
    for case in cases:
        shape = SHAPES[case]
        for dt in ctx.dts(("bf16",) if ctx.quick else DTYPES):
            for op in ops:
                peers = op == "qk_fwd" and (ctx.quick or (case, dt) in PEER_CASES)
                for r in run_case(case, shape, op, dt, peers=peers, reps=reps):
                    impl = r.impl
                    rows.append(suite_rows.make(
                        "rotation", op, case, dt, impl, r.seconds * 1e6, shape=_shape(*shape),
                        nbytes=r.nbytes, ratio_to="" if impl.startswith(("cuprope", "copy"))
                        else "cuprope", note=f"CUDA events, median of {reps}"))
                if peers:
                    rows += _liger_rotation(case, shape, dt, reps)
                    rows += _fi_rotation(ctx, case, shape, dt, op)
            progress(f"rotation {case} {dt}")
    return rows


def _liger_rotation(case, shape, dt, reps):
    """Liger's RoPE (in place on the physical [B, S, H, D] storage, as Liger's
    Llama patch calls it) on the qk_fwd case; [] without Liger."""
    b, s, hq, hk, d, r = shape
    if r != d:
        return []
    try:
        from liger_kernel.ops.rope import rope_forward
    except Exception as e:
        note(f"Liger rows skipped: {type(e).__name__}: {str(e)[:80]}")
        return []
    import torch

    from cuprope.cli.bench_cases import cos_sin_tables, time_gpu
    t = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
    sets = [(torch.randn(b, s, hq, d, device="cuda", dtype=t),
             torch.randn(b, s, hk, d, device="cuda", dtype=t)) for _ in range(2)]
    cos, sin = cos_sin_tables(s, d, 10000.0, t, "cuda")
    i = [0]

    def call():
        q, k = sets[i[0] % 2]
        i[0] += 1
        rope_forward(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    nbytes = 2 * (sets[0][0].numel() + sets[0][1].numel()) * sets[0][0].element_size()
    return [suite_rows.make("rotation", "qk_fwd", case, dt, "liger", time_gpu(call, reps=reps) * 1e6,
                            shape=_shape(*shape), nbytes=nbytes, ratio_to="cuprope",
                            note="in place (Liger's kernel); CUDA events")]


def _fi_rotation(ctx, case, shape, dt, op):
    b, s, hq, hk, d, r = shape
    if r != d:
        return []
    rows = []
    for f in ctx.fi_lines():
        if (f.get("impl") == "flashinfer" and "kernel" not in f and f.get("dtype") == dt
                and (f["B"], f["S"], f["Hq"], f["Hk"], f["D"]) == (b, s, hq, hk, d)):
            for impl, col, rc in (("flashinfer", "computed_us", "ratio_computed"),
                                  ("flashinfer-cos-sin-cache", "cache_us", "ratio_cache")):
                rows.append(suite_rows.make(
                    "rotation", op, case, dt, impl, f[col], shape=_shape(*shape[:5]),
                    frac_copy=f[rc], nbytes=f["bytes"], ratio_to="cuprope",
                    note="fi_bench_bin, own process and copy, graph replay"))
    return rows


def schemes(ctx):
    """YaRN and MRoPE (family schemes), LRPE with SiLU (family lrpe): run_scheme_case."""
    from cuprope.cli.bench_cases import SCHEME_OPS, SHAPES, run_scheme_case
    reps = 10 if ctx.quick else 30
    rows = []
    for op in SCHEME_OPS:
        for dt in ctx.dts(("bf16",) if ctx.quick else DTYPES):
            for r in run_scheme_case("llama3-8b", SHAPES["llama3-8b"], op, dt, reps=reps):
                fam = "lrpe" if op.startswith("lrpe") else "schemes"
                rows.append(suite_rows.make(fam, op, r.case, dt, r.impl, r.seconds * 1e6,
                                            shape=_shape(*r.shape), nbytes=r.nbytes,
                                            note=f"CUDA events, median of {reps}"))
    progress("schemes, lrpe")
    return rows


def ggml(ctx):
    """cuprope.ggml.rope (modes NORMAL and NEOX, out of place) at the Llama-3-8B
    q shape against a copy of its bytes."""
    import torch

    from cuprope import ggml as cg
    from cuprope.cli.bench_cases import time_gpu
    b, s, n, d = 4, 4096, 32, 128
    reps = 10 if ctx.quick else 30
    rows = []
    for dt in ctx.dts(("bf16",) if ctx.quick else DTYPES):
        t = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
        xs = [torch.randn(b, s, n, d, device="cuda", dtype=t) for _ in range(2)]
        outs = [torch.empty_like(x) for x in xs]
        pos = torch.arange(s, device="cuda", dtype=torch.int32)
        nbytes = 2 * xs[0].numel() * xs[0].element_size()
        src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        shape = f"B {b} S {s} N {n} D {d}"
        rows.append(suite_rows.make("ggml", "rope", "llama3-8b q", dt, "copy",
                                    time_gpu(lambda: dst.copy_(src), reps=reps) * 1e6,
                                    shape=shape, nbytes=nbytes))
        for mode, name in ((cg.NORMAL, "normal"), (cg.NEOX, "neox")):
            i = [0]

            def call(mode=mode):
                j = i[0] % 2
                i[0] += 1
                cg.rope(xs[j], pos, n_dims=d, mode=mode, freq_base=500000.0, out=outs[j])
            rows.append(suite_rows.make("ggml", "rope", "llama3-8b q", dt, f"cuprope-{name}",
                                        time_gpu(call, reps=reps) * 1e6, shape=shape,
                                        nbytes=nbytes, note="no ggml peer in Python"))
    progress("ggml")
    return rows


def startup(ctx):
    """The first call's time in a fresh process with an empty CuPy cache, then
    in a second process reusing that cache (the on-disk cache must hit)."""
    import tempfile
    code = ("import time, torch, cuprope; q=torch.randn(1,8,4,128,device='cuda',dtype=torch.bfloat16);"
            "c=cuprope.RopeConfig(128); t=time.perf_counter(); cuprope.rope_forward(q,c);"
            "torch.cuda.synchronize(); print(time.perf_counter()-t)")
    env = dict(os.environ, CUPY_CACHE_DIR=tempfile.mkdtemp(prefix="cuprope-jit-"))
    rows = []
    for case in ("fresh process, empty kernel cache", "second process, disk cache"):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"startup probe failed: {r.stderr[-300:]}")
        s = float(r.stdout.strip().splitlines()[-1])
        rows.append(suite_rows.make("startup", "first rope_forward", case, "bf16", "cuprope",
                                    s * 1e6, note="wall clock incl. NVRTC compile / cache load"))
    progress("startup")
    return rows


def progress(msg, t0=time.time()):
    print(f"[{time.time() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)


def families():
    import suite_fused
    return {"rotation": rotation, "schemes": schemes, "ggml": ggml, "qknorm": suite_fused.qknorm,
            "kv": suite_fused.kv, "prologue": suite_fused.prologue, "mla": suite_fused.mla,
            "decode": suite_fused.decode, "pdl": suite_fused.pdl, "host": suite_fused.host,
            "jax": suite_fused.jax_calls, "startup": startup, "models": _models}


def _models(ctx):
    import models_bench
    return models_bench.suite(ctx)


def repeats(args):
    """Passes of a REPEATED family: --repeats, else 1 with --quick, else 3."""
    if args.repeats is not None:
        if args.repeats < 1:
            sys.exit(f"bench_suite: --repeats must be at least 1, got {args.repeats}")
        return args.repeats
    return 1 if args.quick else 3


def run_family(measure, ctx, passes):
    """The rows of ``measure(ctx)`` over ``passes`` passes (FlashInfer's lines
    timed afresh in each), combined by ``suite_rows.combine``."""
    if passes == 1:
        return measure(ctx)
    runs = []
    for i in range(passes):
        ctx._fi = None  # fi_bench_bin runs again: its rows get a spread too
        runs.append(measure(ctx))
        progress(f"pass {i + 1} of {passes}")
    return suite_rows.combine(runs)


def default_fi_bin():
    for p in (os.path.join(ROOT, "..", "shared", "peers", "fi_bench_bin"),
              os.path.join(ROOT, "build", "fi_bench_bin")):
        if os.path.exists(p):
            return p
    return os.path.join(ROOT, "..", "shared", "peers", "fi_bench_bin")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="cuprope's benchmark suite: every op against its "
                                 "peers, one CSV (see the module docstring)")
    ap.add_argument("--out", default=os.path.join(HERE, "results.csv"), help="the CSV to write")
    ap.add_argument("--quick", action="store_true",
                    help="a short run: bf16, fewer cases and repetitions")
    ap.add_argument("--only", default="", help="comma-separated families: rotation, schemes, "
                    "ggml, qknorm, kv, prologue, mla, decode, pdl, host, jax, startup, models "
                    "(default: all; "
                    "schemes also times the lrpe family)")
    ap.add_argument("--fi-bin", default=default_fi_bin(),
                    help="FlashInfer's fi_bench_bin (../shared/peers/README.md builds it); "
                    "FlashInfer rows are skipped with a note when it is absent")
    ap.add_argument("--cases", default="", help="only cases whose name contains one of these")
    ap.add_argument("--dtypes", default="", help="only these dtypes (bf16,fp16,fp32)")
    ap.add_argument("--no-report", action="store_true", help="do not print the targets table")
    ap.add_argument("--repeats", type=int, default=None,
                    help="passes of each family with prefill cases (%s); each row the median, "
                    "its note the spread (default 3, 1 with --quick)" % ", ".join(REPEATED))
    ap.add_argument("--merge", nargs="+", metavar="CSV", help="no timing: join CSVs of earlier "
                    "runs on one device (e.g. families run in separate calls) into --out")
    return ap.parse_args(argv)


# the families with prefill cases: run --repeats times, each row the median
REPEATED = ("rotation", "schemes", "ggml", "qknorm", "kv", "prologue", "mla")
ALL = ("rotation", "schemes", "ggml", "qknorm", "kv", "prologue", "mla", "decode", "pdl", "host",
       "jax", "startup", "models")


def main(argv=None):
    """Run the selected families, write the CSV; returns 0, 1 if a family failed, or 2
    without PyTorch."""
    args = parse_args(argv)
    if args.merge:  # no timing: join earlier runs' CSVs (one device)
        try:
            rows = suite_rows.merge(args.merge)
        except ValueError as e:
            sys.exit(f"bench_suite --merge: {e}")
        suite_rows.write(rows, args.out)
        print(f"merged {len(rows)} rows into {args.out}", file=sys.stderr)
        return 0
    only = [f for f in args.only.split(",") if f] or list(ALL)
    bad = [f for f in only if f not in ALL]
    if bad:
        sys.exit(f"bench_suite: unknown families {bad}; choose from {', '.join(ALL)}")
    passes = repeats(args)
    try:
        import torch
    except ImportError:
        print("bench_suite: error: the suite times on PyTorch, which is not installed: pip "
              "install torch (a CUDA build)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        sys.exit("bench_suite: no CUDA GPU visible; nothing to time")
    device = torch.cuda.get_device_name()
    ctx = Ctx(args)
    fams = families()
    rows, failed = [], []
    commit = suite_rows.commit_id()
    for fam in only:
        try:
            rows += run_family(fams[fam], ctx, passes if fam in REPEATED else 1)
        except Exception:
            failed.append(fam)
            print(f"bench_suite: family {fam} failed:\n{traceback.format_exc()}", file=sys.stderr)
        suite_rows.finish(rows, device, commit)
        suite_rows.write(rows, args.out)  # after every family: a cut-off run keeps what it timed
    print(f"wrote {len(rows)} rows on {device} to {args.out}", file=sys.stderr)
    if not args.no_report and rows:
        import report
        print(report.targets_markdown(suite_rows.read(args.out)))
    if failed:
        print(f"bench_suite: failed families: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
