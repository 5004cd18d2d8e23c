"""The kernel families' registry. Each op declares one record: the
translation unit (a ``.cu`` file of the kernel folder) its kernels are
compiled from, the families (modules compiled on first use) its
instantiations are grouped into, a function giving a family's name
expressions, its codes and its tuning values. The loader compiles a family
from its record; listings read every record. Records register when their op package
is imported (``import cuprope`` imports them all).

Also the pieces every name expression is built from: the element types'
C++ types and sizes, and the pack widths a kernel is instantiated for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .constants import declare_codes, declare_tuning

DTYPE_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def vec_widths(dtype: str) -> tuple[int, ...]:
    """Pairs per thread that a kernel is instantiated for, widest first.

    The widest gives 16-byte loads (8 half/bf16 or 4 float elements)."""
    widest = 16 // ITEMSIZE[dtype]
    return tuple(v for v in (8, 4, 2, 1) if v <= widest)


def cbool(flag: bool) -> str:
    """A bool template argument as C++ spells it."""
    return "true" if flag else "false"


@dataclass(frozen=True)
class Record:
    """One op's kernels: ``entry`` the translation unit, ``families`` its
    families in listing order, ``names(family)`` a family's name
    expressions in compile order."""
    entry: str
    families: tuple[str, ...]
    names: Callable[[str], list[str]]


_RECORDS: dict[str, Record] = {}  # by family


def register(entry: str, families: tuple[str, ...], names: Callable[[str], list[str]],
             tuning: dict[str, int] | None = None, codes: dict[str, int] | None = None) -> Record:
    """Declare an op's kernels, the codes its kernels share with the host and
    the tuning values they compile with (``-D`` options of every translation
    unit, the host reading the same values: constants.declare_codes,
    declare_tuning). Registering the same families again (a module reloaded)
    replaces the record; a family another record holds is an error."""
    declare_codes(codes or {})
    declare_tuning(tuning or {})
    rec = Record(entry, tuple(families), names)
    for fam in rec.families:
        old = _RECORDS.get(fam)
        if old is not None and old.families != rec.families:
            raise ValueError(f"kernel family {fam!r} is already registered (from {old.entry})")
    for fam in rec.families:
        _RECORDS[fam] = rec
    return rec


def record_of(family: str) -> Record:
    try:
        return _RECORDS[family]
    except KeyError:
        raise ValueError(f"unknown kernel family {family!r}; registered: {families()}") from None


def families(entry: str | None = None) -> tuple[str, ...]:
    """Every registered family (of one translation unit), in registration order."""
    return tuple(f for f, r in _RECORDS.items() if entry in (None, r.entry))


def entries() -> tuple[str, ...]:
    """The translation units the records name, in registration order."""
    return tuple(dict.fromkeys(r.entry for r in _RECORDS.values()))


def family_names(family: str) -> tuple[list[str], str]:
    """A kernel family's instantiations and the translation unit holding them."""
    rec = record_of(family)
    return rec.names(family), rec.entry


def all_kernel_names(family: str | None = None, entry: str | None = None) -> list[str]:
    """Every instantiation the Python side can launch: of one family, of one
    translation unit's families, or of all."""
    fams = families(entry) if family is None else (family,)
    return [n for fam in fams for n in family_names(fam)[0]]
