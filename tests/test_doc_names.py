"""Every cuprope name the README and the notebooks mention exists.

Names are read from README.md and from every cell (code and Markdown) of
notebooks/*.ipynb: each dotted ``cuprope.x.y`` and each ``from cuprope.x
import a, b`` (``cuprope.x.a``, ``cuprope.x.b``). A name resolves when its
longest importable module prefix imports and getattr (or a submodule import)
reaches the rest. Names under a module that needs torch or JAX are checked
where that framework is installed and skip, naming the install, elsewhere.
The repository paths the README names in backticks or links exist too.
"""
import importlib
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FRAMEWORKS = {"torch": "pip install torch", "jax": "pip install jax", "jaxlib": "pip install jax"}

_DOTTED = re.compile(r"(?<![\w./-])cuprope(?:\.[A-Za-z_]\w*)+")
_FROM = re.compile(r"^\s*from\s+(cuprope(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]*)", re.M)


def names(text):
    """Sorted cuprope names in ``text``: dotted mentions and from-imports."""
    out = set(_DOTTED.findall(text))
    for mod, items in _FROM.findall(text):
        for item in items.strip("() \n").split(","):
            item = item.strip().split(" as ")[0].strip()
            if item:
                out.add(f"{mod}.{item}")
    return sorted(out)


class NeedsFramework(Exception):
    pass


def resolve(name):
    """The object ``name`` denotes; AttributeError/ImportError when there is
    none; NeedsFramework(install) when its module needs torch or JAX."""
    parts = name.split(".")
    try:
        obj, i = None, len(parts)
        while i > 0:
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ModuleNotFoundError as e:
                if e.name and e.name.split(".")[0] in FRAMEWORKS:
                    raise
                i -= 1
        for j in range(i, len(parts)):
            if hasattr(obj, parts[j]):
                obj = getattr(obj, parts[j])
            else:
                obj = importlib.import_module(".".join(parts[:j + 1]))
        return obj
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        if root in FRAMEWORKS:
            raise NeedsFramework(FRAMEWORKS[root]) from None
        raise


def notebook_text(path):
    nb = json.loads(path.read_text())
    return "\n".join("".join(c.get("source", "")) for c in nb["cells"])


DOCS = [("README.md", README.read_text())] + [
    (f"notebooks/{p.name}", notebook_text(p)) for p in NOTEBOOKS]


def test_name_extraction():
    text = ("`cuprope.torch.rope_qk` and cuprope.scaling.rope_config_from_hf(cfg). See "
            "`cuprope/schemes/hf_config.py`, `torch.cuprope.x`.\n"
            "from cuprope.kvcache import rope_append_kv, reference as kr\n"
            "from cuprope import (ggml,\n  lrpe)\n"
            "`cuprope.tables.rope_qk_table_*`\n")
    assert names(text) == ["cuprope.ggml", "cuprope.kvcache", "cuprope.kvcache.reference",
                           "cuprope.kvcache.rope_append_kv", "cuprope.lrpe",
                           "cuprope.scaling.rope_config_from_hf", "cuprope.tables.rope_qk_table_",
                           "cuprope.torch.rope_qk"]


def test_resolve_finds_names_and_refuses_missing_ones():
    import cuprope
    assert resolve("cuprope.RopeConfig") is cuprope.RopeConfig
    assert resolve("cuprope.kvcache.reference.dequantize").__name__ == "dequantize"
    for bad in ("cuprope.hf_config.rope_config_from_hf", "cuprope.scaling.no_such_table",
                "cuprope.tables.rope_qk_table_"):
        with pytest.raises((AttributeError, ImportError)):
            resolve(bad)


@pytest.mark.parametrize("doc, text", DOCS, ids=[d for d, _ in DOCS])
def test_every_cuprope_name_resolves(doc, text):
    found = names(text)
    assert found or doc != "README.md"
    missing, needs = [], {}
    for n in found:
        try:
            resolve(n)
        except NeedsFramework as e:
            needs.setdefault(str(e), []).append(n)
        except (AttributeError, ImportError) as e:
            missing.append(f"{n} ({type(e).__name__}: {e})")
    assert not missing, f"{doc} names what cuprope does not have:\n" + "\n".join(missing)
    if needs:
        pytest.skip(f"{doc}: {sum(map(len, needs.values()))} names need "
                    + "; ".join(needs) + " to check")


_PATH = re.compile(r"`((?:benchmarks|cuprope|kernels|notebooks|tests|\.ci)/[\w./-]*)`"
                   r"|\]\(((?!https?:|#)[^)\s]+)\)")


def test_readme_paths_exist():
    text = README.read_text()
    paths = {a or b for a, b in _PATH.findall(text)}
    assert paths
    missing = sorted(p for p in paths if not (ROOT / p.split("#")[0]).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"


def _slug(heading):
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_anchors_name_a_heading():
    text = README.read_text()
    body = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", body, re.M)}
    assert _slug("QK-norm + RoPE (Qwen3, Gemma 3, OLMo 2, Llama 4)") == \
        "qk-norm--rope-qwen3-gemma-3-olmo-2-llama-4"
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links
    assert not sorted(links - slugs), f"README.md links to no heading: {sorted(links - slugs)}"
