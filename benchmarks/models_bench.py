"""Whole transformers models with cuprope inside (``cuprope.torch.patch_hf``)
against the same models as transformers runs them and with Liger's RoPE-only
patch, each also under torch.compile: the suite's ``models`` family.

    python benchmarks/models_bench.py [--quick] [--out benchmarks/results_models.csv]
        [--into benchmarks/results.csv] [--models qwen3-0.6b,llama-3.2-1b,gemma-3-1b]
    python benchmarks/models_bench.py --dry     # CPU, tiny configs: the script runs

Models: random weights from the published configs of Qwen3-0.6B, Llama-3.2-1B
and Gemma-3-1B (``CONFIGS``, written out: no download), bf16, SDPA attention.
Implementations (``impl``): ``hf`` (transformers' eager code), ``cuprope``
(patch_hf), ``liger-rope`` (``apply_liger_kernel_to_*`` with every kernel but
RoPE off: transformers' q/k norm, Liger's rotation), and each ``-compile``
(torch.compile of the model; generation: static cache, which transformers
compiles with CUDA graphs).

Rows (``op``; ``us`` per step, ``ratio`` the peer's µs over cuprope's of the
same compile mode, > 1: cuprope faster):

* ``train step``: forward + backward of the LM loss at B 4 S 4096 (no
  optimizer step); tokens/s in the note;
* ``train pos+norm``: of that step, the device time in position encoding and
  q/k norm, forward and backward (torch.profiler, ``models_profile``; eager);
* ``prefill``: one forward of 4096 tokens; ``decode step``: greedy decode,
  the mean of 128 steps after it (``generate``), B 1 and B 32; the eager
  implementations share one model and take turns, round by round, after a
  round that warms them all;
* ``decode pos+norm``: one decode step's device time in position encoding
  and q/k norm (eager).

Targets (report.py): pos+norm per step ≤ 1/3 of ``hf``'s and below
``liger-rope``'s, training and decode; whole steps never slower than ``hf``.
``--quick`` (about 6 minutes on one H100 / H200): the three models, eager, 32
decode steps, and torch.compile for the first model's training step, ``hf``
and ``cuprope`` only. ``--dry`` also compiles that step (backend "eager").
Liger (``../shared/peers/liger_kernel-*.whl``, pip install --no-deps) is
optional: without it its rows are skipped with a note.
"""
import argparse
import copy
import gc
import inspect
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (HERE, ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

import suite_rows  # noqa: E402

# config.json of each model, the fields the model classes read (random weights)
CONFIGS = {
    "qwen3-0.6b": dict(
        model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000,
        rope_scaling=None, tie_word_embeddings=True, attention_bias=False,
        hidden_act="silu", use_sliding_window=False),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False, hidden_act="silu"),
    "gemma-3-1b": dict(
        model_type="gemma3_text", hidden_size=1152, intermediate_size=6912,
        num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        vocab_size=262144, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000, rope_local_base_freq=10000, rope_scaling=None, sliding_window=512,
        sliding_window_pattern=6, query_pre_attn_scalar=256,
        hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None,
        final_logit_softcapping=None),
}
LIGER = {"qwen3": "apply_liger_kernel_to_qwen3", "llama": "apply_liger_kernel_to_llama",
         "gemma3_text": "apply_liger_kernel_to_gemma3_text"}
MODELING = {"qwen3": "qwen3", "llama": "llama", "gemma3_text": "gemma3"}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=128)


class Run:
    """The sizes and switches of one run."""

    def __init__(self, a):
        self.dry, self.quick = a.dry, a.quick
        self.device = "cpu" if a.dry else "cuda"
        self.batch, self.seq = (1, 32) if a.dry else (a.batch, a.seq)
        self.prefill = 16 if a.dry else a.prefill
        self.decode = 4 if a.dry else (32 if a.quick else a.decode)
        self.decode_batches = (1, 2) if a.dry else (1, 32)
        self.reps = 2 if a.dry else (3 if a.quick else 10)
        self.compile = not a.no_compile
        self.backend = "eager" if a.dry else "inductor"  # a dry run: dynamo only
        self.dtype = "fp32" if a.dry else "bf16"
        self.models, self.notes = [], []

    def note(self, msg):
        if msg not in self.notes:
            self.notes.append(msg)
            print(f"note: {msg}", file=sys.stderr, flush=True)


def progress(msg, t0=time.time()):
    print(f"[{time.time() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)


def build(name, run):
    """A model of ``name`` with random weights, bf16 (fp32 on a dry run), SDPA."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(copy.deepcopy(CONFIGS[name]), **(TINY if run.dry else {}))  # HF edits dicts
    mt = cfg.pop("model_type")
    config = AutoConfig.for_model(mt, **cfg)
    dtype = torch.float32 if run.dry else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(run.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model


class Liger:
    """Liger's RoPE-only patch of one family, undone on exit (Liger sets the
    modelling module's apply_rotary_pos_emb: every model of the family)."""

    def __init__(self, model_type):
        self.model_type = model_type

    def __enter__(self):
        import importlib

        import liger_kernel.transformers as lt
        self.mod = importlib.import_module(
            f"transformers.models.{MODELING[self.model_type]}."
            f"modeling_{MODELING[self.model_type]}")
        self.saved = dict(vars(self.mod))
        fn = getattr(lt, LIGER[self.model_type])
        fn(**{p: p == "rope" for p in inspect.signature(fn).parameters if p != "model"})
        return self

    def __exit__(self, *exc):
        for k in list(vars(self.mod)):
            if k not in self.saved:
                delattr(self.mod, k)
        for k, v in self.saved.items():
            setattr(self.mod, k, v)


def liger_available(run):
    if run.dry:  # Liger's rope is a Triton kernel: GPU tensors only
        run.note("liger-rope rows skipped: a dry run is on the CPU")
        return False
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception as e:  # not installed, or no Triton (a CPU machine)
        run.note(f"liger-rope rows skipped: {type(e).__name__}: {str(e)[:100]}")
        return False
    return True


def timed(fn, run):
    """Median seconds of ``fn()`` over run.reps calls after one warm-up (CUDA
    events, ``cuprope.cli.bench_cases.time_gpu``; wall clock on a dry run)."""
    if not run.dry:
        from cuprope.cli.bench_cases import time_gpu
        return time_gpu(fn, reps=run.reps, warm=1)
    fn()
    out = []
    for _ in range(run.reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _ids(run, b, s, vocab):
    import torch
    g = torch.Generator().manual_seed(b * 1000 + s)
    return torch.randint(0, vocab, (b, s), generator=g).to(run.device)


def train_rows(name, model, impl, run, profile):
    """``train step`` (and, eager, ``train pos+norm``) rows of one model as it is."""
    import torch
    b, s = run.batch, run.seq
    ids = _ids(run, b, s, model.config.vocab_size)
    fwd = torch.compile(model, backend=run.backend) if impl.endswith("-compile") else model
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        fwd(input_ids=ids, labels=ids).loss.backward()
    sec = timed(step, run)
    case, shape = f"{name} B {b} S {s}", f"B {b} S {s}"
    ours = "cuprope-compile" if impl.endswith("-compile") else "cuprope"
    rows = [suite_rows.make("models", "train step", case, run.dtype, impl, sec * 1e6, shape=shape,
                            ratio_to="" if impl == ours else ours,
                            note=f"{b * s / sec:.0f} tokens/s; median of {run.reps}; "
                                 f"forward + backward of the LM loss, no optimizer")]
    if profile:
        f, bw, loose = _profile(model, step, run)
        rows.append(suite_rows.make("models", "train pos+norm", case, run.dtype, impl,
                                    f + bw + loose, shape=shape,
                                    ratio_to="" if impl == ours else ours,
                                    note=f"torch.profiler: forward {f:.0f} µs, backward "
                                         f"{bw:.0f} µs per step{_loose(loose)}"))
    model.zero_grad(set_to_none=True)
    return rows


def _loose(us):
    return f"; {us:.0f} µs of it cuprope kernels the profiler linked to no range" if us else ""


def _profile(model, step, run):
    import models_profile
    step()
    return models_profile.profile_step(model, step, device=not run.dry)


def _generate_kw(ids, compiled):
    import torch
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    if compiled:
        kw["cache_implementation"] = "static"
    else:
        kw["disable_compile"] = True
    return kw


def _generate_pair(model, ids, kw, run):
    """(prefill seconds, prefill + run.decode steps seconds): one generate each."""
    import torch
    with torch.no_grad():
        def pre():
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)

        def full():
            model.generate(ids, max_new_tokens=run.decode + 1, min_new_tokens=run.decode + 1,
                           **kw)
        if run.dry:
            return _wall(pre), _wall(full)
        from cuprope.cli.bench_cases import time_gpu
        return time_gpu(pre, reps=1, warm=0), time_gpu(full, reps=1, warm=0)


def _wall(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _generation_rows(name, impl, b, pres, fulls, run, how):
    pre, full = statistics.median(pres), statistics.median(fulls)
    # (a short dry run can time the longer generate at or under the prefill)
    per = max(full - pre, 0.0) / run.decode
    rate = f"{b / per:.0f} tokens/s" if per > 0 else "no decode time left after the prefill"
    case = f"{name} B {b}"
    shape = f"B {b} prefill {run.prefill} then {run.decode} steps"
    ours = "cuprope-compile" if impl.endswith("-compile") else "cuprope"
    peer = "" if impl == ours else ours
    return [suite_rows.make("models", "prefill", case, run.dtype, impl, pre * 1e6, shape=shape,
                            ratio_to=peer, note=f"generate(max_new_tokens=1); median of "
                            f"{len(pres)}{how}"),
            suite_rows.make("models", "decode step", case, run.dtype, impl, per * 1e6,
                            shape=shape, ratio_to=peer,
                            note=f"(generate of {run.decode + 1} tokens - prefill) / "
                                 f"{run.decode}; {rate}")]


def generate_rows(name, model, impl, run):
    """``prefill`` and ``decode step`` rows of one compiled implementation
    (static cache): one warm-up, then the median of run.reps."""
    model.eval()
    rows = []
    for b in run.decode_batches:
        ids = _ids(run, b, run.prefill, model.config.vocab_size)
        kw = _generate_kw(ids, True)
        _generate_pair(model, ids, kw, run)
        pairs = [_generate_pair(model, ids, kw, run) for _ in range(run.reps)]
        rows += _generation_rows(name, impl, b, [p for p, _ in pairs], [f for _, f in pairs],
                                 run, "")
    return rows


def eager_generate_rows(name, impls, run):
    """``prefill``, ``decode step`` and ``decode pos+norm`` rows of the eager
    implementations (``impls``: name -> context manager factory taking the
    model), all on one model and interleaved: each round times every
    implementation once, after a first round that warms them all (eager
    generation is host-bound, and the first step at each cache length pays
    one-time costs, cuDNN attention's plans among them); medians of
    run.reps rounds."""
    import torch
    model = build(name, run).eval()
    rows = []
    try:
        for b in run.decode_batches:
            ids = _ids(run, b, run.prefill, model.config.vocab_size)
            kw = _generate_kw(ids, False)
            times = {impl: ([], []) for impl in impls}
            for rnd in range(run.reps + 1):
                for impl, ctx in impls.items():
                    with ctx(model):
                        pre, full = _generate_pair(model, ids, kw, run)
                    if rnd:
                        times[impl][0].append(pre)
                        times[impl][1].append(full)
            case, shape = f"{name} B {b}", f"B {b} prefill {run.prefill} then {run.decode} steps"
            for impl, ctx in impls.items():
                others = ", ".join(i for i in impls if i != impl)
                rows += _generation_rows(name, impl, b, *times[impl], run,
                                         f", interleaved with {others}")
                with ctx(model):
                    rows.append(_decode_profile(model, ids, case, shape, impl, run))
    finally:
        del model
        gc.collect()
        if not run.dry:
            torch.cuda.empty_cache()
    return rows


def _decode_profile(model, ids, case, shape, impl, run):
    import torch
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)

        # transformers renamed past_key_values to cache (5.2x): pass the one it takes
        kw = {"cache" if "cache" in inspect.signature(type(model).forward).parameters
              else "past_key_values": cache}

        def step():
            model(nxt, use_cache=True, **kw)
        f, _, loose = _profile(model, step, run)
    return suite_rows.make("models", "decode pos+norm", case, run.dtype, impl, f + loose,
                           shape=shape, ratio_to="" if impl == "cuprope" else "cuprope",
                           note="torch.profiler, one decode step after the prefill"
                                + _loose(loose))


def measure(name, run, log=progress):
    """Every row of one model: hf, cuprope, liger-rope, eager and compiled."""
    import torch

    from cuprope import torch as ctorch
    mt = CONFIGS[name]["model_type"]
    liger = liger_available(run)
    rows = []
    eager = {"hf": lambda model: _Null(), "cuprope": _Patched}
    if liger:
        eager["liger-rope"] = lambda model: Liger(mt)
    try:
        rows += eager_generate_rows(name, eager, run)
    except torch.cuda.OutOfMemoryError as e:
        run.note(f"{name} eager generation: out of memory ({str(e)[:80]}); rows skipped")
    log(f"{name} eager generation")
    for impl in ("hf", "cuprope", "liger-rope"):
        if impl == "liger-rope" and not liger:
            continue
        modes = [impl] + ([impl + "-compile"] if run.compile else [])
        for mode in modes:
            compiled = mode.endswith("-compile")
            short = run.quick or run.dry  # compiled: the first model's training step only
            if compiled and short and (name != run.models[0] or impl == "liger-rope"):
                continue
            model = build(name, run)
            if impl == "cuprope":
                ctorch.patch_hf(model)
            ctx = Liger(mt) if impl == "liger-rope" else _Null()
            try:
                with ctx:
                    torch._dynamo.reset()
                    rows += train_rows(name, model, mode, run, profile=not compiled)
                    if compiled and not short:
                        rows += generate_rows(name, model, mode, run)
            except torch.cuda.OutOfMemoryError as e:
                run.note(f"{name} {mode}: out of memory ({str(e)[:80]}); rows skipped")
            finally:
                del model
                gc.collect()
                if not run.dry:
                    torch.cuda.empty_cache()
            log(f"{name} {mode}")
    return rows


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Patched:
    """``cuprope.torch.patch_hf(model)``, undone on exit."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        from cuprope import torch as ctorch
        ctorch.patch_hf(self.model)
        return self

    def __exit__(self, *exc):
        from cuprope import torch as ctorch
        ctorch.unpatch_hf(self.model)
        return False


def suite(ctx):
    """bench_suite's ``models`` family (``ctx``: bench_suite.Ctx; --quick as
    here, --cases picks models by name)."""
    run = Run(parse_args(["--quick"] if ctx.quick else []))
    run.models = [m for m in CONFIGS if ctx.want_case(m)]
    rows = []
    for name in run.models:
        rows += measure(name, run, log=ctx.progress)
    for n in run.notes:
        ctx.note(n)
    return rows


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results_models.csv"))
    ap.add_argument("--into", default="", help="also merge the rows into this suite CSV "
                    "(its models rows replaced), e.g. benchmarks/results.csv")
    ap.add_argument("--models", default=",".join(CONFIGS))
    ap.add_argument("--quick", action="store_true", help="about 6 minutes (module docstring)")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny configs, a few steps: checks "
                    "that the script runs; its numbers mean nothing")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--decode", type=int, default=128)
    return ap.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    run = Run(a)
    run.models = [m for m in a.models.split(",") if m]
    bad = [m for m in run.models if m not in CONFIGS]
    if bad:
        sys.exit(f"models_bench: unknown models {bad}; choose from {', '.join(CONFIGS)}")
    import torch
    if not run.dry and not torch.cuda.is_available():
        sys.exit("models_bench: no CUDA GPU visible (--dry runs on the CPU)")
    device = "CPU (dry run)" if run.dry else torch.cuda.get_device_name()
    rows = []
    for name in run.models:
        rows += measure(name, run)
        suite_rows.finish(rows, device, suite_rows.commit_id())
        suite_rows.write(rows, a.out)
    print(f"wrote {len(rows)} rows on {device} to {a.out}", file=sys.stderr)
    if a.into:
        merged = suite_rows.merge([a.into, a.out])
        suite_rows.write(merged, a.into)
        print(f"merged into {a.into}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
