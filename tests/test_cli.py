"""The command line, run as a user runs it (``python -m cuprope ...`` in a
subprocess): help for every command, the bare command prints the help (exit
0), every bad argument gives one ``error:`` line on stderr and exit status 2
(never a traceback), ``check`` runs every valid head dim, and ``info`` tells
"CuPy not installed", "no CUDA driver" and "no GPU" apart."""
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, pre=None, timeout=600):
    """Run ``python -m cuprope *args`` from the source checkout; ``pre``: Python
    run first in the same interpreter (to hide CuPy)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [sys.executable, "-m", "cuprope", *args] if pre is None else [
        sys.executable, "-c", f"{pre}\nimport sys\nfrom cuprope.__main__ import main\n"
        f"sys.exit(main({list(args)!r}))"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def test_cli_commands_answer_help_and_info():
    for cmd in (["--help"], ["check", "--help"], ["bench", "--help"], ["info", "--help"], ["info"]):
        r = cli(*cmd)
        assert r.returncode == 0, (cmd, r.stderr)
        assert r.stdout.strip()
    r = cli("info")
    assert "kernel compile cache" in r.stdout and "to clear it" in r.stdout


def test_bare_command_prints_the_help_and_exits_0():
    r = cli()
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.startswith("usage: python -m cuprope")
    for cmd in ("check", "bench", "info"):
        assert f"\n    {cmd} " in r.stdout
    assert r.stdout == cli("--help").stdout


BAD = [
    # (argv, words the error line must hold)
    (["check", "--head-dim", "2"], ["--head-dim", "even integer from 4 to 1024", "got 2"]),
    (["check", "--head-dim", "7"], ["--head-dim", "got 7"]),
    (["check", "--head-dim", "0"], ["--head-dim", "got 0"]),
    (["check", "--head-dim", "-4"], ["--head-dim", "got -4"]),
    (["check", "--head-dim", "1026"], ["--head-dim", "got 1026"]),
    (["check", "--head-dim", "6.0"], ["--head-dim", "'6.0'"]),
    (["check", "--head-dim", "x"], ["--head-dim", "'x'"]),
    (["check", "--head-dim"], ["--head-dim", "expected one argument"]),
    (["check", "--dtype", "float64"], ["--dtype", "float64", "float32", "bfloat16"]),
    (["check", "--dtype", "bf16"], ["--dtype", "bf16"]),
    (["check", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["bench", "--reps", "0"], ["--reps", "from 1 to 10000", "got 0"]),
    (["bench", "--reps", "-3"], ["--reps", "got -3"]),
    (["bench", "--reps", "ten"], ["--reps", "'ten'"]),
    (["bench", "--dtype", "int8"], ["--dtype", "int8"]),
    (["bench", "--seconds", "3"], ["unrecognized arguments: --seconds 3"]),
    (["info", "--verbose"], ["unrecognized arguments: --verbose"]),
    (["frob"], ["invalid choice: 'frob'"]),
]


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_give_one_error_line_and_exit_2(argv, words):
    r = cli(*argv)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    cmd = "python -m cuprope" + ("" if argv[0] == "frob" else f" {argv[0]}")
    assert lines[0].startswith(f"{cmd}: error: "), lines[0]
    assert lines[0].endswith(f"(see {cmd} --help)"), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("head_dim", [4, 6, 10])
def test_check_runs_every_even_head_dim_with_partial_rotary_rounded_to_even(head_dim):
    r = cli("check", "--cpu", "--head-dim", str(head_dim), "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    partial = head_dim // 4 * 2
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("float32 ")]
    assert len(rows) == 12 and all(ln.endswith(" ok") for ln in rows), r.stdout
    assert {ln.split()[2] for ln in rows} == {f"{head_dim}/{head_dim}", f"{partial}/{head_dim}"}
    assert "12/12 configurations within budget" in r.stdout


def test_check_help_states_the_valid_values():
    out = cli("check", "--help").stdout
    for words in ("--head-dim D", "even integer from 4 to 1024", "--dtype DTYPE", "float32",
                  "float16", "bfloat16", "--cpu", "R = D/2 rounded down to even"):
        assert words in " ".join(out.split()), words


def test_bench_help_states_what_it_times_against_what_and_its_options():
    out = " ".join(cli("bench", "--help").stdout.split())
    for words in ("rope_qk_forward(q, k, cfg, out=(q_out, k_out))", "inplace=True", "qkv_slices",
                  "llama3-8b (B 4, S 4096, 32 q heads, 8 k heads, D 128)",
                  "a device-to-device copy of the bytes the op must move", "torch-eager",
                  "torch-compile", "cuprope-hf-tables", "us = the median of --reps CUDA-event",
                  "TB/s = the fewest bytes", "/copy = copy time / op time", "--dtype DTYPE",
                  "--reps N", "--no-peers", "--no-decode", "needs a CUDA GPU and PyTorch"):
        assert words.lower() in out.lower(), words


def _machine_state():
    """This machine's CUDA state found here, independently of cuprope.cli.info."""
    try:
        import cupy
    except ImportError:
        return "no-cupy"
    rt = cupy.cuda.runtime
    if rt.driverGetVersion() == 0:
        return "no-driver"
    try:
        return "gpu" if rt.getDeviceCount() > 0 else "no-gpu"
    except rt.CUDARuntimeError as e:
        return {100: "no-gpu", 35: "old-driver"}.get(e.status, "cuda-error")


INFO_LINE = {"no-cupy": "GPU: none used: CuPy not installed",
             "no-driver": "GPU: none used: no CUDA driver",
             "no-gpu": "GPU: none used: no GPU",
             "old-driver": "GPU: none used: the CUDA driver",
             "gpu": "GPU 0: "}


def test_info_names_this_machines_cuda_state():
    r = cli("info")
    assert r.returncode == 0, r.stderr
    assert INFO_LINE[_machine_state()] in r.stdout, r.stdout


def test_info_and_check_without_cupy_say_cupy_is_not_installed():
    hide = "import sys; sys.modules['cupy'] = None"
    r = cli("info", pre=hide)
    assert r.returncode == 0, r.stderr
    assert INFO_LINE["no-cupy"] in r.stdout and "pip install cupy-cuda" in r.stdout, r.stdout
    assert "the NumPy backend runs" in r.stdout
    r = cli("check", "--dtype", "float32", "--head-dim", "8", pre=hide)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cuprope check: NumPy backend (CuPy not installed)"), r.stdout


@pytest.mark.skipif(_machine_state() == "gpu", reason="a GPU is visible: check runs the kernels")
def test_check_without_a_gpu_runs_the_numpy_backend_and_says_why():
    from cuprope.cli.info import cuda_state
    r = cli("check", "--dtype", "float16", "--head-dim", "8")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"cuprope check: NumPy backend ({cuda_state().reason})"), first


# ------------------------------------------------------------ info's states from a fake CuPy
class FakeCudaError(Exception):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


def fake_runtime(driver, count):
    """A ``cupy.cuda.runtime`` stand-in: ``count`` is a device count or the
    cudaError_t status getDeviceCount raises."""
    def device_count():
        if isinstance(count, tuple):
            raise FakeCudaError(*count)
        return count
    props = {"name": b"Fake GPU", "major": 9, "minor": 0, "multiProcessorCount": 132,
             "totalGlobalMem": 80 * 2 ** 30}
    return types.SimpleNamespace(driverGetVersion=lambda: driver, runtimeGetVersion=lambda: 13000,
                                 getDeviceCount=device_count,
                                 getDeviceProperties=lambda d: props)


NO_DRIVER = (35, "cudaErrorInsufficientDriver: CUDA driver version is insufficient")
STATES = [
    ("no-driver", fake_runtime(0, NO_DRIVER), ["no CUDA driver", "CUDA runtime 13.0"]),
    ("old-driver", fake_runtime(12020, NO_DRIVER),
     ["the CUDA driver (CUDA 12.2) is older than CuPy's CUDA runtime 13.0", "cupy-cuda12x"]),
    ("no-gpu", fake_runtime(13000, (100, "cudaErrorNoDevice: no CUDA-capable device")),
     ["no GPU", "driver (CUDA 13.0) is installed but sees no device", "cudaErrorNoDevice"]),
    ("no-gpu", fake_runtime(13000, 0), ["no GPU", "0 devices"]),
    ("cuda-error", fake_runtime(13000, (999, "cudaErrorUnknown")), ["CUDA error", "cudaErrorUnknown"]),
    ("gpu", fake_runtime(13000, 2), ["CUDA driver 13.0, CUDA runtime 13.0"]),
]


@pytest.mark.parametrize("kind,rt,words", STATES, ids=[f"{s[0]}-{i}" for i, s in enumerate(STATES)])
def test_info_tells_the_cuda_states_apart(monkeypatch, kind, rt, words):
    from cuprope.cli import info
    fake = types.SimpleNamespace(__version__="14.9.9", cuda=types.SimpleNamespace(runtime=rt))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    state = info.cuda_state()
    assert state.kind == kind and state.usable == (kind == "gpu")
    text = info.report()
    for w in words:
        assert w in text, (w, text)
    if kind == "gpu":
        assert "GPU 0: Fake GPU, sm_90, 132 SMs, 80 GiB" in text and "GPU 1: " in text
        assert "NumPy backend" not in text
    else:
        assert "GPU: none used: " in text and "the NumPy backend runs" in text


@pytest.mark.gpu
@pytest.mark.skipif(_machine_state() != "gpu", reason="no CUDA GPU visible (CuPy absent or no device)")
@pytest.mark.parametrize("head_dim", [6, 128])
def test_check_on_the_gpu_runs_the_kernels_at_every_valid_head_dim(head_dim):
    r = cli("check", "--head-dim", str(head_dim))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.startswith("cuprope check: CUDA kernels on GPU "), r.stdout
    assert "36/36 configurations within budget" in r.stdout, r.stdout


@pytest.mark.gpu
@pytest.mark.skipif(_machine_state() != "gpu", reason="no CUDA GPU visible (CuPy absent or no device)")
def test_bench_options_choose_the_dtype_the_peers_and_the_decode_line():
    pytest.importorskip("torch")
    r = cli("bench", "--dtype", "float32", "--reps", "2", "--no-peers", "--no-decode")
    assert r.returncode == 0, (r.stdout, r.stderr)
    rows = [ln.split() for ln in r.stdout.splitlines()[2:]]
    assert {(row[0], row[1]) for row in rows} == {
        ("llama3-8b", "qk_fwd"), ("llama3-8b", "qk_inplace"), ("mha-d64", "qk_fwd"),
        ("llama3-8b", "qkv_slices")}, r.stdout
    assert {row[2] for row in rows} == {"fp32"} and {row[3] for row in rows} == {"copy", "cuprope"}
    assert all(float(row[4]) > 0 for row in rows)
    assert "decode" not in r.stdout


def test_bench_suite_passes_its_arguments_to_the_checkout_suite():
    r = cli("bench", "--suite", "--help")
    assert r.returncode == 0, r.stderr
    assert "--only" in r.stdout and "--quick" in r.stdout  # the suite's own options
    r = cli("bench", "--suite", "--only", "nosuchfamily")
    assert r.returncode != 0 and "nosuchfamily" in r.stderr


def test_bench_suite_without_torch_names_the_install_in_one_line(tmp_path):
    """torch hidden from both interpreters (the CLI's and the suite's child) by a
    sitecustomize on PYTHONPATH: one error line naming the install, exit 2."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-m", "cuprope", "bench", "--suite", "--quick"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bench_suite: error: ") and "pip install torch" in lines[0]


def test_bench_suite_outside_a_checkout_says_where_the_suite_lives(monkeypatch, capsys):
    from cuprope.cli import bench
    monkeypatch.setattr(bench, "suite_path", lambda: None)
    assert bench.run_suite(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "source checkout" in err and "benchmarks/bench_suite.py" in err
