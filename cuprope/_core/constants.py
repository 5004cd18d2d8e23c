"""The constants the kernels share with the host and the tuning values they
compile with (the rotation's here, each other op's declared by its kernel
record): every one reaches the kernels as a ``-D`` option
(``loader.compile_options``), the headers keep no defaults
(``kernels/constants.cuh`` checks them), and the host reads the same merged
values, so the two cannot disagree. ``loader`` re-exports every name."""
from __future__ import annotations

import os

# Angle sources: the rope_kernel template's SRC (kernels kSrc*).
SRC_SHARED, SRC_PER_HEAD, SRC_TABLE = 0, 1, 2
# LRPE activation codes: the template's ACT (kernels kAct*); 0 is plain RoPE.
LRPE_ACTS = {"none": 0, "relu": 1, "sigmoid": 2, "silu": 3, "softmax": 4, "softmax_seq": 5}
# The LRPE sequence-softmax statistics pass runs blocks of (32, SEQ_SLICES)
# threads, each row of the block a slice of the sequence (kernels kSeqSlices).
SEQ_SLICES = 8

# The KV-cache dialect (kernels/kvcache.cuh): kv_rope_kernel's angle sources
# (SRC: computed from a RopeConfig's table, or read from a cos_sin_cache in
# float32 or in the element type) and the bits of its FP8 parameter (q's
# output, the k/v caches in e4m3). The decode rows take one more source:
# KV_TABLES_T, the caller's [B, S, R] cos and sin tables in the element type
# (rope_kernel's SRC_TABLE, HF's formula and roundings).
KV_ANGLES, KV_COS_SIN_F32, KV_COS_SIN_T, KV_TABLES_T = 0, 1, 2, 3
KV_FP8_Q, KV_FP8_CACHE = 1, 2

CODES = {"CUPROPE_SRC_SHARED": SRC_SHARED, "CUPROPE_SRC_PER_HEAD": SRC_PER_HEAD,
         "CUPROPE_SRC_TABLE": SRC_TABLE, "CUPROPE_SEQ_SLICES": SEQ_SLICES,
         **{f"CUPROPE_ACT_{name.upper()}": code for name, code in LRPE_ACTS.items()},
         "CUPROPE_KV_ANGLES": KV_ANGLES, "CUPROPE_KV_COS_SIN_F32": KV_COS_SIN_F32,
         "CUPROPE_KV_COS_SIN_T": KV_COS_SIN_T, "CUPROPE_KV_TABLES_T": KV_TABLES_T,
         "CUPROPE_KV_FP8_Q": KV_FP8_Q,
         "CUPROPE_KV_FP8_CACHE": KV_FP8_CACHE}

# Tuning values, measured on an H200 (benchmarks/NOTES.md); any of them can be
# overridden through CUPROPE_KERNEL_DEFINES (benchmarks/tune.py). By element
# size: 16 for the 16-bit types, 32 for float32. These are the rotation's and
# the decode rows'; every other op's kernel record declares its own
# (declare_tuning, through kernels.register).
TUNING_DEFAULTS = {
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


def _overrides(text: str) -> dict[str, str]:
    """``NAME=value`` tokens of CUPROPE_KERNEL_DEFINES (a bare ``NAME``: ``-DNAME``)."""
    out = {}
    for tok in text.split():
        name, _, value = tok.partition("=")
        if name in CODES:
            raise ValueError(f"CUPROPE_KERNEL_DEFINES: {name} is a code the host and kernels "
                             f"share, not a tuning value")
        out[name] = value
    return out


# The tuning values in effect, read once: the defaults, then
# CUPROPE_KERNEL_DEFINES (e.g. "CUPROPE_ROWS16=2 CUPROPE_MIN_BLOCKS=3"). The
# kernels' -D options and the host's values both come from here.
TUNING = {**{k: str(v) for k, v in TUNING_DEFAULTS.items()},
          **_overrides(os.environ.get("CUPROPE_KERNEL_DEFINES", ""))}


def declare_tuning(defaults: dict[str, int]) -> None:
    """Add an op's tuning values (its kernel record's) to TUNING_DEFAULTS and
    TUNING, where an override from CUPROPE_KERNEL_DEFINES stays in effect. A
    name declared again must keep its value."""
    for name, value in defaults.items():
        old = TUNING_DEFAULTS.get(name)
        if old is not None and old != value:
            raise ValueError(f"tuning value {name} declared as {old} and as {value}")
        TUNING_DEFAULTS[name] = value
        TUNING.setdefault(name, str(value))


def tuning(name: str) -> int:
    """One tuning value in effect, as the kernels compile with it."""
    try:
        return int(TUNING[name])
    except KeyError:
        raise KeyError(f"no tuning value {name}: neither the rotation's nor declared by a "
                       f"kernel record") from None
