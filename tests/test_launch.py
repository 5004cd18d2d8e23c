"""The launch-argument struct on the host (cuprope/_core/launch.py ARGS_FIELDS)
against the C struct the kernels read (kernels/args.cuh), and packing it by
field name. No GPU needed."""
import re
import struct

import pytest

from cuprope._core import args, launch, loader


def c_struct_fields(header="args.cuh", struct_name="RopeArgs"):
    """(name, count, kind) of a kernel argument struct, parsed from its header
    (a member of type RopeArgs: ``(name, 1, "RopeArgs")``)."""
    src = loader.kernel_sources()[header]
    body = re.search(r"struct " + struct_name + r" \{(.*?)\n\};", src, re.S).group(1)
    fields = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if not line:
            continue
        if line.startswith("RopeArgs "):
            fields.append((line[len("RopeArgs "):-1], 1, "RopeArgs"))
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
    assert tuple(c_struct_fields()) == args.ARGS_FIELDS
    assert args.ARGS.size == 8 * sum(c for _, c, _ in args.ARGS_FIELDS)


def test_kv_field_list_is_the_c_struct():
    assert tuple(c_struct_fields(struct_name="KvArgs")) == args.KV_ARGS_FIELDS
    assert args.KV_ARGS.size == 8 * len(args.KV_ARGS_FIELDS)
    raw = args.pack_kv_args(page_size=16, write_rest=3)
    values = struct.unpack(args.KV_ARGS.format, raw)
    names = [n for n, _, _ in args.KV_ARGS_FIELDS]
    assert values[names.index("page_size")] == 16 and values[names.index("write_rest")] == 3
    assert sum(values) == 19
    with pytest.raises(TypeError, match="KvArgs has no field"):
        args.pack_kv_args(page=1)


def test_per_call_slots_derive_from_the_field_list():
    names = [n for n, c, _ in args.ARGS_FIELDS for _ in range(c)]
    assert names[launch._IN0] == names[launch._IN1] == "in_ptr" and launch._IN1 == launch._IN0 + 1
    assert names[launch._OUT0] == names[launch._OUT1] == "out_ptr"
    assert launch._OUT1 == launch._OUT0 + 1
    for slot, name in ((launch._POS, "pos_ptr"), (launch._SEQ, "seq_off_ptr"),
                       (launch._OFFSET, "offset"), (launch._AUX, "aux_ptr"),
                       (launch._STATS, "stats_ptr")):
        assert names[slot] == name and names.index(name) == slot


def test_pack_args_fills_fields_by_name():
    raw = args.pack_args(in_sb=(5, 6), heads=(32, 8), scale=0.75, sin_sign=-1.0, tok_tile=64)
    values = struct.unpack(args.ARGS.format, raw)
    slots = args.ARGS_SLOTS
    assert values[slots["in_sb"]:slots["in_sb"] + 2] == (5, 6)
    assert values[slots["heads"]:slots["heads"] + 2] == (32, 8)
    assert values[slots["scale"]] == 0.75 and values[slots["sin_sign"]] == -1.0
    assert values[slots["tok_tile"]] == 64
    named = {slots[n] + i for n in ("in_sb", "heads", "scale", "sin_sign", "tok_tile")
             for i in range(dict((f, c) for f, c, _ in args.ARGS_FIELDS)[n])}
    assert all(v == 0 for i, v in enumerate(values) if i not in named)
    with pytest.raises(TypeError, match="no field"):
        args.pack_args(in_stride=1)
    with pytest.raises(ValueError, match="heads takes 2 values"):
        args.pack_args(heads=(1,))


def test_flat_order_takes_every_pointer_first_inputs_before_outputs():
    """The flat entries' parameters: the ten pointer words (inputs, then the
    outputs the kernel writes), then every other word once, in struct order."""
    names = [n for n, c, _ in args.ARGS_FIELDS for _ in range(c)]
    assert all(names[s].endswith("_ptr") for s in args.FLAT_POINTER_SLOTS)
    assert sorted(args.FLAT_POINTER_SLOTS + args.FLAT_WORDS) == list(range(len(names)))
    assert list(args.FLAT_WORDS) == sorted(args.FLAT_WORDS)
    assert not any(names[s].endswith("_ptr") for s in args.FLAT_WORDS)
    outs = [i for i, r in enumerate(args.FLAT_POINTERS) if r.startswith(("out_", "stats"))]
    assert outs == list(range(len(args.FLAT_POINTERS) - len(outs), len(args.FLAT_POINTERS)))


def test_flat_entry_signature_and_struct_words_follow_the_flat_order():
    """kernels/flat.cuh: its parameters are FLAT_POINTERS then w<slot> for
    FLAT_WORDS, and it rebuilds the struct with each word at its slot."""
    src = loader.kernel_sources()["flat.cuh"]
    sig = re.search(r"rope_flat_kernel\(([^)]*)\)", src).group(1)
    params = [p.split()[-1] for p in sig.split(",")]
    pointer_names = [r.replace("_ptr0", "0").replace("_ptr1", "1").replace("_ptr", "")
                     for r in args.FLAT_POINTERS]
    assert params == pointer_names + [f"w{i}" for i in args.FLAT_WORDS]
    init = re.search(r"words\[45\] = \{([^}]*)\}", src).group(1)
    words = [w.strip() for w in init.split(",")]
    by_slot = dict(zip(args.FLAT_POINTER_SLOTS, pointer_names))
    assert words == [by_slot.get(i, f"w{i}") for i in range(len(words))]


def test_qknorm_flat_entry_follows_the_flat_order():
    """kernels/qknorm_flat.cuh: its parameters are qknorm_launch.FLAT_POINTERS
    (inputs, then the outputs) then w<slot> for FLAT_WORDS, and it rebuilds
    QkNormArgs with each word at its slot."""
    from cuprope._core import qknorm_launch as ql
    names = [n for n, c, _ in ql.QKNORM_ARGS_FIELDS for _ in range(c)]
    assert len(names) == ql.QKNORM_ARGS.size // 8 == 67
    assert all(names[s].endswith("_ptr") for s in ql.FLAT_POINTER_SLOTS)
    assert sorted(ql.FLAT_POINTER_SLOTS + ql.FLAT_WORDS) == list(range(len(names)))
    outs = [i for i, r in enumerate(ql.FLAT_POINTERS) if r in ql.FLAT_OUTPUTS]
    assert outs == list(range(len(ql.FLAT_POINTERS) - 3, len(ql.FLAT_POINTERS)))
    src = loader.kernel_sources()["qknorm_flat.cuh"]
    sig = re.search(r"qknorm_flat_kernel\(([^)]*)\)", src).group(1)
    params = [p.split()[-1] for p in sig.split(",")]
    c_names = [r.replace("w_ptr", "weight").replace("_ptr", "") for r in ql.FLAT_POINTERS]
    assert params == c_names + [f"w{i}" for i in ql.FLAT_WORDS]
    init = re.search(r"words\[67\] = \{([^}]*)\}", src).group(1)
    words = [w.strip() for w in init.split(",")]
    by_slot = dict(zip(ql.FLAT_POINTER_SLOTS, c_names))
    assert words == [by_slot.get(i, f"w{i}") for i in range(len(names))]
