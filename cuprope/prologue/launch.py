"""The decode prologue's launch (kernels/prologue.cuh ``prologue_kernel``) as
a ``launcher.LaunchSpec`` (:func:`spec`): the QK-norm struct of the call, the
KV-append struct and the prologue's own words (``PROLOGUE_ARGS``), over
QK-norm blocks followed by the v part's blocks.
"""
from __future__ import annotations

from . import kernels
from ..qknorm import launch as qknorm_launch
from .._core.args import ArgStruct
from ..rope.args import KV_ARGS
from .._core.launch import sm_count
from .._core.launcher import LaunchSpec

__all__ = ["PROLOGUE_ARGS", "spec", "pack_ok"]

# struct PrologueArgs (kernels/prologue.cuh), field by field.
PROLOGUE_ARGS = ArgStruct("PrologueArgs", (("norm_blocks", 1, "q"), ("packs", 1, "q")))

PACK_Q, PACK_K, PACK_V = 1, 2, 4  # PrologueArgs.packs bits
V_WARPS_PER_SM = 32  # the v part: at most this many warps per multiprocessor


def pack_ok(width, arrays) -> bool:
    """Whether packs of ``width`` elements stay aligned in every array:
    ``arrays`` are (pointer in bytes, item size, strides in elements)."""
    return all(ptr % (width * isz) == 0 and all(s % width == 0 for s in st)
               for ptr, isz, st in arrays)


def spec(call, qi, qo, ki, device, *, kv, fp8, packs, tokens, inv_freq_ptr,
         stream_map_ptr, calls=(), pdl=False) -> LaunchSpec:
    """The launch of one prologue call: ``call`` a validated
    ``cuprope.qknorm.QkNormCall`` of q (``qi``) and k (``ki``), ``qo`` q's
    output, ``kv`` KvArgs by field name, ``fp8`` a sum of KV_FP8_Q and
    KV_FP8_CACHE, ``packs`` PrologueArgs.packs; ``calls`` the words
    Plan.run writes per call ((field, value index, addend), a field of
    either struct by name); ``pdl`` a programmatic dependent launch.

    The structs: the QK-norm struct of the call (the very fields
    ``cuprope.qknorm`` launches with, q's output redirected to ``q_out`` and
    k's to nothing: k goes to the cache), the KV-append struct (v, the
    caches, the addressing, the fp8 scales) and the prologue's own words
    (where the grid's v part starts, which targets take whole packs). The
    grid: ``qknorm_launch.geometry``'s blocks (the same body and pack width
    cuprope.qknorm would choose for q and k, hence the same bits), then the
    v part's blocks (one warp per token at a time)."""
    sms = sm_count(device)
    ins = [qi, ki]
    geo = qknorm_launch.geometry(call, ins, ins, False, sms)
    fields = qknorm_launch.struct_fields(call, ins, [qo, ki], geo, inv_freq_ptr=inv_freq_ptr,
                                         stream_map_ptr=stream_map_ptr, part_ptr=0)
    fields.update(out_ptr=[qo.ptr, 0], x_ptr=[0, 0])
    for name in ("out_sb", "out_ss", "out_sh"):
        fields[name] = [fields[name][0], 0]
    warps = qknorm_launch.WARPS
    v_blocks = max(1, min(-(-tokens // warps), V_WARPS_PER_SM * sms // warps))
    name = kernels.prologue_kernel_name(call.dtype, call.config.interleaved, geo.vec, fp8)
    params = [(qknorm_launch.QKNORM_ARGS, qknorm_launch.QKNORM_ARGS.pack(**fields)),
              (KV_ARGS, KV_ARGS.pack(**kv)),
              (PROLOGUE_ARGS, PROLOGUE_ARGS.pack(norm_blocks=geo.blocks, packs=packs))]
    return LaunchSpec(name, kernels.prologue_family_of(call.dtype, fp8),
                      (geo.blocks + v_blocks, 1, 1), (qknorm_launch.THREADS, 1, 1), geo.smem,
                      params, calls, vec=max(geo.vec, 1), pdl=pdl)


def vec_of(call, qi, ki, device) -> int:
    """The QK-norm pack width the launch uses (0: the general body)."""
    return qknorm_launch.geometry(call, [qi, ki], [qi, ki], False, sm_count(device)).vec
