"""The rotation's kernel records (its launches: ``launch.py``,
``decode.py``): rope_kernel's plain and LRPE families and the
sequence-softmax statistics pass (kernels/rope.cu), and the decode rows with
the angle table's builder (kernels/kvcache.cu)."""
from __future__ import annotations

from .._core import kernels
from .._core.kernels import DTYPE_CTYPES, cbool, vec_widths

# Angle sources: the rope_kernel template's SRC (kernels kSrc*).
SRC_SHARED, SRC_PER_HEAD, SRC_TABLE = 0, 1, 2
# LRPE activation codes: the template's ACT (kernels kAct*); 0 is plain RoPE.
LRPE_ACTS = {"none": 0, "relu": 1, "sigmoid": 2, "silu": 3, "softmax": 4, "softmax_seq": 5}
# The LRPE sequence-softmax statistics pass runs blocks of (32, SEQ_SLICES)
# threads, each row of the block a slice of the sequence (kernels kSeqSlices).
SEQ_SLICES = 8

# The angle sources of the decode rows and of the KV-cache dialect's
# kv_rope_kernel (kernels/kvcache.cuh, SRC: computed from a RopeConfig's
# table, or read from a cos_sin_cache in float32 or in the element type); the
# decode rows take one more, KV_TABLES_T: the caller's [B, S, R] cos and sin
# tables in the element type (rope_kernel's SRC_TABLE, HF's roundings).
KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T, KV_TABLES_T = 0, 1, 2, 3

CODES = {"CUPROPE_SRC_SHARED": SRC_SHARED, "CUPROPE_SRC_PER_HEAD": SRC_PER_HEAD,
         "CUPROPE_SRC_TABLE": SRC_TABLE, "CUPROPE_SEQ_SLICES": SEQ_SLICES,
         **{f"CUPROPE_ACT_{name.upper()}": code for name, code in LRPE_ACTS.items()},
         "CUPROPE_KV_ANGLES": KV_ANGLES, "CUPROPE_KV_COS_SIN_F32": KV_COS_SIN_F32,
         "CUPROPE_KV_COS_SIN_T": KV_COS_SIN_T, "CUPROPE_KV_TABLES_T": KV_TABLES_T}

# Tuning values, measured on an H200 (benchmarks/NOTES.md); any of them can be
# overridden through CUPROPE_KERNEL_DEFINES (benchmarks/tune.py). By element
# size: 16 for the 16-bit types, 32 for float32.
TUNING = {
    # the most threads per block of the rope, LRPE and KV-cache kernels (their
    # __launch_bounds__, kernels kThreads; whole warps), and the warps per
    # block the host launches them with (at most CUPROPE_THREADS / 32)
    "CUPROPE_THREADS": 256, "CUPROPE_WARPS16": 4, "CUPROPE_WARPS32": 8,
    # rows (heads) a lane keeps in flight per step when it loads into registers:
    # one for 16-bit types (fewer registers, more warps resident), two for
    # float32
    "CUPROPE_ROWS16": 1, "CUPROPE_ROWS32": 2,
    # depth of the shared-memory load ring of the plain shared-angle and
    # cos/sin-table kernels with 16-byte packs: a lane keeps this many heads
    # minus one of its chunk in flight
    "CUPROPE_STAGES16": 3, "CUPROPE_STAGES32": 3,
    # token runs: rows a lane advances between exact cos/sin. kRun - 1
    # compositions add at most ~(kRun - 1) * 1.2e-7: 1.8e-6 for 16 (under 1 %
    # of half an ulp of fp16), 3.6e-7 for float32's 4 (its test slack is 1e-6
    # of max|x|); 0 turns token runs off on the host
    "CUPROPE_RUN16": 16, "CUPROPE_RUN32": 4,
    # depth of the token runs' load ring (16-byte packs): 4 measured 1-3 %
    # faster than 3 for the 16-bit types, and 3 than 4 for the float32
    # backward
    "CUPROPE_RUN_STAGES16": 4, "CUPROPE_RUN_STAGES32": 3,
    # blocks of CUPROPE_THREADS threads that must fit an SM at once (__launch_bounds__).
    # Plain shared-angle kernels (the hot path): 4 caps them at 64 registers
    # with no spills, so 32 warps stay resident; the other instantiations
    # would spill under it. Per-head kernels (plain and elementwise LRPE
    # forward) with token runs: float32 at 3 (80 registers, no
    # spills) runs ~5 % faster than uncapped, the 16-bit forward runs best
    # uncapped (~100 registers; caps that spill lose); the fused elementwise
    # LRPE backward (which also loads x) gains 3-6 % at 2. The softmax
    # kernels stay uncapped.
    "CUPROPE_MIN_BLOCKS": 4, "CUPROPE_MIN_BLOCKS_PH16": 1, "CUPROPE_MIN_BLOCKS_PH32": 3,
    "CUPROPE_MIN_BLOCKS_PH_BWD": 2,
    # the most warp steps per token (host only, launch.MAX_STEPS): the computed
    # angle sources, and the cos/sin-table source
    "CUPROPE_MAX_STEPS": 3, "CUPROPE_MAX_STEPS_TABLE": 5,
    # token runs on (1) or off (0), and a fixed token tile (0: chosen per shape; host only)
    "CUPROPE_TOKEN_RUNS": 1, "CUPROPE_TOKEN_TILE": 0,
    # the decode rows (kernels/decode.cuh; host only, cuprope/rope/decode.py):
    # the most tokens a launch has to take them (0: never), the most tokens
    # (a warp each at D 128) per block, and the bytes of a config's angle
    # table when cache_angles was not called (16 MiB: 32768 positions at R 128)
    "CUPROPE_DECODE_MAX_TOKENS": 1024, "CUPROPE_DECODE_WARPS": 4,
    "CUPROPE_ANGLE_TABLE_BYTES": 16 << 20,
}

ENTRY = "rope.cu"


def kernel_name(dtype: str, interleaved: bool, vec: int, src: int = SRC_SHARED,
                act: int = 0, backward: bool = False) -> str:
    """Name expression of one ``rope_kernel`` instantiation. ``src``: the angle
    source (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE); ``act`` / ``backward`` select
    the LRPE dialect (the kernel's ACT, BWD); the plain RoPE names leave
    them at their defaults."""
    if src not in (SRC_SHARED, SRC_PER_HEAD, SRC_TABLE):
        raise ValueError(f"unknown angle source {src!r}")
    name = f"cuprope::rope_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, {vec}, {int(src)}"
    if act or backward:
        name += f", {act}, {cbool(backward)}"
    return name + ">"


def flat_kernel_name(dtype: str, interleaved: bool, vec: int, src: int = SRC_SHARED,
                     act: int = 0, backward: bool = False) -> str:
    """Name expression of the flat entry (kernels/flat.cuh) of the
    ``rope_kernel`` instantiation with these parameters."""
    return kernel_name(dtype, interleaved, vec, src, act, backward).replace(
        "cuprope::rope_kernel<", "cuprope::rope_flat_kernel<", 1)


def seq_stats_kernel_name(dtype: str, backward: bool) -> str:
    """The LRPE sequence-softmax statistics pass."""
    return f"cuprope::lrpe_seq_stats_kernel<{DTYPE_CTYPES[dtype]}, {cbool(backward)}>"


def lrpe_vec_widths(dtype: str) -> tuple[int, ...]:
    """LRPE kernels exist for the widest width and for 1 pair (any alignment)."""
    return (vec_widths(dtype)[0], 1)


# Instantiations are grouped into modules compiled on first use, so a model
# with shared frequencies never pays for the per-head or cos/sin-table
# variants, and plain RoPE never compiles the LRPE dialect (one family per
# activation).
_PLAIN_FAMILIES = {SRC_SHARED: "shared", SRC_PER_HEAD: "per_head", SRC_TABLE: "table"}
FAMILIES = tuple(_PLAIN_FAMILIES.values()) + tuple(f"lrpe_{a}" for a, c in LRPE_ACTS.items() if c)


def family_of(act: int, src: int) -> str:
    """The family holding the rope_kernel instantiation for ``act`` (0: plain)
    and angle source ``src``."""
    if act == 0:
        return _PLAIN_FAMILIES[src]
    for name, code in LRPE_ACTS.items():
        if code == act:
            return f"lrpe_{name}"
    raise ValueError(f"unknown LRPE activation code {act}")


def family_names(family: str) -> list[str]:
    """A plain or LRPE family's instantiations."""
    for src, name in _PLAIN_FAMILIES.items():
        if family == name:
            return [kernel_name(dt, il, v, src)
                    for dt in DTYPE_CTYPES for il in (False, True) for v in vec_widths(dt)]
    act = LRPE_ACTS[family[len("lrpe_"):]]
    names = [kernel_name(dt, False, v, src, act, bwd)
             for dt in DTYPE_CTYPES for v in lrpe_vec_widths(dt)
             for src in (SRC_SHARED, SRC_PER_HEAD) for bwd in (False, True)]
    if act == LRPE_ACTS["softmax_seq"]:
        names += [seq_stats_kernel_name(dt, bwd) for dt in DTYPE_CTYPES for bwd in (False, True)]
    return names


# The decode rows (rope_decode_kernel, kernels/decode.cuh: the core's and
# rotary_embedding's launches of few tokens) with the angle table's builder,
# compiled from the KV-cache translation unit.
DECODE_ENTRY = "kvcache.cu"
DECODE_FAMILY = "decode"
KV_ANGLE_TABLE_KERNEL = "cuprope::kv_angle_table_kernel"


def decode_kernel_name(dtype: str, interleaved: bool, src: int = KV_ANGLES) -> str:
    """Name expression of one ``rope_decode_kernel`` instantiation (the
    widest packs of ``dtype``): ``src`` KV_ANGLES (the angle table, float64
    past it), KV_COS_SIN_F32 or KV_COS_SIN_T (a cos_sin_cache; T: 16-bit
    dtypes only), KV_TABLES_T (the caller's [B, S, R] cos/sin tables)."""
    if src not in _DECODE_SOURCES or (
            src == KV_COS_SIN_T and dtype == "float32"):
        raise ValueError(f"no rope_decode_kernel for {dtype}, src={src!r}")
    return (f"cuprope::rope_decode_kernel<{DTYPE_CTYPES[dtype]}, {cbool(interleaved)}, "
            f"{vec_widths(dtype)[0]}, {int(src)}>")


_DECODE_SOURCES = (KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T, KV_TABLES_T)


def decode_kernel_names(family: str = DECODE_FAMILY) -> list[str]:
    """The angle table's builder and every decode rows instantiation."""
    return [KV_ANGLE_TABLE_KERNEL] + [
        decode_kernel_name(dt, il, src) for dt in DTYPE_CTYPES for il in (False, True)
        for src in _DECODE_SOURCES
        if not (src == KV_COS_SIN_T and dt == "float32")]


kernels.register(ENTRY, FAMILIES, family_names, tuning=TUNING, codes=CODES)
kernels.register(DECODE_ENTRY, (DECODE_FAMILY,), decode_kernel_names)
