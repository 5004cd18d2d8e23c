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
# kvcache.cu (kv_rope_kernel 92, decode rows 22 and the angle table's builder),
# mla.cu, prologue.cu (12 families of 4)
COUNTS = {"rope.cu": 229, "kvcache.cu": 115, "mla.cu": 48, "prologue.cu": 48}


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


def test_each_op_declares_its_tuning_values():
    """The QK-norm, KV-cache, MLA and prologue records declare their own
    tuning values (the rotation's stay in _core.constants): each is in effect
    on the host and reaches every translation unit as a -D option; declaring
    a name again with another value is an error, with the same value a no-op."""
    from cuprope._core import constants
    from cuprope.kvcache import kernels as kv
    from cuprope.mla import kernels as mla
    from cuprope.prologue import kernels as pro
    from cuprope.qknorm import kernels as qk
    opts = set(loader.compile_options())
    for rec, prefix in ((qk, "CUPROPE_QKNORM_"), (kv, "CUPROPE_KV_"), (mla, "CUPROPE_MLA_"),
                        (pro, "CUPROPE_PROLOGUE_")):
        assert rec.TUNING and all(k.startswith(prefix) for k in rec.TUNING)
        for name, value in rec.TUNING.items():
            assert constants.TUNING_DEFAULTS[name] == value
            assert f"-D{name}={loader.TUNING[name]}" in opts
    src = (ROOT / "cuprope" / "_core" / "constants.py").read_text()
    assert not re.search(r'"CUPROPE_(QKNORM|KV|MLA|PROLOGUE)_\w+": \d', src)
    constants.declare_tuning({"CUPROPE_QKNORM_WARPS": qk.TUNING["CUPROPE_QKNORM_WARPS"]})
    with pytest.raises(ValueError, match="CUPROPE_QKNORM_WARPS declared as 8 and as 4"):
        constants.declare_tuning({"CUPROPE_QKNORM_WARPS": 4})
    with pytest.raises(KeyError, match="no tuning value CUPROPE_NOT_A_VALUE"):
        loader.tuning("CUPROPE_NOT_A_VALUE")
