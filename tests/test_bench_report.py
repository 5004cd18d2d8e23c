"""The benchmark suite's CSV and report on the CPU (no GPU):

* the committed benchmarks/results.csv has the suite's schema and a device in
  every row; suite_rows writes and reads it back;
* report.py marks each performance target met / not met from the data
  (synthetic rows on both sides of each bound), draws one PNG per family and a
  summary, writes TARGETS.md and prints the README's table; the committed
  TARGETS.md and the README's performance table are what it writes from the
  committed CSV; notebook 04, which shows them, runs in test_notebooks.py;
* benchmarks/bench_suite.py --help works without a GPU, a wrong family is
  refused, and the measuring functions it calls exist.
"""
import csv
import json
import importlib
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
CSV = BENCH / "results.csv"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
import suite_rows  # noqa: E402


def test_committed_csv_has_the_schema_and_a_device_in_every_row():
    with open(CSV, newline="") as f:
        header = next(csv.reader(f))
    assert tuple(header) == suite_rows.COLUMNS
    rows = suite_rows.read(CSV)
    assert rows
    assert all(r["device"] and r["commit"] for r in rows)
    fams = {r["family"] for r in rows}
    assert {"rotation", "qknorm", "kv", "decode", "host", "jax"} <= fams, fams
    # every row has a time or a ratio, or is the reference of a ratio in its group (a
    # converted row whose old CSV kept only ratios); fractions of copy are fractions
    key = lambda r: (r["family"], r["op"], r["case"], r["dtype"], r["device"])  # noqa: E731
    refs = {key(r) + (r["ratio_to"],) for r in rows if r["ratio"] is not None}
    assert all(r["us"] is not None or r["ratio"] is not None or key(r) + (r["impl"],) in refs
               for r in rows)
    assert all(0 < r["frac_copy"] < 1.5 for r in rows if r["frac_copy"] is not None)


def test_read_refuses_a_missing_column_and_a_row_without_device(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("family,op\nrotation,qk_fwd\n")
    with pytest.raises(ValueError, match="missing"):
        suite_rows.read(p)
    rows = suite_rows.finish([suite_rows.make("rotation", "qk_fwd", "c", "bf16", "copy", 1.0)],
                             "", "abc")
    suite_rows.write(rows, p)
    with pytest.raises(ValueError, match="no device"):
        suite_rows.read(p)


def _rows(**v):
    """Synthetic rows covering every target; v overrides cuprope's µs per group."""
    m = suite_rows.make
    rows = []
    for fam, op, case, dt, copy, ours, peers in (
            ("qknorm", "fwd", "q", "bf16", 90.0, v.get("qk_fwd", 95.0), {}),
            ("qknorm", "bwd", "q", "bf16", 85.0, 95.0, {}),
            ("qknorm", "fwd autograd", "q", "bf16", None, 100.0, {"torch-compile": 125.0}),
            ("qknorm", "fwd+bwd autograd", "q", "bf16", None, 100.0, {"torch-compile": 130.0}),
            ("kv", "append", "decode B 1", "fp8qkv", 1.0, v.get("kv_b1", 2.0),
             {"flashinfer": 2.4}),
            ("kv", "append", "prefill 16384", "fp8qkv", 86.0, 100.0, {"flashinfer": 140.0}),
            ("prologue", "norm+append", "decode B 1", "fp8qkv", 1.0, v.get("pro_b1", 2.5),
             {"flashinfer-no-norm": 2.4, "unfused": 5.6, "cuprope-two-launches": 4.0}),
            ("prologue", "norm+append", "prefill 16384", "fp8qkv", 86.0, 100.0,
             {"unfused": 300.0, "cuprope-two-launches": 140.0}),
            ("mla", "rope+append", "decode B 1", "fp8", 1.0, v.get("mla_b1", 2.4),
             {"flashinfer": 2.45, "unfused": 9.0}),
            ("decode", "rope_qk in place", "B 1", "bf16", 1.0, 1.5,
             {"flashinfer-cos-sin-cache": 1.6}),
            ("rotation", "qk_fwd", "llama3-8b", "bf16", 98.0, 100.0, {"torch-compile": 106.0}),
            ("jax", "rope_qk fwd", "llama3-8b", "bf16", None, 100.0, {"xla": 111.0}),
            ("models", "train pos+norm", "m", "bf16", None, v.get("models_pn", 10.0),
             {"hf": 40.0, "liger-rope": 20.0}),
            ("models", "train step", "m", "bf16", None, 100.0, {"hf": 101.0})):
        ours_impl = "cuprope-jit" if fam == "jax" else "cuprope"
        if copy is not None:
            rows.append(m(fam, op, case, dt, "copy", copy))
        rows.append(m(fam, op, case, dt, ours_impl, ours))
        rows += [m(fam, op, case, dt, p, us, ratio_to=ours_impl) for p, us in peers.items()]
    rows += [m("pdl", "rope_qk_forward in place", "B 1", "bf16", "cuprope-pdl",
               v.get("pdl", 7.0)),
             m("pdl", "rope_qk_forward in place", "B 1", "bf16", "cuprope-no-pdl", 7.5,
               ratio_to="cuprope-pdl")]
    rows += [m("models", "train step", "m", "bf16", "cuprope-compile", 90.0),
             m("models", "train step", "m", "bf16", "hf-compile", 91.0, ratio_to="cuprope-compile")]
    rows += [m("host", "torch mul_", "B 8", "bf16", "torch-mul_", 10.0, ratio=1.0),
             m("host", "rope_qk_forward in place, positions int32 [B,1]", "B 8", "bf16",
               "cuprope", 12.0, ratio=v.get("host", 1.2), ratio_to="torch-mul_"),
             m("host", "kv append fp8 (device scales), paged", "B 8", "bf16", "cuprope", 14.0,
               ratio=1.4, ratio_to="torch-mul_"),
             m("host", "prologue fp8 (device scales, fp8 q out), paged", "B 8", "bf16",
               "cuprope", 14.0, ratio=v.get("host_fused", 1.45), ratio_to="torch-mul_"),
             m("host", "rope_append_mla fp8, DeepSeek-V3", "T 8", "bf16", "cuprope", 14.0,
               ratio=1.3, ratio_to="torch-mul_")]
    return suite_rows.finish(rows, "TEST GPU", "deadbee")


def _status(rows):
    return {e["target"].split(" >=")[0].split(" <=")[0]: e["status"] for e in report.evaluate(rows)}


def test_every_target_met_on_rows_past_every_bound():
    st = _status(_rows())
    assert len(st) == len(report.TARGETS)
    assert set(st.values()) == {"met"}, st


@pytest.mark.parametrize("override, target", [
    (dict(qk_fwd=101.0), "QK-norm + RoPE forward, fraction of copy"),
    (dict(kv_b1=2.5), "KV append at decode"),
    (dict(pro_b1=2.7), "Decode prologue within 1.1×"),
    (dict(mla_b1=2.5), "MLA append at or under FlashInfer"),
    (dict(host=1.31), "Host time per call of plain RoPE"),
    (dict(host_fused=1.51), "Host time per call of the KV append, the prologue and MLA"),
    (dict(pdl=7.6), "Programmatic dependent launch"),
    (dict(models_pn=14.0), "Models: position encoding + q/k norm per step, HF eager's"),
])
def test_a_row_past_its_bound_is_not_met(override, target):
    st = _status(_rows(**override))
    hit = [k for k in st if k.startswith(target)]
    assert hit and all(st[k] == "not met" for k in hit), st
    assert sum(s == "not met" for s in st.values()) == 1, st


def test_every_host_row_of_a_cuprope_call_meets_one_host_target():
    """host_overhead's rows (built on host tensors): the plain rotation's are
    held to 1.3× mul_, the KV append's, the prologue's and MLA's to 1.5×,
    none to both; the rows named in ROW_CASES exist."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT))
    ho = importlib.import_module("host_overhead")
    names = [n for n, _ in ho.decode_rows(dev="cpu")]
    rows = [dict(family="host", impl="cuprope", op=n, ratio=1.0) for n in names[1:]]
    plain = {n for n, _ in report._host(rows)}
    fused = {n for n, _ in report._host_fused(rows)}
    assert not plain & fused
    assert len(plain) == 3 and [n.split()[0] for n in sorted(fused)] == ["kv"] * 4 + [
        "prologue"] * 2 + ["rope_append_mla"]
    assert set(ho.ROW_CASES) <= set(names)


def test_a_missing_peer_is_incomplete_not_met_and_no_rows_is_no_data():
    rows = [r for r in _rows() if not (r["family"] == "decode" and r["impl"].startswith("flash"))]
    st = _status(rows)
    assert st["Plain RoPE at decode ≤ FlashInfer cos/sin cache (its µs / ours), B 1–1024"] == \
        "no data"
    rows = _rows() + suite_rows.finish([suite_rows.make("decode", "rope_qk in place", "B 64",
                                                        "bf16", "cuprope", 1.0)], "TEST GPU", "x")
    assert _status(rows)["Plain RoPE at decode ≤ FlashInfer cos/sin cache (its µs / ours), "
                         "B 1–1024"] == "incomplete"


def test_ratio_rows_count_when_the_old_csv_kept_no_us():
    rows = suite_rows.finish([
        suite_rows.make("qknorm", "fwd autograd", "q", "bf16", "cuprope", None),
        suite_rows.make("qknorm", "fwd autograd", "q", "bf16", "torch-compile", None, ratio=0.9,
                        ratio_to="cuprope")], "G", "c")
    e = [x for x in report.evaluate(rows) if x["target"].startswith("QK-norm + RoPE forward vs")]
    assert e[0]["status"] == "not met" and e[0]["value"] == pytest.approx(0.9)


def test_report_draws_one_png_per_family_and_writes_every_target(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    targets = tmp_path / "TARGETS.md"
    assert report.main([str(CSV), "--figures", str(tmp_path), "--targets", str(targets)]) == 0
    out = capsys.readouterr().out
    rows = report.load(CSV)
    fams = {r["family"] for r in rows}
    pngs = {p.stem for p in tmp_path.glob("*.png")}
    assert pngs == fams | {"summary"}
    assert all((tmp_path / f"{f}.png").stat().st_size > 5000 for f in fams | {"summary"})
    text = targets.read_text()
    for t, *_ in report.TARGETS:
        assert t in text
    assert text.count("**met**") + text.count("**not met**") + text.count("**incomplete**") + \
        text.count("**no data**") == len(report.TARGETS)
    assert out.strip() == report.readme_markdown(rows)


def test_committed_targets_file_is_what_the_report_writes():
    committed = (BENCH / "TARGETS.md").read_text()
    assert committed == report.targets_file(report.load(CSV)), \
        "benchmarks/TARGETS.md is stale: run python benchmarks/report.py"


def test_readme_performance_table_is_what_the_report_writes():
    text = (ROOT / "README.md").read_text()
    a, b = text.find(report.README_BEGIN), text.find(report.README_END)
    assert 0 <= a < b, "README.md has no performance table markers"
    got = text[a + len(report.README_BEGIN):b].strip()
    assert got == report.readme_markdown(report.load(CSV)), \
        "README's performance table is stale: python benchmarks/report.py --readme README.md"


def test_readme_table_has_cupropes_time_for_every_size_on_the_committed_csv():
    for e in report.readme_rows(report.load(CSV)):
        assert all(v is not None for v in e["ours"]), e["op"]
        assert e["peers"] or e["copy"][0], e["op"]


def test_readme_table_rows_from_synthetic_rows_and_a_missing_peer():
    rows = _rows()
    md = report.readme_markdown(rows)
    kv = next(ln for ln in md.splitlines() if "rope_append_kv" in ln and "cache_angles" not in ln)
    # decode B 1 measured, the other four sizes absent: "–" in each of their cells
    assert "| 2.00 / – / – / – / 100 |" in kv and "FlashInfer: 2.40 / – / – / – / 140" in kv
    assert "TEST GPU" in md
    # a peer with no row at any size is left out, not shown as dashes
    assert "Liger" not in next(ln for ln in md.splitlines() if "rope_append_kv" in ln)


def test_update_readme_rewrites_between_the_markers_only(tmp_path):
    p = tmp_path / "README.md"
    p.write_text(f"# t\n\nbefore\n{report.README_BEGIN}\nold table\n{report.README_END}\nafter\n")
    report.update_readme(_rows(), p)
    text = p.read_text()
    assert "old table" not in text and text.startswith("# t\n\nbefore\n")
    assert text.endswith(f"{report.README_END}\nafter\n")
    assert report.readme_markdown(_rows()) in text
    p.write_text("# no markers\n")
    with pytest.raises(ValueError, match="markers"):
        report.update_readme(_rows(), p)


def test_bench_suite_help_works_without_a_gpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, str(BENCH / "bench_suite.py"), "--help"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for opt in ("--only", "--quick", "--fi-bin", "--out"):
        assert opt in r.stdout
    r = subprocess.run([sys.executable, str(BENCH / "bench_suite.py"), "--only", "nope"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unknown families" in r.stderr


def test_bench_suite_without_a_gpu_says_so(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = tmp_path / "r.csv"
    r = subprocess.run([sys.executable, str(BENCH / "bench_suite.py"), "--only", "rotation",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no CUDA GPU" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("module, names", [
    ("qknorm_bench", ("measure", "SHAPES", "DTYPES")),
    ("kvcache_bench", ("run_case", "flashinfer_lines", "flashinfer_rows", "CASES", "MODES")),
    ("decode_bench", ("measure", "flashinfer_decode", "BATCHES")),
    ("host_overhead", ("decode_rows", "measure", "cupy_rows")),
    ("jax_bench", ("measure", "SHAPES")),
    ("jax_qknorm_bench", ("measure", "SHAPES")),
    ("prologue_bench", ("run_case", "CASES", "HQ", "HK", "D", "PAGE")),
    ("mla_bench", ("run_case", "flashinfer_mla_rows", "CASES", "H", "R", "N", "PAGE")),
    ("suite_fused", ("qknorm", "kv", "prologue", "mla", "decode", "pdl", "host", "jax_calls")),
    ("pdl_bench", ("measure", "build", "OPS", "BATCHES", "LAYERS", "HQ", "HK", "D", "MLA_H")),
    ("models_bench", ("suite", "measure", "CONFIGS")),
    ("models_profile", ("profile_step", "attribute", "ranges")),
    ("cuprope.cli.bench_cases", ("run_case", "run_scheme_case", "time_gpu", "cos_sin_tables",
                                 "SHAPES", "SCHEME_OPS", "Row")),
])
def test_the_measuring_functions_the_suite_calls_exist(module, names):
    pytest.importorskip("torch")
    if module.startswith("jax"):
        pytest.importorskip("jax")
    sys.path.insert(0, str(ROOT))
    mod = importlib.import_module(module)
    for n in names:
        assert callable(getattr(mod, n)) or getattr(mod, n), f"{module}.{n}"


class _Ctx:
    """bench_suite.Ctx's interface, with FlashInfer lines given."""
    quick, cases, dtypes = False, [], []

    def __init__(self, fi):
        self._fi = fi

    def want_case(self, name):
        return True

    def dts(self, default):
        return list(default)

    def fi_lines(self):
        return self._fi

    def fi_note(self):
        return "" if self._fi else "FlashInfer not run (no fi_bench_bin)"

    note = progress = staticmethod(lambda msg: None)


def _fake_modules(monkeypatch):
    """Stand-ins for the GPU measuring modules, returning what the real ones return."""
    import types
    mods = {}
    qb = types.SimpleNamespace(SHAPES={"llama": ("Llama-3-8B prefill", 4, 4096, 32, 8, 128),
                                       "qwen3": ("Qwen3-8B prefill", 4, 4096, 32, 8, 128)},
                               DTYPES={"bf16": 0, "fp16": 1, "fp32": 2})
    qb.measure = lambda *a, reps=30: dict(
        copy_f=9e-5, copy_b=1.3e-4, fwd=1e-4, bwd=1.5e-4, fwd_tab=1.05e-4, bwd_tab=1.6e-4,
        fused_f=1.1e-4, fused_fb=3e-4,
        hf_f=1.2e-4, hf_fb=3.3e-4, unf_f=4e-4, unf_fb=6e-4, liger_f=1.5e-4, liger_fb=4e-4,
        bytes_f=2 ** 28, bytes_b=3 * 2 ** 27)
    mods["qknorm_bench"] = qb
    kb = types.SimpleNamespace(HQ=32, HK=8, D=128, PAGE=16, MODES=("bf16", "fp8kv", "fp8qkv"),
                               CASES=[("decode", 1, 1), ("prefill", 1, 16384)])
    kb.run_case = lambda kind, b, per, mode: dict(
        case=kind, B=b, tokens=b * per, mode=mode, MB=1.0, bytes=2 ** 20, copy_us=1.0,
        fused_us=2.0, table_us=1.9, unfused_us=5.0)
    kb.flashinfer_rows = lambda lines: {r["tokens"]: r for r in lines
                                        if r.get("impl") == "flashinfer_rope_fp8_paged_append"}
    mods["kvcache_bench"] = kb
    pb = types.SimpleNamespace(HQ=32, HK=8, D=128, PAGE=16,
                               CASES=[("decode", 1, 1), ("prefill", 1, 16384)])
    pb.run_case = lambda kind, b, per: dict(
        case=kind, B=b, tokens=b * per, MB=1.0, bytes=2 ** 20, copy_us=1.0, fused_us=2.5,
        two_launches_us=4.0, unfused_us=6.0)
    mods["prologue_bench"] = pb
    mb = types.SimpleNamespace(H=128, R=64, N=512, PAGE=64,
                               CASES=[("decode", 1, 1), ("prefill", 1, 16384)])
    mb.run_case = lambda kind, b, per: dict(case=kind, tokens=b * per, MB=1.0, bytes=2 ** 21,
                                            copy_us=1.5, fused_us=3.0, unfused_us=12.0)
    mb.flashinfer_mla_rows = lambda lines: {r["tokens"]: r for r in lines
                                            if r.get("kernel") == "mla_rope_quant_append"}
    mods["mla_bench"] = mb
    db = types.SimpleNamespace(HQ=32, HK=8, D=128, BATCHES=(1, 64))
    db.measure = lambda batches: [dict(B=b, bytes=4096 * b, copy_us=1.0, core_us=1.5,
                                       core_table_us=1.8, csc_us=1.9) for b in batches]
    db.flashinfer_decode = lambda lines: {r["B"]: r for r in lines if r.get("S") == 1}
    mods["decode_bench"] = db
    ho = types.SimpleNamespace()
    ho.decode_rows = lambda: [("torch mul_ (one eager op)", None),
                              ("rope_qk_forward in place, positions int32 [B,1]", None)]
    ho.cupy_rows = lambda: [("cupy rope_qk_forward in place (fp32)", None)]
    ho.measure = lambda rows, calls, blocks: {n: [10.0 + i] * blocks for i, (n, _) in
                                              enumerate(rows)}
    mods["host_overhead"] = ho
    jb = types.SimpleNamespace(SHAPES={"llama3-8b": (), "decode-b1": ()})
    jb.measure = lambda dt, name, reps, rounds: dict(xla_fwd=110.0, cuprope_jit_fwd=100.0,
                                                     torch_fwd=90.0, xla_grad=300.0,
                                                     cuprope_jit_grad=280.0)
    mods["jax_bench"] = jb
    jq = types.SimpleNamespace(SHAPES={"qwen3-8b prefill": ()})
    jq.measure = lambda name, dt, reps, rounds: dict(xla=300.0, ours=150.0, xla_step=570.0,
                                                     ours_step=550.0)
    mods["jax_qknorm_bench"] = jq
    for k, v in mods.items():
        monkeypatch.setitem(sys.modules, k, v)


FI_LINES = [
    {"impl": "flashinfer", "dtype": "bf16", "B": 1, "S": 1, "Hq": 32, "Hk": 8, "D": 128,
     "bytes": 20480, "copy_us": 1.0, "computed_us": 1.5, "cache_us": 1.4, "cache_inplace_us": 1.6,
     "ratio_computed": 0.6, "ratio_cache": 0.7, "ratio_cache_inplace": 0.6, "err": "no error"},
    {"impl": "flashinfer_rope_fp8_paged_append", "B": 1, "tokens": 1, "Hq": 32, "Hk": 8,
     "D": 128, "bytes": 100, "copy_us": 1.0, "fused_us": 2.4, "ratio": 0.41, "err": "no error"},
    {"impl": "flashinfer", "kernel": "mla_rope_quant_append", "B": 1, "tokens": 1, "Hq": 128,
     "rope_dim": 64, "nope_dim": 512, "page": 64, "bytes": 100, "copy_us": 1.2, "us": 2.4,
     "ratio": 0.5, "err": "no error"}]


@pytest.mark.parametrize("fi", [FI_LINES, []], ids=["with FlashInfer", "without FlashInfer"])
def test_suite_families_turn_measurements_into_schema_rows(monkeypatch, tmp_path, fi):
    _fake_modules(monkeypatch)
    monkeypatch.delitem(sys.modules, "suite_fused", raising=False)
    import suite_fused
    ctx = _Ctx(fi)
    rows = []
    for fam in (suite_fused.qknorm, suite_fused.kv, suite_fused.prologue, suite_fused.mla,
                suite_fused.decode, suite_fused.host, suite_fused.jax_calls):
        rows += fam(ctx)
    suite_rows.finish(rows, "TEST GPU", "deadbee")
    p = tmp_path / "r.csv"
    suite_rows.write(rows, p)
    back = suite_rows.read(p)
    assert len(back) == len(rows)
    assert {r["family"] for r in back} == {"qknorm", "kv", "prologue", "mla", "decode", "host",
                                           "jax"}
    fwd = [r for r in back if r["family"] == "qknorm" and r["op"] == "fwd" and
           r["impl"] == "cuprope"]
    assert fwd[0]["frac_copy"] == pytest.approx(0.9) and fwd[0]["us"] == pytest.approx(100.0)
    tc = [r for r in back if r["op"] == "fwd autograd" and r["impl"] == "torch-compile"]
    assert tc[0]["ratio"] == pytest.approx(120 / 110)
    host = [r for r in back if r["family"] == "host" and r["impl"] == "cuprope"]
    assert [round(r["ratio"], 3) for r in host] == [round(11 / 10, 3), round(12 / 10, 3)]
    st = {e["target"]: e for e in report.evaluate(back)}
    kv = next(e for t, e in st.items() if t.startswith("KV append at decode"))
    dec = next(e for t, e in st.items() if t.startswith("Plain RoPE at decode"))
    pro = next(e for t, e in st.items() if t.startswith("Decode prologue within"))
    two = next(e for t, e in st.items() if t.startswith("Decode prologue vs two separate"))
    mla = next(e for t, e in st.items() if t.startswith("MLA append at or under"))
    mla_unf = next(e for t, e in st.items() if t.startswith("MLA append vs the unfused"))
    assert two["status"] == "met" and two["value"] == pytest.approx(4.0 / 2.5)
    assert mla_unf["status"] == "met" and mla_unf["value"] == pytest.approx(4.0)
    if fi:
        assert pro["status"] == "met" and pro["value"] == pytest.approx(2.4 / 2.5)
        assert mla["status"] == "not met" and mla["value"] == pytest.approx(2.4 / 3.0)
        assert kv["status"] == "met" and kv["value"] == pytest.approx(1.2)
        assert dec["status"] == "incomplete"  # fi_bench_bin has B 1, not B 64
        assert any(r["impl"] == "flashinfer" and r["frac_copy"] == pytest.approx(0.41)
                   for r in back)
    else:
        assert kv["status"] == dec["status"] == pro["status"] == mla["status"] == "no data"
        assert not any(r["impl"].startswith("flashinfer") for r in back)
        assert any("FlashInfer not run" in r["note"] for r in back if r["family"] == "kv")


def _suite_ctx(fi_bin, quick=True):
    import argparse

    import bench_suite
    return bench_suite.Ctx(argparse.Namespace(quick=quick, cases="", dtypes="", fi_bin=fi_bin))


def test_flashinfer_lines_from_the_binary_absent_or_failing(tmp_path):
    pytest.importorskip("torch")  # kvcache_bench imports torch
    ctx = _suite_ctx(str(tmp_path / "nope"))
    assert ctx.fi_lines() == [] and "no fi_bench_bin" in ctx.fi_note()
    fake = tmp_path / "fi_bench_bin"
    good = json.dumps(FI_LINES[1])
    bad = json.dumps(dict(FI_LINES[0], err="an illegal memory access was encountered"))
    fake.write_text(f"#!/bin/sh\necho '{good}'\necho '{bad}'\necho 'not json'\n")
    fake.chmod(0o755)
    ctx = _suite_ctx(str(fake))
    assert ctx.fi_lines() == [FI_LINES[1]] and ctx.fi_note() == ""
    fake.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    ctx = _suite_ctx(str(fake))
    assert ctx.fi_lines() == [] and "exited with 3" in ctx.fi_note()


def test_rotation_and_schemes_families_rows(monkeypatch):
    import bench_suite

    import cuprope.cli.bench_cases as cb
    shape = cb.SHAPES["llama3-8b"]

    def run_case(name, shp, op, dt, peers=True, reps=30):
        rows = [cb.Row(name, op, dt, "copy", shp, 1000, 1e-4, 1e-4),
                cb.Row(name, op, dt, "cuprope", shp, 1000, 1.02e-4, 1e-4)]
        if peers:
            rows.append(cb.Row(name, op, dt, "torch-compile", shp, 1000, 1.1e-4, 1e-4))
        return rows

    def run_scheme_case(name, shp, op, dt, reps=30):
        return [cb.Row(name, op, dt, "copy", shp, 1000, 1e-4, 1e-4),
                cb.Row(name, op, dt, "cuprope", shp, 1000, 1.25e-4, 1e-4)]
    monkeypatch.setattr(cb, "run_case", run_case)
    monkeypatch.setattr(cb, "run_scheme_case", run_scheme_case)
    monkeypatch.setattr(bench_suite, "_liger_rotation", lambda *a: [])
    fi = dict(FI_LINES[0], S=4096, B=4, bytes=1000, computed_us=120.0, cache_us=90.0,
              ratio_computed=0.8, ratio_cache=0.95)
    ctx = _suite_ctx("")
    ctx._fi = [fi]
    rows = bench_suite.rotation(ctx) + bench_suite.schemes(ctx)
    suite_rows.finish(rows, "TEST GPU", "c")
    rot = [r for r in rows if r["family"] == "rotation"]
    assert {r["case"] for r in rot} == set(bench_suite.QUICK_CASES)
    assert {r["op"] for r in rot} == {"qk_fwd", "qk_bwd"}
    ours = [r for r in rot if r["impl"] == "cuprope"]
    assert all(r["frac_copy"] == pytest.approx(1 / 1.02) for r in ours)
    tc = [r for r in rot if r["impl"] == "torch-compile"]
    assert tc and all(r["op"] == "qk_fwd" and r["ratio"] == pytest.approx(110 / 102) for r in tc)
    f = [r for r in rot if r["impl"].startswith("flashinfer")]
    assert [(r["case"], r["impl"], r["frac_copy"]) for r in f] == [
        ("llama3-8b", "flashinfer", 0.8), ("llama3-8b", "flashinfer-cos-sin-cache", 0.95)]
    assert f[0]["ratio"] == pytest.approx(120 / 102)
    assert {r["family"] for r in rows} == {"rotation", "schemes", "lrpe"}
    assert rot[0]["shape"] == "B {} S {} Hq {} Hk {} D {}".format(*shape[:5])


def test_merge_joins_one_devices_csvs_and_refuses_two_devices(tmp_path):
    import bench_suite
    a, b, c, out = (tmp_path / n for n in ("a.csv", "b.csv", "c.csv", "out.csv"))
    m = suite_rows.make
    suite_rows.write(suite_rows.finish([m("rotation", "qk_fwd", "x", "bf16", "copy", 1.0),
                                        m("kv", "append", "B 1", "bf16", "copy", 9.0)], "G", "1"), a)
    suite_rows.write(suite_rows.finish([m("kv", "append", "B 1", "bf16", "copy", 2.0)], "G", "2"),
                     b)
    suite_rows.write(suite_rows.finish([m("jax", "f", "x", "bf16", "xla", 3.0)], "H", "3"), c)
    assert bench_suite.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    rows = suite_rows.read(out)
    assert [(r["family"], r["us"]) for r in rows] == [("rotation", 1.0), ("kv", 2.0)]
    with pytest.raises(SystemExit, match="different devices"):
        bench_suite.main(["--merge", str(a), str(c), "--out", str(out)])


def _row(op, impl, us, note="", case="llama3-8b"):
    return suite_rows.make("rotation", op, case, "bf16", impl, us, note=note)


def test_combine_takes_the_median_of_the_passes_and_states_the_spread():
    passes = [[_row("qk_fwd", "copy", 10.0), _row("qk_fwd", "cuprope", 12.0, "events")],
              [_row("qk_fwd", "copy", 11.0), _row("qk_fwd", "cuprope", 15.0, "events")],
              [_row("qk_fwd", "copy", 10.5), _row("qk_fwd", "cuprope", 12.5, "events"),
               _row("qk_bwd", "cuprope", 20.0)]]
    rows = suite_rows.combine(passes)
    assert [(r["op"], r["impl"]) for r in rows] == [("qk_fwd", "copy"), ("qk_fwd", "cuprope"),
                                                    ("qk_bwd", "cuprope")]
    assert [r["us"] for r in rows] == [10.5, 12.5, 20.0]
    assert rows[1]["note"] == "events; median of 3 suite passes (12–15 µs, 25.0 %)"
    assert rows[2]["note"] == ""                # one pass gave it: no spread claimed
    suite_rows.finish(rows, "GPU", "abc")       # frac_copy from the medians
    assert rows[1]["frac_copy"] == pytest.approx(10.5 / 12.5)


def test_bench_suite_repeats_prefill_families_and_reruns_flashinfer(monkeypatch):
    import bench_suite
    args = bench_suite.parse_args([])
    assert bench_suite.repeats(args) == 3
    assert bench_suite.repeats(bench_suite.parse_args(["--quick"])) == 1
    assert bench_suite.repeats(bench_suite.parse_args(["--quick", "--repeats", "2"])) == 2
    with pytest.raises(SystemExit):
        bench_suite.repeats(bench_suite.parse_args(["--repeats", "0"]))
    assert {"rotation", "qknorm", "kv", "prologue", "mla"} <= set(bench_suite.REPEATED)
    assert not {"decode", "host", "jax", "startup", "models"} & set(bench_suite.REPEATED)
    ctx = bench_suite.Ctx(args)
    seen, times = [], iter([3.0, 1.0, 2.0])

    def measure(c):
        seen.append(c._fi)
        c._fi = ["fi lines of this pass"]
        return [_row("qk_fwd", "cuprope", next(times))]
    monkeypatch.setattr(bench_suite, "progress", lambda msg: None)
    rows = bench_suite.run_family(measure, ctx, 3)
    assert seen == [None, None, None]           # fi_bench_bin's lines are timed again each pass
    assert len(rows) == 1 and rows[0]["us"] == 2.0 and "median of 3 suite passes" in rows[0]["note"]


def test_pdl_family_rows_and_target(monkeypatch):
    """The pdl family (pdl_bench.measure): three rows per (op, B), with and
    without enable_pdl and the matmuls alone, the plain row's ratio over the
    PDL row; the target is met where PDL is faster everywhere, not met
    where one row is slower."""
    import types

    import bench_suite
    pb = types.SimpleNamespace(BATCHES=(1, 64), LAYERS=32, HQ=32, HK=8, D=128, MLA_H=128,
                               MLA_R=64, MLA_DC=512)
    times = {"rope_qk_forward in place": (6.0, 5.5), "rope_append_mla fp8": (9.0, 8.0)}

    def measure(batches, layers, replays):
        return [dict(op=op, B=b, layers=layers, hidden=512, matmul_us=4.0, plain_us=p,
                     pdl_us=q + (b == 64 and slow), op_plain_us=p - 4.0, op_pdl_us=q - 4.0,
                     saved_us=p - q) for op, (p, q) in times.items() for b in batches]
    monkeypatch.setitem(sys.modules, "pdl_bench", pb)
    monkeypatch.delitem(sys.modules, "suite_fused", raising=False)
    import suite_fused
    assert "pdl" in bench_suite.ALL and bench_suite.families()["pdl"] is suite_fused.pdl
    for slow, status in ((0.0, "met"), (1.0, "not met")):
        pb.measure = measure
        rows = suite_rows.finish(suite_fused.pdl(_Ctx([])), "TEST GPU", "deadbee")
        assert len(rows) == 3 * 2 * 2 and {r["family"] for r in rows} == {"pdl"}
        plain = [r for r in rows if r["impl"] == "cuprope-no-pdl"]
        assert plain[0]["ratio"] == pytest.approx(6.0 / 5.5)
        assert "T 1 H 128" in [r for r in rows if "mla" in r["op"]][0]["shape"]
        e = next(e for e in report.evaluate(rows) if "enable_pdl" in e["target"])
        assert e["status"] == status and e["n"] == 4
        assert report._metric("pdl", rows)[0] == "us"
