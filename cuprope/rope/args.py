"""The rotation family's argument structs on the host: ``struct RopeArgs``
and ``KvArgs`` (kernels/args.cuh; every rope-family kernel takes RopeArgs,
the KV dialect, the decode rows, MLA and the prologue KvArgs beside it) and
``kv_angle_table_kernel``'s scalar parameters; RopeArgs' flat entry
(kernels/flat.cuh) is declared here. Tests compare the lists with the C
structs.
"""
from __future__ import annotations

from .._core.args import ArgStruct, declare_flat

# struct RopeArgs (kernels/args.cuh) field by field, in order.
ROPE_ARGS = ArgStruct("RopeArgs", (
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
), pointers=("in_ptr0", "in_ptr1", "pos_ptr", "seq_off_ptr", "inv_freq_ptr", "stream_map_ptr",
             "aux_ptr", "out_ptr0", "out_ptr1", "stats_ptr"),
    outputs=("out_ptr0", "out_ptr1", "stats_ptr"))

# struct KvArgs (kernels/args.cuh), the KV-cache dialect's second argument (all int64).
KV_ARGS = ArgStruct("KvArgs", tuple((name, 1, "q") for name in (
    "v_ptr", "v_sb", "v_ss", "v_sh", "k_cache", "v_cache", "kc_sp", "kc_sr", "kc_sh",
    "vc_sp", "vc_sr", "vc_sh", "num_pages", "page_size", "slot_ptr", "batch_ptr", "cpos_ptr",
    "indices_ptr", "indptr_ptr", "n_indices", "index_is64", "n_seqs", "q_scale", "k_scale",
    "v_scale", "kv_scale_sh", "cs_ptr", "cs_st", "cs_rows", "write_rest")))

# kv_angle_table_kernel's parameters after its RopeArgs (kernels/kvcache.cuh).
TABLE_ARGS = ArgStruct("kv_angle_table_kernel", (("out_ptr", 1, "q"), ("rows", 1, "q")),
                       spread=True)

declare_flat("CUPROPE_FLAT_ROPE", ROPE_ARGS)

# Short names.
ARGS_FIELDS, ARGS, ARGS_SLOTS = ROPE_ARGS.fields, ROPE_ARGS.packer, ROPE_ARGS.slots
pack_args, pack_kv_args = ROPE_ARGS.pack, KV_ARGS.pack
