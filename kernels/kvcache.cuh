// The KV-cache dialect of the RoPE family (cuprope/kvcache/api.py): rotate q and
// k of each token and write the rotated k and v into a paged KV cache, in one
// launch. The rotation is the core's: the same cos/sin (pair_cos_sin, exact
// angles) and the same arithmetic (rotate_chunk), so rotated values equal
// rope_kernel's bit for bit. Optionally the cache (and q's output) holds fp8
// e4m3: x * (1 / scale), rounded to nearest even and saturated to +-448.
//
// A second angle source reads a cos_sin_cache [rows, R] (cos in [0, R/2), sin
// in [R/2, R); float32 or the element type) at each token's position, the
// table serving engines keep (vLLM's rotary_embedding op); there nothing is
// cached, q and k are rotated in place or out.
//
// Work: one warp per (token, group of rows), the rows being q's heads, then
// k's, then v's (as rope_kernel's head groups: the host's grid_for). A lane
// owns one chunk (ChunkGeometry: VEC pairs in two packs, or pass-through
// elements) of every row of its warp step. A shared table's cos/sin are
// computed once per (token, pair) per warp into its shared-memory slice (the
// core's SliceCosSin and cs_slot layout) and read by the q and k heads alike;
// per-head tables give them per row, the cos_sin_cache per chunk.
#pragma once

#include <cuda_fp8.h>

#include "rope.cuh"

#if !defined(CUPROPE_KV_ANGLES) || !defined(CUPROPE_KV_COS_SIN_F32) ||  \
    !defined(CUPROPE_KV_COS_SIN_T) || !defined(CUPROPE_KV_TABLES_T) ||  \
    !defined(CUPROPE_KV_FP8_Q) || !defined(CUPROPE_KV_FP8_CACHE)
#error "the CUPROPE_KV_* codes are defined by cuprope/_core/loader.py (compile_options)"
#endif

namespace cuprope {

// Angle sources of kv_rope_kernel (SRC) and its fp8 bits (FP8).
constexpr int kKvAngles = CUPROPE_KV_ANGLES;          // RopeArgs' inv_freq (shared or per head)
constexpr int kKvCosSinF32 = CUPROPE_KV_COS_SIN_F32;  // cos_sin_cache in float32
constexpr int kKvCosSinT = CUPROPE_KV_COS_SIN_T;      // cos_sin_cache in the element type
constexpr int kKvTablesT = CUPROPE_KV_TABLES_T;      // [B, S, R] cos, sin tables in T (decode rows)
constexpr int kKvFp8Q = CUPROPE_KV_FP8_Q;             // q's output in e4m3
constexpr int kKvFp8Cache = CUPROPE_KV_FP8_CACHE;     // the k and v caches in e4m3

// Blocks of kThreads threads that must fit an SM at once (kv_rope_kernel's
// __launch_bounds__; 0: none stated), and the same for its WIDE
// instantiations (many-wave grids).
#if !defined(CUPROPE_KV_MIN_BLOCKS) || CUPROPE_KV_MIN_BLOCKS < 0 || \
    !defined(CUPROPE_KV_WIDE_MIN_BLOCKS) || CUPROPE_KV_WIDE_MIN_BLOCKS < 0
#error "CUPROPE_KV_(WIDE_)MIN_BLOCKS (>= 0) are defined by cuprope/_core/loader.py (compile_options)"
#endif
constexpr int kKvMinBlocks = CUPROPE_KV_MIN_BLOCKS;
constexpr int kKvWideMinBlocks = CUPROPE_KV_WIDE_MIN_BLOCKS;

// A pack stored as T, or (FP8) as e4m3 of each element times inv (the
// reciprocal of the scale, fp32), saturating finite: |x| beyond 448 stores
// +-448, NaN the canonical 0x7f (cuda_fp8.h).
template <typename T, bool FP8, int VEC>
__device__ __forceinline__ void store_as(long long ptr, long long off, const Pack<T, VEC>& p,
                                         float inv) {
  if constexpr (FP8) {
    Pack<unsigned char, VEC> o;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      o.v[i] = __nv_cvt_float_to_fp8(__fmul_rn(to_f32(p.v[i]), inv), __NV_SATFINITE, __NV_E4M3);
    }
    store_pack<unsigned char, VEC>(ptr, off, o);
  } else {
    store_pack<T, VEC>(ptr, off, p);
  }
}

// 1 / scale[i] rounded to nearest (fp8 only; 1 otherwise).
template <bool FP8>
__device__ __forceinline__ float inv_scale(long long ptr, long long i) {
  if constexpr (FP8) return __frcp_rn(reinterpret_cast<const float*>(ptr)[i]);
  return 1.f;
}

// The cache page and row of token t (its flat index b * S + s); not written
// (finish returns false) for a negative slot (padding), or any index out of
// range (slot beyond the cache, batch index outside [0, n_seqs), a position
// < 0 or past the sequence's pages, a page outside [0, num_pages)).
//   flat slots: slot = page * page_size + row
//   paged: token of batch b at position p goes to page
//          kv_indices[kv_indptr[b] + p / page_size], row p % page_size
// In three stages, so that the chain of dependent index loads runs under the
// warp's other latencies: begin issues the token's loads (slot, or batch
// index and position) beside the position load; advance waits for them,
// issues kv_indptr's pair and does the divisions, before the cos/sin slice;
// finish (after the slice) issues the kv_indices load and checks ranges.
struct CacheRow {
  long long x = -1, p = -1;            // begin: the slot, or the batch index and position
  long long lo = -1, hi = -1, q = 0;  // advance: the sequence's pages in kv_indices, p / ps
  int row = 0;                        // advance: the row in the page (< page_size)
  bool ok = false;                    // advance: x and p in range

  __device__ __forceinline__ void begin(const KvArgs& kv, long long t) {
    if (kv.slot_ptr) {
      x = reinterpret_cast<const long long*>(kv.slot_ptr)[t];
    } else {
      x = load_index(kv.batch_ptr, t, kv.index_is64 & 1);
      p = load_index(kv.cpos_ptr, t, kv.index_is64 & 2);
    }
  }
  __device__ __forceinline__ void advance(const KvArgs& kv) {
    const long long ps = kv.page_size;
    if (kv.slot_ptr) {
      ok = x >= 0 && x < kv.num_pages * ps;
      if (ok) {
        q = x / ps;
        row = static_cast<int>(x - q * ps);
      }
      return;
    }
    ok = x >= 0 && x < kv.n_seqs && p >= 0;
    if (ok) {
      lo = load_index(kv.indptr_ptr, x, kv.index_is64 & 8);
      hi = load_index(kv.indptr_ptr, x + 1, kv.index_is64 & 8);
      q = p / ps;
      row = static_cast<int>(p - q * ps);
    }
  }
  __device__ __forceinline__ bool finish(const KvArgs& kv, long long& page, long long& prow) const {
    if (!ok) return false;
    prow = row;
    if (kv.slot_ptr) {
      page = q;
      return true;
    }
    const long long j = lo + q;
    if (lo < 0 || j >= hi || j >= kv.n_indices) return false;
    page = load_index(kv.indices_ptr, j, kv.index_is64 & 4);
    return page >= 0 && page < kv.num_pages;
  }
};

template <typename T, bool F32> struct CosSinType { using type = T; };
template <typename T> struct CosSinType<T, true> { using type = float; };

// cos/sin of the chunk's VEC pairs (pair_at) for the token at (b, s): the
// core's pair_cos_sin with frequency row frow (per-head tables), or the
// cos_sin_cache row pos0, its sin times a.sin_sign (-1: vLLM's inverse).
template <typename T, bool INTERLEAVED, int VEC, int SRC>
__device__ __forceinline__ void chunk_cos_sin(const RopeArgs& a, const KvArgs& kv, unsigned b,
                                              unsigned s, long long frow, long long pos0,
                                              const ChunkPairs<INTERLEAVED, VEC>& pair_at,
                                              float2 (&cs)[VEC]) {
  if constexpr (SRC == kKvAngles) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) cs[v] = pair_cos_sin(a, b, s, pair_at(v), frow, pos0);
  } else {
    using C = typename CosSinType<T, SRC == kKvCosSinF32>::type;
    const C* row = reinterpret_cast<const C*>(kv.cs_ptr) + pos0 * kv.cs_st;
    const int half = static_cast<int>(a.rot_dim >> 1);
    const float sign = static_cast<float>(a.sin_sign);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const int j = pair_at(v);
      cs[v] = make_float2(to_f32(row[j]), to_f32(row[half + j]) * sign);
    }
  }
}

// Row roles of the warp's list: q heads, k heads, v heads.
enum KvRole { kRoleQ = 0, kRoleK = 1, kRoleV = 2 };

// WIDE: the same kernel held to kKvWideMinBlocks blocks per SM (fewer
// registers, a few spilled, more warps resident), for grids of many waves
// (prefill), where more warps in flight pay; decode grids take the other.
template <typename T, bool INTERLEAVED, int VEC, int SRC, int FP8, bool WIDE>
__global__ void __launch_bounds__(kThreads, WIDE ? kKvWideMinBlocks : kKvMinBlocks)
    kv_rope_kernel(const RopeArgs a, const KvArgs kv) {
  constexpr bool Q8 = (FP8 & kKvFp8Q) != 0;
  constexpr bool C8 = (FP8 & kKvFp8Cache) != 0;
  static_assert(SRC == kKvAngles || FP8 == 0, "the cos_sin_cache source writes no fp8");
  using P = Pack<T, VEC>;
  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = npairs / VEC;
  const int cw = static_cast<int>(a.copy_rest);  // packs per pass-through chunk (0: R = D)
  const int chunks = rot_chunks + (cw ? static_cast<int>((a.head_dim - a.rot_dim) / (VEC * cw)) : 0);
  const int cpr = min(chunks, 32);
  const int rpw = 32 / cpr;
  const int lane = threadIdx.x & 31;
  const int sub = lane / cpr;
  const int hq = static_cast<int>(a.heads[0]), hk = static_cast<int>(a.heads[1]);
  const int htot = hq + hk + (kv.v_ptr ? hk : 0);
  const unsigned groups = static_cast<unsigned>(a.head_groups);
  const unsigned unit = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const unsigned n_seq = static_cast<unsigned>(a.n_seq);
  if (unit >= static_cast<unsigned>(a.n_batch) * n_seq * groups) return;  // whole warps
  const unsigned tok = unit / groups;
  const int h0 = static_cast<int>(unit - tok * groups) * static_cast<int>(a.heads_per_group);
  const int h1 = min(htot, h0 + static_cast<int>(a.heads_per_group));
  const unsigned b = tok / n_seq, s = tok - b * n_seq;
  // The cache row's index loads start beside the position's (warps of q rows
  // alone skip them); their chain runs under the cos/sin slice (CacheRow).
  const bool has_kv = h1 > hq && kv.k_cache != 0;  // (warp-uniform)
  CacheRow crow;
  if (has_kv) crow.begin(kv, tok);
  const long long pos0 = a.stream_map_ptr ? 0 : token_position(a, b, s, 0);
  if constexpr (SRC != kKvAngles) {
    if (pos0 < 0 || pos0 >= kv.cs_rows) return;  // outside the table: the token is not written
  }
  // Shared table: the warp's cos/sin slice in shared memory, each pair computed
  // once by one lane (the core's SliceCosSin, every lane taking part), read by
  // every lane of a chunk. Per-head tables: per row, below.
  const bool per_head = SRC == kKvAngles && a.freq_sh != 0;
  constexpr bool kSlice = SRC == kKvAngles;
  // An angle table (RopeConfig.cache_angles: kv.cs_ptr with the angles source)
  // holds scaled_cos_sin of rows [0, cs_rows) in float32, the very values the
  // slice would compute: a token inside it reads its chunk's row instead.
  const bool from_table = kSlice && kv.cs_ptr != 0 && pos0 >= 0 && pos0 < kv.cs_rows;
  const bool slice = kSlice && !per_head && !from_table && h0 < hq + hk;  // (not for v rows alone)
  extern __shared__ float2 warp_cs[];
  float2* const my_cs = warp_cs + (threadIdx.x >> 5) * npairs;
  const double f0 = slice && lane < npairs ? inv_freq_at(a, 0, lane) : 0.0;
  if (has_kv) crow.advance(kv);
  if (slice) SliceCosSin<INTERLEAVED, VEC>{lane, npairs, a, b, s, my_cs}(pos0, f0);
  if (sub >= rpw) return;  // lanes left over when cpr does not divide 32
  long long page = 0, prow = 0;
  const bool cached = has_kv && crow.finish(kv, page, prow);
  const float q_inv = inv_scale<Q8>(kv.q_scale, 0);
  wait_prior_grids();  // (the loads above read no earlier kernel's output)
  let_dependents_launch();
  int e0 = 0, e1 = 0;  // the chunk's packs (ChunkGeometry)
  bool rot = false, two = false;
  for (int c = lane - sub * cpr; c < chunks; c += cpr) {
    ChunkGeometry<INTERLEAVED, VEC>{rot, c, rot_chunks, two, cw, e0, e1, npairs, chunks}();
    const ChunkPairs<INTERLEAVED, VEC> pair_at{e0, e1};
    float2 cs[VEC];
    if (rot && !per_head && (!kSlice || slice || from_table)) {
      if (slice) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) cs[v] = my_cs[cs_slot<INTERLEAVED, VEC>(pair_at(v), npairs)];
      } else {  // the cos_sin_cache, or the angle table
        chunk_cos_sin<T, INTERLEAVED, VEC, kSlice ? kKvCosSinF32 : SRC>(a, kv, b, s, 0, pos0,
                                                                       pair_at, cs);
      }
    }
    for (int h = h0 + sub; h < h1; h += rpw) {
      const int role = h < hq ? kRoleQ : h < hq + hk ? kRoleK : kRoleV;
      const int hh = role == kRoleQ ? h : role == kRoleK ? h - hq : h - hq - hk;
      const bool rest_out = (kv.write_rest >> role) & 1;  // q_out / k_out take dims >= R
      const bool to_out = role != kRoleV && (rot || rest_out) &&
                          (role == kRoleQ || a.out_ptr[1] != 0);
      // (the row's loads do not wait for the cache row's last index load:
      // whether it is written is known only at the store)
      const bool to_cache = role != kRoleQ && has_kv;
      if (!to_out && !to_cache) continue;
      long long src;
      long long off;
      if (role == kRoleV) {
        src = kv.v_ptr;
        off = b * kv.v_sb + s * kv.v_ss + hh * kv.v_sh;
      } else {  // (selects, not a runtime index into the parameter arrays)
        const bool k = role == kRoleK;
        src = k ? a.in_ptr[1] : a.in_ptr[0];
        off = b * (k ? a.in_sb[1] : a.in_sb[0]) + s * (k ? a.in_ss[1] : a.in_ss[0]) +
              hh * (k ? a.in_sh[1] : a.in_sh[0]);
      }
      P x0 = load_pack<T, VEC>(src, off + e0);
      P x1;
      if (two) x1 = load_pack<T, VEC>(src, off + e1);
      if (rot && role != kRoleV) {
        if (per_head) chunk_cos_sin<T, INTERLEAVED, VEC, SRC>(a, kv, b, s, hh, pos0, pair_at, cs);
        rotate_chunk<T, INTERLEAVED, VEC>(x0, x1, cs, cs + VEC / 2, 1);
      }
      if (to_out) {
        if (role == kRoleQ) {
          const long long oo = b * a.out_sb[0] + s * a.out_ss[0] + hh * a.out_sh[0];
          store_as<T, Q8, VEC>(a.out_ptr[0], oo + e0, x0, q_inv);
          if (two) store_as<T, Q8, VEC>(a.out_ptr[0], oo + e1, x1, q_inv);
        } else {
          const long long oo = b * a.out_sb[1] + s * a.out_ss[1] + hh * a.out_sh[1];
          store_pack<T, VEC>(a.out_ptr[1], oo + e0, x0);
          if (two) store_pack<T, VEC>(a.out_ptr[1], oo + e1, x1);
        }
      }
      if (to_cache && cached) {
        const bool is_k = role == kRoleK;
        const long long co = page * (is_k ? kv.kc_sp : kv.vc_sp) +
                             prow * (is_k ? kv.kc_sr : kv.vc_sr) + hh * (is_k ? kv.kc_sh : kv.vc_sh);
        const long long cptr = is_k ? kv.k_cache : kv.v_cache;
        const float inv = inv_scale<C8>(is_k ? kv.k_scale : kv.v_scale, hh * kv.kv_scale_sh);
        store_as<T, C8, VEC>(cptr, co + e0, x0, inv);
        if (two) store_as<T, C8, VEC>(cptr, co + e1, x1, inv);
      }
    }
  }
}

// The angle table of RopeConfig.cache_angles: row p of out [rows, R] holds
// the cos of pairs 0 .. R/2 - 1 at position p, then their sin, as float32:
// scaled_cos_sin with the shared frequencies, the values kv_rope_kernel's
// slice computes (a.sin_sign 1). One thread per (row, pair).
__global__ void __launch_bounds__(kThreads) kv_angle_table_kernel(const RopeArgs a,
                                                                   long long out_ptr,
                                                                   long long rows) {
  const long long npairs = a.rot_dim >> 1;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * npairs) return;
  const long long p = i / npairs;
  const int j = static_cast<int>(i - p * npairs);
  const float2 cs = scaled_cos_sin(a, p, inv_freq_at(a, 0, j));
  float* row = reinterpret_cast<float*>(out_ptr) + p * 2 * npairs;
  row[j] = cs.x;
  row[npairs + j] = cs.y;
}

}  // namespace cuprope
