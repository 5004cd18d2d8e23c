"""Launches of the KV-cache dialect (``kernels/kvcache.cuh``): the vector
width, the grid (the core's ``grid_for``: one warp per token and group of
rows) and the two argument structs (``kv_spec``), packed per call.
"""
from __future__ import annotations

from .._core import launcher
from .._core.launch import sm_count
from .._core.loader import ITEMSIZE, tuning
from ..rope import decode
from ..rope.args import KV_ARGS, ROPE_ARGS
from ..rope.kernels import KV_ANGLES, SRC_SHARED, lrpe_vec_widths
from ..rope.launch import MAX_STEPS, grid_for
from .kernels import kv_family_of, kv_kernel_name


def pick_pack_vec(dtype, arrays, widths) -> int:
    """The widest instantiated pack width (16 bytes of ``dtype``) when every
    array allows it, else 1. ``arrays``: (pointer in bytes, item size,
    strides in elements) of each array moved in packs (fp8 arrays have item
    size 1: the same width is VEC bytes there); ``widths``: the row widths
    the packs tile (R/2 for the rotated halves, the pass-through tail; MLA's
    Dn and Dc)."""
    widest = lrpe_vec_widths(dtype)[0]
    if any(w % widest for w in widths):
        return 1
    for ptr, itemsize, strides in arrays:
        if ptr % (widest * itemsize) or any(s % widest for s in strides):
            return 1
    return widest


def copy_packs(tail, vec, needed) -> int:
    """Packs per pass-through chunk (dims >= R): 0 when none is written
    (``needed`` False, or R = D), else 2 where the tail allows (every lane
    then moves two packs, as a rotated chunk does), else 1."""
    if not needed or not tail:
        return 0
    return 2 if tail % (2 * vec) == 0 else 1


def is_wide(device, dtype, vec, src, warps) -> bool:
    """Whether a launch of ``warps`` warps takes the WIDE instantiation: the
    computed angles at the widest packs, in a grid of at least
    CUPROPE_KV_WIDE_WARPS_PER_SM warps per SM (several waves: a prefill),
    where more resident warps beat the spills that buy them (measured on an
    H200)."""
    return (src == KV_ANGLES and vec == lrpe_vec_widths(dtype)[0]
            and warps >= WIDE_WARPS_PER_SM * sm_count(device))


WIDE_WARPS_PER_SM = tuning("CUPROPE_KV_WIDE_WARPS_PER_SM")


def kv_spec(device, *, dtype, interleaved, vec, src, fp8, rope, kv, calls=(), pdl=False):
    """One ``kv_rope_kernel`` launch on ``device`` as a launcher.LaunchSpec.

    The kernel takes a ``RopeArgs`` (q as tensor 0, k as tensor 1, their
    outputs, positions, the angle source) and a ``KvArgs`` (v, the caches,
    the cache addressing, fp8 scales, a cos_sin_cache). Both are packed into
    one buffer (a LaunchSpec of two parameter groups), whose per-call words
    the fast paths of ``cuprope.kvcache`` and ``cuprope.cos_sin_cache`` fill
    with each call's pointers through ``Plan.run``.

    ``rope``: RopeArgs fields by name (heads, n_batch, n_seq, head_dim,
    rot_dim, copy_rest, ...; head_groups and heads_per_group are set here);
    ``kv``: KvArgs fields by name; ``calls``: (field, index, addend) per
    pointer field Plan.run fills from the call's pointers (a field of either
    struct; a RopeArgs pair's element as ``name1``, e.g. ``in_ptr1``); ``pdl``
    a programmatic dependent launch. Its
    plan allocates nothing on the device, so a warmed-up call can be captured
    in a CUDA graph."""
    npairs = rope["rot_dim"] // 2
    cw = rope.get("copy_rest", 0)
    chunks = npairs // vec + ((rope["head_dim"] - rope["rot_dim"]) // (vec * cw) if cw else 0)
    hq, hk = rope["heads"]
    htot = hq + hk + (hk if kv.get("v_ptr") else 0)
    tokens = rope["n_batch"] * rope["n_seq"]
    if (src != KV_ANGLES and not fp8 and not any(kv.get(f) for f in ("v_ptr", "k_cache",
                                                                      "v_cache"))
            and decode.fits(dtype, vec, tokens)
            and decode.table_aligned(dtype, interleaved, vec, src, kv["cs_ptr"], kv["cs_st"])):
        # a cos_sin_cache rotation of few tokens (rotary_embedding): the decode rows
        rows = decode.spec(sm_count(device), dtype=dtype, interleaved=interleaved, vec=vec,
                           src=src, rope_args=ROPE_ARGS.pack(**rope), kv=kv, calls=calls,
                           htot=htot, chunks=chunks, n_batch=rope["n_batch"],
                           n_seq=rope["n_seq"], pdl=pdl)
        if rows is not None:
            return rows
    slice_ = src == KV_ANGLES and not rope.get("freq_sh")  # the warp's cos/sin slice
    grid, block, groups, per_group, smem = grid_for(sm_count(device), ITEMSIZE[dtype], npairs,
                                                    chunks, htot, tokens, slice_, 0,
                                                    MAX_STEPS[SRC_SHARED])
    ra = ROPE_ARGS.pack(head_groups=groups, heads_per_group=per_group, **rope)
    wide = is_wide(device, dtype, vec, src, grid[0] * block[0] // 32)
    return launcher.LaunchSpec(kv_kernel_name(dtype, interleaved, vec, src, fp8, wide),
                               kv_family_of(src, wide), grid, block, smem,
                               [(ROPE_ARGS, ra), (KV_ARGS, KV_ARGS.pack(**kv))], calls, vec=vec,
                               pdl=pdl)


def angle_table(config, device):
    """The float32 ``[config.angle_rows, R]`` angle table of ``config`` on
    ``device`` (RopeConfig.cache_angles; ``cuprope.rope.decode.angle_table``
    builds it on first use and keeps it); None when ``cache_angles`` was not
    called (or with 0), or the config's angles are not shared (per-head
    tables, multi-stream maps)."""
    if not config.angle_rows:
        return None
    return decode.angle_table(config, device)
