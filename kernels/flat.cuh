// Flat entry points: each rope_kernel instantiation with one 8-byte
// parameter per RopeArgs word instead of the struct, for launchers that pass
// flat pointer/scalar parameters (jaxlib's GPU kernel call; cuprope/jax.py).
// The pointers come first, inputs before outputs, which is the order in which
// XLA hands a custom call its buffers; then every other word in struct order,
// named w<slot> (its index in the struct as int64 words; the float64 fields
// arrive as their bit patterns). cuprope/_core/args.py FLAT_POINTERS and
// FLAT_WORDS list the same order, and a test compares the two.
#pragma once

#include "rope.cuh"

namespace cuprope {

static_assert(sizeof(RopeArgs) == 45 * sizeof(long long), "RopeArgs: 45 words of 8 bytes");

template <typename T, bool INTERLEAVED, int VEC, int SRC, int ACT = kActNone, bool BWD = false>
__global__ void __launch_bounds__(kThreads, rope_min_blocks<T, SRC, ACT, BWD>())
    rope_flat_kernel(long long in0, long long in1, long long pos, long long seq_off,
        long long inv_freq, long long stream_map, long long aux, long long out0, long long out1,
        long long stats, long long w4, long long w5, long long w6, long long w7, long long w8,
        long long w9, long long w10, long long w11, long long w12, long long w13, long long w14,
        long long w15, long long w16, long long w17, long long w18, long long w19, long long w20,
        long long w21, long long w22, long long w24, long long w25, long long w26, long long w27,
        long long w29, long long w30, long long w32, long long w34, long long w35, long long w36,
        long long w37, long long w39, long long w40, long long w41, long long w43,
        long long w44) {
  const long long words[45] = {in0, in1, out0, out1, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13,
                               w14, w15, w16, w17, w18, w19, w20, w21, w22, pos, w24, w25, w26,
                               w27, seq_off, w29, w30, inv_freq, w32, stream_map, w34, w35, w36,
                               w37, aux, w39, w40, w41, stats, w43, w44};
  // The struct in shared memory, not registers: the body reads its fields
  // where it needs them (as it reads the by-value struct from the constant
  // bank), so they hold no registers (a register copy spilled under the cap).
  __shared__ RopeArgs a;
  if (threadIdx.x == 0) memcpy(&a, words, sizeof(a));
  __syncthreads();
  rope_body<T, INTERLEAVED, VEC, SRC, ACT, BWD>(a);
}

}  // namespace cuprope
