// The decode prologue in one launch (cuprope/prologue/): the QK-norm of q and
// k with their rotation (kernels/qknorm.cuh), q stored to its output (the
// tensor's dtype or fp8 e4m3), the normed and rotated k and the raw v
// written into the KV cache rows their tokens' addressing names
// (kernels/kvcache.cuh: CacheRow, store_as, inv_scale).
//
// The grid has two parts. Blocks [0, norm_blocks) run the QK-norm body that
// cuprope.qknorm would launch for these q and k (VEC > 0: the head-rows fast
// path at that pack width; VEC 0: the general body), the same arithmetic,
// with a sink (PrologueSink) in place of its output stores: every value is
// rounded to T as QK-norm's output is, then stored as T or as e4m3 of
// x * (1 / scale) exactly as kv_rope_kernel stores a row, so the results are
// the bits of rope_qk_norm_forward followed by rope_append_kv, up to the sign
// of zero (that call's angle-0 rotation adds x2 * 0 to x1: a -0 may come out
// +0 there; here it is stored as it is). Blocks [norm_blocks, grid) copy v
// into the cache, one warp per token at a time.
#pragma once

#include "kvcache.cuh"
#include "qknorm.cuh"

namespace cuprope {

// Blocks of kQkThreads threads that must fit an SM at once (the prologue's
// __launch_bounds__).
#if !defined(CUPROPE_PROLOGUE_MIN_BLOCKS) || CUPROPE_PROLOGUE_MIN_BLOCKS < 1
#error "CUPROPE_PROLOGUE_MIN_BLOCKS (>= 1) is defined by cuprope/_core/loader.py (compile_options)"
#endif
constexpr int kPrologueMinBlocks = CUPROPE_PROLOGUE_MIN_BLOCKS;

// The prologue's own words (host mirror PROLOGUE_ARGS in cuprope/prologue/launch.py).
struct PrologueArgs {
  long long norm_blocks;  // blocks [0, norm_blocks) norm q and k; the others copy v
  long long packs;        // whole packs may be stored: bit 0 q_out, bit 1 the k cache,
                          // bit 2 v and the v cache (else element by element)
};

// VEC values rounded to T, stored as T or (FP8) as e4m3 of x * inv: in one
// pack, or element by element (the same bytes) where the target is not
// aligned for one.
template <typename T, bool FP8, int VEC>
__device__ __forceinline__ void store_rounded(long long ptr, long long off, const float (&x)[VEC],
                                              float inv, bool whole) {
  Pack<T, VEC> p;
  pack_f32<T, VEC>(x, p);
  if (whole) {
    store_as<T, FP8, VEC>(ptr, off, p, inv);
    return;
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    Pack<T, 1> e;
    e.v[0] = p.v[i];
    store_as<T, FP8, 1>(ptr, off + i, e, inv);
  }
}

// The element offset of token tok's row (head 0) in a cache of page and row
// strides sp, sr, or -1 where the token is not written (CacheRow).
__device__ __forceinline__ long long cache_row_offset(const KvArgs& kv, long long tok,
                                                      long long sp, long long sr) {
  CacheRow cr;
  cr.begin(kv, tok);
  cr.advance(kv);
  long long page = 0, prow = 0;
  if (!cr.finish(kv, page, prow)) return -1;
  return page * sp + prow * sr;
}

// The QK-norm bodies' sink: q (tensor 0) to out_ptr[0] (q_out, T or e4m3
// with q_inv), k (tensor 1) to its cache row (T or e4m3 with the head's
// scale); nothing for a k whose token is not written.
template <int FP8>
struct PrologueSink {
  static constexpr bool Q8 = (FP8 & kKvFp8Q) != 0;
  static constexpr bool C8 = (FP8 & kKvFp8Cache) != 0;
  const KvArgs& kv;
  const PrologueArgs& p;
  float q_inv;

  // programmatic dependent launch: what the body loaded so far (weights, the
  // q scale) no earlier kernel writes; q and k come next
  __device__ __forceinline__ void ready() const {
    wait_prior_grids();
    let_dependents_launch();
  }

  // (target pointer, element offset of head hh's row, inverse scale); false: not written
  __device__ __forceinline__ bool k_target(const QkNormArgs& a, unsigned b, unsigned s, int hh,
                                           long long& off, float& inv) const {
    if (!kv.k_cache) return false;
    const long long row = cache_row_offset(kv, static_cast<long long>(b) * a.r.n_seq + s,
                                           kv.kc_sp, kv.kc_sr);
    if (row < 0) return false;
    off = row + hh * kv.kc_sh;
    inv = inv_scale<C8>(kv.k_scale, hh * kv.kv_scale_sh);
    return true;
  }

  template <typename T>
  __device__ __forceinline__ void item(const QkNormArgs& a, const QkToken& tk, const QkUnit& u,
                                       int h, const QkItem& it, const float (&v)[2]) const {
    if (u.t == 0) {
      const long long off = u.out_off + h * a.r.out_sh[0];
      for (int m = 0; m < it.n; ++m)
        store_rounded<T, Q8, 1>(a.r.out_ptr[0], off + it.e[m], {v[m]}, q_inv, true);
      return;
    }
    long long off;
    float inv;
    if (!k_target(a, tk.b, tk.s, h, off, inv)) return;
    for (int m = 0; m < it.n; ++m)
      store_rounded<T, C8, 1>(kv.k_cache, off + it.e[m], {v[m]}, inv, true);
  }

  template <typename T, int VEC>
  __device__ __forceinline__ void vals(const QkNormArgs& a, int t, unsigned b, unsigned s, int hh,
                                       long long out_off, int e0, int e1,
                                       const float (&x)[2][VEC]) const {
    if (t == 0) {
      const bool whole = (p.packs & 1) != 0;
      store_rounded<T, Q8, VEC>(a.r.out_ptr[0], out_off + e0, x[0], q_inv, whole);
      store_rounded<T, Q8, VEC>(a.r.out_ptr[0], out_off + e1, x[1], q_inv, whole);
      return;
    }
    long long off;
    float inv;
    if (!k_target(a, b, s, hh, off, inv)) return;
    const bool whole = (p.packs & 2) != 0;
    store_rounded<T, C8, VEC>(kv.k_cache, off + e0, x[0], inv, whole);
    store_rounded<T, C8, VEC>(kv.k_cache, off + e1, x[1], inv, whole);
  }
};

// v of one token (heads [0, hk), D each) into its cache row at element
// offset row, W elements per lane step.
template <typename T, bool C8, int W>
__device__ __forceinline__ void copy_v_row(const KvArgs& kv, long long src, long long row, int hk,
                                           int d, int lane) {
  const int per_head = d / W;
  for (int i = lane; i < hk * per_head; i += 32) {
    const int h = i / per_head;
    const int e = (i - h * per_head) * W;
    const Pack<T, W> x = load_pack<T, W>(kv.v_ptr, src + h * kv.v_sh + e);
    store_as<T, C8, W>(kv.v_cache, row + h * kv.vc_sh + e, x,
                       inv_scale<C8>(kv.v_scale, h * kv.kv_scale_sh));
  }
}

// The v part of the grid: block ``block`` of ``n_blocks``; warp w takes
// tokens w, w + W, ... (W warps in the part).
template <typename T, bool C8>
__device__ __forceinline__ void prologue_v_body(const RopeArgs& r, const KvArgs& kv,
                                                const PrologueArgs& p, unsigned block,
                                                unsigned n_blocks) {
  constexpr int kW = 16 / static_cast<int>(sizeof(T));
  if (!kv.v_cache || !kv.v_ptr) return;
  const int lane = threadIdx.x & 31;
  const long long warp = static_cast<long long>(block) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long n_warps = static_cast<long long>(n_blocks) * (blockDim.x >> 5);
  const long long tokens = r.n_batch * r.n_seq;
  const int hk = static_cast<int>(r.heads[1]), d = static_cast<int>(r.head_dim);
  for (long long tok = warp; tok < tokens; tok += n_warps) {
    const long long row = cache_row_offset(kv, tok, kv.vc_sp, kv.vc_sr);
    if (row < 0) continue;  // (warp-uniform)
    const long long b = tok / r.n_seq, s = tok - b * r.n_seq;
    const long long src = b * kv.v_sb + s * kv.v_ss;
    if (p.packs & 4) {
      copy_v_row<T, C8, kW>(kv, src, row, hk, d, lane);
    } else {
      copy_v_row<T, C8, 1>(kv, src, row, hk, d, lane);
    }
  }
}

// Blocks of the QK-norm kernels' size (kQkThreads: the host launches the
// prologue with the QK-norm geometry's threads).
template <typename T, bool INTERLEAVED, int VEC, int FP8>
__global__ void __launch_bounds__(kQkThreads, kPrologueMinBlocks)
    prologue_kernel(const QkNormArgs a, const KvArgs kv, const PrologueArgs p) {
  const unsigned nb = static_cast<unsigned>(p.norm_blocks);
  if (blockIdx.x >= nb) {  // (block-uniform: the norm bodies' __syncthreads stay whole)
    wait_prior_grids();
    let_dependents_launch();
    prologue_v_body<T, (FP8 & kKvFp8Cache) != 0>(a.r, kv, p, blockIdx.x - nb, gridDim.x - nb);
    return;
  }
  const PrologueSink<FP8> sink{kv, p, inv_scale<(FP8 & kKvFp8Q) != 0>(kv.q_scale, 0)};
  if constexpr (VEC > 0) {
    qknorm_rows_body<T, INTERLEAVED, VEC, false>(a, GridPart{nb}, sink);
  } else {
    qknorm_body<T, INTERLEAVED, false>(a, GridPart{nb}, sink);
  }
}

}  // namespace cuprope
