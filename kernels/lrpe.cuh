// The LRPE dialect (cuprope/lrpe/api.py): the hooks rope_kernel calls under its
// ACT / BWD template parameters (activations and their gradients, the fused
// chunk, the head-dim softmax) and the sequence-softmax statistics kernel.
#pragma once

#include "common.cuh"

#if !defined(CUPROPE_ACT_NONE) || !defined(CUPROPE_ACT_RELU) || !defined(CUPROPE_ACT_SIGMOID) || \
    !defined(CUPROPE_ACT_SILU) || !defined(CUPROPE_ACT_SOFTMAX) ||                            \
    !defined(CUPROPE_ACT_SOFTMAX_SEQ) || !defined(CUPROPE_SEQ_SLICES)
#error "CUPROPE_ACT_* and CUPROPE_SEQ_SLICES are defined by cuprope/_core/loader.py (compile_options)"
#endif

namespace cuprope {

// Activations before the rotation (rope_kernel's ACT).
constexpr int kActNone = CUPROPE_ACT_NONE;
constexpr int kActRelu = CUPROPE_ACT_RELU;
constexpr int kActSigmoid = CUPROPE_ACT_SIGMOID;
constexpr int kActSilu = CUPROPE_ACT_SILU;
constexpr int kActSoftmax = CUPROPE_ACT_SOFTMAX;  // over the head dim: a row reduction in the warp
constexpr int kActSoftmaxSeq = CUPROPE_ACT_SOFTMAX_SEQ;  // over the sequence: lrpe_seq_stats_kernel

// Sequence slices of lrpe_seq_stats_kernel: its block is (32, kSeqSlices).
constexpr int kSeqSlices = CUPROPE_SEQ_SLICES;

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

// A chunk's two packs of a half-split row: elements [off, off + VEC) and
// [off + npairs, off + npairs + VEC).
template <typename T, int VEC>
__device__ __forceinline__ void load_halves(long long ptr, long long off, int npairs,
                                            Pack<T, VEC>& p0, Pack<T, VEC>& p1) {
  p0 = load_pack<T, VEC>(ptr, off);
  p1 = load_pack<T, VEC>(ptr, off + npairs);
}

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
        load_halves<T, VEC>(xptr, x_row + c * VEC, npairs, x0, x1);
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
            load_halves<T, VEC>(xptr, x_row + c * VEC, npairs, x0, x1);
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
            load_halves<T, VEC>(xptr, x_row + c * VEC, npairs, x0, x1);
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
            load_halves<T, VEC>(xptr, x_row + c * VEC, npairs, x0, x1);
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

// ---------------------------------------------------------------- sequence softmax
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
#include "lrpe_seq_stats_body.cuh"
}

// Flat entry of the statistics pass for launchers with one-dimensional
// blocks and flat parameters (jaxlib's GPU kernel call; cuprope/_core/xla.py):
// blocks of 32 * kSeqSlices threads, thread i standing for (i % 32, i / 32)
// of the by-value kernel's (32, kSeqSlices) block. ``args`` points to the
// packed RopeArgs (an XLA constant); the buffers XLA passes replace its
// pointer words: x (dO in the backward), the frequency table, aux (x in the
// backward; 0 in the forward) and the float statistics planes written here.
template <typename T, bool BWD>
__global__ void __launch_bounds__(32 * kSeqSlices)
    lrpe_seq_stats_flat_kernel(const RopeArgs* args, long long in0, long long inv_freq,
                               long long aux, long long stats) {
  __shared__ RopeArgs a;
  if (threadIdx.x == 0) {
    a = *args;
    a.in_ptr[0] = in0;
    a.inv_freq_ptr = inv_freq;
    a.aux_ptr = aux;
    a.stats_ptr = stats;
  }
  __syncthreads();
  // the body's threadIdx: this thread's place in the (32, kSeqSlices) block
  const uint3 threadIdx = make_uint3(::threadIdx.x % 32, ::threadIdx.x / 32, 0);
#include "lrpe_seq_stats_body.cuh"
}

}  // namespace cuprope
