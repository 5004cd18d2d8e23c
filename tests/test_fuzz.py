"""Seeded random-configuration fuzz over every public rotation (tests/fuzz_cases.py).

Each case draws one call — family, backend, dtype, layout, head dim, rotary
dim, pairing, GQA head counts, sizes, positions (up to 2³¹ − 1), frequency
table or scheme, output form (new, ``out=`` into a NaN-poisoned buffer,
``inplace=True``, ``out=`` the input), strided / fused-qkv / misaligned views
— from ``np.random.default_rng([seed, i])`` and compares every output with
the float64 reference under the suite's tolerance, the pass-through dims bit
for bit, and every buffer element outside what the call may write unchanged.

On a GPU (CuPy and torch CUDA) the arrays are torch CUDA tensors or CuPy
arrays and the kernels run; elsewhere NumPy arrays or torch CPU tensors and
the NumPy backend runs. The draws do not depend on the machine, so a case is
the same configuration on both (only where its arrays live differs).

Environment:
  CUPROPE_FUZZ_SEED  master seed (default 20250917)
  CUPROPE_FUZZ_N     number of cases (default 1000 on the CPU, 2000 on a GPU)
  CUPROPE_FUZZ_CASE  run only these case numbers (comma-separated)

A failure prints ``CUPROPE_FUZZ_SEED=... CUPROPE_FUZZ_CASE=...`` and the
drawn configuration; that line reruns the case alone.
"""
import os
import re
import time
from collections import Counter

import pytest

import fuzz_cases as fc

SEED = int(os.environ.get("CUPROPE_FUZZ_SEED", "20250917"))
N = int(os.environ.get("CUPROPE_FUZZ_N", "2000" if fc.ON_GPU else "1000"))
ONLY = [int(v) for v in os.environ.get("CUPROPE_FUZZ_CASE", "").replace(",", " ").split()]
MAX_KINDS = 10      # stop after this many different failures
SHOWN_PER_KIND = 3  # reproductions shown per kind (all its case numbers are listed)
SUMMARY: list = []


def _say(config, line):
    """Write a line to the terminal even while output is captured."""
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if capman is None or reporter is None:
        print(line)
        return
    with capman.global_and_fixture_disabled():
        reporter.write_line(line)


@pytest.fixture(scope="module", autouse=True)
def fuzz_log(request):
    where = "GPU (torch CUDA / CuPy)" if fc.ON_GPU else "CPU (NumPy backend; NumPy / torch CPU)"
    cases = f"CUPROPE_FUZZ_CASE={','.join(map(str, ONLY))}" if ONLY else f"CUPROPE_FUZZ_N={N}"
    _say(request.config, f"\ncuprope fuzz: CUPROPE_FUZZ_SEED={SEED} {cases} on the {where}")
    yield
    for line in SUMMARY:
        _say(request.config, line)


def _cases(family):
    ids = ONLY or range(N)
    return [i for i in ids if fc.family_of(i) == family]


def _first_line(e):
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 1500 else text[:1500] + " ..."


def _kind(message):
    """A failure's kind: its message with the numbers blanked, so that one bug
    met in many cases is reported once and does not hide another."""
    return re.sub(r"-?\d[\d.e+-]*", "#", message.split("\n")[0])[:120]


@pytest.mark.parametrize("family", fc.FAMILIES)
def test_fuzz(family):
    ids = _cases(family)
    if not ids:
        pytest.skip(f"no {family} case among the cases selected")
    kinds: dict = {}   # kind -> [case numbers, reproductions]
    tags = Counter()
    t0 = time.perf_counter()
    ran = 0
    for i in ids:
        desc = "(not drawn)"
        try:
            case = fc.make_case(SEED, i)
            desc = case.desc
            for key, value in case.tags.items():
                tags[f"{key}={value}"] += 1
            fc.run_case(case)
        except Exception as e:  # the call's own errors count as failures too
            msg = _first_line(e)
            seen = kinds.setdefault(_kind(msg), [[], []])
            seen[0].append(i)
            if len(seen[1]) < SHOWN_PER_KIND:
                seen[1].append(f"CUPROPE_FUZZ_SEED={SEED} CUPROPE_FUZZ_CASE={i} "
                               f"python -m pytest tests/test_fuzz.py -q -k {family}\n"
                               f"    case: {family} {desc}\n    {msg}")
        ran += 1
        if len(kinds) >= MAX_KINDS:
            break
    dt = time.perf_counter() - t0
    failed = sum(len(c) for c, _ in kinds.values())
    counts = ", ".join(f"{k} {v}" for k, v in sorted(tags.items()))
    SUMMARY.append(f"fuzz {family}: {ran} cases, {failed} failed, {dt:.1f} s [{counts}]")
    if kinds:
        stop = f" (stopped at {MAX_KINDS} kinds of failure)" if len(kinds) >= MAX_KINDS else ""
        report = [f"{failed} of {ran} {family} cases failed, {len(kinds)} kinds{stop}:"]
        for kind, (cases, shown) in kinds.items():
            more = f", first {len(shown)} shown" if len(cases) > len(shown) else ""
            report.append(f"--- {len(cases)} case(s){more}: CUPROPE_FUZZ_CASE="
                          + ",".join(map(str, cases[:60])) + (" ..." if len(cases) > 60 else ""))
            report.extend(shown)
        pytest.fail("\n".join(report), pytrace=False)
