"""The kernel records: every op declares its translation unit, families and
name expressions (``_core.kernels``); the loader compiles from them and
names no kernel itself."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cuprope  # noqa: F401  (registers every op's kernels)
from cuprope._core import kernels, loader

ROOT = Path(__file__).resolve().parents[1]

# instantiations per translation unit: rope.cu (plain 66, LRPE 126, QK-norm 37),
# kvcache.cu (kv_rope_kernel 92, decode rows 16 and the angle table's builder),
# mla.cu, prologue.cu (12 families of 4)
COUNTS = {"rope.cu": 229, "kvcache.cu": 109, "mla.cu": 48, "prologue.cu": 48}


def test_every_family_lists_its_names_once():
    seen = {}
    for fam in kernels.families():
        names, entry = loader.family_names(fam)
        assert names, fam
        for n in names:
            assert n not in seen, f"{n} in {seen.get(n)} and {fam}"
            seen[n] = fam
    assert len(seen) == len(kernels.all_kernel_names()) == sum(COUNTS.values())


def test_the_records_name_their_translation_units():
    assert set(kernels.entries()) == set(COUNTS)
    assert set(COUNTS) <= set(loader.kernel_sources())
    for entry, n in COUNTS.items():
        assert len(kernels.all_kernel_names(entry=entry)) == n, entry
        assert all(loader.family_names(f)[1] == entry for f in kernels.families(entry))


def test_an_unknown_or_taken_family_is_refused():
    with pytest.raises(ValueError, match="unknown kernel family"):
        loader.family_names("no_such_family")
    with pytest.raises(ValueError, match="already registered"):
        kernels.register("other.cu", ("shared",), lambda fam: [])


def test_the_loader_names_no_kernel():
    text = (ROOT / "cuprope" / "_core" / "loader.py").read_text()
    assert "cuprope::" not in text
    assert not re.search(r"qknorm|lrpe|mla|prologue|kv_|decode", text)


def test_importing_the_loader_registers_every_op():
    code = "from cuprope._core import kernels, loader; print(len(kernels.families()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert int(out) == len(kernels.families()) == 26
