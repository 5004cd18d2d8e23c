"""Execute every notebooks/*.ipynb top to bottom and fail on any cell error.

Cells tagged "gpu" (cell metadata ``tags``) are removed before execution when no
CUDA GPU is visible. Needs nbformat, nbclient, ipykernel (and what the notebooks
import, e.g. matplotlib); a notebook whose cells import torch or jax needs those
too. Without them the tests skip with a reason naming the install, unless
CUPROPE_REQUIRE_NOTEBOOKS=1 is set (CI's second stage, where torch and jax are
installed), in which case they fail.
"""
import importlib
import os
import pathlib
import re

import pytest

import cuprope

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
REQUIRED_MODULES = ("nbformat", "nbclient", "ipykernel", "matplotlib")
TIMEOUT_S = 300
# The frameworks a notebook may import, and how to get them.
FRAMEWORKS = {"torch": "pip install torch", "jax": "pip install jax"}
_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:cuprope\s+import\s+)?(torch|jax)\b", re.M)


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


def _require_modules():
    missing = [mod for mod in REQUIRED_MODULES if not _importable(mod)]
    if missing:
        _skip_or_fail(f"notebook tests need {', '.join(missing)} "
                      f"(pip install nbformat nbclient ipykernel matplotlib)")


def frameworks_used(nb):
    """The frameworks of FRAMEWORKS that the notebook's code cells import
    (``import torch``, ``from jax import ...``, ``from cuprope import torch``)."""
    found = set()
    for c in nb.cells:
        if c.cell_type == "code":
            found.update(_IMPORT.findall(c.source))
    return sorted(found)


def _require_frameworks(nb, name):
    missing = [f for f in frameworks_used(nb) if not _importable(f)]
    if missing:
        _skip_or_fail(f"{name} needs {' and '.join(missing)}: "
                      + "; ".join(FRAMEWORKS[f] for f in missing))


def _drop_gpu_cells(nb):
    """Remove cells tagged "gpu"; returns how many were removed."""
    keep = [c for c in nb.cells if "gpu" not in c.get("metadata", {}).get("tags", [])]
    dropped = len(nb.cells) - len(keep)
    nb.cells = keep
    return dropped


def test_notebooks_directory_holds_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


def test_gpu_tagged_cells_are_dropped_and_untagged_kept():
    _require_modules()
    import nbformat.v4 as v4
    nb = v4.new_notebook(cells=[v4.new_code_cell("a = 1"),
                                v4.new_code_cell("import cupy", metadata={"tags": ["gpu"]}),
                                v4.new_markdown_cell("text", metadata={"tags": ["gpu", "x"]}),
                                v4.new_code_cell("b = 2", metadata={"tags": ["slow"]})])
    assert _drop_gpu_cells(nb) == 2
    assert [c.source for c in nb.cells] == ["a = 1", "b = 2"]


def test_framework_imports_are_found():
    _require_modules()
    import nbformat.v4 as v4
    nb = v4.new_notebook(cells=[v4.new_code_cell("import numpy\nimport torch.nn as nn"),
                                v4.new_markdown_cell("import jax"),
                                v4.new_code_cell("x = 1\n  from cuprope import jax as cjax"),
                                v4.new_code_cell("import torchvision  # not torch")])
    assert frameworks_used(nb) == ["jax", "torch"]
    assert frameworks_used(v4.new_notebook(cells=[v4.new_code_cell("import cupy")])) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_cell_errors(path, monkeypatch):
    _require_modules()
    # the kernel runs in notebooks/: a relative PYTHONPATH entry (PYTHONPATH=.) must
    # still name the directory it named here
    if os.environ.get("PYTHONPATH"):
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            os.path.abspath(e) for e in os.environ["PYTHONPATH"].split(os.pathsep) if e))
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    if not cuprope.gpu_available():
        _drop_gpu_cells(nb)
    _require_frameworks(nb, path.name)
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                            allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell raised:\n{e}", pytrace=False)
    # belt and braces: no error output anywhere (e.g. a cell tagged raises-exception)
    errors = [(i, o.get("ename"), o.get("evalue"))
              for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: cells with errors: {errors}"
