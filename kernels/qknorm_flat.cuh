// Flat entry points of the QK-norm kernels (kernels/qknorm.cuh) for launchers
// that pass flat pointer/scalar parameters (jaxlib's GPU kernel call;
// cuprope/jax_qknorm.py), as kernels/flat.cuh does for rope_kernel: one
// 8-byte parameter per QkNormArgs word. The pointers come first, the inputs
// (in_ptr: x forward, dy backward; the saved x; positions or cos; seq_offsets
// or sin; the weights; inv_freq; the stream map) before the outputs (out_ptr,
// then the backward's partial rows of the weight gradient), which is the order
// in which XLA hands a custom call its buffers; then every other word in
// struct order, named w<slot> (its index in the struct as int64 words; the
// float64 fields arrive as their bit patterns, aux_ptr and stats_ptr as 0).
// cuprope/_core/qknorm_launch.py FLAT_POINTERS and FLAT_WORDS list the same
// order, and a test compares the two. VEC 0 is qknorm_kernel's body, VEC > 0
// qknorm_rows_kernel's (the fast path at that pack width).
#pragma once

#include "qknorm.cuh"

namespace cuprope {

static_assert(sizeof(QkNormArgs) == 67 * sizeof(long long), "QkNormArgs: 67 words of 8 bytes");

// The fast path keeps qknorm_rows_kernel's bound; the general body is left
// uncapped (~100 registers, no spills: held to 64 registers it would spill up
// to 168 bytes, where the by-value kernel reads its fields as constant operands).
template <int VEC, bool BWD>
__host__ __device__ constexpr int qknorm_flat_min_blocks() {
  return VEC ? qknorm_rows_min_blocks<BWD>() : 1;
}

template <typename T, bool INTERLEAVED, int VEC, bool BWD>
__global__ void __launch_bounds__(256, qknorm_flat_min_blocks<VEC, BWD>())
    qknorm_flat_kernel(
        long long in0, long long in1, long long x0, long long x1, long long pos,
        long long seq_off, long long weight0, long long weight1, long long inv_freq,
        long long stream_map, long long out0, long long out1, long long part, long long w4,
        long long w5, long long w6, long long w7, long long w8, long long w9, long long w10,
        long long w11, long long w12, long long w13, long long w14, long long w15, long long w16,
        long long w17, long long w18, long long w19, long long w20, long long w21, long long w22,
        long long w24, long long w25, long long w26, long long w27, long long w29, long long w30,
        long long w32, long long w34, long long w35, long long w36, long long w37, long long w38,
        long long w39, long long w40, long long w41, long long w42, long long w43, long long w44,
        long long w47, long long w48, long long w49, long long w50, long long w51, long long w52,
        long long w55, long long w56, long long w57, long long w58, long long w60, long long w61,
        long long w62, long long w63, long long w64, long long w65, long long w66) {
  const long long words[67] = {
      in0, in1, out0, out1, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18,
      w19, w20, w21, w22, pos, w24, w25, w26, w27, seq_off, w29, w30, inv_freq, w32, stream_map,
      w34, w35, w36, w37, w38, w39, w40, w41, w42, w43, w44, x0, x1, w47, w48, w49, w50, w51, w52,
      weight0, weight1, w55, w56, w57, w58, part, w60, w61, w62, w63, w64, w65, w66};
  // The struct in shared memory (thread 0 writes it, one barrier), as in
  // kernels/flat.cuh: the bodies read its fields where they need them. The
  // bodies' dynamic shared memory starts after it.
  __shared__ QkNormArgs a;
  if (threadIdx.x == 0) memcpy(&a, words, sizeof(a));
  __syncthreads();
  if constexpr (VEC == 0) {
    qknorm_body<T, INTERLEAVED, BWD>(a);
  } else {
    qknorm_rows_body<T, INTERLEAVED, VEC, BWD>(a);
  }
}

}  // namespace cuprope
