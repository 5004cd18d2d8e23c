// cuprope: one templated kernel family for rotary position embedding.
//
// Every variant is described by the same three things:
//   * an angle source: a float64 table of inverse frequencies, one per rotated
//     pair, shared by all heads ([R/2]) or per head ([H, R/2]);
//   * a position for each (token, pair): a scalar offset, an optional per-
//     sequence offset [B], and either the implicit sequence index s or an
//     explicit int32/int64 tensor with one row per position stream
//     (multimodal schemes map each pair to a stream);
//   * a scale multiplying cos and sin, and a sign on sin (-1: the inverse
//     rotation, used for backward).
// The angle position * inv_freq is formed in float64 and reduced mod 2*pi
// before a precise fp32 sincosf, so the angle is exact to ~2e-7 rad at any
// position below 2^31.
//
// Compile-time parameters: element type T, pairing (interleaved (2i, 2i+1) or
// half split (i, i + R/2)) and VEC, the number of pairs a thread owns, chosen
// so a thread's loads are 16 bytes wide where alignment allows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cuprope {

// Kernel arguments, passed by value as one struct. Every field is 8 bytes so
// the host-side NumPy structured dtype (cuprope/_launch.py) has the same
// layout with no padding rules involved. Strides are in elements.
struct RopeArgs {
  long long in_ptr[2];   // tensor 0 (q or x) and tensor 1 (k; unused if heads[1] == 0)
  long long out_ptr[2];
  long long in_sb[2], in_ss[2], in_sh[2];     // batch, sequence, head strides of the inputs
  long long out_sb[2], out_ss[2], out_sh[2];  // ... of the outputs
  long long heads[2];
  long long n_batch, n_seq;  // tokens = n_batch * n_seq; token t -> (t / n_seq, t % n_seq)
  long long head_dim;        // D
  long long rot_dim;         // R (even, <= D)
  long long copy_rest;       // 1: also copy dims [R, D) to the output (out-of-place)
  // positions
  long long pos_ptr;         // 0: implicit position s
  long long pos_is64;
  long long pos_s_stream, pos_sb, pos_ss;
  long long seq_off_ptr;     // 0: none; else [B] int32/int64
  long long seq_off_is64;
  long long offset;
  // angle source
  long long inv_freq_ptr;    // const double*, [R/2] or [H, R/2]
  long long freq_sh;         // head stride of inv_freq in elements; 0 = shared by all heads
  long long stream_map_ptr;  // const int*, [R/2] stream index per pair; 0 = stream 0
  double scale;              // multiplies cos and sin
  double sin_sign;           // +1 forward, -1 inverse
  // tiling (chosen on the host): each warp owns one (token, head group)
  long long head_groups;     // groups per token
  long long heads_per_group; // a multiple of the rows a warp covers per step
};

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// N contiguous elements, aligned to their size so one load is one instruction.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(long long ptr, long long off) {
  return *reinterpret_cast<const Pack<T, N>*>(reinterpret_cast<const T*>(ptr) + off);
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(long long ptr, long long off, const Pack<T, N>& p) {
  *reinterpret_cast<Pack<T, N>*>(reinterpret_cast<T*>(ptr) + off) = p;
}

// cos and sin of position * inv_freq, the product formed in float64 and
// reduced to [-pi, pi] with a two-constant Cody-Waite step (2*pi = HI + LO).
// The reduced angle is then exact to ~1e-15, and rounding it to fp32 costs at
// most pi * 2^-24 ~ 1.9e-7 rad; sincosf stays on its fast, accurate path.
__device__ __forceinline__ float2 exact_cos_sin(long long pos, double inv_freq) {
  const double kTwoPiHi = 6.283185307179586;
  const double kTwoPiLo = 2.4492935982947064e-16;
  const double kInvTwoPi = 0.15915494309189535;
  const double angle = __dmul_rn(static_cast<double>(pos), inv_freq);
  const double k = rint(angle * kInvTwoPi);
  double r = fma(-k, kTwoPiHi, angle);
  r = fma(-k, kTwoPiLo, r);
  float s, c;
  sincosf(static_cast<float>(r), &s, &c);
  return make_float2(c, s);
}

__device__ __forceinline__ long long load_index(long long ptr, long long i, bool is64) {
  return is64 ? reinterpret_cast<const long long*>(ptr)[i]
              : static_cast<long long>(reinterpret_cast<const int*>(ptr)[i]);
}

// Position of the token at (batch b, sequence index s) in position stream `stream`.
__device__ __forceinline__ long long token_position(const RopeArgs& a, unsigned b, unsigned s,
                                                    int stream) {
  long long p = a.offset;
  if (a.seq_off_ptr) p += load_index(a.seq_off_ptr, b, a.seq_off_is64);
  if (a.pos_ptr) {
    p += load_index(a.pos_ptr, stream * a.pos_s_stream + b * a.pos_sb + s * a.pos_ss, a.pos_is64);
  } else {
    p += s;
  }
  return p;
}

// (cos, sin) of pair j for the token at (b, s) and head row `frow` of the
// frequency table, with scale and sin sign applied.
__device__ __forceinline__ float2 pair_cos_sin(const RopeArgs& a, unsigned b, unsigned s, int j,
                                               long long frow) {
  const int stream = a.stream_map_ptr ? reinterpret_cast<const int*>(a.stream_map_ptr)[j] : 0;
  const double f = reinterpret_cast<const double*>(a.inv_freq_ptr)[frow * a.freq_sh + j];
  const float2 cs = exact_cos_sin(token_position(a, b, s, stream), f);
  const float sc = static_cast<float>(a.scale);
  return make_float2(cs.x * sc, cs.y * sc * static_cast<float>(a.sin_sign));
}

constexpr int kThreads = 256;  // most threads per block (whole warps)

// Rows (heads) each lane keeps in flight per step. Measured on an H200
// (benchmarks/NOTES.md): one row for 16-bit types (fewer registers, more warps
// resident), two for float32.
#ifndef CUPROPE_ROWS16
#define CUPROPE_ROWS16 1
#endif
#ifndef CUPROPE_ROWS32
#define CUPROPE_ROWS32 2
#endif

// Rotate pair (x1, x2) of a chunk held in two packs: pair v is (p0[v], p1[v])
// for the half split and (e[2v], e[2v+1]) of the concatenation p0|p1 when
// interleaved. Every index is a compile-time constant after unrolling.
template <typename T, bool INTERLEAVED, int VEC>
__device__ __forceinline__ void rotate_chunk(Pack<T, VEC>& p0, Pack<T, VEC>& p1, const float2* cs) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    T* e1;
    T* e2;
    if (INTERLEAVED) {
      Pack<T, VEC>& p = (2 * v < VEC) ? p0 : p1;
      const int i = (2 * v) % VEC;
      e1 = &p.v[i];
      e2 = &p.v[i + 1];
    } else {
      e1 = &p0.v[v];
      e2 = &p1.v[v];
    }
    const float x1 = to_f32(*e1);
    const float x2 = to_f32(*e2);
    *e1 = from_f32<T>(x1 * cs[v].x - x2 * cs[v].y);
    *e2 = from_f32<T>(x2 * cs[v].x + x1 * cs[v].y);
  }
}

// Each warp owns one (token, head group): heads [g*heads_per_group, ...) of the
// concatenated head list (q heads, then k heads). A lane owns one chunk (VEC
// pairs of a head, or VEC pass-through elements when copying dims >= R); the
// warp covers 32/cpr heads per step, cpr = min(chunks, 32) lanes per head.
//
// PER_HEAD: the frequency table has one row per head (freq_sh != 0) and cos/sin
// are computed per (token, head, pair). Otherwise the warp computes cos/sin once per (token, pair) into
// its slice of shared memory, each lane pulls its chunk's VEC values into
// registers, and every head of q and k reuses them: per head a lane only
// advances a pointer, loads two 16-byte packs, rotates and stores.
template <typename T, bool INTERLEAVED, int VEC, bool PER_HEAD>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeArgs a) {
  extern __shared__ float2 warp_cs[];  // [warps per block][R/2]

  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = npairs / VEC;
  const int chunks = rot_chunks + (a.copy_rest ? static_cast<int>((a.head_dim - a.rot_dim) / VEC) : 0);
  const int cpr = min(chunks, 32);
  const int rpw = 32 / cpr;
  const int lane = threadIdx.x & 31;
  const int sub = lane / cpr;
  const int heads0 = static_cast<int>(a.heads[0]);
  const int htot = heads0 + static_cast<int>(a.heads[1]);
  const unsigned groups = static_cast<unsigned>(a.head_groups);
  const unsigned unit = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const unsigned n_seq = static_cast<unsigned>(a.n_seq);
  if (unit >= static_cast<unsigned>(a.n_batch * a.n_seq) * groups) return;  // whole warp
  const unsigned tok = unit / groups;
  const int h0 = static_cast<int>(unit - tok * groups) * static_cast<int>(a.heads_per_group);
  const int h1 = min(htot, h0 + static_cast<int>(a.heads_per_group));
  const unsigned b = tok / n_seq;
  const unsigned s = tok - b * n_seq;
  constexpr int kRows = sizeof(T) == 4 ? CUPROPE_ROWS32 : CUPROPE_ROWS16;
  float2* my_cs = warp_cs + (threadIdx.x >> 5) * npairs;
  if (!PER_HEAD) {
    for (int p = lane; p < npairs; p += 32) my_cs[p] = pair_cos_sin(a, b, s, p, 0);
    __syncwarp();
  }
  if (sub >= rpw) return;  // lanes left over when cpr does not divide 32

  const long long in_base0 = b * a.in_sb[0] + s * a.in_ss[0];
  const long long in_base1 = b * a.in_sb[1] + s * a.in_ss[1];
  const long long out_base0 = b * a.out_sb[0] + s * a.out_ss[0];
  const long long out_base1 = b * a.out_sb[1] + s * a.out_ss[1];

  for (int c = lane - sub * cpr; c < chunks; c += cpr) {
    const bool rot = c < rot_chunks;
    // element offsets of the chunk's two packs (one pack for a pass-through chunk)
    const long long e0 = rot ? (INTERLEAVED ? 2LL * c * VEC : static_cast<long long>(c) * VEC)
                             : a.rot_dim + static_cast<long long>(c - rot_chunks) * VEC;
    const long long e1 = INTERLEAVED ? e0 + VEC : e0 + npairs;
    float2 cs[VEC];
    if (rot && !PER_HEAD) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) cs[v] = my_cs[c * VEC + v];
    }
    for (int h = h0 + sub; h < h1; h += kRows * rpw) {
      Pack<T, VEC> x[kRows][2];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int hu = h + u * rpw;
        if (hu >= h1) continue;
        const bool is_k = hu >= heads0;
        const long long ptr = is_k ? a.in_ptr[1] : a.in_ptr[0];
        const long long off = is_k ? in_base1 + (hu - heads0) * a.in_sh[1] : in_base0 + hu * a.in_sh[0];
        x[u][0] = load_pack<T, VEC>(ptr, off + e0);
        if (rot) x[u][1] = load_pack<T, VEC>(ptr, off + e1);
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int hu = h + u * rpw;
        if (hu >= h1) continue;
        const bool is_k = hu >= heads0;
        const int hh = is_k ? hu - heads0 : hu;
        const long long ptr = is_k ? a.out_ptr[1] : a.out_ptr[0];
        const long long off = is_k ? out_base1 + hh * a.out_sh[1] : out_base0 + hh * a.out_sh[0];
        if (rot) {
          if (PER_HEAD) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) cs[v] = pair_cos_sin(a, b, s, c * VEC + v, hh);
          }
          rotate_chunk<T, INTERLEAVED, VEC>(x[u][0], x[u][1], cs);
          store_pack<T, VEC>(ptr, off + e1, x[u][1]);
        }
        store_pack<T, VEC>(ptr, off + e0, x[u][0]);
      }
    }
  }
}

}  // namespace cuprope
