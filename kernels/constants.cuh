// The compile-time constants the kernels share with the host. Every value is
// declared by an op's kernel record (its codes and tuning) and arrives as a
// -D option (cuprope/_core/loader.py), so the host's copies are the same
// values by construction: no default lives here, and a compile without them
// stops at the #error.
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
    !defined(CUPROPE_MIN_BLOCKS_PH_BWD) || !defined(CUPROPE_THREADS) ||               \
    !defined(CUPROPE_WARPS16) || !defined(CUPROPE_WARPS32) ||                         \
    !defined(CUPROPE_QKNORM_WARPS) || !defined(CUPROPE_QKNORM_MIN_BLOCKS) ||          \
    !defined(CUPROPE_QKNORM_MIN_BLOCKS_BWD) || !defined(CUPROPE_QKNORM_DW_PAD) ||         \
    !defined(CUPROPE_QKNORM_STAGES) || !defined(CUPROPE_QKNORM_STAGES_BWD)
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
#if CUPROPE_QKNORM_WARPS < 1 || CUPROPE_QKNORM_WARPS > 32
#error "CUPROPE_QKNORM_WARPS: 1 to 32 warps per block"
#endif
#if CUPROPE_MIN_BLOCKS < 1 || CUPROPE_MIN_BLOCKS_PH16 < 1 || CUPROPE_MIN_BLOCKS_PH32 < 1 || \
    CUPROPE_MIN_BLOCKS_PH_BWD < 1 || CUPROPE_QKNORM_MIN_BLOCKS < 1 ||                      \
    CUPROPE_QKNORM_MIN_BLOCKS_BWD < 1
#error "CUPROPE_*MIN_BLOCKS*: at least one block per SM"
#endif
#if CUPROPE_QKNORM_STAGES < 2 || CUPROPE_QKNORM_STAGES > 8 || CUPROPE_QKNORM_STAGES_BWD == 1 || \
    CUPROPE_QKNORM_STAGES_BWD < 0 || CUPROPE_QKNORM_STAGES_BWD > 8
#error "CUPROPE_QKNORM_STAGES(_BWD): a ring of 2 to 8 units per warp (backward: 0, registers)"
#endif
#if CUPROPE_QKNORM_DW_PAD < 0 || CUPROPE_QKNORM_DW_PAD % 4 != 0
#error "CUPROPE_QKNORM_DW_PAD: whole float4s (the dw rows are read and written as float4)"
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

// The most threads per block of rope_kernel, lrpe_seq_stats_kernel aside,
// and of the KV-cache kernels (their __launch_bounds__).
constexpr int kThreads = CUPROPE_THREADS;

// QK-norm (qknorm.cuh): warps per block of every QK-norm kernel, so threads
// per block (their __launch_bounds__), and the floats of padding after each
// head row of the fast backward's dw terms in shared memory (kDwPad's note).
constexpr int kQkWarps = CUPROPE_QKNORM_WARPS;
constexpr int kQkThreads = 32 * kQkWarps;
constexpr int kDwPad = CUPROPE_QKNORM_DW_PAD;
constexpr int kQkStages = CUPROPE_QKNORM_STAGES;  // qknorm_ring_stages
constexpr int kQkStagesBwd = CUPROPE_QKNORM_STAGES_BWD;

// The KV-cache append (kernels/kvcache.cuh): blocks of kThreads threads that
// must fit an SM at once (kv_rope_kernel's __launch_bounds__; 0: none
// stated), and the same for its WIDE instantiations (many-wave grids).
#if !defined(CUPROPE_KV_MIN_BLOCKS) || CUPROPE_KV_MIN_BLOCKS < 0 || \
    !defined(CUPROPE_KV_WIDE_MIN_BLOCKS) || CUPROPE_KV_WIDE_MIN_BLOCKS < 0
#error "CUPROPE_KV_(WIDE_)MIN_BLOCKS (>= 0) are defined by cuprope/_core/loader.py (compile_options)"
#endif
constexpr int kKvMinBlocks = CUPROPE_KV_MIN_BLOCKS;
constexpr int kKvWideMinBlocks = CUPROPE_KV_WIDE_MIN_BLOCKS;

// DeepSeek MLA (kernels/mla.cuh): the pass-through packs and the rotated
// chunks a lane loads before it stores.
#if !defined(CUPROPE_MLA_UNROLL) || !defined(CUPROPE_MLA_ROT_UNROLL)
#error "CUPROPE_MLA_UNROLL / _ROT_UNROLL are defined by cuprope/_core/loader.py (compile_options)"
#endif
constexpr int kMlaUnroll = CUPROPE_MLA_UNROLL;
constexpr int kMlaRotUnroll = CUPROPE_MLA_ROT_UNROLL;
// ... and the blocks of kThreads threads that must fit an SM at once.
#if !defined(CUPROPE_MLA_MIN_BLOCKS) || CUPROPE_MLA_MIN_BLOCKS < 1
#error "CUPROPE_MLA_MIN_BLOCKS (>= 1) is defined by cuprope/_core/loader.py (compile_options)"
#endif
constexpr int kMlaMinBlocks = CUPROPE_MLA_MIN_BLOCKS;

// The decode prologue (kernels/prologue.cuh): blocks of kQkThreads threads that
// must fit an SM at once (its __launch_bounds__).
#if !defined(CUPROPE_PROLOGUE_MIN_BLOCKS) || CUPROPE_PROLOGUE_MIN_BLOCKS < 1
#error "CUPROPE_PROLOGUE_MIN_BLOCKS (>= 1) is defined by cuprope/_core/loader.py (compile_options)"
#endif
constexpr int kPrologueMinBlocks = CUPROPE_PROLOGUE_MIN_BLOCKS;

}  // namespace cuprope
