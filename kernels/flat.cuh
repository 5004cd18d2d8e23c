// Flat entry points: each rope_kernel instantiation with one 8-byte parameter
// per RopeArgs word instead of the struct, for launchers that pass flat
// pointer/scalar parameters (jaxlib's GPU kernel call; cuprope/_core/xla.py).
//
// The parameter list and the order in which the words rebuild the struct are
// not written here: cuprope/_core/args.py generates them from the struct's
// field list (ArgStruct.flat_source) and passes them as -D options when a flat
// entry is compiled (cuprope/_core/ptx.py): <PREFIX>_PARAMS, the pointers
// first, inputs before outputs (the order in which XLA hands a custom call its
// buffers), then every other word named w<slot>; <PREFIX>_WORDS, every word
// in slot order. Without them (the by-value module) only the helper is defined.
#pragma once

#include "rope.cuh"

namespace cuprope {

// The one struct rebuild of every flat entry: thread 0 copies the words into
// the struct in shared memory, one barrier. Shared, not registers: the bodies
// read the fields where they need them (as the by-value kernels read theirs
// from the constant bank), so the fields hold no registers.
template <typename S, int N>
__device__ __forceinline__ void flat_rebuild(S& a, const long long (&words)[N]) {
  static_assert(sizeof(S) == N * sizeof(long long), "a flat entry passes every word of the struct");
  if (threadIdx.x == 0) memcpy(&a, words, sizeof(S));
  __syncthreads();
}

#ifdef CUPROPE_FLAT_ROPE_PARAMS
template <typename T, bool INTERLEAVED, int VEC, int SRC, int ACT = kActNone, bool BWD = false>
__global__ void __launch_bounds__(kThreads, rope_min_blocks<T, SRC, ACT, BWD>())
    rope_flat_kernel(CUPROPE_FLAT_ROPE_PARAMS) {
  const long long words[] = {CUPROPE_FLAT_ROPE_WORDS};
  __shared__ RopeArgs a;
  flat_rebuild(a, words);
  rope_body<T, INTERLEAVED, VEC, SRC, ACT, BWD>(a);
}
#endif

}  // namespace cuprope
