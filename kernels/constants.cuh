// The compile-time constants the kernels share with the host. Every value is
// defined in cuprope/_core/loader.py (CODES, TUNING_DEFAULTS) and arrives as a
// -D option, so the host's copies are the same values by construction: no
// default lives here, and a compile without them stops at the #error.
#pragma once

#if !defined(CUPROPE_SRC_SHARED) || !defined(CUPROPE_SRC_PER_HEAD) ||                  \
    !defined(CUPROPE_SRC_TABLE) || !defined(CUPROPE_SEQ_SLICES) ||                    \
    !defined(CUPROPE_ACT_NONE) || !defined(CUPROPE_ACT_RELU) ||                       \
    !defined(CUPROPE_ACT_SIGMOID) || !defined(CUPROPE_ACT_SILU) ||                    \
    !defined(CUPROPE_ACT_SOFTMAX) || !defined(CUPROPE_ACT_SOFTMAX_SEQ) ||             \
    !defined(CUPROPE_ROWS16) || !defined(CUPROPE_ROWS32) || !defined(CUPROPE_RUN16) || \
    !defined(CUPROPE_RUN32) || !defined(CUPROPE_RUN_STAGES16) ||                      \
    !defined(CUPROPE_RUN_STAGES32) || !defined(CUPROPE_STAGES16) ||                   \
    !defined(CUPROPE_STAGES32) || !defined(CUPROPE_MIN_BLOCKS) ||                     \
    !defined(CUPROPE_MIN_BLOCKS_PH16) || !defined(CUPROPE_MIN_BLOCKS_PH32) ||         \
    !defined(CUPROPE_MIN_BLOCKS_PH_BWD)
#error "the CUPROPE_* kernel constants are defined by cuprope/_core/loader.py (compile_options)"
#endif

namespace cuprope {

// Angle sources (rope_kernel's SRC).
// kSrcShared:  inv_freq [R/2]: cos/sin once per (token, pair)
// kSrcPerHead: inv_freq [H, R/2]: cos/sin per (token, head, pair)
// kSrcTable:   cos, sin read from [B, S, R] tables in T (HF's tensors)
constexpr int kSrcShared = CUPROPE_SRC_SHARED;
constexpr int kSrcPerHead = CUPROPE_SRC_PER_HEAD;
constexpr int kSrcTable = CUPROPE_SRC_TABLE;

// LRPE activations before the rotation (rope_kernel's ACT).
constexpr int kActNone = CUPROPE_ACT_NONE;
constexpr int kActRelu = CUPROPE_ACT_RELU;
constexpr int kActSigmoid = CUPROPE_ACT_SIGMOID;
constexpr int kActSilu = CUPROPE_ACT_SILU;
constexpr int kActSoftmax = CUPROPE_ACT_SOFTMAX;  // over the head dim: a row reduction in the warp
constexpr int kActSoftmaxSeq = CUPROPE_ACT_SOFTMAX_SEQ;  // over the sequence: lrpe_seq_stats_kernel

// Sequence slices of lrpe_seq_stats_kernel: its block is (32, kSeqSlices).
constexpr int kSeqSlices = CUPROPE_SEQ_SLICES;

// DeepSeek MLA (kernels/mla.cuh): the items a lane loads before it stores.
#if !defined(CUPROPE_MLA_UNROLL)
#error "CUPROPE_MLA_UNROLL is defined by cuprope/_core/loader.py (compile_options)"
#endif
constexpr int kMlaUnroll = CUPROPE_MLA_UNROLL;

}  // namespace cuprope
