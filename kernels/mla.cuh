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
// computes pair j, j + 32, ...), after its first loads are issued, and read
// by every row. The warp's rows are two lists of items: first the rows'
// rotated chunks (ChunkGeometry's VEC pairs in two packs; q rows, then k_pe),
// kMlaRotUnroll per lane at a time, then their pass-through packs (q_nope,
// then ckv), kMlaUnroll per lane at a time; a lane takes items lane,
// lane + 32, ..., every load of a step issued before its first store. The
// pass-through loop holds one pack per item, not a chunk's two and its
// cos/sin, so it keeps more loads in flight for its registers (the kernel is
// held to kMlaMinBlocks blocks per SM).
#pragma once

#include "kvcache.cuh"

namespace cuprope {

// The pass-through packs and the rotated chunks a lane loads before it stores.
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

// The kernel's third argument (host mirror MLA_ARGS in cuprope/mla/kernels.py):
// the absorbed q_nope and its output, and the widths.
struct MlaArgs {
  long long qn_ptr, qn_st, qn_sh;      // q_nope [T, H, Dn]: token, head strides (0: none)
  long long qno_ptr, qno_st, qno_sh;   // q_nope_out
  long long nope_dim, ckv_dim;         // Dn, Dc (kv_lora_rank)
};

// One item of a warp's list: the byte addresses its packs are loaded from
// and stored to (the row's element 0 for a rotated chunk, the pack itself
// for a pass-through pack), whether it is a query item (q_scale, Q8) or a
// cache item, and, for a rotated chunk, its ChunkGeometry index c (-1: no
// item).
struct MlaItem {
  long long src = 0, dst = 0;
  int c = -1;
  bool q = false;
};

// Rotated item i of a warp's rows: chunk c of query row r (r < nq), or of
// the latent row's k_pe (r == nq). QS / CS: bytes per element of the query
// outputs and of the cache (1 for e4m3); kc0: k_pe's cache row (elements).
template <typename T, int QS, int CS>
__device__ __forceinline__ MlaItem mla_rot_item(const RopeArgs& a, const KvArgs& kv, unsigned t,
                                                int h0, int nq, int i, int rot_chunks,
                                                long long kc0) {
  constexpr int ES = sizeof(T);
  MlaItem it;
  const int r = i / rot_chunks;
  it.c = i - r * rot_chunks;
  it.q = r < nq;
  if (it.q) {
    const int h = h0 + r;
    it.src = a.in_ptr[0] + (t * a.in_ss[0] + h * a.in_sh[0]) * ES;
    it.dst = a.out_ptr[0] + (t * a.out_ss[0] + h * a.out_sh[0]) * QS;
  } else {
    it.src = a.in_ptr[1] + t * a.in_ss[1] * ES, it.dst = kv.k_cache + kc0 * CS;
  }
  return it;
}

// Pass-through item i of a warp's rows: pack n of query row r's q_nope (i <
// nq * nope_packs), else ckv's pack i - nq * nope_packs; vc0: ckv's cache
// row (elements).
template <typename T, int VEC, int QS, int CS>
__device__ __forceinline__ MlaItem mla_pass_item(const KvArgs& kv, const MlaArgs& m, unsigned t,
                                                 int h0, int nq, int i, int nope_packs,
                                                 long long vc0) {
  constexpr int ES = sizeof(T);
  MlaItem it;
  const int q_total = nq * nope_packs;
  it.q = i < q_total;
  if (it.q) {
    const int r = i / nope_packs;
    const long long n = static_cast<long long>(i - r * nope_packs) * VEC;
    const int h = h0 + r;
    it.src = m.qn_ptr + (t * m.qn_st + h * m.qn_sh + n) * ES;
    it.dst = m.qno_ptr + (t * m.qno_st + h * m.qno_sh + n) * QS;
  } else {
    const long long n = static_cast<long long>(i - q_total) * VEC;
    it.src = kv.v_ptr + (t * kv.v_ss + n) * ES, it.dst = kv.v_cache + (vc0 + n) * CS;
  }
  return it;
}

// A chunk's two pack offsets (ChunkGeometry with no pass-through chunks).
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ void mla_chunk(int c, int npairs, int& e0, int& e1) {
  const int rot_chunks = npairs / VEC, cw = 0;
  bool rot = false, two = false;
  ChunkGeometry<INTERLEAVED, VEC>{rot, c, rot_chunks, two, cw, e0, e1, npairs, rot_chunks}();
}

// The warp's rotated chunks (n_rot of them), kMlaRotUnroll per lane at a
// time, every load of a step issued before its first store. The first
// step's loads go out before the warp's cos/sin are formed (fill_cs(), then
// a __syncwarp: the steps are warp-uniform), so the float64 angles and the
// trig run under the first load latency instead of before it.
template <typename T, bool INTERLEAVED, int VEC, bool Q8, bool C8, typename FillCs>
__device__ __forceinline__ void mla_rot_items(const RopeArgs& a, const KvArgs& kv, unsigned t,
                                              int h0, int nq, int n_rot, long long kc0,
                                              const float2* my_cs, FillCs fill_cs, float q_inv,
                                              float c_inv) {
  constexpr int QS = Q8 ? 1 : sizeof(T), CS = C8 ? 1 : sizeof(T);
  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = npairs / VEC;
  const int lane = threadIdx.x & 31;
  for (int b0 = 0; b0 < n_rot; b0 += 32 * kMlaRotUnroll) {
    MlaItem it[kMlaRotUnroll];
    Pack<T, VEC> x0[kMlaRotUnroll], x1[kMlaRotUnroll];
    int e0[kMlaRotUnroll], e1[kMlaRotUnroll];
#pragma unroll
    for (int u = 0; u < kMlaRotUnroll; ++u) {
      const int i = b0 + lane + 32 * u;
      if (i < n_rot) it[u] = mla_rot_item<T, QS, CS>(a, kv, t, h0, nq, i, rot_chunks, kc0);
      e0[u] = 0, e1[u] = 0;
      if (it[u].c >= 0) {
        mla_chunk<INTERLEAVED, VEC>(it[u].c, npairs, e0[u], e1[u]);
        x0[u] = load_pack<T, VEC>(it[u].src, e0[u]);
        x1[u] = load_pack<T, VEC>(it[u].src, e1[u]);
      }
    }
    if (b0 == 0) {
      fill_cs();
      __syncwarp();
    }
#pragma unroll
    for (int u = 0; u < kMlaRotUnroll; ++u) {
      if (it[u].c < 0) continue;
      const ChunkPairs<INTERLEAVED, VEC> pair_at{e0[u], e1[u]};
      float2 cs[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) cs[v] = my_cs[pair_at(v)];
      rotate_chunk<T, INTERLEAVED, VEC>(x0[u], x1[u], cs, cs + VEC / 2, 1);
      if (it[u].q) {
        store_as<T, Q8, VEC>(it[u].dst, e0[u], x0[u], q_inv);
        store_as<T, Q8, VEC>(it[u].dst, e1[u], x1[u], q_inv);
      } else {
        store_as<T, C8, VEC>(it[u].dst, e0[u], x0[u], c_inv);
        store_as<T, C8, VEC>(it[u].dst, e1[u], x1[u], c_inv);
      }
    }
  }
}

// The warp's pass-through packs (n_pass of them: q_nope, then ckv), a copy
// with the stores' conversion, kMlaUnroll packs per lane in flight.
template <typename T, int VEC, bool Q8, bool C8>
__device__ __forceinline__ void mla_pass_items(const KvArgs& kv, const MlaArgs& m, unsigned t,
                                               int h0, int nq, int n_pass, int nope_packs,
                                               long long vc0, float q_inv, float c_inv) {
  constexpr int QS = Q8 ? 1 : sizeof(T), CS = C8 ? 1 : sizeof(T);
  const int lane = threadIdx.x & 31;
  for (int b0 = 0; b0 < n_pass; b0 += 32 * kMlaUnroll) {
    MlaItem it[kMlaUnroll];
    Pack<T, VEC> x[kMlaUnroll];
#pragma unroll
    for (int u = 0; u < kMlaUnroll; ++u) {
      const int i = b0 + lane + 32 * u;
      if (i < n_pass) {
        it[u] = mla_pass_item<T, VEC, QS, CS>(kv, m, t, h0, nq, i, nope_packs, vc0);
        it[u].c = 0;
        x[u] = load_pack<T, VEC>(it[u].src, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kMlaUnroll; ++u) {
      if (it[u].c < 0) continue;
      if (it[u].q) {
        store_as<T, Q8, VEC>(it[u].dst, 0, x[u], q_inv);
      } else {
        store_as<T, C8, VEC>(it[u].dst, 0, x[u], c_inv);
      }
    }
  }
}

template <typename T, bool INTERLEAVED, int VEC, int FP8>
__global__ void __launch_bounds__(kThreads, kMlaMinBlocks)
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
  // the token's cos/sin into the warp's slice (lane j: pairs j, j + 32, ...)
  auto fill_cs = [&]() {
    for (int j = lane; j < npairs; j += 32) my_cs[j] = scaled_cos_sin(a, pos, inv_freq_at(a, 0, j));
  };
  if (has_kv) crow.advance(kv);
  long long page = 0, prow = 0;
  const bool cached = has_kv && crow.finish(kv, page, prow);
  const float q_inv = inv_scale<Q8>(kv.q_scale, 0);
  const float c_inv = inv_scale<C8>(kv.k_scale, 0);
  wait_prior_grids();  // (the loads above read no earlier kernel's output)
  let_dependents_launch();
  const int nope_packs = m.qn_ptr ? static_cast<int>(m.nope_dim) / VEC : 0;
  const int nq = max(0, min(h1, hq) - h0);  // the warp's query rows
  const int n_rot = (nq + (cached ? 1 : 0)) * rot_chunks;
  const int n_pass = nq * nope_packs + (cached ? static_cast<int>(m.ckv_dim) / VEC : 0);
  mla_rot_items<T, INTERLEAVED, VEC, Q8, C8>(a, kv, t, h0, nq, n_rot,
                                             page * kv.kc_sp + prow * kv.kc_sr, my_cs, fill_cs,
                                             q_inv, c_inv);
  mla_pass_items<T, VEC, Q8, C8>(kv, m, t, h0, nq, n_pass, nope_packs,
                                 page * kv.vc_sp + prow * kv.vc_sr, q_inv, c_inv);
}

}  // namespace cuprope
