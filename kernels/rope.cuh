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
  // tiling (chosen on the host)
  long long tok_per_block;
  long long heads_per_block;
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

// Position of token `tok` in position stream `stream`.
__device__ __forceinline__ long long token_position(const RopeArgs& a, unsigned tok, int stream) {
  const unsigned n_seq = static_cast<unsigned>(a.n_seq);
  const long long b = tok / n_seq;
  const long long s = tok - static_cast<unsigned>(b) * n_seq;
  long long p = a.offset;
  if (a.seq_off_ptr) p += load_index(a.seq_off_ptr, b, a.seq_off_is64);
  if (a.pos_ptr) {
    p += load_index(a.pos_ptr, stream * a.pos_s_stream + b * a.pos_sb + s * a.pos_ss, a.pos_is64);
  } else {
    p += s;
  }
  return p;
}

// (cos, sin) of pair j for token tok and head row `frow` of the frequency table,
// with scale and sin sign applied.
__device__ __forceinline__ float2 pair_cos_sin(const RopeArgs& a, unsigned tok, int j, long long frow) {
  const int stream = a.stream_map_ptr ? reinterpret_cast<const int*>(a.stream_map_ptr)[j] : 0;
  const double f = reinterpret_cast<const double*>(a.inv_freq_ptr)[frow * a.freq_sh + j];
  const float2 cs = exact_cos_sin(token_position(a, tok, stream), f);
  const float sc = static_cast<float>(a.scale);
  return make_float2(cs.x * sc, cs.y * sc * static_cast<float>(a.sin_sign));
}

constexpr int kThreads = 256;  // most threads per block (the host launches blockDim.x * blockDim.y <= this)
// (token, head) rows each thread keeps in flight: with 16-byte packs, 4 rows
// are 128 bytes of loads per thread. Bytes in flight per SM is what limits a
// streaming kernel (Little's law), so rows are loaded together and their
// offsets recomputed at store time rather than held in registers.
#ifndef CUPROPE_ROWS
#define CUPROPE_ROWS 4
#endif
#ifndef CUPROPE_MIN_BLOCKS
#define CUPROPE_MIN_BLOCKS 2
#endif
constexpr int kRows = CUPROPE_ROWS;

// Block shape: blockDim.x threads walk the chunks of a head (a chunk is VEC
// pairs, or VEC pass-through elements when copying dims >= R), blockDim.y
// threads walk rows. A row is one (token, head) of the concatenated head list
// (q heads, then k heads). A block owns tok_per_block consecutive tokens and
// heads [blockIdx.y * heads_per_block, ...).
//
// Each thread first issues the loads of its first kRows rows, then the block
// computes cos/sin once per (token, pair) into shared memory (shared
// frequencies), so the table's float64 math overlaps the memory latency; every
// head of q and k then reuses the table.
template <typename T, bool INTERLEAVED, int VEC>
__global__ void __launch_bounds__(kThreads, CUPROPE_MIN_BLOCKS) rope_kernel(const RopeArgs a) {
  extern __shared__ float2 cs_table[];  // [tok_per_block][R/2]

  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = npairs / VEC;
  const int chunks = rot_chunks + (a.copy_rest ? static_cast<int>((a.head_dim - a.rot_dim) / VEC) : 0);
  const int heads0 = static_cast<int>(a.heads[0]);
  const int htot = heads0 + static_cast<int>(a.heads[1]);
  const unsigned n_seq = static_cast<unsigned>(a.n_seq);
  const unsigned tokens = static_cast<unsigned>(a.n_batch * a.n_seq);  // host checks < 2^31
  const unsigned tok0 = blockIdx.x * static_cast<unsigned>(a.tok_per_block);
  const int ntok = static_cast<int>(min(static_cast<unsigned>(a.tok_per_block), tokens - tok0));
  const int h_begin = static_cast<int>(blockIdx.y * a.heads_per_block);
  const int hcount = min(static_cast<int>(a.heads_per_block), htot - h_begin);
  const bool shared_freq = a.freq_sh == 0;
  const int rows = ntok * hcount;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;

  Pack<T, VEC> x[kRows][2];
  int meta[kRows];  // row index r, or -1

  // Element offset of row r's head in tensor `ten`, for the input or output strides.
  auto row_offset = [&](int r, bool out, int& ten, int& hh) -> long long {
    const int t = r / hcount;
    const int h = h_begin + (r - t * hcount);
    ten = h < heads0 ? 0 : 1;
    hh = ten ? h - heads0 : h;
    const unsigned tok = tok0 + t;
    const unsigned b = tok / n_seq;
    const unsigned s = tok - b * n_seq;
    return out ? b * a.out_sb[ten] + s * a.out_ss[ten] + hh * a.out_sh[ten]
               : b * a.in_sb[ten] + s * a.in_ss[ten] + hh * a.in_sh[ten];
  };

  // Issue the loads of rows threadIdx.y + u*blockDim.y, u < kRows, for chunk c.
  auto load_rows = [&](int row0, int c) {
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const int r = row0 + u * static_cast<int>(blockDim.y);
      meta[u] = -1;
      if (r >= rows) continue;
      int ten, hh;
      const long long in_off = row_offset(r, false, ten, hh);
      meta[u] = r;
      if (c < rot_chunks) {
        const long long e0 = INTERLEAVED ? 2LL * c * VEC : static_cast<long long>(c) * VEC;
        const long long e1 = INTERLEAVED ? e0 + VEC : e0 + npairs;
        x[u][0] = load_pack<T, VEC>(a.in_ptr[ten], in_off + e0);
        x[u][1] = load_pack<T, VEC>(a.in_ptr[ten], in_off + e1);
      } else {
        x[u][0] = load_pack<T, VEC>(a.in_ptr[ten], in_off + a.rot_dim + (c - rot_chunks) * VEC);
      }
    }
  };

  auto rotate_store_rows = [&](int c) {
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const int r = meta[u];
      if (r < 0) continue;
      int ten, hh;
      const long long out_off = row_offset(r, true, ten, hh);
      if (c >= rot_chunks) {
        store_pack<T, VEC>(a.out_ptr[ten], out_off + a.rot_dim + (c - rot_chunks) * VEC, x[u][0]);
        continue;
      }
      const int t = r / hcount;
      // e[0..2*VEC): the chunk's elements; pair v is (e[v], e[VEC + v]) for the
      // half split and (e[2v], e[2v + 1]) when interleaved.
      T e[2 * VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        e[v] = x[u][0].v[v];
        e[VEC + v] = x[u][1].v[v];
      }
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        const int j = c * VEC + v;
        const float2 cs = shared_freq ? cs_table[t * npairs + j]
                                      : pair_cos_sin(a, tok0 + t, j, hh);
        const int i1 = INTERLEAVED ? 2 * v : v;
        const int i2 = INTERLEAVED ? 2 * v + 1 : VEC + v;
        const float x1 = to_f32(e[i1]);
        const float x2 = to_f32(e[i2]);
        e[i1] = from_f32<T>(x1 * cs.x - x2 * cs.y);
        e[i2] = from_f32<T>(x2 * cs.x + x1 * cs.y);
      }
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        x[u][0].v[v] = e[v];
        x[u][1].v[v] = e[VEC + v];
      }
      const long long e0 = INTERLEAVED ? 2LL * c * VEC : static_cast<long long>(c) * VEC;
      const long long e1 = INTERLEAVED ? e0 + VEC : e0 + npairs;
      store_pack<T, VEC>(a.out_ptr[ten], out_off + e0, x[u][0]);
      store_pack<T, VEC>(a.out_ptr[ten], out_off + e1, x[u][1]);
    }
  };

  const int c0 = threadIdx.x;
  const bool has_first = c0 < chunks;
  if (has_first) load_rows(threadIdx.y, c0);

  if (shared_freq) {
    for (int i = tid; i < ntok * npairs; i += blockDim.x * blockDim.y) {
      const int t = i / npairs;
      cs_table[i] = pair_cos_sin(a, tok0 + t, i - t * npairs, 0);
    }
    __syncthreads();
  }

  // First group (already loaded), then the rest of this thread's (row, chunk) work.
  for (int c = c0; c < chunks; c += blockDim.x) {
    for (int row0 = threadIdx.y; row0 < rows; row0 += kRows * blockDim.y) {
      if (!(c == c0 && row0 == static_cast<int>(threadIdx.y))) load_rows(row0, c);
      rotate_store_rows(c);
    }
  }
}

}  // namespace cuprope
