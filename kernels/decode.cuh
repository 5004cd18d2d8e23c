// Decode rows: the rotation of a launch of few tokens (decode steps), where
// one thread's chain of dependent instructions is the launch's time
// (measured on an H200). The core's rope_qk_forward, the cos/sin-table
// calls and rotary_embedding take it for few tokens; its arithmetic is
// theirs (rotate_chunk, rotate_table, scaled_cos_sin), so the results are
// the same bits.
//
// Work: grid (gx, head groups, gz), block (cx, hy, tz): thread (x, y, z) of
// block (i, j, k) owns chunks x, x + cx, ... (ChunkGeometry) of head j·hy + y
// (q's heads, then k's) of token (b, s) = (k·tz + z, 0) when S is 1, else
// (k, i·tz + z). Every index is a block or thread index, chosen by selects:
// no division and no branch before the first loads (at a kernel's start a
// branch waits for its constant and for its target's instructions). The
// thread issues the position load first, waits for the stream's previous
// grid (a no-op unless launched with enable_pdl), loads its q/k packs and its
// chunk's cos/sin from a row of an fp32 table (four 16-byte loads for 16-bit
// VEC 8), rotates and stores: two dependent loads.
//
// The table is KvArgs' cs_ptr [cs_rows, R] (row stride cs_st; cos of the
// pairs in [0, R/2), their sin in [R/2, R)):
//   SRC kKvAngles:    RopeConfig's angle table (scaled_cos_sin of each row,
//                     sin_sign 1; cs_ptr 0: none); a token outside [0, cs_rows)
//                     computes its cos/sin from inv_freq in float64 instead;
//   SRC kKvCosSinF32 / kKvCosSinT: the caller's cos_sin_cache in float32 or T
//                     (vLLM's rotary_embedding); a token outside it is not
//                     written.
// SRC kKvTablesT reads no position and no such table: the caller's [B, S, R]
// cos and sin tables in T (rope_kernel's kSrcTable: pointers in pos_ptr and
// seq_off_ptr, strides pos_sb, pos_ss) at the chunk's own elements, rotated
// by rotate_table (HF's formula and roundings); one level of loads.
#pragma once

#include "kvcache.cuh"

namespace cuprope {

// G consecutive values of a cos/sin table row as fp32, in 16-byte loads (or
// one narrower load when G values are fewer bytes).
template <typename C, int G>
__device__ __forceinline__ void load_row(long long ptr, long long off, float (&out)[G]) {
  constexpr int kPer = (G * sizeof(C) > 16) ? 16 / sizeof(C) : G;
#pragma unroll
  for (int i = 0; i < G; i += kPer) {
    const Pack<C, kPer> p = load_pack<C, kPer>(ptr, off + i);
#pragma unroll
    for (int k = 0; k < kPer; ++k) out[i + k] = to_f32(p.v[k]);
  }
}

// A load of `ptr[i]` through the read-only path where `on`, else 0: a
// predicated instruction, never a branch around it (the compiler branches
// around a plain `on ? ptr[i] : 0`). One line of PTX: a closing brace on a line
// of its own would end a kernel's body for tools that read the PTX.
__device__ __forceinline__ long long load_if(bool on, const long long* ptr, long long i) {
  long long v = 0;
  asm("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q ld.global.nc.s64 %0, [%1]; }"
      : "+l"(v) : "l"(ptr + i), "r"(static_cast<unsigned>(on)));
  return v;
}
__device__ __forceinline__ long long load_if(bool on, const int* ptr, long long i) {
  int v = 0;
  asm("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q ld.global.nc.s32 %0, [%1]; }"
      : "+r"(v) : "l"(ptr + i), "r"(static_cast<unsigned>(on)));
  return v;
}

// token_position (no position streams), its loads issued together and
// predicated: the position (int32 or int64; none: s) and the sequence offset.
__device__ __forceinline__ long long decode_position(const RopeArgs& a, unsigned b, unsigned s) {
  const long long i = b * a.pos_sb + s * a.pos_ss;
  const bool pos = a.pos_ptr != 0, p64 = a.pos_is64 != 0;
  const bool off = a.seq_off_ptr != 0, o64 = a.seq_off_is64 != 0;
  const long long p = load_if(pos && p64, reinterpret_cast<const long long*>(a.pos_ptr), i) +
                      load_if(pos && !p64, reinterpret_cast<const int*>(a.pos_ptr), i);
  const long long o = load_if(off && o64, reinterpret_cast<const long long*>(a.seq_off_ptr), b) +
                      load_if(off && !o64, reinterpret_cast<const int*>(a.seq_off_ptr), b);
  return (pos ? p : static_cast<long long>(s)) + o + a.offset;
}

// The float64 angle of pair j (shared frequencies) for a token past the
// angle table: out of line and per pair (a float2 in registers), so the
// table's path is the kernel's straight code (inline, the fallback doubled
// the kernel's code) and keeps its cos/sin in registers.
__device__ __noinline__ float2 decode_pair_angle(long long inv_freq_ptr, int j, long long pos,
                                                 float sc, float sign) {
  return scaled_cos_sin(pos, reinterpret_cast<const double*>(inv_freq_ptr)[j], sc, sign);
}

// Bounded as the shared-angle rope kernels (64 registers at the defaults:
// 40-64 used, no spill), so large decode batches keep 32 warps per SM.
template <typename T, bool INTERLEAVED, int VEC, int SRC>
__global__ void __launch_bounds__(kThreads, CUPROPE_MIN_BLOCKS)
    rope_decode_kernel(const RopeArgs a, const KvArgs kv) {
  using P = Pack<T, VEC>;
  using C = typename CosSinType<T, SRC != kKvCosSinT>::type;  // the table's element type
  constexpr bool TABLES = SRC == kKvTablesT;
  constexpr int G = kCsGroup<INTERLEAVED, VEC>;  // consecutive pairs of a chunk's run
  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = static_cast<int>(static_cast<unsigned>(npairs) / VEC);
  const unsigned cw = static_cast<unsigned>(a.copy_rest);  // packs per pass-through chunk
  const int chunks =
      rot_chunks +
      (cw ? static_cast<int>((static_cast<unsigned>(a.head_dim - a.rot_dim) / VEC) >> (cw - 1))
          : 0);
  const int heads0 = static_cast<int>(a.heads[0]);
  const int h = static_cast<int>(blockIdx.y * blockDim.y + threadIdx.y);
  const bool one = a.n_seq == 1;  // tokens of a block: along B when S is 1, else along S
  const unsigned run = (one ? blockIdx.z : blockIdx.x) * blockDim.z + threadIdx.z;
  const unsigned b = one ? run : blockIdx.z;
  const unsigned s = one ? 0u : run;
  if (h >= heads0 + static_cast<int>(a.heads[1]) ||
      run >= static_cast<unsigned>(one ? a.n_batch : a.n_seq)) {
    return;
  }
  long long pos0 = 0;
  if constexpr (!TABLES) pos0 = decode_position(a, b, s);
  const bool is_k = h >= heads0;
  const long long hh = is_k ? h - heads0 : h;
  const long long in_ptr = is_k ? a.in_ptr[1] : a.in_ptr[0];
  const long long out_ptr = is_k ? a.out_ptr[1] : a.out_ptr[0];
  const long long in_off = b * (is_k ? a.in_sb[1] : a.in_sb[0]) +
                           s * (is_k ? a.in_ss[1] : a.in_ss[0]) +
                           hh * (is_k ? a.in_sh[1] : a.in_sh[0]);
  const long long out_off = b * (is_k ? a.out_sb[1] : a.out_sb[0]) +
                            s * (is_k ? a.out_ss[1] : a.out_ss[0]) +
                            hh * (is_k ? a.out_sh[1] : a.out_sh[0]);
  const bool in_table = kv.cs_ptr != 0 && pos0 >= 0 && pos0 < kv.cs_rows;
  const float sign = static_cast<float>(a.sin_sign);
  int e0 = 0, e1 = 0;
  bool rot = false, two = false;
  wait_prior_grids();
  let_dependents_launch();
  for (int c = static_cast<int>(threadIdx.x); c < chunks; c += static_cast<int>(blockDim.x)) {
    ChunkGeometry<INTERLEAVED, VEC>{rot, c, rot_chunks, two, static_cast<int>(cw), e0, e1, npairs,
                                    chunks}();
    const ChunkPairs<INTERLEAVED, VEC> pair_at{e0, e1};
    P x0 = load_pack<T, VEC>(in_ptr, in_off + e0), x1;
    if (two) x1 = load_pack<T, VEC>(in_ptr, in_off + e1);
    if constexpr (TABLES) {
      if (rot) {
        const long long toff = b * a.pos_sb + s * a.pos_ss;
        const P tc[2] = {load_pack<T, VEC>(a.pos_ptr, toff + e0),
                         load_pack<T, VEC>(a.pos_ptr, toff + e1)};
        const P ts[2] = {load_pack<T, VEC>(a.seq_off_ptr, toff + e0),
                         load_pack<T, VEC>(a.seq_off_ptr, toff + e1)};
        rotate_table<T, INTERLEAVED, VEC>(x0, x1, tc, ts, a.sin_sign < 0.0);
      }
    } else if (rot) {
      float2 cs[VEC];
      if (in_table) {
        const long long row = pos0 * kv.cs_st;
#pragma unroll
        for (int r = 0; r < VEC / G; ++r) {
          float cn[G], sn[G];
          load_row<C, G>(kv.cs_ptr, row + pair_at(r * G), cn);
          load_row<C, G>(kv.cs_ptr, row + npairs + pair_at(r * G), sn);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            // both tables hold sin_sign 1 (the angle table; vLLM's cache, whose
            // inverse negates): negating is exact
            cs[r * G + g] = make_float2(cn[g], sn[g] * sign);
          }
        }
      } else if constexpr (SRC == kKvAngles) {
        const float sc = static_cast<float>(a.scale);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          cs[v] = decode_pair_angle(a.inv_freq_ptr, pair_at(v), pos0, sc, sign);
        }
      } else {
        return;  // outside the caller's cos_sin_cache: the token is not written
      }
      rotate_chunk<T, INTERLEAVED, VEC>(x0, x1, cs, cs + VEC / 2, 1);
    }
    store_pack<T, VEC>(out_ptr, out_off + e0, x0);
    if (two) store_pack<T, VEC>(out_ptr, out_off + e1, x1);
  }
}

}  // namespace cuprope
