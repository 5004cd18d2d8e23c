"""The host's mirror of ``struct RopeArgs`` (kernels/args.cuh), the one
argument every kernel of the family takes.

``ARGS_FIELDS`` lists the struct field by field; the packed format, each
field's slot in the int64 view and the flat entry points' parameter order
(``kernels/flat.cuh``, for launchers that pass flat parameters) derive from it.
A test compares it with the C struct.
"""
from __future__ import annotations

import struct

import numpy as np

# struct RopeArgs (kernels/args.cuh) field by field, in order: (name, count,
# kind), kind "q" an int64 and "d" a float64. Every field being 8 bytes, a
# field's index in the int64 view of the packed struct is its slot below.
ARGS_FIELDS = (
    ("in_ptr", 2, "q"), ("out_ptr", 2, "q"),
    ("in_sb", 2, "q"), ("in_ss", 2, "q"), ("in_sh", 2, "q"),
    ("out_sb", 2, "q"), ("out_ss", 2, "q"), ("out_sh", 2, "q"),
    ("heads", 2, "q"), ("n_batch", 1, "q"), ("n_seq", 1, "q"),
    ("head_dim", 1, "q"), ("rot_dim", 1, "q"), ("copy_rest", 1, "q"),
    ("pos_ptr", 1, "q"), ("pos_is64", 1, "q"),
    ("pos_s_stream", 1, "q"), ("pos_sb", 1, "q"), ("pos_ss", 1, "q"),
    ("seq_off_ptr", 1, "q"), ("seq_off_is64", 1, "q"), ("offset", 1, "q"),
    ("inv_freq_ptr", 1, "q"), ("freq_sh", 1, "q"), ("stream_map_ptr", 1, "q"),
    ("scale", 1, "d"), ("sin_sign", 1, "d"),
    ("head_groups", 1, "q"), ("heads_per_group", 1, "q"),
    ("aux_ptr", 1, "q"), ("aux_sb", 1, "q"), ("aux_ss", 1, "q"), ("aux_sh", 1, "q"),
    ("stats_ptr", 1, "q"), ("stats_plane", 1, "q"),
    ("tok_tile", 1, "q"),
)
ARGS = struct.Struct("<" + "".join(kind * count for _, count, kind in ARGS_FIELDS))
ARGS_DTYPE = np.dtype([("raw", np.uint8, (ARGS.size,))])


def field_slots(fields) -> dict[str, int]:
    """Each field's slot (the index of its first element in the int64 view of
    the packed struct) in a field list of ``ARGS_FIELDS``' form."""
    out, slot = {}, 0
    for name, count, _ in fields:
        out[name] = slot
        slot += count
    return out


ARGS_SLOTS = field_slots(ARGS_FIELDS)  # name -> the slot of its first element


def pack_fields(fields, packer, what, values) -> bytes:
    """A struct of the field list ``fields`` packed by ``packer`` from
    ``values`` by field name (a sequence for the multi-element fields); a
    field not named is 0. ``what`` names the struct in errors."""
    unknown = set(values) - {name for name, _, _ in fields}
    if unknown:
        raise TypeError(f"{what} has no field {sorted(unknown)}")
    flat = []
    for name, count, _ in fields:
        v = values.get(name, (0,) * count)
        v = tuple(v) if isinstance(v, (tuple, list)) else (v,)
        if len(v) != count:
            raise ValueError(f"{what}.{name} takes {count} values, got {len(v)}")
        flat += v
    return packer.pack(*flat)


def pack_args(**values) -> bytes:
    """RopeArgs packed from its fields by name (a pair for the two-element
    fields); a field not named is 0."""
    return pack_fields(ARGS_FIELDS, ARGS, "RopeArgs", values)


# struct KvArgs (kernels/args.cuh), the KV-cache dialect's second argument,
# field by field (all int64).
KV_ARGS_FIELDS = tuple((name, 1, "q") for name in (
    "v_ptr", "v_sb", "v_ss", "v_sh", "k_cache", "v_cache", "kc_sp", "kc_sr", "kc_sh",
    "vc_sp", "vc_sr", "vc_sh", "num_pages", "page_size", "slot_ptr", "batch_ptr", "cpos_ptr",
    "indices_ptr", "indptr_ptr", "n_indices", "index_is64", "n_seqs", "q_scale", "k_scale",
    "v_scale", "kv_scale_sh", "cs_ptr", "cs_st", "cs_rows", "write_rest"))
KV_ARGS = struct.Struct("<" + "q" * len(KV_ARGS_FIELDS))
KV_ARGS_DTYPE = np.dtype([("raw", np.uint8, (KV_ARGS.size,))])


def pack_kv_args(**values) -> bytes:
    """KvArgs packed from its fields by name; a field not named is 0."""
    return pack_fields(KV_ARGS_FIELDS, KV_ARGS, "KvArgs", values)


# The flat entry points (kernels/flat.cuh) take the struct's pointers first,
# inputs before outputs (the order in which XLA hands a custom call its
# buffers), then every other word in struct order (FLAT_WORDS: int64 slots;
# the float64 fields travel as their bit patterns).
FLAT_POINTERS = ("in_ptr0", "in_ptr1", "pos_ptr", "seq_off_ptr", "inv_freq_ptr",
                 "stream_map_ptr", "aux_ptr", "out_ptr0", "out_ptr1", "stats_ptr")


def flat_order(fields, pointers) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pointer slots, other slots) of a flat entry over the struct ``fields``
    whose parameters are the pointer words ``pointers`` (roles such as
    ``in_ptr0``: field ``in_ptr``, element 0) then every other word in struct
    order."""
    slots = field_slots(fields)

    def slot(role):
        name, _, idx = role.rpartition("_ptr")
        return slots[name + "_ptr"] + (int(idx) if idx else 0)
    pointer_slots = tuple(slot(r) for r in pointers)
    n = sum(count for _, count, _ in fields)
    return pointer_slots, tuple(i for i in range(n) if i not in pointer_slots)


FLAT_POINTER_SLOTS, FLAT_WORDS = flat_order(ARGS_FIELDS, FLAT_POINTERS)
