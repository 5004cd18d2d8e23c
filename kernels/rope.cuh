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
// The angle position * inv_freq is formed in float64 and reduced mod pi/2
// there before fp32 polynomials (exact_cos_sin), so cos and sin are within
// ~7e-8 of those of the float64 angle at any position below 2^31. (Per-head
// tables with implicit positions compose exact rotations along the tokens
// instead: within ~2e-6 in 16-bit and ~4e-7 in fp32 at any position; token
// runs, CUPROPE_RUN16/32.)
//
// A third angle source skips the angles: the caller's own cos/sin tables
// ([B, S, R] in the element type, as Hugging Face models pass them), applied
// with HF's formula and PyTorch's roundings (cuprope/tables.py).
//
// Compile-time parameters: element type T, pairing (interleaved (2i, 2i+1) or
// half split (i, i + R/2)), VEC, the number of pairs a thread owns, chosen
// so a thread's loads are 16 bytes wide where alignment allows, and SRC, the
// angle source (shared table, per-head table, cos/sin tables).
//
// The LRPE dialect (cuprope/lrpe.py, seed 000) reuses the same kernel: two
// more template parameters, ACT (an activation applied to x before the
// rotation) and BWD (the fused backward through rotation and activation, with
// x read beside dO). Their defaults, ACT = kActNone and BWD = false, compile
// every LRPE hook away, so the plain RoPE instantiations are unchanged.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "args.cuh"
#include "constants.cuh"

namespace cuprope {

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

// A pack's elements as fp32 and back, for the instruction-bound LRPE
// kernels. The 16-bit types go two elements per 32-bit word: bf16 widens by
// a shift or a mask (element by element the compiler first extracted each
// half, two instructions per element), and both narrow two elements per
// instruction (element by element, pairs that land in different packs were
// narrowed together and split apart again). The memory-bound rotate_chunk
// keeps the element-wise form: there it measured 0.5-1 % slower (NOTES 24).
template <typename T> constexpr bool kIsHalf = false;
template <> constexpr bool kIsHalf<__half> = true;
template <typename T, int N>
__device__ __forceinline__ void unpack_f32(const Pack<T, N>& p, float (&f)[N]) {
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      // (the pack is aligned to 16 bytes and i is even: a whole 32-bit word)
      if constexpr (!kIsHalf<T>) {  // bf16: the high half of fp32
        const unsigned w = *reinterpret_cast<const unsigned*>(&p.v[i]);
        f[i] = __uint_as_float(w << 16);
        f[i + 1] = __uint_as_float(w & 0xffff0000u);
      } else {
        const float2 g = __half22float2(*reinterpret_cast<const __half2*>(&p.v[i]));
        f[i] = g.x;
        f[i + 1] = g.y;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_f32(p.v[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void pack_f32(const float (&f)[N], Pack<T, N>& p) {
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      if constexpr (kIsHalf<T>) {
        *reinterpret_cast<__half2*>(&p.v[i]) = __floats2half2_rn(f[i], f[i + 1]);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(&p.v[i]) = __floats2bfloat162_rn(f[i], f[i + 1]);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p.v[i] = from_f32<T>(f[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(long long ptr, long long off) {
  return *reinterpret_cast<const Pack<T, N>*>(reinterpret_cast<const T*>(ptr) + off);
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(long long ptr, long long off, const Pack<T, N>& p) {
  *reinterpret_cast<Pack<T, N>*>(reinterpret_cast<T*>(ptr) + off) = p;
}

// A row of a tensor: its base pointer and the element offset of the row.
struct Row {
  long long ptr, off;
};

// 16 bytes global -> shared with no register in between (cp.async, sm_80+;
// a plain copy before). Completion is per thread: cp_async_wait<N>() returns
// once at most N of this thread's committed groups are still in flight, and
// makes the finished ones visible to this thread.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// cos and sin of position * inv_freq. The product is formed in float64 and
// reduced mod pi/2 there: angle = k * pi/2 + r, with k the nearest integer to
// angle * 2/pi (one FMA adding 1.5 * 2^52 leaves k in the low mantissa bits)
// and r = angle - k * (PIO2_HI + PIO2_LO) by two FMAs, exact to ~1e-16 with
// |r| <= pi/4 (+ a rounding). Rounding r to fp32 costs at most 2^-26 rad; fp32
// polynomials on [-pi/4, pi/4] (fitted for this range: within 0.72 ulp for
// sin, 0.87 ulp for cos) and the quadrant k mod 4 finish it. Against a fp32
// sincosf after a float64 reduction mod 2*pi this skips sincosf's own
// second reduction and its never-taken slow path (registers the compiler
// had to keep for it), and the error drops from ~2e-7 to ~7e-8 at any
// position below 2^31 (|angle| * 2/pi must stay below 2^51).
__device__ __forceinline__ float2 exact_cos_sin(long long pos, double inv_freq) {
  const double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  const double kTwoOverPi = 0.6366197723675814;
  const double kPio2Hi = 1.5707963267948966;
  const double kPio2Lo = 6.123233995736766e-17;
  const double angle = __dmul_rn(static_cast<double>(pos), inv_freq);
  const double t = fma(angle, kTwoOverPi, kMagic);
  const double k = t - kMagic;
  const int q = __double2loint(t);  // k mod 2^32, two's complement
  double r = fma(-k, kPio2Hi, angle);
  r = fma(-k, kPio2Lo, r);
  const float x = static_cast<float>(r);
  const float x2 = x * x;
  float ps = fmaf(x2, -1.95152868e-4f, 8.33216123e-3f);
  ps = fmaf(x2, ps, -1.66666552e-1f);
  const float sn = fmaf(x2 * x, ps, x);
  float pc = fmaf(x2, 2.44331586e-5f, -1.38873165e-3f);
  pc = fmaf(x2, pc, 4.16666456e-2f);
  pc = fmaf(x2, pc, -0.5f);
  const float cn = fmaf(x2, pc, 1.f);
  // angle = r + k * pi/2: quadrant 1 gives (-sin r, cos r), 2 (-cos, -sin), 3 (sin, -cos)
  const float c = (q & 1) ? sn : cn;
  const float s = (q & 1) ? cn : sn;
  return make_float2(((q + 1) & 2) ? -c : c, (q & 2) ? -s : s);
}

// e^(i * sign * pos * inv_freq) as (cos, sin): exact_cos_sin with the sign
// on sin and no scale (a token run composes these; the scale comes after).
__device__ __forceinline__ float2 unit_rotation(long long pos, double inv_freq, float sign) {
  const float2 cs = exact_cos_sin(pos, inv_freq);
  return make_float2(cs.x, cs.y * sign);
}

// The product z * w, w a unit complex number (angles add, |z| is kept): two
// roundings per component, so each step of a token run adds at most ~1.2e-7.
__device__ __forceinline__ float2 compose(float2 z, float2 w) {
  return make_float2(fmaf(z.x, w.x, -(z.y * w.y)), fmaf(z.y, w.x, z.x * w.y));
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

// Inverse frequency of pair j in row `frow` of the frequency table.
__device__ __forceinline__ double inv_freq_at(const RopeArgs& a, long long frow, int j) {
  return reinterpret_cast<const double*>(a.inv_freq_ptr)[frow * a.freq_sh + j];
}

// (cos, sin) of pos * f with the scale and the sin sign applied.
__device__ __forceinline__ float2 scaled_cos_sin(const RopeArgs& a, long long pos, double f) {
  const float2 cs = exact_cos_sin(pos, f);
  const float sc = static_cast<float>(a.scale);
  return make_float2(cs.x * sc, cs.y * sc * static_cast<float>(a.sin_sign));
}

// (cos, sin) of pair j for the token at (b, s) and head row `frow` of the
// frequency table, with scale and sin sign applied. pos0: the token's position
// in stream 0, which every pair uses when there is no stream map (callers
// looping over heads load it once).
__device__ __forceinline__ float2 pair_cos_sin(const RopeArgs& a, unsigned b, unsigned s, int j,
                                               long long frow, long long pos0) {
  const long long pos =
      a.stream_map_ptr
          ? token_position(a, b, s, reinterpret_cast<const int*>(a.stream_map_ptr)[j])
          : pos0;
  return scaled_cos_sin(a, pos, inv_freq_at(a, frow, j));
}

__device__ __forceinline__ float2 pair_cos_sin(const RopeArgs& a, unsigned b, unsigned s, int j,
                                               long long frow) {
  return pair_cos_sin(a, b, s, j, frow, a.stream_map_ptr ? 0 : token_position(a, b, s, 0));
}

constexpr int kThreads = 256;  // most threads per block (whole warps)

// Where pair v of a lane's chunk sits in its two packs: element i1 of pack k1
// and element i2 of pack k2. Half split: (p0[v], p1[v]). Interleaved: pack 0
// holds pairs [0, VEC/2) and pack 1 the rest, each as two adjacent elements;
// with VEC == 1 the pair is the two one-element packs.
struct Slot {
  int k1, i1, k2, i2;
};
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ constexpr Slot pair_slot(int v) {
  if (!INTERLEAVED) return {0, v, 1, v};
  if (VEC == 1) return {0, 0, 1, 0};
  const int k = 2 * v < VEC ? 0 : 1;
  return {k, (2 * v) % VEC, k, (2 * v) % VEC + 1};
}

// Where the warp's shared cos/sin slice keeps pair j: column-major over
// groups of G pairs (G: the consecutive pairs a pack holds), so when the
// lanes of a row read pair v of their chunks in one instruction they read
// consecutive slots (no bank conflicts; a row-major slice had 4-way conflicts
// at D 128 and 8-way at D 256). Slot j % G * (npairs / G) + j / G.
template <bool INTERLEAVED, int VEC>
constexpr int kCsGroup = (INTERLEAVED && VEC > 1) ? VEC / 2 : VEC;  // G
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ int cs_slot(int j, int npairs) {
  constexpr int G = kCsGroup<INTERLEAVED, VEC>;
  return (j % G) * (npairs / G) + j / G;
}
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ int cs_stride(int npairs) {  // slots between pair j and j + 1
  return npairs / kCsGroup<INTERLEAVED, VEC>;
}

// Rotate the pairs of a chunk held in two packs (pair_slot). cos/sin of pair
// v (pair_value): cs0[v * stride], or cs1[(v - VEC/2) * stride] for the
// interleaved pairs of pack 1 (stride 1 for registers; cs_slot's column
// stride in shared memory).
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ float2 pair_value(const float2* cs0, const float2* cs1, int stride,
                                             int v) {
  return (INTERLEAVED && VEC > 1 && 2 * v >= VEC) ? cs1[(v - VEC / 2) * stride] : cs0[v * stride];
}

template <typename T, bool INTERLEAVED, int VEC>
__device__ __forceinline__ void rotate_chunk(Pack<T, VEC>& p0, Pack<T, VEC>& p1,
                                             const float2* cs0, const float2* cs1, int stride) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    const Slot q = pair_slot<INTERLEAVED, VEC>(v);
    T& e1 = (q.k1 == 0 ? p0 : p1).v[q.i1];
    T& e2 = (q.k2 == 0 ? p0 : p1).v[q.i2];
    const float2 cs = pair_value<INTERLEAVED, VEC>(cs0, cs1, stride, v);
    const float x1 = to_f32(e1);
    const float x2 = to_f32(e2);
    e1 = from_f32<T>(x1 * cs.x - x2 * cs.y);
    e2 = from_f32<T>(x2 * cs.x + x1 * cs.y);
  }
}


// fp32 multiply, add and subtract rounded to nearest with subnormals kept:
// inline PTX, because CuPy compiles with -ftz=true while PyTorch's kernels
// keep subnormals, and an intrinsic would be neither contracted nor exact.
__device__ __forceinline__ float mul_exact(float x, float y) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}
__device__ __forceinline__ float add_exact(float x, float y) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}
__device__ __forceinline__ float sub_exact(float x, float y) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}

// x * y rounded to T, as PyTorch stores a product evaluated eagerly in T.
template <typename T>
__device__ __forceinline__ float rounded_product(T x, T y) {
  return to_f32(from_f32<T>(mul_exact(to_f32(x), to_f32(y))));
}

// HF's o = x * cos + rotate_half(x) * sin for a chunk, rounded exactly as
// PyTorch's eager kernels round it in T (each product to T, then the sum), so
// the result equals HF's bit for bit. Pair (x1, x2) at elements (i1, i2) reads
// the tables at the same elements:
//   forward:  o1 = x1 c1 - x2 s1,   o2 = x2 c2 + x1 s2
//   backward (autograd of that expression): d1 = g1 c1 + g2 s2,  d2 = g2 c2 - g1 s1
// The chunk's cos/sin are in tc[0] | tc[1] and ts[0] | ts[1], laid out like p0 | p1.
template <typename T, bool INTERLEAVED, int VEC>
__device__ __forceinline__ void rotate_table(Pack<T, VEC>& p0, Pack<T, VEC>& p1,
                                             const Pack<T, VEC>* tc, const Pack<T, VEC>* ts,
                                             bool backward) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    const Slot q = pair_slot<INTERLEAVED, VEC>(v);
    const int k1 = q.k1, i1 = q.i1, k2 = q.k2, i2 = q.i2;
    T& e1 = (k1 == 0 ? p0 : p1).v[i1];
    T& e2 = (k2 == 0 ? p0 : p1).v[i2];
    const T x1 = e1, x2 = e2;
    const float a1 = rounded_product(x1, tc[k1].v[i1]);
    const float a2 = rounded_product(x2, tc[k2].v[i2]);
    if (!backward) {
      e1 = from_f32<T>(sub_exact(a1, rounded_product(x2, ts[k1].v[i1])));
      e2 = from_f32<T>(add_exact(a2, rounded_product(x1, ts[k2].v[i2])));
    } else {
      e1 = from_f32<T>(add_exact(a1, rounded_product(x2, ts[k2].v[i2])));
      e2 = from_f32<T>(sub_exact(a2, rounded_product(x1, ts[k1].v[i1])));
    }
  }
}

// ---------------------------------------------------------------- LRPE dialect

// The sigmoid-based activations take e^-x from the SFU (__expf: ex2.approx of
// x * log2(e), within 2 + 1.2|x| ulp) and divide with __fdividef (a reciprocal
// and a multiply, 2 ulp): about 5 instructions for expf's and IEEE division's
// ~16, which made the SiLU forward instruction-bound. The relative error grows
// with |x| only where the result is tiny (|x| e^-|x| or e^-|x|), so every
// result stays within ~1.5e-7 absolute of the exact one, or a few ulp of
// itself. A denominator past 2^126 (x < -87.3) makes __fdividef return 0,
// where the exact value is below 1e-36.
template <int ACT>
__device__ __forceinline__ float act_forward(float x) {
  if constexpr (ACT == kActRelu) {
    return x < 0.f ? 0.f : x;  // NaN stays NaN
  } else if constexpr (ACT == kActSigmoid) {
    return __fdividef(1.f, 1.f + __expf(-x));
  } else if constexpr (ACT == kActSilu) {
    return __fdividef(x, 1.f + __expf(-x));
  } else {
    return x;
  }
}

// d act(x) / dx for the elementwise activations. With e = exp(-|x|) <= 1,
// sigmoid(|x|) = 1/(1+e) and sigmoid(-|x|) = e/(1+e): no overflow, and both
// tails keep their relative precision.
template <int ACT>
__device__ __forceinline__ float act_grad(float x) {
  if constexpr (ACT == kActRelu) {
    return x > 0.f ? 1.f : 0.f;
  } else {
    const float e = __expf(-fabsf(x));
    const float hi = __fdividef(1.f, 1.f + e);  // sigmoid(|x|); d = 1 + e is in [1, 2]
    const float lo = e * hi;                    // sigmoid(-|x|)
    if constexpr (ACT == kActSigmoid) {
      return hi * lo;  // sigmoid(x) * sigmoid(-x)
    } else {           // silu: sigmoid(x) * (1 + x * sigmoid(-x))
      const bool pos = x >= 0.f;
      return (pos ? hi : lo) * (1.f + x * (pos ? lo : hi));
    }
  }
}

// Rotate fp32 pairs (v1[v], v2[v]) and round them into two packs (half split).
template <typename T, int VEC>
__device__ __forceinline__ void rotate_f32(const float* v1, const float* v2, const float2* cs,
                                           Pack<T, VEC>& p0, Pack<T, VEC>& p1) {
  float o1[VEC], o2[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    o1[v] = v1[v] * cs[v].x - v2[v] * cs[v].y;
    o2[v] = v2[v] * cs[v].x + v1[v] * cs[v].y;
  }
  pack_f32(o1, p0);
  pack_f32(o2, p1);
}

// VEC floats of the sequence-softmax statistics, in loads of at most 16 bytes
// (the statistics buffer is only assumed 16-byte aligned).
template <int VEC>
__device__ __forceinline__ Pack<float, VEC> load_stats(long long ptr, long long off) {
  if constexpr (VEC > 4) {
    Pack<float, VEC> p;
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      const Pack<float, 4> q = load_pack<float, 4>(ptr, off + i);
#pragma unroll
      for (int j = 0; j < 4; ++j) p.v[i + j] = q.v[j];
    }
    return p;
  } else {
    return load_pack<float, VEC>(ptr, off);
  }
}

// One chunk of the elementwise and sequence-softmax LRPE modes (half split,
// every pair rotates). On entry p0/p1 hold x (forward) or dO (backward; cs
// then carries -sin, so the rotation is R^T), xa0/xa1 hold x in the backward;
// on exit p0/p1 hold the result. scol: index of this head's element 0 in one
// plane of the sequence-softmax statistics; e0/e1: element offsets of the packs.
//   forward:  o = R act(x)
//   backward: dx = act'(x) * R^T dO, or s * (g - <g, s>_seq) with g = R^T dO
template <typename T, int VEC, int ACT, bool BWD>
__device__ __forceinline__ void lrpe_chunk(const RopeArgs& a, Pack<T, VEC>& p0, Pack<T, VEC>& p1,
                                           const Pack<T, VEC>& xa0, const Pack<T, VEC>& xa1,
                                           const float2* cs, long long scol, long long e0,
                                           long long e1) {
  float v1[VEC], v2[VEC];
  unpack_f32(p0, v1);
  unpack_f32(p1, v2);
  [[maybe_unused]] Pack<float, VEC> r0, r1, l0, l1, d0, d1;  // sequence statistics
  if constexpr (ACT == kActSoftmaxSeq) {
    const long long pl = a.stats_plane;
    r0 = load_stats<VEC>(a.stats_ptr, scol + e0);
    r1 = load_stats<VEC>(a.stats_ptr, scol + e1);
    l0 = load_stats<VEC>(a.stats_ptr, pl + scol + e0);
    l1 = load_stats<VEC>(a.stats_ptr, pl + scol + e1);
    if constexpr (BWD) {
      d0 = load_stats<VEC>(a.stats_ptr, 2 * pl + scol + e0);
      d1 = load_stats<VEC>(a.stats_ptr, 2 * pl + scol + e1);
    }
  }
  if constexpr (!BWD) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      if constexpr (ACT == kActSoftmaxSeq) {
        v1[v] = expf(v1[v] - r0.v[v]) / l0.v[v];
        v2[v] = expf(v2[v] - r1.v[v]) / l1.v[v];
      } else {
        v1[v] = act_forward<ACT>(v1[v]);
        v2[v] = act_forward<ACT>(v2[v]);
      }
    }
    rotate_f32<T, VEC>(v1, v2, cs, p0, p1);
  } else {
    float x1[VEC], x2[VEC], o1[VEC], o2[VEC];
    unpack_f32(xa0, x1);
    unpack_f32(xa1, x2);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const float g1 = v1[v] * cs[v].x - v2[v] * cs[v].y;
      const float g2 = v2[v] * cs[v].x + v1[v] * cs[v].y;
      if constexpr (ACT == kActSoftmaxSeq) {
        const float s1 = expf(x1[v] - r0.v[v]) / l0.v[v];
        const float s2 = expf(x2[v] - r1.v[v]) / l1.v[v];
        o1[v] = s1 * (g1 - d0.v[v]);
        o2[v] = s2 * (g2 - d1.v[v]);
      } else {
        o1[v] = act_grad<ACT>(x1[v]) * g1;
        o2[v] = act_grad<ACT>(x2[v]) * g2;
      }
    }
    pack_f32(o1, p0);
    pack_f32(o2, p1);
  }
}

// Segmented warp reductions over the cpr consecutive lanes [leader, leader +
// cpr) that own one row; cpr need not be a power of two. Lane c0 (its index in
// the segment) folds in lane c0 + d while that lane is in the segment, so after
// the step with d the lane holds the fold of [c0, min(c0 + 2d, cpr)); lane 0 of
// the segment ends with the whole row and broadcasts it. Every lane of the
// warp must call these together (full-mask shuffles); lanes of a partial
// segment past the last row get values nobody uses.
__device__ __forceinline__ float seg_max(float v, int c0, int cpr, int leader) {
  for (int d = 1; d < cpr; d <<= 1) {
    const float o = __shfl_down_sync(0xffffffffu, v, d);
    if (c0 + d < cpr) v = fmaxf(v, o);
  }
  return __shfl_sync(0xffffffffu, v, leader);
}

__device__ __forceinline__ float seg_sum(float v, int c0, int cpr, int leader) {
  for (int d = 1; d < cpr; d <<= 1) {
    const float o = __shfl_down_sync(0xffffffffu, v, d);
    if (c0 + d < cpr) v += o;
  }
  return __shfl_sync(0xffffffffu, v, leader);
}

// -inf (NVRTC has neither <math.h> nor INFINITY).
__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

// exp(x - ref) with ref = 0 when the max is -inf (an all -inf row sums to 0
// and its softmax is 0/0 = NaN, as in torch).
__device__ __forceinline__ float softmax_ref(float m) { return m == neg_inf() ? 0.f : m; }

// g = R^T dO and s = exp(x - ref) / sum for one chunk of the head-softmax backward.
template <typename T, int VEC, bool PER_HEAD>
__device__ __forceinline__ void softmax_grad_chunk(const RopeArgs& a, const float2* my_cs,
                                                   unsigned b, unsigned s, int h, int c,
                                                   int npairs, long long g_off,
                                                   const Pack<T, VEC>& x0, const Pack<T, VEC>& x1,
                                                   float ref, float sum, float* g1, float* g2,
                                                   float* s1, float* s2) {
  const Pack<T, VEC> d0 = load_pack<T, VEC>(a.in_ptr[0], g_off);
  const Pack<T, VEC> d1 = load_pack<T, VEC>(a.in_ptr[0], g_off + npairs);
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    const float2 cs = PER_HEAD ? pair_cos_sin(a, b, s, c * VEC + v, h)
                               : my_cs[cs_slot<false, VEC>(c * VEC + v, npairs)];
    const float o1 = to_f32(d0.v[v]);
    const float o2 = to_f32(d1.v[v]);
    g1[v] = o1 * cs.x - o2 * cs.y;  // cs.y = -sin: the transposed rotation
    g2[v] = o2 * cs.x + o1 * cs.y;
    s1[v] = expf(to_f32(x0.v[v]) - ref) / sum;
    s2[v] = expf(to_f32(x1.v[v]) - ref) / sum;
  }
}

// Softmax over the head dim (ACT == kActSoftmax), forward or backward, for the
// warp's heads [h0, h1) of token (b, s). Rows are owned as in rope_kernel: the
// cpr lanes of segment `sub` own head hb + sub, lane c0 its chunks c0, c0 +
// cpr, ... (several when chunks > 32). Every lane runs every loop trip (rows
// and chunks are predicated, never skipped) because the reductions shuffle.
// A lane keeps its chunk in registers across the reductions when it owns one
// (chunks <= 32, the usual case) and reloads it otherwise.
template <typename T, int VEC, bool PER_HEAD, bool BWD>
__device__ __forceinline__ void softmax_head_rows(const RopeArgs& a, const float2* my_cs,
                                                  unsigned b, unsigned s, int h0, int h1,
                                                  int npairs, int chunks, int cpr, int rpw,
                                                  int lane) {
  const int sub = lane / cpr;
  const int c0 = lane - sub * cpr;
  const int leader = sub * cpr;
  const int kmax = (chunks + cpr - 1) / cpr;  // chunks per lane, the same for the whole warp
  const long long xptr = BWD ? a.aux_ptr : a.in_ptr[0];
  const long long x_base = BWD ? b * a.aux_sb + s * a.aux_ss : b * a.in_sb[0] + s * a.in_ss[0];
  const long long x_sh = BWD ? a.aux_sh : a.in_sh[0];
  const long long g_base = b * a.in_sb[0] + s * a.in_ss[0];
  const long long o_base = b * a.out_sb[0] + s * a.out_ss[0];
  for (int hb = h0; hb < h1; hb += rpw) {
    const int h = hb + sub;
    const bool row = sub < rpw && h < h1;
    const long long x_row = x_base + h * x_sh;
    const long long o_row = o_base + h * a.out_sh[0];
    Pack<T, VEC> x0, x1;
    // 1. lane-local online max m and sum l of exp(x - softmax_ref(m))
    float m = neg_inf(), l = 0.f;
    for (int k = 0; k < kmax; ++k) {
      const int c = c0 + k * cpr;
      if (row && c < chunks) {
        x0 = load_pack<T, VEC>(xptr, x_row + c * VEC);
        x1 = load_pack<T, VEC>(xptr, x_row + c * VEC + npairs);
        float cm = m;
#pragma unroll
        for (int v = 0; v < VEC; ++v) cm = fmaxf(cm, fmaxf(to_f32(x0.v[v]), to_f32(x1.v[v])));
        l *= m == neg_inf() ? 0.f : expf(m - cm);  // l is 0 (or NaN) while m is -inf
        m = cm;
        const float ref = softmax_ref(m);
#pragma unroll
        for (int v = 0; v < VEC; ++v) l += expf(to_f32(x0.v[v]) - ref) + expf(to_f32(x1.v[v]) - ref);
      }
    }
    // 2. the row's max and sum
    const float ref = softmax_ref(seg_max(m, c0, cpr, leader));
    const float sum = seg_sum(m == neg_inf() ? 0.f * l : l * expf(m - ref), c0, cpr, leader);
    if constexpr (!BWD) {
      // 3. s = exp(x - ref) / sum, rotated
      for (int k = 0; k < kmax; ++k) {
        const int c = c0 + k * cpr;
        if (row && c < chunks) {
          if (kmax > 1) {
            x0 = load_pack<T, VEC>(xptr, x_row + c * VEC);
            x1 = load_pack<T, VEC>(xptr, x_row + c * VEC + npairs);
          }
          float v1[VEC], v2[VEC];
          float2 cs[VEC];
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            v1[v] = expf(to_f32(x0.v[v]) - ref) / sum;
            v2[v] = expf(to_f32(x1.v[v]) - ref) / sum;
            cs[v] = PER_HEAD ? pair_cos_sin(a, b, s, c * VEC + v, h)
                             : my_cs[cs_slot<false, VEC>(c * VEC + v, npairs)];
          }
          Pack<T, VEC> o0, o1;
          rotate_f32<T, VEC>(v1, v2, cs, o0, o1);
          store_pack<T, VEC>(a.out_ptr[0], o_row + c * VEC, o0);
          store_pack<T, VEC>(a.out_ptr[0], o_row + c * VEC + npairs, o1);
        }
      }
    } else {
      // 3. g = R^T dO, s, and the row's <g, s>
      const long long g_row = g_base + h * a.in_sh[0];
      float g1[VEC], g2[VEC], s1[VEC], s2[VEC];
      float dot = 0.f;
      for (int k = 0; k < kmax; ++k) {
        const int c = c0 + k * cpr;
        if (row && c < chunks) {
          if (kmax > 1) {
            x0 = load_pack<T, VEC>(xptr, x_row + c * VEC);
            x1 = load_pack<T, VEC>(xptr, x_row + c * VEC + npairs);
          }
          softmax_grad_chunk<T, VEC, PER_HEAD>(a, my_cs, b, s, h, c, npairs, g_row + c * VEC, x0,
                                               x1, ref, sum, g1, g2, s1, s2);
#pragma unroll
          for (int v = 0; v < VEC; ++v) dot += g1[v] * s1[v] + g2[v] * s2[v];
        }
      }
      dot = seg_sum(dot, c0, cpr, leader);
      // 4. dx = s * (g - <g, s>)
      for (int k = 0; k < kmax; ++k) {
        const int c = c0 + k * cpr;
        if (row && c < chunks) {
          if (kmax > 1) {
            x0 = load_pack<T, VEC>(xptr, x_row + c * VEC);
            x1 = load_pack<T, VEC>(xptr, x_row + c * VEC + npairs);
            softmax_grad_chunk<T, VEC, PER_HEAD>(a, my_cs, b, s, h, c, npairs, g_row + c * VEC,
                                                 x0, x1, ref, sum, g1, g2, s1, s2);
          }
          Pack<T, VEC> o0, o1;
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            o0.v[v] = from_f32<T>(s1[v] * (g1[v] - dot));
            o1.v[v] = from_f32<T>(s2[v] * (g2[v] - dot));
          }
          store_pack<T, VEC>(a.out_ptr[0], o_row + c * VEC, o0);
          store_pack<T, VEC>(a.out_ptr[0], o_row + c * VEC + npairs, o1);
        }
      }
    }
  }
}

// Each warp owns one (token, head group): heads [g*heads_per_group, ...) of the
// concatenated head list (q heads, then k heads). A lane owns one chunk (VEC
// pairs of a head, or pass-through elements when copying dims >= R); the warp
// covers 32/cpr heads per step, cpr = min(chunks, 32) lanes per head.
//
// SRC, the angle source:
//   kSrcShared:  the warp computes cos/sin once per (token, pair) into its
//                slice of shared memory (cs_slot's layout); every head of q
//                and k reuses them.
//   kSrcPerHead: one frequency row per head (freq_sh != 0); cos/sin per
//                (token, head, pair). With implicit positions (tok_tile != 0)
//                a warp owns one head of tok_tile consecutive tokens instead
//                ("token runs"), so cos/sin advance by composition along
//                the tokens rather than by a sincos per row, and with
//                16-byte packs the rows load through a ring of their own
//                (NOTES.md 21-22).
//   kSrcTable:   cos and sin read from the caller's tables (HF layout), once
//                per (token, chunk), and applied as PyTorch evaluates HF's
//                formula (rotate_table).
// Per head a lane then only advances a pointer, loads one or two 16-byte
// packs, rotates and stores. Where packs are 16 bytes and the source is not
// per-head (kStages > 0), the loads go through a per-warp shared-memory ring
// (cp.async), kStages - 1 heads ahead, the first ones issued before the
// cos/sin are computed, and cos/sin (or the table packs) are re-read from
// shared memory per head; otherwise the lane loads kRows heads into registers
// (benchmarks/NOTES.md 13-17 for what each choice measured).
//
// ACT, BWD (LRPE, half split, one tensor, R = D): the activation is applied to
// x before the rotation (BWD: dx = act'(x) * R^T dO with x read from aux_ptr).
// The head-dim softmax takes its own warp-synchronous path (softmax_head_rows).
//
// Blocks that must fit an SM at once (CUPROPE_MIN_BLOCKS*, a register cap):
// the plain shared-angle kernels, and the per-head plain and elementwise LRPE
// kernels by element size and direction; the others are uncapped.
template <typename T, bool INTERLEAVED, int VEC, int SRC, int ACT = kActNone, bool BWD = false>
__global__ void __launch_bounds__(kThreads, (SRC == kSrcShared && ACT == kActNone) ? CUPROPE_MIN_BLOCKS
                                            : SRC != kSrcPerHead || ACT > kActSilu ? 1
                                            : BWD            ? CUPROPE_MIN_BLOCKS_PH_BWD
                                            : sizeof(T) == 4 ? CUPROPE_MIN_BLOCKS_PH32
                                                             : CUPROPE_MIN_BLOCKS_PH16)
    rope_kernel(const RopeArgs a) {
  static_assert(ACT == kActNone || !INTERLEAVED, "LRPE pairs are half split");
  static_assert(ACT != kActNone || !BWD, "the plain backward is the forward with -sin");
  static_assert(ACT == kActNone || SRC != kSrcTable, "LRPE computes its angles");
  constexpr bool PER_HEAD = SRC == kSrcPerHead;
  constexpr bool TABLE = SRC == kSrcTable;
  // [warps per block][R/2] cos/sin (kSrcShared), then the staged loads' rings
  extern __shared__ float2 warp_cs[];

  const int npairs = static_cast<int>(a.rot_dim >> 1);
  const int rot_chunks = npairs / VEC;
  // copy_rest: packs per pass-through chunk (0: none, in-place)
  const int cw = static_cast<int>(a.copy_rest);
  const int chunks = rot_chunks + (cw ? static_cast<int>((a.head_dim - a.rot_dim) / (VEC * cw)) : 0);
  const int cpr = min(chunks, 32);
  const int rpw = 32 / cpr;
  const int lane = threadIdx.x & 31;
  const int sub = static_cast<int>(static_cast<unsigned>(lane) / static_cast<unsigned>(cpr));
  const int heads0 = static_cast<int>(a.heads[0]);
  const int htot = heads0 + static_cast<int>(a.heads[1]);
  const unsigned unit = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const unsigned n_seq = static_cast<unsigned>(a.n_seq);
  // The warp's token (b, s) and heads [h0, h1); token runs: its one head h0
  // and tokens [s, s + tok_tile) of sequence b, the unit ordered (b, tile, head).
  const bool runs = PER_HEAD && a.tok_tile != 0;
  const unsigned tile = static_cast<unsigned>(a.tok_tile);
  const unsigned groups = runs ? (n_seq + tile - 1) / tile : static_cast<unsigned>(a.head_groups);
  if (unit >= static_cast<unsigned>(a.n_batch) * groups * (runs ? htot : n_seq)) return;
  const unsigned tok = runs ? unit / htot : unit / groups;  // runs: b * groups + tile index
  const int h0 = runs ? static_cast<int>(unit - tok * htot)
                      : static_cast<int>(unit - tok * groups) * static_cast<int>(a.heads_per_group);
  const int h1 = runs ? h0 + 1 : min(htot, h0 + static_cast<int>(a.heads_per_group));
  const unsigned b = tok / (runs ? groups : n_seq);
  const unsigned s = runs ? (tok - b * groups) * tile : tok - b * n_seq;
  float2* my_cs = warp_cs + (threadIdx.x >> 5) * npairs;
  // the token's position in stream 0: loaded once, not once per pair (with
  // few tokens, as in decode, the launch is one dependent chain of loads)
  auto stream0_position = [&]() { return a.stream_map_ptr ? 0 : token_position(a, b, s, 0); };
  // this lane's share of the token's cos/sin into the warp's slice
  // (kSrcShared). pos0, f0: the token's stream-0 position and the inverse
  // frequency of the lane's first pair, which the staged path loads before
  // priming its ring
  auto warp_cos_sin_from = [&](long long pos0, double f0) {
    for (int p = lane; p < npairs; p += 32) {
      const float2 cs = p == lane && !a.stream_map_ptr ? scaled_cos_sin(a, pos0, f0)
                                                       : pair_cos_sin(a, b, s, p, 0, pos0);
      my_cs[cs_slot<INTERLEAVED, VEC>(p, npairs)] = cs;
    }
    __syncwarp();
  };
  auto warp_cos_sin = [&]() {
    warp_cos_sin_from(stream0_position(), lane < npairs ? inv_freq_at(a, 0, lane) : 0.0);
  };
  if constexpr (ACT == kActSoftmax) {  // every lane stays: the row reductions shuffle
    if (!PER_HEAD) warp_cos_sin();
    softmax_head_rows<T, VEC, PER_HEAD, BWD>(a, my_cs, b, s, h0, h1, npairs, chunks, cpr, rpw, lane);
    return;
  }
  // rows (heads) a lane keeps in flight per step when it loads into registers
  // (no ring: narrower packs, the per-head source in head mode, LRPE with
  // shared angles)
  constexpr int kRows = sizeof(T) == 4 ? CUPROPE_ROWS32 : CUPROPE_ROWS16;
  constexpr int kStages = (SRC != kSrcPerHead && ACT == kActNone && sizeof(T) * VEC == 16)
                              ? (sizeof(T) == 4 ? CUPROPE_STAGES32 : CUPROPE_STAGES16)
                              : 0;
  const int step = kRows * rpw;  // heads a lane advances per trip
  const bool active = sub < rpw;  // lanes left over when cpr does not divide 32 idle

  const long long in_base0 = b * a.in_sb[0] + s * a.in_ss[0];
  const long long in_base1 = b * a.in_sb[1] + s * a.in_ss[1];
  const long long out_base0 = b * a.out_sb[0] + s * a.out_ss[0];
  const long long out_base1 = b * a.out_sb[1] + s * a.out_ss[1];
  const long long aux_base = b * a.aux_sb + s * a.aux_ss;

  // Element offsets of chunk c's packs; `two`: a second pack (every rotated
  // chunk, and pass-through chunks of two packs). A region's chunks take its
  // first half with their first pack and its second half with the second, so
  // each load instruction of the warp covers whole contiguous sectors: rotated
  // [0, R) splits at R/2 (interleaved too: pairs never straddle it, since
  // R/2 is a multiple of VEC), pass-through [R, D) at its middle. The one
  // exception, interleaved with one-element packs, keeps a pair's two
  // elements side by side.
  int c = lane - sub * cpr;
  int e0 = 0, e1 = 0;  // within a head: D < 2^31
  bool rot = false, two = false;
  auto geometry = [&]() {
    rot = c < rot_chunks;
    two = rot || cw == 2;
    if (rot) {
      e0 = (INTERLEAVED && VEC == 1) ? 2 * c : c * VEC;
      e1 = (INTERLEAVED && VEC == 1) ? e0 + 1 : e0 + npairs;
    } else {
      e0 = 2 * npairs + (c - rot_chunks) * VEC;
      e1 = e0 + (chunks - rot_chunks) * VEC;  // used when cw == 2
    }
  };
  // the pair of the rotated chunk at pair_slot v (geometry() set e0, e1)
  auto pair_at = [&](int v) {
    return INTERLEAVED ? ((2 * v < VEC ? e0 : e1) + (2 * v) % VEC) / 2 : e0 + v;
  };
  // (pointer, element offset) of head h's row in the inputs and outputs; h
  // indexes the concatenated head list, so tensor 1 (k) from heads0 on
  auto in_row = [&](int h) {
    const bool is_k = h >= heads0;
    return Row{is_k ? a.in_ptr[1] : a.in_ptr[0],
               is_k ? in_base1 + (h - heads0) * a.in_sh[1] : in_base0 + h * a.in_sh[0]};
  };
  auto out_row = [&](int h) {
    const bool is_k = h >= heads0;
    return Row{is_k ? a.out_ptr[1] : a.out_ptr[0],
               is_k ? out_base1 + (h - heads0) * a.out_sh[1] : out_base0 + h * a.out_sh[0]};
  };
  // load the rows h, h + rpw, ... (kRows of them) of chunk c (geometry() set e0, e1, two)
  auto load_rows = [&](int h, Pack<T, VEC> (&x)[kRows][2], Pack<T, VEC> (&xa)[kRows][2]) {
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const int hu = h + u * rpw;
      if (hu >= h1) continue;
      const Row r = in_row(hu);
      x[u][0] = load_pack<T, VEC>(r.ptr, r.off + e0);
      if (two) x[u][1] = load_pack<T, VEC>(r.ptr, r.off + e1);
      if constexpr (BWD) {
        const long long aoff = aux_base + hu * a.aux_sh;
        xa[u][0] = load_pack<T, VEC>(a.aux_ptr, aoff + e0);
        xa[u][1] = load_pack<T, VEC>(a.aux_ptr, aoff + e1);
      }
    }
  };

  if constexpr (kStages > 0) {
    // Staged: lane slots (stage st, pack k) at ring[(2 * st + k) * 32] of the
    // warp's ring, which follows the block's cos/sin slices (kSrcShared). Head
    // h + j * rpw of the lane's chunk goes to stage j mod kStages, one commit
    // group per head. kSrcTable: four more slots after the stages hold the
    // chunk's cos (packs 0, 1) and sin (2, 3), one group issued first.
    using P = Pack<T, VEC>;
    constexpr int kSlots = 2 * kStages + (TABLE ? 4 : 0);
    P* ring = reinterpret_cast<P*>(warp_cs + (TABLE ? 0 : (blockDim.x >> 5) * npairs)) +
              (threadIdx.x >> 5) * (kSlots * 32) + lane;
    [[maybe_unused]] P* tslot = ring + 2 * kStages * 32;
    auto issue = [&](int h, int st) {
      if (h < h1) {
        const Row r = in_row(h);
        const T* src = reinterpret_cast<const T*>(r.ptr) + r.off;
        cp_async16(ring + 2 * st * 32, src + e0);
        if (two) cp_async16(ring + (2 * st + 1) * 32, src + e1);
      }
      cp_async_commit();
    };
    auto prime = [&]() {
      geometry();
      if constexpr (TABLE) {
        if (rot) {
          const long long toff = b * a.pos_sb + s * a.pos_ss;
          const T* tcos = reinterpret_cast<const T*>(a.pos_ptr) + toff;
          const T* tsin = reinterpret_cast<const T*>(a.seq_off_ptr) + toff;
          cp_async16(tslot, tcos + e0);
          cp_async16(tslot + 32, tcos + e1);
          cp_async16(tslot + 64, tsin + e0);
          cp_async16(tslot + 96, tsin + e1);
        }
        cp_async_commit();
      }
#pragma unroll
      for (int j = 0; j + 1 < kStages; ++j) issue(h0 + sub + j * rpw, j);
    };
    // the angle inputs' loads go out before the ring's: the cp.async memory
    // clobber would keep them behind it, and in a short launch (decode) they
    // head the chain position -> trig -> rotation
    long long pos0 = 0;
    double f0 = 0.0;
    if constexpr (!TABLE) {
      pos0 = stream0_position();
      if (lane < npairs) f0 = inv_freq_at(a, 0, lane);
    }
    if (active) prime();  // in flight while the cos/sin are computed
    if constexpr (!TABLE) warp_cos_sin_from(pos0, f0);
    if (!active) return;
    for (bool primed = true; c < chunks; c += cpr, primed = false) {
      if (!primed) prime();
      // cos/sin (or the table packs) are re-read from shared memory per head:
      // fewer registers, and the wait's memory clobber keeps the compiler
      // from hoisting them
      const float2* cs0 = my_cs + cs_slot<INTERLEAVED, VEC>(pair_at(0), npairs);
      const float2* cs1 = my_cs + cs_slot<INTERLEAVED, VEC>(pair_at(VEC / 2), npairs);
      const int cstride = cs_stride<INTERLEAVED, VEC>(npairs);
      int st = 0;
      for (int h = h0 + sub; h < h1; h += rpw) {
        issue(h + (kStages - 1) * rpw, st == 0 ? kStages - 1 : st - 1);
        cp_async_wait<kStages - 1>();  // head h (and the tables) have landed
        P x0 = ring[2 * st * 32], x1;
        if (two) x1 = ring[(2 * st + 1) * 32];
        if (rot) {
          if constexpr (TABLE) {
            const P tc[2] = {tslot[0], tslot[32]};
            const P ts[2] = {tslot[64], tslot[96]};
            rotate_table<T, INTERLEAVED, VEC>(x0, x1, tc, ts, a.sin_sign < 0.0);
          } else {
            rotate_chunk<T, INTERLEAVED, VEC>(x0, x1, cs0, cs1, cstride);
          }
        }
        const Row r = out_row(h);
        store_pack<T, VEC>(r.ptr, r.off + e0, x0);
        if (two) store_pack<T, VEC>(r.ptr, r.off + e1, x1);
        st = st + 1 == kStages ? 0 : st + 1;
      }
    }
    return;
  }
  if constexpr (PER_HEAD && ACT != kActSoftmax) {
    if (runs) {
      // Token runs: the warp's head h0 at its tokens [s, s_end); a lane takes
      // every rpw-th (its rows k = 0, 1, ...). Its cos/sin are computed
      // exactly at rows k % kRun == 0 and composed with the exact rotation by
      // rpw positions in between (CUPROPE_RUN16/32: the error stays bounded
      // at any position). The scale rides on the exact values (composing
      // with a unit rotation keeps it; pair_cos_sin's value, without its
      // stream-map branch and freq reload, which cost registers here).
      constexpr int kRun = sizeof(T) == 4 ? CUPROPE_RUN32 : CUPROPE_RUN16;
      const int hh = h0 >= heads0 ? h0 - heads0 : h0;
      const double* freq = reinterpret_cast<const double*>(a.inv_freq_ptr) + hh * a.freq_sh;
      const float sign = static_cast<float>(a.sin_sign), sc = static_cast<float>(a.scale);
      // the step's rotation (rpw positions) per pair, in the warp's shared
      // slice (cs_slot's layout): computed once per warp, and not held in
      // registers, of which the 16-bit kernels have too few
      for (int p = lane; p < npairs; p += 32)
        my_cs[cs_slot<INTERLEAVED, VEC>(p, npairs)] = unit_rotation(rpw, freq[p], sign);
      __syncwarp();
      if (!active) return;
      const int s_end = static_cast<int>(min(n_seq, s + tile));
      const bool is_k = h0 >= heads0;
      const Row ri = in_row(h0), ro = out_row(h0);
      const long long iss = is_k ? a.in_ss[1] : a.in_ss[0];
      const long long oss = is_k ? a.out_ss[1] : a.out_ss[0];
      const long long aux_off = aux_base + hh * a.aux_sh;
      [[maybe_unused]] const long long scol =
          (static_cast<long long>(b) * a.heads[0] + hh) * a.head_dim;
      // With 16-byte packs the rows load through a per-warp shared-memory
      // ring (cp.async, kTokStages - 1 rows ahead), after the warp's step
      // slice: the latency hides without holding rows in registers. Slots
      // (stage st, pack k) at ring[(kPacks * st + k) * 32]: x at e0, e1, and
      // in the LRPE backward x beside dO at e0, e1.
      using P = Pack<T, VEC>;
      constexpr int kTokStages =
          sizeof(T) * VEC != 16 ? 0 : sizeof(T) == 4 ? CUPROPE_RUN_STAGES32 : CUPROPE_RUN_STAGES16;
      constexpr int kPacks = BWD ? 4 : 2;
      [[maybe_unused]] P* ring = reinterpret_cast<P*>(warp_cs + (blockDim.x >> 5) * npairs) +
                                 (threadIdx.x >> 5) * (kPacks * kTokStages * 32) + lane;
      [[maybe_unused]] auto issue = [&](int t, int st) {
        if (t < s_end) {
          const long long dt = t - static_cast<int>(s);
          const T* src = reinterpret_cast<const T*>(ri.ptr) + ri.off + dt * iss;
          cp_async16(ring + kPacks * st * 32, src + e0);
          if (two) cp_async16(ring + (kPacks * st + 1) * 32, src + e1);
          if constexpr (BWD) {
            const T* xs = reinterpret_cast<const T*>(a.aux_ptr) + aux_off + dt * a.aux_ss;
            cp_async16(ring + (kPacks * st + 2) * 32, xs + e0);
            cp_async16(ring + (kPacks * st + 3) * 32, xs + e1);
          }
        }
        cp_async_commit();
      };
      for (; c < chunks; c += cpr) {
        geometry();
        float2 z[VEC];  // the row's cos/sin (scaled)
        const float2* w0 = my_cs + cs_slot<INTERLEAVED, VEC>(pair_at(0), npairs);
        const float2* w1 = my_cs + cs_slot<INTERLEAVED, VEC>(pair_at(VEC / 2), npairs);
        const int wstride = cs_stride<INTERLEAVED, VEC>(npairs);
        const int t0 = static_cast<int>(s) + sub;
        if constexpr (kTokStages > 0) {
#pragma unroll
          for (int j = 0; j + 1 < kTokStages; ++j) issue(t0 + j * rpw, j);
        }
        int k = 0, st = 0;
#pragma unroll 1
        for (int t = t0; t < s_end; t += rpw, ++k) {
          const long long dt = t - static_cast<int>(s);
          P x0, x1;
          [[maybe_unused]] P xa0, xa1;  // LRPE backward: x beside dO
          if constexpr (kTokStages > 0) {
            issue(t + (kTokStages - 1) * rpw, st == 0 ? kTokStages - 1 : st - 1);
            cp_async_wait<kTokStages - 1>();  // row t has landed
            x0 = ring[kPacks * st * 32];
            if (two) x1 = ring[(kPacks * st + 1) * 32];
            if constexpr (BWD) {
              xa0 = ring[(kPacks * st + 2) * 32];
              xa1 = ring[(kPacks * st + 3) * 32];
            }
            st = st + 1 == kTokStages ? 0 : st + 1;
          } else {
            x0 = load_pack<T, VEC>(ri.ptr, ri.off + dt * iss + e0);
            if (two) x1 = load_pack<T, VEC>(ri.ptr, ri.off + dt * iss + e1);
            if constexpr (BWD) {
              xa0 = load_pack<T, VEC>(a.aux_ptr, aux_off + dt * a.aux_ss + e0);
              xa1 = load_pack<T, VEC>(a.aux_ptr, aux_off + dt * a.aux_ss + e1);
            }
          }
          if (rot) {
            if (k % kRun == 0) {
              const long long pos = token_position(a, b, t, 0);
#pragma unroll
              for (int v = 0; v < VEC; ++v) {
                const float2 u = unit_rotation(pos, freq[pair_at(v)], sign);
                z[v] = make_float2(u.x * sc, u.y * sc);
              }
            } else {
#pragma unroll
              for (int v = 0; v < VEC; ++v)
                z[v] = compose(z[v], pair_value<INTERLEAVED, VEC>(w0, w1, wstride, v));
            }
            if constexpr (ACT == kActNone) {
              rotate_chunk<T, INTERLEAVED, VEC>(x0, x1, z, z + VEC / 2, 1);
            } else {
              lrpe_chunk<T, VEC, ACT, BWD>(a, x0, x1, xa0, xa1, z, scol, e0, e1);
            }
          }
          store_pack<T, VEC>(ro.ptr, ro.off + dt * oss + e0, x0);
          if (two) store_pack<T, VEC>(ro.ptr, ro.off + dt * oss + e1, x1);
        }
      }
      return;
    }
  }
  if (SRC == kSrcShared) warp_cos_sin();
  if (!active) return;
  [[maybe_unused]] long long pos0 = 0;
  if constexpr (PER_HEAD) pos0 = stream0_position();

  for (; c < chunks; c += cpr) {
    geometry();
    float2 cs[VEC];
    [[maybe_unused]] Pack<T, VEC> tc[2], ts[2];  // kSrcTable: cos and sin at e0 and e1
    if (rot) {
      if constexpr (TABLE) {
        const long long toff = b * a.pos_sb + s * a.pos_ss;
        tc[0] = load_pack<T, VEC>(a.pos_ptr, toff + e0);
        tc[1] = load_pack<T, VEC>(a.pos_ptr, toff + e1);
        ts[0] = load_pack<T, VEC>(a.seq_off_ptr, toff + e0);
        ts[1] = load_pack<T, VEC>(a.seq_off_ptr, toff + e1);
      } else if constexpr (!PER_HEAD) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) cs[v] = my_cs[cs_slot<INTERLEAVED, VEC>(pair_at(v), npairs)];
      }
    }
    for (int h = h0 + sub; h < h1; h += step) {
      Pack<T, VEC> x[kRows][2];
      [[maybe_unused]] Pack<T, VEC> xa[kRows][2];  // LRPE backward: x beside dO
      load_rows(h, x, xa);
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int hu = h + u * rpw;
        if (hu >= h1) continue;
        const bool is_k = hu >= heads0;
        const int hh = is_k ? hu - heads0 : hu;
        const long long ptr = is_k ? a.out_ptr[1] : a.out_ptr[0];
        const long long off = is_k ? out_base1 + hh * a.out_sh[1] : out_base0 + hh * a.out_sh[0];
        if (rot) {
          if constexpr (PER_HEAD) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) cs[v] = pair_cos_sin(a, b, s, pair_at(v), hh, pos0);
          }
          if constexpr (TABLE) {
            rotate_table<T, INTERLEAVED, VEC>(x[u][0], x[u][1], tc, ts, a.sin_sign < 0.0);
          } else if constexpr (ACT == kActNone) {
            rotate_chunk<T, INTERLEAVED, VEC>(x[u][0], x[u][1], cs, cs + VEC / 2, 1);
          } else {
            const long long scol = (static_cast<long long>(b) * a.heads[0] + hh) * a.head_dim;
            lrpe_chunk<T, VEC, ACT, BWD>(a, x[u][0], x[u][1], xa[u][0], xa[u][1], cs, scol, e0, e1);
          }
        }
        store_pack<T, VEC>(ptr, off + e0, x[u][0]);
        if (two) store_pack<T, VEC>(ptr, off + e1, x[u][1]);
      }
    }
  }
}

// ---------------------------------------------------------------- LRPE sequence softmax
// Statistics of the softmax over the sequence (LRPE, dim = 1) for every
// (b, h, d): ref = the max over n (0 when it is -inf), sum = sum_n exp(x - ref)
// and, for the backward, dot = sum_n g s with g = R^T dO (rotation with -sin)
// and s = exp(x - ref) / sum. They are stored as float planes [3][B*H*D] at
// stats_ptr (index (b*H + h)*D + d); rope_kernel<..., kActSoftmaxSeq, ...> then
// forms s from x and them, and rotates (forward) or finishes dx (backward).
// Block (32, kSeqSlices): threadIdx.x picks a (b, h, pair) column (both
// elements of the pair), threadIdx.y a slice of the sequence; each thread runs
// an online max/sum over its slice (sums in float64), and the slices merge
// through shared memory. x is tensor 0 in the forward, aux in the backward
// (tensor 0 is then dO).

template <bool BWD>
__device__ __forceinline__ void seq_acc_add(float& m, double& l, double& q, float x, float g) {
  const float mn = fmaxf(m, x);  // a NaN x leaves m and makes l NaN below
  if (mn != m) {
    const float f = m == neg_inf() ? 0.f : expf(m - mn);  // l, q are 0 (or NaN) while m is -inf
    l *= f;
    if constexpr (BWD) q *= f;
    m = mn;
  }
  const float e = expf(x - softmax_ref(m));
  l += e;
  if constexpr (BWD) q += static_cast<double>(g) * e;
}

template <typename T, bool BWD>
__global__ void __launch_bounds__(32 * kSeqSlices) lrpe_seq_stats_kernel(const RopeArgs a) {
  __shared__ float sm_m[kSeqSlices][2][32];
  __shared__ double sm_l[kSeqSlices][2][32];
  __shared__ double sm_q[BWD ? kSeqSlices : 1][2][32];
  const long long npairs = a.rot_dim >> 1;
  const long long heads = a.heads[0];
  const long long col = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  const bool live = col < a.n_batch * heads * npairs;
  const long long j = col % npairs;
  const long long bh = col / npairs;  // b * H + h
  const long long h = bh % heads;
  const long long b = bh / heads;
  float m[2] = {neg_inf(), neg_inf()};
  double l[2] = {0.0, 0.0}, q[2] = {0.0, 0.0};
  if (live) {
    const T* xp = reinterpret_cast<const T*>(BWD ? a.aux_ptr : a.in_ptr[0]) +
                  (b * (BWD ? a.aux_sb : a.in_sb[0]) + h * (BWD ? a.aux_sh : a.in_sh[0]) + j);
    const long long xss = BWD ? a.aux_ss : a.in_ss[0];
    const T* gp = reinterpret_cast<const T*>(a.in_ptr[0]) + (b * a.in_sb[0] + h * a.in_sh[0] + j);
    for (long long n = threadIdx.y; n < a.n_seq; n += kSeqSlices) {
      const float x1 = to_f32(xp[n * xss]);
      const float x2 = to_f32(xp[n * xss + npairs]);
      float g1 = 0.f, g2 = 0.f;
      if constexpr (BWD) {
        const float d1 = to_f32(gp[n * a.in_ss[0]]);
        const float d2 = to_f32(gp[n * a.in_ss[0] + npairs]);
        const float2 cs = pair_cos_sin(a, static_cast<unsigned>(b), static_cast<unsigned>(n),
                                       static_cast<int>(j), h);
        g1 = d1 * cs.x - d2 * cs.y;  // cs.y = -sin: the transposed rotation
        g2 = d2 * cs.x + d1 * cs.y;
      }
      seq_acc_add<BWD>(m[0], l[0], q[0], x1, g1);
      seq_acc_add<BWD>(m[1], l[1], q[1], x2, g2);
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    sm_m[threadIdx.y][k][threadIdx.x] = m[k];
    sm_l[threadIdx.y][k][threadIdx.x] = l[k];
    if constexpr (BWD) sm_q[threadIdx.y][k][threadIdx.x] = q[k];
  }
  __syncthreads();
  if (threadIdx.y != 0 || !live) return;
  float* st = reinterpret_cast<float*>(a.stats_ptr);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    float mx = neg_inf();
#pragma unroll
    for (int i = 0; i < kSeqSlices; ++i) mx = fmaxf(mx, sm_m[i][k][threadIdx.x]);
    const float ref = softmax_ref(mx);
    double sum = 0.0, dot = 0.0;
#pragma unroll
    for (int i = 0; i < kSeqSlices; ++i) {
      const float mi = sm_m[i][k][threadIdx.x];
      const double f = mi == neg_inf() ? 0.0 : static_cast<double>(expf(mi - ref));
      sum += sm_l[i][k][threadIdx.x] * f;
      if constexpr (BWD) dot += sm_q[i][k][threadIdx.x] * f;
    }
    const long long idx = bh * a.head_dim + j + k * npairs;
    st[idx] = ref;
    st[a.stats_plane + idx] = static_cast<float>(sum);
    if constexpr (BWD) st[2 * a.stats_plane + idx] = static_cast<float>(dot / sum);
  }
}

}  // namespace cuprope
