"""The kernels' argument structs on the host, each from one named, ordered
field list (:class:`ArgStruct`; each op's structs are in its package), and
the flat entries' generated parameter lists (:func:`flat_defines`, entries
declared by the records: :func:`declare_flat`). Tests compare the lists with
the C structs.
"""
from __future__ import annotations

import struct

import numpy as np


class ArgStruct:
    """One argument struct (or scalar parameter list) from its field list.

    ``fields``: (name, count, kind) in order, kind "q" (int64) or "d"
    (float64). ``spread``: False for a struct passed by value (one kernel
    parameter), True for a list of 8-byte scalar parameters (one per word).
    ``pointers``: the flat entry's pointer roles (``"in_ptr1"``: field
    ``in_ptr``, element 1), inputs before outputs; ``outputs``: those the
    kernel writes (empty where the struct has no flat entry).

    From the field list derive: the packed format (every field is one or
    more 8-byte words: int64 ``"q"`` or float64 ``"d"``), each field's slot
    in the int64 view, and the flat entry points (one 8-byte kernel
    parameter per word, for jaxlib's GPU kernel call): their parameter order
    (pointers first, inputs before outputs, then every other word in struct
    order) and the C source of their parameter list and struct rebuild
    (``flat_defines``, passed to NVRTC as ``-D`` options when a flat entry
    is compiled; the flat entries' headers use them)."""

    def __init__(self, c_name, fields, *, spread=False, pointers=(), outputs=()):
        self.c_name, self.fields, self.spread = c_name, tuple(fields), spread
        self.packer = struct.Struct("<" + "".join(kind * n for _, n, kind in self.fields))
        self.size = self.packer.size
        self.n_words = self.size // 8
        self.dtype = np.dtype([("raw", np.uint8, (self.size,))])
        self.slots, slot = {}, 0
        for name, count, _ in self.fields:
            self.slots[name] = slot
            slot += count
        self.pointers, self.outputs = tuple(pointers), tuple(outputs)
        self.pointer_slots = tuple(self.slot(r) for r in self.pointers)
        self.flat_words = tuple(i for i in range(self.n_words) if i not in self.pointer_slots)

    def slot(self, role) -> int:
        """The int64 slot of a field, or of one element of a pair field named
        with its index (``in_ptr1``, ``w_ptr0``)."""
        if role in self.slots:
            return self.slots[role]
        name, idx = role[:-1], int(role[-1])
        return self.slots[name] + idx

    def pack(self, **values) -> bytes:
        """The struct packed from its fields by name (a sequence for the
        multi-element fields); a field not named is 0."""
        unknown = set(values) - set(self.slots)
        if unknown:
            raise TypeError(f"{self.c_name} has no field {sorted(unknown)}")
        flat = []
        for name, count, _ in self.fields:
            v = values.get(name, (0,) * count)
            v = tuple(v) if isinstance(v, (tuple, list)) else (v,)
            if len(v) != count:
                raise ValueError(f"{self.c_name}.{name} takes {count} values, got {len(v)}")
            flat += v
        return self.packer.pack(*flat)

    def flat_params(self) -> tuple[str, ...]:
        """The flat entry's C parameter names in order: the pointer roles,
        then ``w<slot>`` for every other word."""
        return self.pointers + tuple(f"w{i}" for i in self.flat_words)

    def flat_source(self) -> tuple[str, str]:
        """(parameter list, the words in struct order) of the flat entry, as C."""
        params = ", ".join(f"long long {p}" for p in self.flat_params())
        by_slot = dict(zip(self.pointer_slots, self.pointers))
        words = ", ".join(by_slot.get(i, f"w{i}") for i in range(self.n_words))
        return params, words


# The flat entries generated from the field lists: define prefix -> struct
# (each op's kernel record declares its own: declare_flat).
FLAT_ENTRIES: dict = {}


def declare_flat(prefix: str, struct: ArgStruct) -> None:
    """A flat entry point whose parameters NVRTC gets as ``<prefix>_PARAMS``
    and ``<prefix>_WORDS``, generated from ``struct`` (a kernel record's)."""
    old = FLAT_ENTRIES.get(prefix)
    if old is not None and old.fields != struct.fields:
        raise ValueError(f"flat entry {prefix} declared with two structs")
    FLAT_ENTRIES[prefix] = struct


def flat_defines() -> tuple[str, ...]:
    """NVRTC ``-D`` options giving each declared flat entry (kernels/flat.cuh,
    an op's flat header) its parameter list (``<PREFIX>_PARAMS``) and the
    struct's words in slot order (``<PREFIX>_WORDS``)."""
    out = []
    for prefix, st in FLAT_ENTRIES.items():
        params, words = st.flat_source()
        out += [f"-D{prefix}_PARAMS={params}", f"-D{prefix}_WORDS={words}"]
    return tuple(out)
