"""Every skip and xfail reason in tests/*.py names what a reader can act on
(the install, the hardware), never a project issue number.

Reasons are read from the source: the ``reason=`` (or first positional string)
of ``pytest.skip``, ``pytest.importorskip``, ``pytest.xfail``,
``pytest.mark.skip``, ``pytest.mark.skipif`` and ``pytest.mark.xfail`` calls,
with module-level string constants resolved and f-strings' literal parts kept.
"""
import ast
import pathlib
import re

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
_CALLS = {"skip", "importorskip", "xfail", "skipif"}
_BAD = re.compile(r"\bissues?\b|#\s?\d+", re.I)


def _constants(tree):
    """{name: str} of the module-level assignments of a string constant."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value.value
    return out


def _text(node, consts):
    """The literal text of a reason expression ('' where none is known)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id, "")
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v, consts) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _text(node.left, consts) + _text(node.right, consts)
    return ""


def _callee(func):
    """'skip' for pytest.skip / pytest.mark.skip / skip, etc."""
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def reasons(source):
    """[(line, reason)] of the skip/xfail calls in ``source``."""
    tree = ast.parse(source)
    consts = _constants(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _callee(node.func) in _CALLS):
            continue
        exprs = [kw.value for kw in node.keywords if kw.arg in ("reason", "msg")]
        name = _callee(node.func)
        # positional reason: skip(reason) / xfail(reason); importorskip and skipif take a
        # module name or condition first
        if name in ("skip", "xfail"):
            exprs += node.args[:1]
        out += [(node.lineno, t) for t in (_text(e, consts) for e in exprs) if t]
    return out


def test_reason_extraction():
    src = ('X = "needs two GPUs (issue 18)"\n'
           'import pytest\n'
           'pytestmark = pytest.mark.skipif(True, reason=X)\n'
           'pytest.importorskip("jax", reason="needs jax: pip install jax")\n'
           'pytest.skip(f"see #12 for {x}")\n'
           'mark = pytest.mark.xfail(strict=True, reason="fp16" + " rounding")\n')
    got = reasons(src)
    assert got == [(3, "needs two GPUs (issue 18)"), (4, "needs jax: pip install jax"),
                   (5, "see #12 for "), (6, "fp16 rounding")]
    assert [r for _, r in got if _BAD.search(r)] == ["needs two GPUs (issue 18)", "see #12 for "]


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda p: p.name)
def test_skip_reasons_name_the_install_or_hardware_not_an_issue(path):
    bad = [f"{path.name}:{line}: {r!r}" for line, r in reasons(path.read_text())
           if _BAD.search(r)]
    assert not bad, "skip/xfail reasons that point at an issue number:\n" + "\n".join(bad)
