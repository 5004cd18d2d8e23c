"""README.md's Python blocks run as pasted, each in a fresh interpreter.

Every ```` ```python ```` block is extracted and run in its own subprocess
(cwd: a temporary directory; PYTHONPATH: the repository root), so a block
that uses a name it does not define fails here. Conventions of the fence's
info string:

* ```` ```python gpu ````: needs a CUDA GPU; runs only where one is visible,
  skips with that reason elsewhere (the device suite runs it).
* a block that imports torch or jax skips, naming the install, where that
  framework is absent (CI's second stage installs both).

The README is for users: it must not point at things a reader cannot follow
(issue numbers, NOTES.md entry numbers, seed files, commit hashes, the
project's own targets or device runs), nor use the kernels' internal jargon.
Every block that needs a GPU says so in the text above it, and the install
lines the CPU blocks need (a CPU-only install, torch, JAX) are there.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

import cuprope

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TIMEOUT_S = 600
FRAMEWORKS = {"torch": "pip install torch", "jax": "pip install jax"}
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)
_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:cuprope\s+import\s+)?(torch|jax)\b", re.M)
_KNOWN_TAGS = {"gpu"}


def python_blocks(text):
    """[(line number, tags, source)] of the ```python blocks of ``text``."""
    blocks = []
    for m in _FENCE.finditer(text):
        info = m.group(1).split()
        if info and info[0] == "python":
            line = text.count("\n", 0, m.start()) + 1
            blocks.append((line, set(info[1:]), m.group(2)))
    return blocks


def _importable(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False


BLOCKS = python_blocks(README.read_text())


def test_readme_has_python_blocks_with_known_tags():
    assert len(BLOCKS) >= 10
    for line, tags, _ in BLOCKS:
        assert tags <= _KNOWN_TAGS, f"README.md:{line}: unknown tags {tags - _KNOWN_TAGS}"


def test_block_extraction():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python gpu\nimport torch\n```\n"
    got = python_blocks(text)
    assert [(ln, tags, src) for ln, tags, src in got] == [
        (2, set(), "x = 1\n"), (8, {"gpu"}, "import torch\n")]
    assert _IMPORT.findall("import numpy\nfrom cuprope import jax as cjax\nimport torch.nn") == \
        ["jax", "torch"]


_INTERNAL = re.compile(
    r"\b(?:issues? #?\d+|open issues?|NOTES(?:\.md)? \d+|seed \d{3}|the issue's|today's|"
    r"not met|lent|device-suite|commit [0-9a-f]{7,40})\b|#\d{2,}\b", re.I)
_JARGON = ("flat entry", "flat entries", "dialect", "Shardy", "SFU", "token run", "staged ring",
           "fi_bench_bin", "ncu ")


def _hashes(text):
    """Words that look like git commit hashes: 7-40 hex digits, letters and digits both."""
    return [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text)
            if re.search(r"[a-f]", w) and re.search(r"\d", w)]


def test_readme_has_no_internal_references():
    text = README.read_text()
    bad = [m.group(0) for m in _INTERNAL.finditer(text)] + _hashes(text)
    assert not bad, f"README.md points at things a reader cannot follow: {bad}"


def test_internal_reference_patterns():
    for bad in ("see issue 25", "NOTES 44", "today's two launches", "**not met**", "a lent GPU",
                ".ci/device-suite", "at commit 39f5212", "(#18)"):
        assert _INTERNAL.search(bad) or _hashes(bad), bad
    for ok in ("float16 and bfloat16", "e4m3fn", "0x7f", "issued first", "talent"):
        assert not (_INTERNAL.search(ok) or _hashes(ok)), ok


def test_readme_has_no_internal_jargon():
    text = README.read_text()
    bad = [w for w in _JARGON if w.lower() in text.lower()]
    assert not bad, f"README.md uses jargon a user is not told about: {bad}"


def _paragraph_before(text, pos):
    """The last paragraph (blank-line separated) of text[:pos]."""
    return text[:pos].rstrip().split("\n\n")[-1]


def test_every_gpu_block_says_so_in_the_text_above_it():
    text = README.read_text()
    quiet = []
    for m in _FENCE.finditer(text):
        if m.group(1).split()[:2] == ["python", "gpu"] and \
                "needs a CUDA GPU" not in _paragraph_before(text, m.start()):
            quiet.append(text.count("\n", 0, m.start()) + 1)
    assert not quiet, (f"README.md lines {quiet}: a `python gpu` block without 'needs a CUDA GPU' "
                       "in the paragraph above it (the fence's word is invisible to a reader)")


def test_readme_has_the_install_lines_its_cpu_blocks_need():
    text = README.read_text()
    lines = [ln.strip() for m in _FENCE.finditer(text) if m.group(1).strip() == "bash"
             for ln in m.group(2).splitlines()]
    assert any(re.match(r"python -m pip install \.(\s|$)", ln) for ln in lines), \
        "README.md has no CPU-only install line (python -m pip install .)"
    needed = {f for _, tags, src in BLOCKS if "gpu" not in tags for f in _IMPORT.findall(src)}
    assert needed == {"torch", "jax"}
    for f in sorted(needed):
        assert any(re.match(rf"python -m pip install {f}\b", ln) for ln in lines), \
            f"README.md's CPU blocks import {f} but no install line for it"


def test_layout_section_is_short():
    text = README.read_text()
    section = text.split("## Layout of the repository", 1)[1].split("\n## ", 1)[0]
    assert len(section.strip().splitlines()) <= 25, "the layout section is for users: keep it short"


@pytest.mark.parametrize("line, tags, source", [
    pytest.param(ln, tags, src, id=f"line{ln}", marks=[pytest.mark.gpu] if "gpu" in tags else [])
    for ln, tags, src in BLOCKS])
def test_readme_block_runs_as_pasted(line, tags, source, tmp_path):
    if "gpu" in tags and not cuprope.gpu_available():
        pytest.skip("README block marked gpu: no CUDA GPU visible (CuPy absent or no device)")
    missing = [f for f in sorted(set(_IMPORT.findall(source))) if not _importable(f)]
    if missing:
        pytest.skip(f"README block needs {' and '.join(missing)}: "
                    + "; ".join(FRAMEWORKS[f] for f in missing))
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (
        f"README.md:{line}: the block failed (exit {proc.returncode}):\n{source}\n"
        f"--- stderr ---\n{proc.stderr[-4000:]}")


def test_ci_runs_the_readme_install_commands_verbatim():
    text = README.read_text()
    bash = [m.group(2) for m in _FENCE.finditer(text) if m.group(1).strip() == "bash"]
    assert bash, "README.md has no ```bash install block"
    commands = [ln.strip() for ln in bash[0].splitlines() if ln.strip()]
    assert commands == ['python -m pip install ".[cuda13]" && python -m cuprope check',
                        'python -m pip install ".[test]" && pytest tests -q']
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[0] in ci and commands[1] in ci, ".ci/run no longer runs the README's commands"
