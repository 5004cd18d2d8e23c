"""The package's shape, read from its source (nothing is imported).

* The top level is the public face: ``__init__``, ``__main__``, ``config``
  (RopeConfig), ``reference`` (the float64 formulas) and the framework
  modules ``torch`` and ``jax``; everything else lives in a sub-package.
* ``cuprope._core`` is the lowest layer: it imports only itself, ``config``
  and ``reference``, never an op package, a dialect or an adapter.
* The imports a module runs when it is imported (those outside functions)
  form no circle.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cuprope"
TOP = {"__init__", "__main__", "config", "reference", "torch", "jax"}
CORE_MAY_IMPORT = ("cuprope._core", "cuprope.config", "cuprope.reference")


def _modules():
    """{dotted name: path} of every module of the package."""
    out = {}
    for p in PKG.rglob("*.py"):
        parts = ("cuprope",) + p.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name, path, top_only):
    """The cuprope modules and packages ``name`` imports: every import, or
    with ``top_only`` those outside function bodies."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = []

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if top_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                nodes.append(child)
            walk(child)
    walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in MODULES:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t:
                found.add(t)
                parent = t.rpartition(".")[0]
                while parent.count("."):  # the packages on the way run first
                    found.add(parent)
                    parent = parent.rpartition(".")[0]
    # a module's own packages are imported before it runs: no edge back to them
    return {m for m in found if m != name and not name.startswith(m + ".")}


def test_the_top_level_is_the_public_face():
    top = {p.stem for p in PKG.glob("*.py")}
    assert top == TOP, (f"top-level modules beyond the public face: {sorted(top - TOP)}; "
                        f"missing: {sorted(TOP - top)}")


def test_core_imports_nothing_above_it():
    bad = {}
    for name, path in MODULES.items():
        if name.startswith("cuprope._core"):
            up = sorted(m for m in _imports(name, path, top_only=False)
                        if m != "cuprope" and not m.startswith(CORE_MAY_IMPORT))
            if up:
                bad[name] = up
    assert not bad, f"cuprope._core imports from above it: {bad}"


def _circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_import_time_imports_form_no_circle():
    graph = {n: _imports(n, p, top_only=True) for n, p in MODULES.items()}
    assert not _circles(graph)


def test_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
