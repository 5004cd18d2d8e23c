"""The launch-argument struct on the host (cuprope/_core/launch.py ARGS_FIELDS)
against the C struct the kernels read (kernels/args.cuh), and packing it by
field name. No GPU needed."""
import re
import struct

import pytest

from cuprope._core import launch, loader


def c_struct_fields():
    """(name, count, kind) of struct RopeArgs, parsed from its header."""
    src = loader.kernel_sources()["args.cuh"]
    body = re.search(r"struct RopeArgs \{(.*?)\n\};", src, re.S).group(1)
    fields = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if not line:
            continue
        m = re.match(r"(long long|double) (.*);$", line)
        assert m, line
        kind = "d" if m.group(1) == "double" else "q"
        for name in m.group(2).split(","):
            k = re.match(r"(\w+)(?:\[(\d+)\])?$", name.strip())
            fields.append((k.group(1), int(k.group(2) or 1), kind))
    return fields


def test_field_list_is_the_c_struct():
    """Names, order, element counts and types (every element 8 bytes)."""
    assert tuple(c_struct_fields()) == launch.ARGS_FIELDS
    assert launch._ARGS.size == 8 * sum(c for _, c, _ in launch.ARGS_FIELDS)


def test_per_call_slots_derive_from_the_field_list():
    names = [n for n, c, _ in launch.ARGS_FIELDS for _ in range(c)]
    assert names[launch._IN0] == names[launch._IN1] == "in_ptr" and launch._IN1 == launch._IN0 + 1
    assert names[launch._OUT0] == names[launch._OUT1] == "out_ptr"
    assert launch._OUT1 == launch._OUT0 + 1
    for slot, name in ((launch._POS, "pos_ptr"), (launch._SEQ, "seq_off_ptr"),
                       (launch._OFFSET, "offset"), (launch._AUX, "aux_ptr"),
                       (launch._STATS, "stats_ptr")):
        assert names[slot] == name and names.index(name) == slot


def test_pack_args_fills_fields_by_name():
    raw = launch.pack_args(in_sb=(5, 6), heads=(32, 8), scale=0.75, sin_sign=-1.0, tok_tile=64)
    values = struct.unpack(launch._ARGS.format, raw)
    slots = launch.ARGS_SLOTS
    assert values[slots["in_sb"]:slots["in_sb"] + 2] == (5, 6)
    assert values[slots["heads"]:slots["heads"] + 2] == (32, 8)
    assert values[slots["scale"]] == 0.75 and values[slots["sin_sign"]] == -1.0
    assert values[slots["tok_tile"]] == 64
    named = {slots[n] + i for n in ("in_sb", "heads", "scale", "sin_sign", "tok_tile")
             for i in range(dict((f, c) for f, c, _ in launch.ARGS_FIELDS)[n])}
    assert all(v == 0 for i, v in enumerate(values) if i not in named)
    with pytest.raises(TypeError, match="no field"):
        launch.pack_args(in_stride=1)
    with pytest.raises(ValueError, match="heads takes 2 values"):
        launch.pack_args(heads=(1,))
