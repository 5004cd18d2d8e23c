// The compile-time constants of the rotation's kernels, which every kernel
// family builds on, shared with the host. Each value is declared by a kernel
// record (its codes and tuning) and arrives as a -D option
// (cuprope/_core/loader.py), so the host's copies are the same values by
// construction: no default lives here, and a compile without them stops at
// the #error. Another op's constants live in its own header, checked there.
#pragma once

#if !defined(CUPROPE_SRC_SHARED) || !defined(CUPROPE_SRC_PER_HEAD) ||                  \
    !defined(CUPROPE_SRC_TABLE) || !defined(CUPROPE_ROWS16) || !defined(CUPROPE_ROWS32) || \
    !defined(CUPROPE_RUN16) || !defined(CUPROPE_RUN32) || !defined(CUPROPE_RUN_STAGES16) || \
    !defined(CUPROPE_RUN_STAGES32) || !defined(CUPROPE_STAGES16) ||                    \
    !defined(CUPROPE_STAGES32) || !defined(CUPROPE_MIN_BLOCKS) ||                      \
    !defined(CUPROPE_MIN_BLOCKS_PH16) || !defined(CUPROPE_MIN_BLOCKS_PH32) ||          \
    !defined(CUPROPE_MIN_BLOCKS_PH_BWD) || !defined(CUPROPE_THREADS) ||                \
    !defined(CUPROPE_WARPS16) || !defined(CUPROPE_WARPS32)
#error "the CUPROPE_* kernel constants are defined by cuprope/_core/loader.py (compile_options)"
#endif

// The tuning values a kernel cannot work with (CUPROPE_KERNEL_DEFINES can set any).
#if CUPROPE_THREADS % 32 != 0 || CUPROPE_THREADS < 32 || CUPROPE_THREADS > 1024
#error "CUPROPE_THREADS: whole warps, 32 to 1024 threads"
#endif
#if CUPROPE_WARPS16 < 1 || CUPROPE_WARPS32 < 1 || 32 * CUPROPE_WARPS16 > CUPROPE_THREADS || \
    32 * CUPROPE_WARPS32 > CUPROPE_THREADS
#error "CUPROPE_WARPS16/32: 1 to CUPROPE_THREADS / 32 warps per block"
#endif
#if CUPROPE_MIN_BLOCKS < 1 || CUPROPE_MIN_BLOCKS_PH16 < 1 || CUPROPE_MIN_BLOCKS_PH32 < 1 || \
    CUPROPE_MIN_BLOCKS_PH_BWD < 1
#error "CUPROPE_*MIN_BLOCKS*: at least one block per SM"
#endif

namespace cuprope {

// Angle sources (rope_kernel's SRC).
// kSrcShared:  inv_freq [R/2]: cos/sin once per (token, pair)
// kSrcPerHead: inv_freq [H, R/2]: cos/sin per (token, head, pair)
// kSrcTable:   cos, sin read from [B, S, R] tables in T (HF's tensors)
constexpr int kSrcShared = CUPROPE_SRC_SHARED;
constexpr int kSrcPerHead = CUPROPE_SRC_PER_HEAD;
constexpr int kSrcTable = CUPROPE_SRC_TABLE;

// The most threads per block of rope_kernel, lrpe_seq_stats_kernel aside,
// and of the KV-cache kernels (their __launch_bounds__).
constexpr int kThreads = CUPROPE_THREADS;

}  // namespace cuprope
