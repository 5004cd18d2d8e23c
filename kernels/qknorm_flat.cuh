// Flat entry points of the QK-norm kernels (kernels/qknorm.cuh) for launchers
// that pass flat pointer/scalar parameters (jaxlib's GPU kernel call;
// cuprope/qknorm/jax.py), as kernels/flat.cuh does for rope_kernel: one
// 8-byte parameter per QkNormArgs word, the parameter list and the struct's
// words generated from its field list (cuprope/qknorm/kernels.py QKNORM_ARGS) as
// CUPROPE_FLAT_QKNORM_PARAMS / _WORDS. VEC 0 is qknorm_kernel's body, VEC > 0
// qknorm_rows_kernel's (the fast path at that pack width; MODEL as there).
// The bodies' dynamic shared memory starts after the struct (both launchers
// budget for it).
#pragma once

#include "flat.cuh"
#include "qknorm.cuh"

namespace cuprope {

// The fast path keeps qknorm_rows_kernel's bound; the general body is left
// uncapped (~100 registers, no spills: held to 64 registers it would spill up
// to 168 bytes, where the by-value kernel reads its fields as constant operands).
template <int VEC, bool BWD>
__host__ __device__ constexpr int qknorm_flat_min_blocks() {
  return VEC ? qknorm_rows_min_blocks<BWD>() : 1;
}

#ifdef CUPROPE_FLAT_QKNORM_PARAMS
template <typename T, bool INTERLEAVED, int VEC, bool BWD, bool MODEL = false>
__global__ void __launch_bounds__(kQkThreads, qknorm_flat_min_blocks<VEC, BWD>())
    qknorm_flat_kernel(CUPROPE_FLAT_QKNORM_PARAMS) {
  const long long words[] = {CUPROPE_FLAT_QKNORM_WORDS};
  __shared__ QkNormArgs a;
  flat_rebuild(a, words);
  if constexpr (VEC == 0) {
    qknorm_body<T, INTERLEAVED, BWD>(a);
  } else {
    qknorm_rows_body<T, INTERLEAVED, VEC, BWD, WholeGrid, QkOutSink, MODEL>(a);
  }
}
#endif

}  // namespace cuprope
