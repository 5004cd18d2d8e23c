"""Every notebooks/*.ipynb, run whole and unmodified, as
``jupyter nbconvert --to notebook --execute`` runs it: the notebook's own
kernelspec, the kernel working in notebooks/, no cell dropped.

A notebook states what it needs in its first (markdown) cell:

- a ``**Needs:**`` item whose ``pip install NAME ...`` code span lists the
  packages its cells import beyond cuprope and NumPy (a span installing a
  path, ``pip install .``, is cuprope itself and not counted);
- a ``**GPU:**`` item. No notebook needs a GPU to run: a cell that only means
  something on one checks ``cuprope.gpu_available()`` itself and, without a
  GPU, prints a line starting with NO_GPU and what it would have shown.

A notebook whose stated packages are missing skips, its reason naming the
install, unless CUPROPE_REQUIRE_NOTEBOOKS=1 is set (CI's second stage, where
torch and jax are installed): then it fails. On a GPU the same test runs the
GPU branches and checks that none printed NO_GPU. Needs nbformat, nbclient and
ipykernel (the ``[test]`` extra).
"""
import importlib
import json
import os
import pathlib
import re

import pytest

import cuprope

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
HARNESS = ("nbformat", "nbclient", "ipykernel")
TIMEOUT_S = 300  # per cell
NO_GPU = "No CUDA GPU here"
# What a notebook's run must show besides running (a notebook's name: a text its outputs hold).
EXPECTED_OUTPUT = {"04_performance.ipynb": "| target | status |"}

# The optional packages a code cell may import; a notebook must state each one it imports.
_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:cuprope\s+import\s+)?(torch|jax|matplotlib)\b",
                     re.M)
_ITEM = re.compile(r"\*\*(Needs|GPU):\*\*(.*?)(?=\n\s*[-*]\s|\n\s*\n|\Z)", re.S)
_PIP = re.compile(r"`(?:python3? -m )?pip install ([^`]+)`")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def _importable(mod):
    try:
        importlib.import_module(mod)
        return True
    except Exception:  # ImportError or a broken install
        return False


def _skip_or_fail(msg):
    if os.environ.get("CUPROPE_REQUIRE_NOTEBOOKS") == "1":
        pytest.fail(msg + "; CUPROPE_REQUIRE_NOTEBOOKS=1 is set", pytrace=False)
    pytest.skip(msg)


def _require_harness():
    missing = [mod for mod in HARNESS if not _importable(mod)]
    if missing:
        _skip_or_fail(f"notebook tests need {', '.join(missing)} "
                      f"(pip install {' '.join(HARNESS)})")


def _read(path):
    """The notebook as plain JSON (no nbformat needed)."""
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell):
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def optional_imports(cells):
    """The packages of ``_IMPORT`` that the code cells import (``import torch``,
    ``from jax import ...``, ``from cuprope import torch``), sorted."""
    found = set()
    for c in cells:
        if c.get("cell_type") == "code":
            found.update(_IMPORT.findall(_source(c)))
    return sorted(found)


def stated(cells):
    """{"Needs": [package, ...], "GPU": text} of the first cell's items; a
    missing item is absent. Needs lists the names in its ``pip install`` spans
    (each also the name its module is imported by)."""
    if not cells or cells[0].get("cell_type") != "markdown":
        return {}
    out = {}
    for key, text in _ITEM.findall(_source(cells[0])):
        if key == "Needs":
            names = [n for span in _PIP.findall(text) for n in span.split()]
            out[key] = [n for n in names if _NAME.fullmatch(n)]
        else:
            out[key] = text.strip()
    return out


def missing_message(name, needs, importable=_importable):
    """The skip reason of a notebook whose stated packages are not all
    importable (naming the install), or None."""
    missing = [p for p in needs if not importable(p)]
    if missing:
        return (f"{name} needs {' and '.join(missing)}: "
                f"python -m pip install {' '.join(missing)}")
    return None


def _kernel_env(monkeypatch):
    """The kernel imports the cuprope this process imported: a source
    checkout's root goes first on its PYTHONPATH (it starts in notebooks/,
    where a relative entry such as PYTHONPATH=. would name another folder)."""
    entries = [os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    root = pathlib.Path(cuprope.__file__).resolve().parent.parent
    if root == NOTEBOOK_DIR.parent:
        entries.insert(0, str(root))
    if entries:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(entries))


def test_notebooks_directory_holds_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


def test_optional_imports_are_found():
    code = lambda s: {"cell_type": "code", "source": s}  # noqa: E731
    cells = [code("import numpy\nimport torch.nn as nn"),
             {"cell_type": "markdown", "source": "import jax"},
             code("x = 1\n  from cuprope import jax as cjax"),
             code("import torchvision  # not torch"),
             code(["import matplotlib", ".pyplot as plt"])]
    assert optional_imports(cells) == ["jax", "matplotlib", "torch"]
    assert optional_imports([code("import cupy\nfrom cuprope import kvcache")]) == []


def test_stated_needs_and_gpu_are_parsed():
    md = ("# Title\n\n- **Needs:** cuprope (`python -m pip install .`) and torch:\n"
          "  `python -m pip install matplotlib torch`.\n"
          "- **GPU:** only for the last cell, which also needs `pip install cupy`.\n\nMore text.")
    got = stated([{"cell_type": "markdown", "source": md}])
    assert got["Needs"] == ["matplotlib", "torch"]
    assert got["GPU"].startswith("only for the last cell")
    assert stated([{"cell_type": "markdown", "source": "**Needs:** nothing to install"}]) \
        == {"Needs": []}
    assert stated([{"cell_type": "code", "source": md}]) == {}
    assert stated([]) == {}


def test_missing_needs_name_the_install_and_fail_when_required(monkeypatch):
    have = {"matplotlib"}.__contains__
    msg = missing_message("x.ipynb", ["matplotlib", "torch", "jax"], importable=have)
    assert msg == "x.ipynb needs torch and jax: python -m pip install torch jax"
    assert missing_message("x.ipynb", ["matplotlib"], importable=have) is None
    monkeypatch.delenv("CUPROPE_REQUIRE_NOTEBOOKS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="pip install torch"):
        _skip_or_fail(msg)
    monkeypatch.setenv("CUPROPE_REQUIRE_NOTEBOOKS", "1")
    with pytest.raises(pytest.fail.Exception, match="CUPROPE_REQUIRE_NOTEBOOKS=1"):
        _skip_or_fail(msg)


def test_kernel_imports_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.curdir)
    _kernel_env(monkeypatch)
    entries = os.environ["PYTHONPATH"].split(os.pathsep)
    assert all(os.path.isabs(e) for e in entries), entries
    if pathlib.Path(cuprope.__file__).resolve().parent.parent == NOTEBOOK_DIR.parent:
        assert entries[0] == str(NOTEBOOK_DIR.parent)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_states_what_it_needs(path):
    cells = _read(path)["cells"]
    assert cells and cells[0]["cell_type"] == "markdown", f"{path.name}: no markdown first cell"
    got = stated(cells)
    assert "Needs" in got and "GPU" in got, (
        f"{path.name}: the first cell lacks a **Needs:** or a **GPU:** item: {got}")
    unstated = set(optional_imports(cells)) - set(got["Needs"])
    assert not unstated, (f"{path.name} imports {sorted(unstated)}, which its **Needs:** item's "
                          f"`pip install` does not name")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_file_is_clean(path):
    """The python3 kernelspec (what nbconvert and Jupyter start), no stored
    outputs, no cell tagged for a harness to drop."""
    nb = _read(path)
    spec = nb.get("metadata", {}).get("kernelspec", {})
    assert spec.get("name") == "python3" and spec.get("language") == "python", (
        f"{path.name}: kernelspec {spec}")
    for i, c in enumerate(nb["cells"]):
        assert not c.get("outputs") and c.get("execution_count") is None, (
            f"{path.name}: cell {i} stores outputs (clear them before committing)")
        assert "execution" not in c.get("metadata", {}), f"{path.name}: cell {i} stores timings"
        assert "gpu" not in c.get("metadata", {}).get("tags", []), (
            f"{path.name}: cell {i} is tagged gpu; it must check for a GPU itself")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_whole(path, monkeypatch):
    _require_harness()
    msg = missing_message(path.name, stated(_read(path)["cells"]).get("Needs", []))
    if msg:
        _skip_or_fail(msg)
    _kernel_env(monkeypatch)
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    n_cells = len(nb.cells)
    client = NotebookClient(nb, timeout=TIMEOUT_S, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell raised:\n{e}", pytrace=False)
    assert len(nb.cells) == n_cells
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [(o.get("ename"), o.get("evalue")) for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: cells with errors: {errors}"
    text = "\n".join(
        o.get("text", "") if o.get("output_type") == "stream"
        else "\n".join(str(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
        for o in outputs)
    if cuprope.gpu_available():
        assert NO_GPU not in text, f"{path.name}: a cell took its no-GPU branch on a GPU"
    if path.name in EXPECTED_OUTPUT:
        assert EXPECTED_OUTPUT[path.name] in text, f"{path.name}: no {EXPECTED_OUTPUT[path.name]!r}"
