// What every kernel of cuprope needs: element types and their conversions,
// packs and rows, cp.async, the exact angle math, exact fp32 arithmetic, and
// the position / frequency helpers that read the launch arguments.
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
// a shift or a mask (element by element the compiler extracts each half
// first, two instructions per element), and both narrow two elements per
// instruction (element by element, pairs that land in different packs are
// narrowed together and split apart again). The memory-bound rotate_chunk
// keeps the element-wise form: there the packed one measured 0.5-1 % slower.
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
// must keep for it), and the error drops from ~2e-7 to ~7e-8 at any
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

// (cos, sin) of pos * f times the scale, sin also times the sign.
__device__ __forceinline__ float2 scaled_cos_sin(long long pos, double f, float sc, float sign) {
  const float2 cs = exact_cos_sin(pos, f);
  return make_float2(cs.x * sc, cs.y * sc * sign);
}

// ... with a's scale and sin sign.
__device__ __forceinline__ float2 scaled_cos_sin(const RopeArgs& a, long long pos, double f) {
  return scaled_cos_sin(pos, f, static_cast<float>(a.scale), static_cast<float>(a.sin_sign));
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


// Where the warp's shared cos/sin slice keeps pair j: column-major over
// groups of G pairs (G: the consecutive pairs a pack holds), so when the
// lanes of a row read pair v of their chunks in one instruction they read
// consecutive slots (no bank conflicts; a row-major slice has 4-way conflicts
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

// Programmatic dependent launch (a launch with enable_pdl: the driver's
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) lets a kernel start
// while the stream's previous kernel is still running. A kernel calls
// wait_prior_grids() after the loads no earlier kernel of the stream writes
// (positions, slots, page tables, weights, scales, angle table rows) and
// before its first load of what one may write (q, k, v, caches) and its
// first global store; then let_dependents_launch(), so that the stream's
// next kernel, when it was launched with the attribute too, may start its
// own prologue. Called after the wait, that next kernel starts only once
// everything before this one has completed.
// griddepcontrol.wait blocks until the prerequisite grids in flight have
// completed and their memory is visible (PTX ISA, griddepcontrol); a grid
// launched without the attribute was ordered after the previous kernel's
// end, has none in flight, and goes on at once: the kernels carry both
// instructions unconditionally. They exist from sm_90 on; older
// architectures compile neither (and the host refuses enable_pdl there).
__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void let_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace cuprope
