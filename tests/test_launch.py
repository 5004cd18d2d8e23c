"""The launch-argument struct on the host (ROPE_ARGS, cuprope/rope/args.py)
against the C struct the kernels read (kernels/args.cuh), and packing it by
field name. No GPU needed."""
import re
import struct

import pytest

from cuprope._core import args as core_args, launcher, loader
from cuprope.rope import args
from cuprope.rope import kernels as rope_kernels
from cuprope.rope import launch
from cuprope.qknorm import kernels as qknorm_kernels


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
    assert tuple(c_struct_fields(struct_name="KvArgs")) == args.KV_ARGS.fields
    assert args.KV_ARGS.size == 8 * len(args.KV_ARGS.fields)
    raw = args.pack_kv_args(page_size=16, write_rest=3)
    values = struct.unpack(args.KV_ARGS.packer.format, raw)
    names = [n for n, _, _ in args.KV_ARGS.fields]
    assert values[names.index("page_size")] == 16 and values[names.index("write_rest")] == 3
    assert sum(values) == 19
    with pytest.raises(TypeError, match="KvArgs has no field"):
        args.pack_kv_args(page=1)


def test_per_call_slots_derive_from_the_field_list():
    """The rope launches' per-call words (launch.ROPE_CALLS, LRPE_CALLS)
    resolve to the struct's slots of those fields."""
    names = [n for n, c, _ in args.ARGS_FIELDS for _ in range(c)]
    spec = launcher.LaunchSpec("k", "f", (1, 1, 1), (32, 1, 1), 0,
                               [(args.ROPE_ARGS, args.pack_args())], launch.ROPE_CALLS)
    assert [names[s] for s, _, _ in spec.calls] == [
        "in_ptr", "in_ptr", "out_ptr", "out_ptr", "pos_ptr", "seq_off_ptr", "offset"]
    assert [s for s, _, _ in spec.calls[:4]] == [0, 1, 2, 3]
    assert [i for _, i, _ in spec.calls] == list(range(7))
    lrpe = launcher.LaunchSpec("k", "f", (1, 1, 1), (32, 1, 1), 0,
                               [(args.ROPE_ARGS, args.pack_args())], launch.LRPE_CALLS)
    assert [(names[s], i) for s, i, _ in lrpe.calls] == [
        ("in_ptr", 0), ("in_ptr", 0), ("out_ptr", 1), ("out_ptr", 1), ("aux_ptr", 2),
        ("stats_ptr", 3), ("offset", 4)]


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


@pytest.mark.parametrize("st", [args.ROPE_ARGS, qknorm_kernels.QKNORM_ARGS],
                         ids=lambda s: s.c_name)
def test_flat_order_takes_every_pointer_first_inputs_before_outputs(st):
    """The flat entries' parameters: the pointer words (inputs, then the
    outputs the kernel writes), then every other word once, in struct order."""
    names = [n for n, c, _ in st.fields for _ in range(c)]
    assert len(names) == st.n_words == st.size // 8
    assert all(names[s].endswith("_ptr") for s in st.pointer_slots)
    assert sorted(st.pointer_slots + st.flat_words) == list(range(len(names)))
    assert list(st.flat_words) == sorted(st.flat_words)
    unused = {"aux_ptr", "stats_ptr"} if st is qknorm_kernels.QKNORM_ARGS else set()  # 0 there
    assert not any(names[s].endswith("_ptr") and names[s] not in unused for s in st.flat_words)
    outs = [i for i, r in enumerate(st.pointers) if r in st.outputs]
    assert outs == list(range(len(st.pointers) - len(st.outputs), len(st.pointers)))


@pytest.mark.parametrize("prefix,st,header", [
    ("CUPROPE_FLAT_ROPE", args.ROPE_ARGS, "flat.cuh"),
    ("CUPROPE_FLAT_QKNORM", qknorm_kernels.QKNORM_ARGS, "qknorm_flat.cuh")])
def test_flat_entry_source_is_generated_from_the_field_list(prefix, st, header):
    """The flat entries' parameter list and struct rebuild come from the
    field list (core_args.flat_defines): parameters are the pointer roles then
    w<slot> for the other words; the rebuild puts each word at its slot; the
    header uses them and the one shared rebuild helper."""
    defines = dict(d[2:].split("=", 1) for d in core_args.flat_defines())
    params = [p.strip() for p in defines[f"{prefix}_PARAMS"].split(",")]
    assert all(p.startswith("long long ") for p in params)
    params = [p.split()[-1] for p in params]
    assert params == list(st.pointers) + [f"w{i}" for i in st.flat_words]
    words = [w.strip() for w in defines[f"{prefix}_WORDS"].split(",")]
    by_slot = dict(zip(st.pointer_slots, st.pointers))
    assert words == [by_slot.get(i, f"w{i}") for i in range(st.n_words)]
    src = loader.kernel_sources()[header]
    assert f"({prefix}_PARAMS)" in src and f"{{{prefix}_WORDS}}" in src
    assert "flat_rebuild(a, words);" in src and "__syncthreads" not in src.split(
        "flat_rebuild(a, words);")[1]


def test_flat_call_passes_the_eager_specs_words():
    """launcher.flat_call (the jit lowering) of a rope LaunchSpec: the flat
    entry of the spec's kernel, its grid, warps and shared memory, an array
    parameter for every pointer with a source (aligned as asked) and 0 for
    the rest, then every other word of the spec's packed struct in slot
    order, the per-call offset fixed."""
    st = args.ROPE_ARGS
    plans = [launch.TensorPlan(0, 0, (4096, 512, 128), (4096, 512, 128), 4),
             launch.TensorPlan(0, 0, (1024, 256, 128), (1024, 256, 128), 2)]
    spec = launch.rope_spec(sms=132, dtype="bfloat16", interleaved=False, plans=plans,
                            n_batch=2, n_seq=8, head_dim=128, rot_dim=128, copy_rest=True,
                            pos=(0, 0, 0, 1), seq_off=None, inv_freq_ptr=1, freq_sh=0,
                            stream_map_ptr=0, scale=0.5, sin_sign=1.0)
    assert spec.flat == rope_kernels.flat_kernel_name("bfloat16", False, 8, rope_kernels.SRC_SHARED)
    assert spec.kernel == rope_kernels.kernel_name("bfloat16", False, 8, rope_kernels.SRC_SHARED)
    sources = {"in_ptr0": ("operand", 0), "in_ptr1": ("operand", 1), "pos_ptr": ("operand", 2),
               "inv_freq_ptr": ("constant", "table"), "out_ptr0": "out", "out_ptr1": "out"}
    fc = launcher.flat_call(spec, sources, {"in_ptr0": 16, "out_ptr1": 16},
                            fixed={"offset": 77})
    assert (fc.name, fc.grid, fc.smem) == (spec.flat, spec.grid, spec.smem)
    assert fc.warps == spec.block[0] // 32
    n = len(st.pointers)
    assert [p[0] for p in fc.params[:n]] == ["array" if r in sources else "scalar"
                                             for r in st.pointers]
    assert fc.params[0] == ("array", 16) and fc.params[st.pointers.index("out_ptr1")][1] == 16
    assert fc.operands == (("operand", 0), ("operand", 1), ("operand", 2), ("constant", "table"))
    words = list(struct.unpack("<" + "q" * st.n_words, spec.params[0][1]))
    words[st.slot("offset")] = 77
    assert [p[1] for p in fc.params[n:]] == [words[i] for i in st.flat_words]
    assert all(p[0] == "scalar" and p[2] == "i64" for p in fc.params[n:])
    assert len(fc.params) == st.n_words == 45
