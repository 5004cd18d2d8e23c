// DeepSeek MLA's decode/prefill prologue (cuprope/mla): rotate each query
// head's rope slice q_pe (in place or into q_pe_out, optionally e4m3), copy
// the absorbed q_nope into q_nope_out (same dtype rule), rotate the token's
// shared k_pe and write [ckv | rotated k_pe] into a paged latent cache (in
// the element type or e4m3), in one launch. The rotation is the core's: the
// same cos/sin (pair_cos_sin, exact angles) and the same arithmetic
// (rotate_chunk), so rotated values equal rope_kernel's bit for bit; the
// stores are the KV-cache dialect's (store_as, inv_scale) and so is the
// cache addressing (CacheRow: slot mapping or paged indices, out of range
// and padding skipped).
//
// Arguments: RopeArgs (tensor 0: q_pe [T, H, R] and its output, tensor 1:
// k_pe [T, R]; positions; the frequency table; n_seq = T, heads[0] = H),
// KvArgs (v_ptr: ckv [T, Dc] with token stride v_ss; k_cache: where k_pe's
// cache row starts, v_cache: where ckv's does, with page / row strides;
// the addressing; q_scale, k_scale (the one cache scale)) and MlaArgs.
//
// Work: one warp per (token, group of rows); the rows of a token are its H
// query heads, then the latent row (k_pe and ckv). The warp's cos/sin of the
// token's R/2 pairs are computed once into its shared-memory slice (lane j
// computes pair j, j + 32, ...) and read by every row. A row's items are its
// rotated chunks (ChunkGeometry: VEC pairs in two packs) and then its
// pass-through packs (q_nope, or ckv), spread over the lanes.
#pragma once

#include "kvcache.cuh"

namespace cuprope {

// The pass-through packs of one row: pack n of src (element offset so) stored
// to dst (element offset do), as T or e4m3 times inv.
template <typename T, bool FP8, int VEC>
__device__ __forceinline__ void mla_copy_pack(long long src, long long so, long long dst,
                                              long long d0, int n, float inv) {
  const Pack<T, VEC> x = load_pack<T, VEC>(src, so + static_cast<long long>(n) * VEC);
  store_as<T, FP8, VEC>(dst, d0 + static_cast<long long>(n) * VEC, x, inv);
}

// Rotated chunk c (ChunkGeometry: VEC pairs in two packs) of the row at src
// (element offset so), cos/sin from the warp's slice cs (pair j at cs[j]),
// stored to dst (element offset d0) as T or e4m3 times inv.
template <typename T, bool INTERLEAVED, int VEC, bool FP8>
__device__ __forceinline__ void mla_rotate_chunk(long long src, long long so, long long dst,
                                                 long long d0, int c, const float2* my_cs,
                                                 int npairs, float inv) {
  const int rot_chunks = npairs / VEC, cw = 0;
  int e0 = 0, e1 = 0;
  bool rot = false, two = false;
  ChunkGeometry<INTERLEAVED, VEC>{rot, c, rot_chunks, two, cw, e0, e1, npairs, rot_chunks}();
  const ChunkPairs<INTERLEAVED, VEC> pair_at{e0, e1};
  float2 cs[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) cs[v] = my_cs[pair_at(v)];
  Pack<T, VEC> x0 = load_pack<T, VEC>(src, so + e0);
  Pack<T, VEC> x1 = load_pack<T, VEC>(src, so + e1);
  rotate_chunk<T, INTERLEAVED, VEC>(x0, x1, cs, cs + VEC / 2, 1);
  store_as<T, FP8, VEC>(dst, d0 + e0, x0, inv);
  store_as<T, FP8, VEC>(dst, d0 + e1, x1, inv);
}

template <typename T, bool INTERLEAVED, int VEC, int FP8>
__global__ void __launch_bounds__(kThreads)
    mla_rope_kernel(const RopeArgs a, const KvArgs kv, const MlaArgs m) {
  constexpr bool Q8 = (FP8 & kKvFp8Q) != 0;
  constexpr bool C8 = (FP8 & kKvFp8Cache) != 0;
  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = npairs / VEC;
  const int hq = static_cast<int>(a.heads[0]);
  const unsigned groups = static_cast<unsigned>(a.head_groups);
  const unsigned unit = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (unit >= static_cast<unsigned>(a.n_seq) * groups) return;  // whole warps
  const unsigned t = unit / groups;
  const int per = static_cast<int>(a.heads_per_group);
  const int h0 = static_cast<int>(unit - t * groups) * per;
  const int h1 = min(hq + 1, h0 + per);
  const int lane = threadIdx.x & 31;
  const bool has_kv = h1 > hq;  // the warp holds the latent row (warp-uniform)
  CacheRow crow;
  if (has_kv) crow.begin(kv, t);
  const long long pos = token_position(a, 0, t, 0);
  extern __shared__ float2 warp_cs[];
  float2* const my_cs = warp_cs + (threadIdx.x >> 5) * npairs;
  const double f0 = lane < npairs ? inv_freq_at(a, 0, lane) : 0.0;
  if (has_kv) crow.advance(kv);
  for (int j = lane; j < npairs; j += 32) {
    my_cs[j] = scaled_cos_sin(a, pos, j == lane ? f0 : inv_freq_at(a, 0, j));
  }
  __syncwarp();
  long long page = 0, prow = 0;
  const bool cached = has_kv && crow.finish(kv, page, prow);
  const float q_inv = inv_scale<Q8>(kv.q_scale, 0);
  const float c_inv = inv_scale<C8>(kv.k_scale, 0);
  const int nope_packs = m.qn_ptr ? static_cast<int>(m.nope_dim) / VEC : 0;
  const int ckv_packs = static_cast<int>(m.ckv_dim) / VEC;
  for (int h = h0; h < min(h1, hq); ++h) {  // the query heads
    const long long qi = t * a.in_ss[0] + h * a.in_sh[0];
    const long long qo = t * a.out_ss[0] + h * a.out_sh[0];
    for (int c = lane; c < rot_chunks; c += 32) {
      mla_rotate_chunk<T, INTERLEAVED, VEC, Q8>(a.in_ptr[0], qi, a.out_ptr[0], qo, c, my_cs,
                                                 npairs, q_inv);
    }
    for (int n = lane; n < nope_packs; n += 32) {
      mla_copy_pack<T, Q8, VEC>(m.qn_ptr, t * m.qn_st + h * m.qn_sh, m.qno_ptr,
                                t * m.qno_st + h * m.qno_sh, n, q_inv);
    }
  }
  if (!cached) return;  // the latent row (the token's last): k_pe and ckv into the cache
  const long long kc0 = page * kv.kc_sp + prow * kv.kc_sr;
  for (int c = lane; c < rot_chunks; c += 32) {
    mla_rotate_chunk<T, INTERLEAVED, VEC, C8>(a.in_ptr[1], t * a.in_ss[1], kv.k_cache, kc0, c,
                                               my_cs, npairs, c_inv);
  }
  const long long vc0 = page * kv.vc_sp + prow * kv.vc_sr;
  for (int n = lane; n < ckv_packs; n += 32) {
    mla_copy_pack<T, C8, VEC>(kv.v_ptr, t * kv.v_ss, kv.v_cache, vc0, n, c_inv);
  }
}

}  // namespace cuprope
