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
// computes pair j, j + 32, ...) and read by every row. The warp's rows are
// one list of items (per row: its rotated chunks, ChunkGeometry's VEC pairs
// in two packs, then its pass-through packs, q_nope or ckv); a lane takes
// items lane, lane + 32, ..., kMlaUnroll of them at a time, every load of
// a step issued before its first store, so each lane keeps kMlaUnroll
// 16-byte loads in flight.
#pragma once

#include "kvcache.cuh"

namespace cuprope {

// One item of a warp's list: a rotated chunk (c >= 0: ChunkGeometry's
// chunk c of the row at src + so, stored at dst + d0), a pass-through pack
// (c == -1: VEC elements at src + so to dst + d0), or nothing (c == -2).
// q: a query item (q_scale, Q8), else a cache item.
struct MlaItem {
  long long src = 0, so = 0, dst = 0, d0 = 0;
  int c = -2;
  bool q = false;
};

// Item i of the warp's list: its nq query rows' items (per row: the rotated
// chunks, then the q_nope packs), then, with the latent row, k_pe's chunks
// and the ckv packs.
template <int VEC>
__device__ __forceinline__ MlaItem mla_item(const RopeArgs& a, const KvArgs& kv, const MlaArgs& m,
                                            unsigned t, int h0, int i, int q_items, int q_total,
                                            int rot_chunks, long long kc0, long long vc0) {
  MlaItem it;
  int c;
  if (i < q_total) {
    const int r = i / q_items;
    const int h = h0 + r;
    c = i - r * q_items;
    it.q = true;
    if (c < rot_chunks) {
      it.src = a.in_ptr[0], it.so = t * a.in_ss[0] + h * a.in_sh[0];
      it.dst = a.out_ptr[0], it.d0 = t * a.out_ss[0] + h * a.out_sh[0];
    } else {
      const long long n = static_cast<long long>(c - rot_chunks) * VEC;
      it.src = m.qn_ptr, it.so = t * m.qn_st + h * m.qn_sh + n;
      it.dst = m.qno_ptr, it.d0 = t * m.qno_st + h * m.qno_sh + n;
    }
  } else {
    c = i - q_total;
    if (c < rot_chunks) {
      it.src = a.in_ptr[1], it.so = t * a.in_ss[1], it.dst = kv.k_cache, it.d0 = kc0;
    } else {
      const long long n = static_cast<long long>(c - rot_chunks) * VEC;
      it.src = kv.v_ptr, it.so = t * kv.v_ss + n, it.dst = kv.v_cache, it.d0 = vc0 + n;
    }
  }
  it.c = c < rot_chunks ? c : -1;
  return it;
}

// A chunk's two pack offsets (ChunkGeometry with no pass-through chunks).
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ void mla_chunk(int c, int npairs, int& e0, int& e1) {
  const int rot_chunks = npairs / VEC, cw = 0;
  bool rot = false, two = false;
  ChunkGeometry<INTERLEAVED, VEC>{rot, c, rot_chunks, two, cw, e0, e1, npairs, rot_chunks}();
}

// The warp's items, kMlaUnroll per lane at a time: every load of a step is
// issued before its first store (stores may alias loads for all the compiler
// knows), so a warp keeps kMlaUnroll 16-byte loads per lane in flight.
template <typename T, bool INTERLEAVED, int VEC, bool Q8, bool C8>
__device__ __forceinline__ void mla_flat_items(const RopeArgs& a, const KvArgs& kv,
                                               const MlaArgs& m, unsigned t, int h0, int nq,
                                               int total, long long kc0, long long vc0,
                                               const float2* my_cs, float q_inv, float c_inv) {
  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = npairs / VEC;
  const int q_items = rot_chunks + (m.qn_ptr ? static_cast<int>(m.nope_dim) / VEC : 0);
  const int q_total = nq * q_items;
  for (int base = threadIdx.x & 31; base < total; base += 32 * kMlaUnroll) {
    MlaItem it[kMlaUnroll];
    Pack<T, VEC> x0[kMlaUnroll], x1[kMlaUnroll];
    int e0[kMlaUnroll], e1[kMlaUnroll];
#pragma unroll
    for (int u = 0; u < kMlaUnroll; ++u) {
      const int i = base + 32 * u;
      if (i < total) {
        it[u] = mla_item<VEC>(a, kv, m, t, h0, i, q_items, q_total, rot_chunks, kc0, vc0);
      }
      e0[u] = 0, e1[u] = 0;
      if (it[u].c >= 0) mla_chunk<INTERLEAVED, VEC>(it[u].c, npairs, e0[u], e1[u]);
      if (it[u].c >= -1) x0[u] = load_pack<T, VEC>(it[u].src, it[u].so + e0[u]);
      if (it[u].c >= 0) x1[u] = load_pack<T, VEC>(it[u].src, it[u].so + e1[u]);
    }
#pragma unroll
    for (int u = 0; u < kMlaUnroll; ++u) {
      if (it[u].c < -1) continue;
      const bool rot = it[u].c >= 0;
      if (rot) {
        const ChunkPairs<INTERLEAVED, VEC> pair_at{e0[u], e1[u]};
        float2 cs[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) cs[v] = my_cs[pair_at(v)];
        rotate_chunk<T, INTERLEAVED, VEC>(x0[u], x1[u], cs, cs + VEC / 2, 1);
      }
      if (it[u].q) {
        store_as<T, Q8, VEC>(it[u].dst, it[u].d0 + e0[u], x0[u], q_inv);
        if (rot) store_as<T, Q8, VEC>(it[u].dst, it[u].d0 + e1[u], x1[u], q_inv);
      } else {
        store_as<T, C8, VEC>(it[u].dst, it[u].d0 + e0[u], x0[u], c_inv);
        if (rot) store_as<T, C8, VEC>(it[u].dst, it[u].d0 + e1[u], x1[u], c_inv);
      }
    }
  }
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
  const int nq = max(0, min(h1, hq) - h0);  // the warp's query rows
  const int total = nq * (rot_chunks + nope_packs) + (cached ? rot_chunks + ckv_packs : 0);
  mla_flat_items<T, INTERLEAVED, VEC, Q8, C8>(a, kv, m, t, h0, nq, total,
                                              page * kv.kc_sp + prow * kv.kc_sr,
                                              page * kv.vc_sp + prow * kv.vc_sr, my_cs, q_inv,
                                              c_inv);
}

}  // namespace cuprope
