// Fused QK-norm + RoPE (cuprope/qknorm/api.py): an RMS (or L2) norm over each
// head's D values, or over all heads of a token of one tensor (OLMo 2), with
// an optional weight w' = weight_offset + w, before the rotation (Qwen3,
// Gemma 3, OLMo 2) or after it (Llama 4); forward and backward, q and k in
// one launch.
//
// One warp per token at a time (grid-stride over the tokens, the same tokens
// for a warp on every run). The warp computes the token's cos/sin once per
// pair into its slice of shared memory (shared angle source; per-head tables
// and the caller's cos/sin tables are read per head instead), then walks the
// norm units (a head, or all heads of a tensor): lane l takes the unit's
// items l, l + 32, ..., an item being a rotated pair j of a head (elements
// e1, e2 as the pairing places them) or one pass-through element in [R, D).
// Pass 1 sums the squares of the unit's pre-norm values (x, or R x for
// rope_then_norm) and a butterfly shuffle gives every lane the same total;
// later passes recompute what they need from the inputs (L1/L2 hits).
//
// Backward (dx from the saved x and dy): with n = v * r, r = rsqrt(mean(v^2)
// + eps), u = w' * g (g = R^T dy, or dy for rope_then_norm):
//   dv = r * (u - n * mean(n * u)),  dw += g * n,
// and dx = dv (norm_then_rope) or R^T dv (rope_then_norm). Each warp adds its
// dw terms to its own row of a partial buffer (a lane always owns the same
// columns: no atomics), and qknorm_dw_kernel sums the rows in a fixed order,
// so the weight gradient is the same bits on every run.
//
// Roundings (QkNormArgs::rounding): 0 exact (fp32 from the float64 angles,
// rounded once); 1 cast_then_weight (Qwen3RMSNorm: v * r rounded to T, times
// the weight in T, rounded to T); 2 weight_then_cast (Gemma3RMSNorm, OLMo 2,
// Llama 4's L2 norm: v * r * (offset + w) in fp32, rounded to T). In 1 and 2
// the norm's output is rounded to T before the rotation (and the rotation's
// before the norm for rope_then_norm), as HF's modules hand tensors on; with
// the caller's cos/sin tables the rotation is rotate_table's (PyTorch's
// roundings). The backward: exact with rounding 0; in the model modes the
// gradient autograd forms op by op (unit_backward_model, and per lane's row
// row_backward_model in qknorm_rows_kernel's MODEL instantiation).
#pragma once

#include "common.cuh"
#include "rope.cuh"

#if !defined(CUPROPE_QKNORM_WARPS) || !defined(CUPROPE_QKNORM_MIN_BLOCKS) ||       \
    !defined(CUPROPE_QKNORM_MIN_BLOCKS_BWD) || !defined(CUPROPE_QKNORM_DW_PAD) ||   \
    !defined(CUPROPE_QKNORM_STAGES) || !defined(CUPROPE_QKNORM_STAGES_BWD)
#error "the CUPROPE_QKNORM_* constants are defined by cuprope/_core/loader.py (compile_options)"
#endif
// The tuning values the QK-norm kernels cannot work with.
#if CUPROPE_QKNORM_WARPS < 1 || CUPROPE_QKNORM_WARPS > 32
#error "CUPROPE_QKNORM_WARPS: 1 to 32 warps per block"
#endif
#if CUPROPE_QKNORM_MIN_BLOCKS < 1 || CUPROPE_QKNORM_MIN_BLOCKS_BWD < 1
#error "CUPROPE_QKNORM_MIN_BLOCKS*: at least one block per SM"
#endif
#if CUPROPE_QKNORM_STAGES < 2 || CUPROPE_QKNORM_STAGES > 8 || CUPROPE_QKNORM_STAGES_BWD == 1 || \
    CUPROPE_QKNORM_STAGES_BWD < 0 || CUPROPE_QKNORM_STAGES_BWD > 8
#error "CUPROPE_QKNORM_STAGES(_BWD): a ring of 2 to 8 units per warp (backward: 0, registers)"
#endif
#if CUPROPE_QKNORM_DW_PAD < 0 || CUPROPE_QKNORM_DW_PAD % 4 != 0
#error "CUPROPE_QKNORM_DW_PAD: whole float4s (the dw rows are read and written as float4)"
#endif

namespace cuprope {

// Warps per block of every QK-norm kernel, so threads per block (their
// __launch_bounds__), and the floats of padding after each head row of the
// fast backward's dw terms in shared memory (kDwPad's note).
constexpr int kQkWarps = CUPROPE_QKNORM_WARPS;
constexpr int kQkThreads = 32 * kQkWarps;
constexpr int kDwPad = CUPROPE_QKNORM_DW_PAD;
constexpr int kQkStages = CUPROPE_QKNORM_STAGES;  // qknorm_ring_stages
constexpr int kQkStagesBwd = CUPROPE_QKNORM_STAGES_BWD;

// The launch argument: RopeArgs (tensors, positions, angles; in_ptr is x in
// the forward and dy in the backward) and the norm's fields. Every field is 8
// bytes; the host mirrors it in cuprope/qknorm/kernels.py (QKNORM_ARGS).
struct QkNormArgs {
  RopeArgs r;
  long long x_ptr[2];                 // backward: the saved inputs q, k
  long long x_sb[2], x_ss[2], x_sh[2];
  long long w_ptr[2];                 // weights, contiguous (0: none, w' = 1)
  long long w_dtype[2];               // 0 float32, 1 float16, 2 bfloat16
  long long w_col[2];                 // first column of each weight in a partial row
  long long part_ptr;                 // backward: float [n_warps, part_cols]
  long long part_cols;
  long long norm_token;               // 1: the unit is all heads of a token
  long long rope_first;               // 1: rope_then_norm
  long long rounding;                 // 0 exact, 1 cast_then_weight, 2 weight_then_cast
  long long table;                    // 1: cos at r.pos_ptr, sin at r.seq_off_ptr, [B, S, R] in T
  long long step_groups;              // rows kernel: warps sharing a token's heads (1: one warp)
  double eps, weight_offset;
};

template <typename T>
__device__ __forceinline__ float elem(long long ptr, long long off) {
  return to_f32(reinterpret_cast<const T*>(ptr)[off]);
}

template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_f32(from_f32<T>(v));
}

__device__ __forceinline__ float weight_at(const QkNormArgs& a, int t, long long i) {
  const long long p = a.w_ptr[t];
  if (a.w_dtype[t] == 1) return elem<__half>(p, i);
  if (a.w_dtype[t] == 2) return elem<__nv_bfloat16>(p, i);
  return elem<float>(p, i);
}

// Item i of a head: rotated pair j = i (n = 2) at elements e[0], e[1], or the
// pass-through element e[0] = R + (i - R/2) (n = 1).
struct QkItem {
  int e[2];
  int n;
};
template <bool INTERLEAVED>
__device__ __forceinline__ QkItem qk_item(int i, int npairs) {
  if (i >= npairs) return {{npairs + i, npairs + i}, 1};
  return INTERLEAVED ? QkItem{{2 * i, 2 * i + 1}, 2} : QkItem{{i, i + npairs}, 2};
}

// The token a warp works on and its angles.
struct QkToken {
  unsigned b, s;
  long long pos0;     // stream-0 position (per-head tables)
  const float2* cs;   // shared source: the token's cos/sin per pair
};

// cos and sin at the two elements of pair j of head h (within its tensor):
// c[k], sn[k] at element e[k] (equal for computed angles; the tables' own).
struct QkCosSin {
  float c[2], sn[2];
};
template <typename T>
__device__ __forceinline__ QkCosSin qk_cos_sin(const QkNormArgs& a, const QkToken& tk, int h,
                                               int j, const QkItem& it) {
  if (a.table) {
    const long long toff = tk.b * a.r.pos_sb + tk.s * a.r.pos_ss;
    return {{elem<T>(a.r.pos_ptr, toff + it.e[0]), elem<T>(a.r.pos_ptr, toff + it.e[1])},
            {elem<T>(a.r.seq_off_ptr, toff + it.e[0]), elem<T>(a.r.seq_off_ptr, toff + it.e[1])}};
  }
  const float2 cs = a.r.freq_sh ? pair_cos_sin(a.r, tk.b, tk.s, j, h, tk.pos0) : tk.cs[j];
  return {{cs.x, cs.x}, {cs.y, cs.y}};
}

// The rotation of a pair and its transpose (fp32).
__device__ __forceinline__ void rot_fwd(const QkCosSin& k, float (&v)[2]) {
  const float v1 = v[0], v2 = v[1];
  v[0] = v1 * k.c[0] - v2 * k.sn[0];
  v[1] = v2 * k.c[1] + v1 * k.sn[1];
}
__device__ __forceinline__ void rot_bwd(const QkCosSin& k, float (&v)[2]) {
  const float d1 = v[0], d2 = v[1];
  v[0] = d1 * k.c[0] + d2 * k.sn[1];
  v[1] = d2 * k.c[1] - d1 * k.sn[0];
}

// rotate_table (HF's formula with PyTorch's roundings; backward: autograd's
// gradient of it) on one pair of T values, with the tables' values k2.
template <typename T, bool INTERLEAVED>
__device__ __forceinline__ void table_rotate(const QkCosSin& k2, float (&v)[2], bool backward) {
  Pack<T, 1> p0, p1, tc[2], ts[2];
  p0.v[0] = from_f32<T>(v[0]);
  p1.v[0] = from_f32<T>(v[1]);
  for (int m = 0; m < 2; ++m) {
    tc[m].v[0] = from_f32<T>(k2.c[m]);
    ts[m].v[0] = from_f32<T>(k2.sn[m]);
  }
  rotate_table<T, INTERLEAVED, 1>(p0, p1, tc, ts, backward);
  v[0] = to_f32(p0.v[0]);
  v[1] = to_f32(p1.v[0]);
}

// An item's values, rounded to T, into the row at dst + off.
template <typename T>
__device__ __forceinline__ void store_item(long long dst, long long off, const QkItem& it,
                                           const float (&v)[2]) {
  for (int m = 0; m < it.n; ++m) reinterpret_cast<T*>(dst)[off + it.e[m]] = from_f32<T>(v[m]);
}

// The sum over the warp, the same bits in every lane (a fixed butterfly).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// One norm unit of tensor t: heads [h0, h0 + nh) of the token. *_off: the
// token's element offsets of tensor t (head 0) in the inputs (in_ptr), the
// outputs and, backward, the saved x; src, dst, xs: their pointers.
struct QkUnit {
  int t, h0, nh;
  long long in_off, out_off, x_off;
  int npairs, ni;              // pairs and items per head
  long long src, dst, xs;      // tensor t's input (x, or dy backward), output, saved x
};

// The unit's pre-norm values of an item: x (norm_then_rope) or R x, rounded
// to T in the model modes' forward (rope_then_norm); x at src + off.
template <typename T, bool INTERLEAVED>
__device__ __forceinline__ void pre_norm(const QkNormArgs& a, const QkToken& tk, int h,
                                         int j, const QkItem& it, long long src, long long off,
                                         bool model_round, float (&v)[2]) {
  v[0] = elem<T>(src, off + it.e[0]);
  v[1] = it.n == 2 ? elem<T>(src, off + it.e[1]) : 0.f;
  if (a.rope_first && it.n == 2) {
    rot_fwd(qk_cos_sin<T>(a, tk, h, j, it), v);
    if (model_round && a.rounding) {
      v[0] = round_to<T>(v[0]);
      v[1] = round_to<T>(v[1]);
    }
  }
}

// r = rsqrt(mean(v^2) + eps) of a unit (every lane gets the same value).
template <typename T, bool INTERLEAVED>
__device__ __forceinline__ float unit_rsqrt(const QkNormArgs& a, const QkToken& tk,
                                            const QkUnit& u, long long src, long long off,
                                            const long long* sh, bool model_round, int lane) {
  const int d = static_cast<int>(a.r.head_dim);
  float ss = 0.f;
  for (int k = lane; k < u.nh * u.ni; k += 32) {
    const int h = u.h0 + k / u.ni, i = k % u.ni;
    const QkItem it = qk_item<INTERLEAVED>(i, u.npairs);
    float v[2];
    pre_norm<T, INTERLEAVED>(a, tk, h, i, it, src, off + h * sh[u.t], model_round, v);
    ss = fmaf(v[0], v[0], ss);
    ss = fmaf(v[1], v[1], ss);
  }
  ss = warp_sum(ss);
  const float ms = __fdiv_rn(ss, static_cast<float>(u.nh * d));
  return rsqrtf(add_exact(ms, static_cast<float>(a.eps)));
}

// w' of element e of head h (1 with no weight), and whether there is one.
__device__ __forceinline__ float weight_factor(const QkNormArgs& a, const QkUnit& u, int h, int e) {
  if (!a.w_ptr[u.t]) return 1.f;
  const long long col = a.norm_token ? static_cast<long long>(h) * a.r.head_dim + e : e;
  return add_exact(static_cast<float>(a.weight_offset), weight_at(a, u.t, col));
}

// The norm of one value (v * r * w') with the mode's roundings.
template <typename T>
__device__ __forceinline__ float norm_value(const QkNormArgs& a, bool has_w, float v, float r,
                                            float wf) {
  if (a.rounding == 1) {
    const float n = round_to<T>(mul_exact(v, r));
    return has_w ? round_to<T>(mul_exact(n, round_to<T>(wf))) : n;
  }
  if (a.rounding == 2) return round_to<T>(mul_exact(mul_exact(v, r), wf));
  return v * r * wf;
}

// Where a forward puts its results: the outputs out_ptr (QK-norm itself), or
// another op's targets (kernels/prologue.cuh: fp8 q, the KV cache). item
// takes one item of head h of unit u (qknorm_kernel's body), vals the two
// packs of a lane's chunk of head hh of tensor t (qknorm_rows_kernel's), both
// in fp32 before their rounding to T. ready() runs once per thread before
// its first load of q or k (the prologue's programmatic dependent launch
// waits there; nothing here).
struct QkOutSink {
  __device__ __forceinline__ void ready() const {}
  template <typename T>
  __device__ __forceinline__ void item(const QkNormArgs& a, const QkToken&, const QkUnit& u,
                                       int h, const QkItem& it, const float (&v)[2]) const;
  template <typename T, int VEC>
  __device__ __forceinline__ void vals(const QkNormArgs& a, int t, unsigned, unsigned, int,
                                       long long out_off, int e0, int e1,
                                       const float (&x)[2][VEC]) const;
};

template <typename T, bool INTERLEAVED, class Sink = QkOutSink>
__device__ __forceinline__ void unit_forward(const QkNormArgs& a, const QkToken& tk,
                                             const QkUnit& u, int lane,
                                             const Sink& sink = Sink{}) {
  const float r = unit_rsqrt<T, INTERLEAVED>(a, tk, u, u.src, u.in_off, a.r.in_sh, true, lane);
  const bool has_w = a.w_ptr[u.t] != 0;
  for (int k = lane; k < u.nh * u.ni; k += 32) {
    const int h = u.h0 + k / u.ni, i = k % u.ni;
    const QkItem it = qk_item<INTERLEAVED>(i, u.npairs);
    float v[2];
    pre_norm<T, INTERLEAVED>(a, tk, h, i, it, u.src, u.in_off + h * a.r.in_sh[u.t], true, v);
    for (int m = 0; m < it.n; ++m)
      v[m] = norm_value<T>(a, has_w, v[m], r, weight_factor(a, u, h, it.e[m]));
    if (it.n == 2 && !a.rope_first) {
      const QkCosSin k2 = qk_cos_sin<T>(a, tk, h, i, it);
      if (a.table) {  // HF's formula with PyTorch's roundings, on the norm's T values
        table_rotate<T, INTERLEAVED>(k2, v, false);
      } else {
        rot_fwd(k2, v);
      }
    }
    sink.template item<T>(a, tk, u, h, it, v);
  }
}

template <typename T>
__device__ __forceinline__ void QkOutSink::item(const QkNormArgs& a, const QkToken&,
                                                const QkUnit& u, int h, const QkItem& it,
                                                const float (&v)[2]) const {
  store_item<T>(u.dst, u.out_off + h * a.r.out_sh[u.t], it, v);
}

template <typename T, bool INTERLEAVED>
__device__ __forceinline__ void unit_backward(const QkNormArgs& a, const QkToken& tk,
                                              const QkUnit& u, int lane, float* part) {
  const float r = unit_rsqrt<T, INTERLEAVED>(a, tk, u, u.xs, u.x_off, a.x_sh, false, lane);
  const float mean_scale = 1.f / static_cast<float>(u.nh * a.r.head_dim);
  // g (the norm's incoming gradient) and n = v * r of an item
  auto load = [&](int h, int i, const QkItem& it, float (&g)[2], float (&n)[2]) {
    pre_norm<T, INTERLEAVED>(a, tk, h, i, it, u.xs, u.x_off + h * a.x_sh[u.t], false, n);
    n[0] *= r;
    n[1] *= r;
    const long long go = u.in_off + h * a.r.in_sh[u.t];
    g[0] = elem<T>(u.src, go + it.e[0]);
    g[1] = it.n == 2 ? elem<T>(u.src, go + it.e[1]) : 0.f;
    if (it.n == 2 && !a.rope_first) rot_bwd(qk_cos_sin<T>(a, tk, h, i, it), g);
  };
  float dot = 0.f;
  for (int k = lane; k < u.nh * u.ni; k += 32) {
    const int h = u.h0 + k / u.ni, i = k % u.ni;
    const QkItem it = qk_item<INTERLEAVED>(i, u.npairs);
    float g[2], n[2];
    load(h, i, it, g, n);
    for (int m = 0; m < it.n; ++m) dot = fmaf(n[m], weight_factor(a, u, h, it.e[m]) * g[m], dot);
  }
  const float mean = warp_sum(dot) * mean_scale;
  const bool has_w = a.w_ptr[u.t] != 0;
  for (int k = lane; k < u.nh * u.ni; k += 32) {
    const int h = u.h0 + k / u.ni, i = k % u.ni;
    const QkItem it = qk_item<INTERLEAVED>(i, u.npairs);
    float g[2], n[2], dv[2] = {0.f, 0.f};
    load(h, i, it, g, n);
    for (int m = 0; m < it.n; ++m) {
      dv[m] = r * (weight_factor(a, u, h, it.e[m]) * g[m] - n[m] * mean);
      if (has_w) {
        const long long col = a.w_col[u.t] +
                              (a.norm_token ? static_cast<long long>(h) * a.r.head_dim : 0) +
                              it.e[m];
        part[col] = fmaf(g[m], n[m], part[col]);
      }
    }
    if (it.n == 2 && a.rope_first) rot_bwd(qk_cos_sin<T>(a, tk, h, i, it), dv);
    store_item<T>(u.dst, u.out_off + h * a.r.out_sh[u.t], it, dv);
  }
}

// The model modes' backward: the gradient autograd forms for HF's modules,
// op by op in their dtypes (cuprope/qknorm/reference.py model_backward):
// gin = the rotation's backward of dy rounded to T (the tables': PyTorch's
// roundings), or dy for rope_then_norm; dn = (gin * w'_T)_T with dw terms
// (gin * (v r)_T)_T (cast_then_weight), or dn = gin * w', terms gin * v r
// (weight_then_cast); dr = sum dn * v, du = (-0.5 dr) * (r r r),
// dv = dn r + (du / N) * (2 v), rounded to T (rope_then_norm: then the
// transposed rotation, rounded).
template <typename T, bool INTERLEAVED>
__device__ __forceinline__ void unit_backward_model(const QkNormArgs& a, const QkToken& tk,
                                                    const QkUnit& u, int lane, float* part) {
  const float r = unit_rsqrt<T, INTERLEAVED>(a, tk, u, u.xs, u.x_off, a.x_sh, true, lane);
  const bool has_w = a.w_ptr[u.t] != 0;
  // v (the norm's input) and dn of an item, and its dw terms
  auto load = [&](int h, int i, const QkItem& it, float (&v)[2], float (&dn)[2],
                  float (&term)[2]) {
    pre_norm<T, INTERLEAVED>(a, tk, h, i, it, u.xs, u.x_off + h * a.x_sh[u.t], true, v);
    const long long go = u.in_off + h * a.r.in_sh[u.t];
    dn[0] = elem<T>(u.src, go + it.e[0]);
    dn[1] = it.n == 2 ? elem<T>(u.src, go + it.e[1]) : 0.f;
    if (it.n == 2 && !a.rope_first) {
      const QkCosSin k2 = qk_cos_sin<T>(a, tk, h, i, it);
      if (a.table) {
        table_rotate<T, INTERLEAVED>(k2, dn, true);
      } else {
        rot_bwd(k2, dn);
        dn[0] = round_to<T>(dn[0]);
        dn[1] = round_to<T>(dn[1]);
      }
    }
    for (int m = 0; m < it.n; ++m) {
      term[m] = 0.f;
      if (!has_w) continue;
      const float wf = weight_factor(a, u, h, it.e[m]);
      const float n = mul_exact(v[m], r);
      if (a.rounding == 1) {
        term[m] = round_to<T>(mul_exact(dn[m], round_to<T>(n)));
        dn[m] = round_to<T>(mul_exact(dn[m], round_to<T>(wf)));
      } else {
        term[m] = mul_exact(dn[m], n);
        dn[m] = mul_exact(dn[m], wf);
      }
    }
  };
  float dr = 0.f;
  for (int k = lane; k < u.nh * u.ni; k += 32) {
    const int h = u.h0 + k / u.ni, i = k % u.ni;
    const QkItem it = qk_item<INTERLEAVED>(i, u.npairs);
    float v[2], dn[2], term[2];
    load(h, i, it, v, dn, term);
    for (int m = 0; m < it.n; ++m) dr = add_exact(dr, mul_exact(dn[m], v[m]));
  }
  dr = warp_sum(dr);
  const float du = mul_exact(mul_exact(-0.5f, dr), mul_exact(mul_exact(r, r), r));
  const float dsq = __fdiv_rn(du, static_cast<float>(u.nh * a.r.head_dim));
  for (int k = lane; k < u.nh * u.ni; k += 32) {
    const int h = u.h0 + k / u.ni, i = k % u.ni;
    const QkItem it = qk_item<INTERLEAVED>(i, u.npairs);
    float v[2], dn[2], term[2];
    load(h, i, it, v, dn, term);
    for (int m = 0; m < it.n; ++m) {
      dn[m] = round_to<T>(add_exact(mul_exact(dn[m], r), mul_exact(dsq, mul_exact(2.f, v[m]))));
      if (has_w) {
        const long long col = a.w_col[u.t] +
                              (a.norm_token ? static_cast<long long>(h) * a.r.head_dim : 0) +
                              it.e[m];
        part[col] = add_exact(part[col], term[m]);
      }
    }
    if (it.n == 2 && a.rope_first) {
      rot_bwd(qk_cos_sin<T>(a, tk, h, i, it), dn);
    }
    store_item<T>(u.dst, u.out_off + h * a.r.out_sh[u.t], it, dn);
  }
}

// The blocks a body runs on: the whole grid, or (a kernel of several
// bodies) blocks [0, n) of it.
struct WholeGrid {
  __device__ __forceinline__ unsigned blocks() const { return gridDim.x; }
};
struct GridPart {
  unsigned n;
  __device__ __forceinline__ unsigned blocks() const { return n; }
};

// The general kernel's body (qknorm_kernel, and its flat entry in
// kernels/qknorm_flat.cuh): warp w takes items w, w + W, ... (W warps in the
// blocks of ``grid``), an item a token's units (its heads, or all of them for
// the norm over the token) split into a.step_groups contiguous groups (1 at
// prefill and backward: a warp walks all of its token's units; more at
// decode, so the units' chains overlap); forward results go to ``sink``.
template <typename T, bool INTERLEAVED, bool BWD, class Grid = WholeGrid, class Sink = QkOutSink>
__device__ __forceinline__ void qknorm_body(const QkNormArgs& a, const Grid& grid = Grid{},
                                            const Sink& sink = Sink{}) {
  extern __shared__ float2 qk_cs[];
  const int lane = threadIdx.x & 31;
  const int npairs = static_cast<int>(a.r.rot_dim >> 1);
  const int d = static_cast<int>(a.r.head_dim);
  float2* cs = qk_cs + (threadIdx.x >> 5) * npairs;
  const long long warp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long n_warps = static_cast<long long>(grid.blocks()) * (blockDim.x >> 5);
  const long long tokens = a.r.n_batch * a.r.n_seq;
  float* part = BWD ? reinterpret_cast<float*>(a.part_ptr) + warp * a.part_cols : nullptr;
  if (BWD) {
    for (long long c = lane; c < a.part_cols; c += 32) part[c] = 0.f;
    __syncwarp();
  }
  const bool shared_src = !a.table && !a.r.freq_sh;
  sink.ready();
  const int groups = BWD ? 1 : static_cast<int>(a.step_groups);
  const int ustep[2] = {a.norm_token ? max(1, static_cast<int>(a.r.heads[0])) : 1,
                        a.norm_token ? max(1, static_cast<int>(a.r.heads[1])) : 1};
  const int units = (static_cast<int>(a.r.heads[0]) + ustep[0] - 1) / ustep[0] +
                    (static_cast<int>(a.r.heads[1]) + ustep[1] - 1) / ustep[1];
  const int per = (units + groups - 1) / groups;
  for (long long item = warp; item < tokens * groups; item += n_warps) {
    const long long tok = groups > 1 ? item / groups : item;
    const int u0 = static_cast<int>(item - tok * groups) * per, u1 = min(units, u0 + per);
    const unsigned b = static_cast<unsigned>(tok / a.r.n_seq);
    const unsigned s = static_cast<unsigned>(tok - static_cast<long long>(b) * a.r.n_seq);
    const long long pos0 = (a.table || a.r.stream_map_ptr) ? 0 : token_position(a.r, b, s, 0);
    if (shared_src) {
      for (int p = lane; p < npairs; p += 32) cs[p] = pair_cos_sin(a.r, b, s, p, 0, pos0);
    }
    __syncwarp();
    const QkToken tk{b, s, pos0, cs};
    int ui = 0;  // the unit's index among the token's
    for (int t = 0; t < 2; ++t) {
      const int heads = static_cast<int>(a.r.heads[t]);
      const long long in_off = b * a.r.in_sb[t] + s * a.r.in_ss[t];
      const long long out_off = b * a.r.out_sb[t] + s * a.r.out_ss[t];
      const long long x_off = b * a.x_sb[t] + s * a.x_ss[t];
      const int step = ustep[t];
      for (int h0 = 0; h0 < heads; h0 += step, ++ui) {
        if (ui < u0 || ui >= u1) continue;
        const QkUnit u{t, h0, step, in_off, out_off, x_off, npairs, d - npairs,
                       a.r.in_ptr[t], a.r.out_ptr[t], a.x_ptr[t]};
        if constexpr (BWD) {
          if (a.rounding) {
            unit_backward_model<T, INTERLEAVED>(a, tk, u, lane, part);
          } else {
            unit_backward<T, INTERLEAVED>(a, tk, u, lane, part);
          }
        } else {
          unit_forward<T, INTERLEAVED, Sink>(a, tk, u, lane, sink);
        }
        __syncwarp();
      }
    }
  }
}

template <typename T, bool INTERLEAVED, bool BWD>
__global__ void __launch_bounds__(kQkThreads) qknorm_kernel(const QkNormArgs a) {
  qknorm_body<T, INTERLEAVED, BWD>(a);
}

// ---------------------------------------------------------------- head rows
// The fast path for the common case: the norm over each head, R = D, 16-byte
// packs (the host checks alignment and npairs / VEC <= 32), angles computed
// (shared or per-head table). Like rope_kernel's register rows: a lane owns
// chunk c of a head, VEC pairs in two packs (p0 at e0, p1 at e1 =
// e0 + R/2; interleaved pairs sit in adjacent elements, pair_slot), the warp
// covers rpw = 32 / cpr heads per step, cpr = npairs / VEC lanes per head, and
// the head's sum (of squares; backward, of n * w' * g) is a segmented
// shuffle over its cpr lanes (seg_sum). The head stays in registers between
// the reduction and the store; w' of both tensors sits in shared memory (read
// once per block). Backward: the lane adds its dw terms to its own
// columns of its head row's slice of shared memory over every head and token
// it handles, and at the end the block sums the slices in a fixed order into
// its own partial row (part_ptr row = blockIdx.x).
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ void rotate_vals(float (&x)[2][VEC], const float2 (&cs)[VEC],
                                            float sign) {
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    const Slot q = pair_slot<INTERLEAVED, VEC>(v);
    const float x1 = x[q.k1][q.i1], x2 = x[q.k2][q.i2];
    const float c = cs[v].x, sn = cs[v].y * sign;
    x[q.k1][q.i1] = x1 * c - x2 * sn;
    x[q.k2][q.i2] = x2 * c + x1 * sn;
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void load_vals(long long ptr, long long off, int e0, int e1,
                                          float (&x)[2][VEC]) {
  unpack_f32<T, VEC>(load_pack<T, VEC>(ptr, off + e0), x[0]);
  unpack_f32<T, VEC>(load_pack<T, VEC>(ptr, off + e1), x[1]);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vals(long long ptr, long long off, int e0, int e1,
                                           const float (&x)[2][VEC]) {
  Pack<T, VEC> p;
  pack_f32<T, VEC>(x[0], p);
  store_pack<T, VEC>(ptr, off + e0, p);
  pack_f32<T, VEC>(x[1], p);
  store_pack<T, VEC>(ptr, off + e1, p);
}

// w' of column e of tensor t's per-head weight (1 with none).
__device__ __forceinline__ float head_weight(const QkNormArgs& a, int t, int e) {
  return a.w_ptr[t] ? add_exact(static_cast<float>(a.weight_offset), weight_at(a, t, e)) : 1.f;
}

// The head rows of dw terms in shared memory are part_cols + kDwPad floats
// apart (kDwPad: CUPROPE_QKNORM_DW_PAD, above): with an odd number
// of 16-byte slots per row, the float4 accesses of a warp's rpw rows and cpr
// chunks spread over all banks (unpadded, the rows fell on the same banks:
// ncu counted 59 % excess wavefronts).

// Slot (in float2) of pair p in qknorm_rows_kernel's cos/sin slice: chunk c's
// pairs v, v + 1 (v even, pair_at's order) share the 16-byte slot
// (v / 2) * cpr + c, so the lanes of a head row read consecutive slots in one
// wavefront (pair-major, chunk c's slots were 8 * VEC bytes apart).
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ int rows_cs_slot(int p, int npairs) {
  const int cpr = npairs / VEC;
  int c, v;
  if (INTERLEAVED) {  // pair_at: v < VEC/2 from the first half of the pairs, the rest the second
    const int half = npairs / 2, hv = VEC / 2;
    const bool hi = p >= half;
    const int q = hi ? p - half : p;
    c = q / hv;
    v = (hi ? hv : 0) + q % hv;
  } else {
    c = p / VEC;
    v = p % VEC;
  }
  return 2 * ((v >> 1) * cpr + c) + (v & 1);
}

// The block's dw partial row: the sum, in order, of its warps' head rows of
// dw terms in shared memory (rows[nrows][part_cols], each lane adding to its
// own columns of row wib * rpw + sub).
__device__ __forceinline__ void block_dw_row(const QkNormArgs& a, const float* rows, int nrows) {
  const long long cols = a.part_cols;
  __syncthreads();  // every warp is done with its tokens
  float* part = reinterpret_cast<float*>(a.part_ptr) + blockIdx.x * cols;
  for (long long col = threadIdx.x; col < cols; col += blockDim.x) {
    float sum = 0.f;
    for (int r = 0; r < nrows; ++r) sum += rows[r * (cols + kDwPad) + col];
    part[col] = sum;
  }
}

// A warp's work is the sequence of units (token, step), step covering heads
// [step * rpw, step * rpw + rpw) of q then k. The loads go through a ring
// of S units per warp in shared memory (cp.async, no registers held: a lane
// copies its own packs and reads them back after its own wait, so no
// barrier), issued S - 1 units ahead of the one worked on (S:
// qknorm_ring_stages); with S 0 (the backward by default: its dw rows leave
// no room for a ring in 48 KB at 8 warps) a lane keeps the raw packs of the
// next unit in registers. Either way a unit's loads are in flight during the
// previous units' reductions and stores, and a token's first loads during
// its cos/sin.
template <typename T, int VEC, bool BWD>
struct RowPacks {
  Pack<T, VEC> x[2], g[2];  // x (the saved input, backward); g: dy (backward)
};

// Ring stages of the rows kernel (0: registers); a stage is a warp's 32
// lanes x its packs (forward x at e0, e1; backward x, then dy), [pack][lane].
template <bool BWD>
__host__ __device__ constexpr int qknorm_ring_stages() {
  return BWD ? kQkStagesBwd : kQkStages;
}

// Where a warp is in its sequence of units: item (token, group of steps) and
// its token (b, s), the step and the group's end (item >= items: done). The
// item in 32 bits (the host keeps items + the grid's warps below 2^31,
// ROWS_MAX_ITEMS): 64-bit ones spilled at the forward's 80 registers.
struct RowCursor {
  int item;
  int step, end;
  unsigned b, s;
};

// The lane's row of unit (token (b, s), step): head h (of q, then k),
// tensor t, its head hh there, whether the lane works on it, its offsets.
struct RowUnit {
  unsigned b, s;
  int t, hh;
  bool on;
  long long in_off, out_off, x_off;
};

// The forward of the lane's row of unit u: x (pre-norm) normed with r and
// w', rotated (norm_then_rope) and handed to ``sink``.
template <typename T, bool INTERLEAVED, int VEC, class Sink>
__device__ __forceinline__ void row_forward(const QkNormArgs& a, const RowUnit& u,
                                            float (&x)[2][VEC], const float (&w)[2][VEC],
                                            const float2 (&csv)[VEC], float r, bool has_w,
                                            int e0, int e1, const Sink& sink) {
  if (a.rounding == 0) {  // (warp-uniform: the exact mode's loop has no branches)
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int i = 0; i < VEC; ++i) x[k][i] = x[k][i] * r * w[k][i];
  } else {
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int i = 0; i < VEC; ++i) x[k][i] = norm_value<T>(a, has_w, x[k][i], r, w[k][i]);
  }
  if (!a.rope_first) rotate_vals<INTERLEAVED, VEC>(x, csv, 1.f);
  if (u.on) sink.template vals<T, VEC>(a, u.t, u.b, u.s, u.hh, u.out_off, e0, e1, x);
}

// The backward of the lane's row (exact rounding), from x (pre-norm) and g
// (dy): g rotated back (norm_then_rope), x turned into n = x * r, and the
// head's mean(n * w' * g), a segmented shuffle over its cpr lanes.
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ float row_backward_mean(const QkNormArgs& a, float (&x)[2][VEC],
                                                   float (&g)[2][VEC], const float (&w)[2][VEC],
                                                   const float2 (&csv)[VEC], float r,
                                                   float inv_d, int c, int cpr, int sub) {
  if (!a.rope_first) rotate_vals<INTERLEAVED, VEC>(g, csv, -1.f);
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      x[k][i] *= r;  // n
      dot = fmaf(x[k][i], w[k][i] * g[k][i], dot);
    }
  return seg_sum(dot, c, cpr, sub * cpr) * inv_d;
}

// Then dv = r * (w' * g - n * mean), rotated back (rope_then_norm) into dx
// and stored.
template <typename T, bool INTERLEAVED, int VEC>
__device__ __forceinline__ void row_backward_store(const QkNormArgs& a, const RowUnit& u,
                                                   float (&x)[2][VEC], const float (&g)[2][VEC],
                                                   const float (&w)[2][VEC],
                                                   const float2 (&csv)[VEC], float r, float mean,
                                                   int e0, int e1) {
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int i = 0; i < VEC; ++i) x[k][i] = r * (w[k][i] * g[k][i] - x[k][i] * mean);  // dv
  if (a.rope_first) rotate_vals<INTERLEAVED, VEC>(x, csv, -1.f);
  if (u.on) store_vals<T, VEC>(a.r.out_ptr[u.t], u.out_off, e0, e1, x);
}

// The model modes (qknorm_rows_kernel<..., MODEL = true>). With the caller's
// tables, the warp's slice holds the token's cos row then its sin row in T
// (table_rows); a lane's four packs of it (cos at e0 | e1, then sin) are
// read where they are used (lane_table).
template <typename T, int VEC>
__device__ __forceinline__ void table_rows(const QkNormArgs& a, T* tsm, unsigned b, unsigned s,
                                           int lane, int rd) {
  const long long toff = b * a.r.pos_sb + s * a.r.pos_ss;
  for (int p = lane * VEC; p < 2 * rd; p += 32 * VEC) {
    const bool sn = p >= rd;
    *reinterpret_cast<Pack<T, VEC>*>(tsm + p) =
        load_pack<T, VEC>(sn ? a.r.seq_off_ptr : a.r.pos_ptr, toff + (sn ? p - rd : p));
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void lane_table(const T* tsm, int rd, int e0, int e1,
                                           Pack<T, VEC> (&tcs)[4]) {
#pragma unroll
  for (int m = 0; m < 4; ++m)
    tcs[m] = *reinterpret_cast<const Pack<T, VEC>*>(tsm + (m >> 1) * rd + ((m & 1) ? e1 : e0));
}

// The forward with the caller's tables: the norm's T values rotated by
// rotate_table (HF's formula with PyTorch's roundings).
template <typename T, bool INTERLEAVED, int VEC, class Sink>
__device__ __forceinline__ void row_forward_table(const QkNormArgs& a, const RowUnit& u,
                                                  float (&x)[2][VEC], const float (&w)[2][VEC],
                                                  const T* tsm, int rd, float r, bool has_w,
                                                  int e0, int e1, const Sink& sink) {
  Pack<T, VEC> p[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) x[k][i] = norm_value<T>(a, has_w, x[k][i], r, w[k][i]);
    pack_f32<T, VEC>(x[k], p[k]);
  }
  Pack<T, VEC> tcs[4];
  lane_table<T, VEC>(tsm, rd, e0, e1, tcs);
  rotate_table<T, INTERLEAVED, VEC>(p[0], p[1], tcs, tcs + 2, false);
  unpack_f32<T, VEC>(p[0], x[0]);
  unpack_f32<T, VEC>(p[1], x[1]);
  if (u.on) sink.template vals<T, VEC>(a, u.t, u.b, u.s, u.hh, u.out_off, e0, e1, x);
}

// The model modes' backward of the lane's row: unit_backward_model's
// arithmetic on v (the norm's input) and g (dy), the head's dr a segmented
// shuffle over its cpr lanes (its own sum order: within an fp32 rounding of
// the general kernel's), the dw terms added to the lane's columns of my_row.
template <typename T, bool INTERLEAVED, int VEC>
__device__ __forceinline__ void row_backward_model(
    const QkNormArgs& a, const RowUnit& u, const float (&v)[2][VEC], float (&g)[2][VEC],
    const float (&w)[2][VEC], const float2 (&csv)[VEC], const T* tsm, bool tab, float r,
    bool has_w, float fd, int c, int cpr, int sub, float* my_row, int e0, int e1) {
  const int rd = 2 * (e1 - e0);  // e1 = e0 + R/2
  if (!a.rope_first) {  // dn: the rotation's backward of dy, in T
    if (tab) {
      Pack<T, VEC> p[2], tcs[4];
      pack_f32<T, VEC>(g[0], p[0]);
      pack_f32<T, VEC>(g[1], p[1]);
      lane_table<T, VEC>(tsm, rd, e0, e1, tcs);
      rotate_table<T, INTERLEAVED, VEC>(p[0], p[1], tcs, tcs + 2, true);
      unpack_f32<T, VEC>(p[0], g[0]);
      unpack_f32<T, VEC>(p[1], g[1]);
    } else {
      rotate_vals<INTERLEAVED, VEC>(g, csv, -1.f);
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int i = 0; i < VEC; ++i) g[k][i] = round_to<T>(g[k][i]);
    }
  }
  // dn (times w'), its dw terms straight into the lane's columns, dr
  float dr = 0.f;
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      float term[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float& dn = g[k][i + j];
        const float n = mul_exact(v[k][i + j], r);
        term[j] = 0.f;
        if (has_w) {
          if (a.rounding == 1) {
            term[j] = round_to<T>(mul_exact(dn, round_to<T>(n)));
            dn = round_to<T>(mul_exact(dn, round_to<T>(w[k][i + j])));
          } else {
            term[j] = mul_exact(dn, n);
            dn = mul_exact(dn, w[k][i + j]);
          }
        }
        dr = add_exact(dr, mul_exact(dn, v[k][i + j]));
      }
      if (u.on && has_w) {
        float4& dw = *reinterpret_cast<float4*>(my_row + a.w_col[u.t] + (k ? e1 : e0) + i);
        float4 v4 = dw;
        v4.x = add_exact(v4.x, term[0]);
        v4.y = add_exact(v4.y, term[1]);
        v4.z = add_exact(v4.z, term[2]);
        v4.w = add_exact(v4.w, term[3]);
        dw = v4;
      }
    }
  dr = seg_sum(dr, c, cpr, sub * cpr);
  const float du = mul_exact(mul_exact(-0.5f, dr), mul_exact(mul_exact(r, r), r));
  const float dsq = __fdiv_rn(du, fd);
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      g[k][i] = round_to<T>(
          add_exact(mul_exact(g[k][i], r), mul_exact(dsq, mul_exact(2.f, v[k][i]))));
  if (a.rope_first) rotate_vals<INTERLEAVED, VEC>(g, csv, -1.f);
  if (u.on) store_vals<T, VEC>(a.r.out_ptr[u.t], u.out_off, e0, e1, g);
}

// w' of the lane's columns of tensor t (float4 reads: e0, e1 and d are
// multiples of VEC >= 4, the slices before wsm whole float4s).
template <int VEC>
__device__ __forceinline__ void lane_weights(const float* wsm, int t, int d, int e0, int e1,
                                             float (&w)[2][VEC]) {
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      const float4 v4 = *reinterpret_cast<const float4*>(wsm + t * d + (k ? e1 : e0) + i);
      w[k][i] = v4.x;
      w[k][i + 1] = v4.y;
      w[k][i + 2] = v4.z;
      w[k][i + 3] = v4.w;
    }
}

// The chunk's cos/sin: pairs v, v + 1 (v even) share a 16-byte slot
// (rows_cs_slot), so one shared load takes both (all issued together);
// per-head tables compute them instead.
template <bool INTERLEAVED, int VEC>
__device__ __forceinline__ void chunk_cos_sin(const QkNormArgs& a, const float2* cs, int cpr,
                                              int c, const RowUnit& u,
                                              const ChunkPairs<INTERLEAVED, VEC>& pair_at,
                                              long long pos0, float2 (&csv)[VEC]) {
#pragma unroll
  for (int v = 0; v < VEC; v += 2) {
    const float4 c4 = *reinterpret_cast<const float4*>(cs + 2 * ((v >> 1) * cpr + c));
    csv[v] = make_float2(c4.x, c4.y);
    csv[v + 1] = make_float2(c4.z, c4.w);
  }
  if (a.r.freq_sh) {
#pragma unroll
    for (int v = 0; v < VEC; ++v)
      csv[v] = u.on ? pair_cos_sin(a.r, u.b, u.s, pair_at(v), u.hh, pos0) : make_float2(0.f, 0.f);
  }
}

// r = rsqrt(mean(x^2) + eps) of the head row in x, its sum of squares a
// segmented shuffle over the row's cpr lanes. mean(x^2): a power-of-two D
// scales exactly, so the product is the quotient.
template <int VEC>
__device__ __forceinline__ float row_rsqrt(const float (&x)[2][VEC], int c, int cpr, int sub,
                                           bool pow2_d, float inv_d, float fd, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss = fmaf(x[k][i], x[k][i], ss);
  ss = seg_sum(ss, c, cpr, sub * cpr);
  const float ms = pow2_d ? ss * inv_d : __fdiv_rn(ss, fd);
  return rsqrtf(add_exact(ms, eps));
}

// The fast path's body (qknorm_rows_kernel and its flat entry).
// (``grid``, ``sink`` as in qknorm_body; the backward's partial rows assume
// the whole grid.)
// MODEL: the model modes' kernel (a model rounding; the caller's cos/sin
// tables or computed angles; backward: row_backward_model), else the exact
// mode's (forward: any rounding, computed angles).
template <typename T, bool INTERLEAVED, int VEC, bool BWD, class Grid = WholeGrid,
          class Sink = QkOutSink, bool MODEL = false>
__device__ __forceinline__ void qknorm_rows_body(const QkNormArgs& a, const Grid& grid = Grid{},
                                                 const Sink& sink = Sink{}) {
  // [warps][kRing][kPacks][32] packs (the load ring); then
  // [warps][npairs · kSlice] cos/sin, then w' of q and k [2][D];
  // BWD: then [warps * rpw][part_cols]
  constexpr int kRing = qknorm_ring_stages<BWD>();
  constexpr int kStage = (BWD ? 4 : 2) * 32;  // a ring stage's packs
  static_assert(kRing == 0 || sizeof(Pack<T, VEC>) == 16, "the ring holds 16-byte packs");
  extern __shared__ __align__(16) uint4 qk_smem[];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  [[maybe_unused]] uint4* ring = qk_smem + wib * kRing * kStage;
  float2* qk_cs = reinterpret_cast<float2*>(qk_smem + (blockDim.x >> 5) * kRing * kStage);
  const int npairs = static_cast<int>(a.r.rot_dim >> 1);
  const int cpr = npairs / VEC, rpw = 32 / cpr;
  const int sub = lane / cpr, c = lane - sub * cpr;
  const int heads0 = static_cast<int>(a.r.heads[0]);
  const int htot = heads0 + static_cast<int>(a.r.heads[1]);
  const int steps = (htot + rpw - 1) / rpw;
  const float fd = static_cast<float>(a.r.head_dim), inv_d = 1.f / fd;
  const bool pow2_d = (a.r.head_dim & (a.r.head_dim - 1)) == 0;
  const float eps = static_cast<float>(a.eps);
  // the slice: npairs float2 (MODEL with fp32 tables: the two rows need twice that)
  constexpr int kSlice = (MODEL && sizeof(T) == 4) ? 2 : 1;
  float2* cs = qk_cs + wib * npairs * kSlice;
  const int e0 = c * VEC, e1 = e0 + npairs;
  const ChunkPairs<INTERLEAVED, VEC> pair_at{e0, e1};
  const long long warp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + wib;
  const long long n_warps = static_cast<long long>(grid.blocks()) * (blockDim.x >> 5);
  const long long tokens = a.r.n_batch * a.r.n_seq;
  const int d = static_cast<int>(a.r.head_dim);
  float* wsm = reinterpret_cast<float*>(qk_cs + (blockDim.x >> 5) * npairs * kSlice);  // w' [2][D]
  for (int i = threadIdx.x; i < 2 * d; i += blockDim.x) wsm[i] = head_weight(a, i / d, i % d);
  // BWD: the lane's dw terms go to its columns of row wib * rpw + sub (zeroed first)
  [[maybe_unused]] float* rows = wsm + 2 * d;
  [[maybe_unused]] float* my_row = rows + (wib * rpw + sub) * (a.part_cols + kDwPad);
  if (BWD) {
    const long long n_rows = (blockDim.x >> 5) * rpw * (a.part_cols + kDwPad);
    for (long long i = threadIdx.x; i < n_rows; i += blockDim.x) rows[i] = 0.f;
  }
  auto unit_at = [&](unsigned ub, unsigned us, int step) {  // the lane's row (RowUnit)
    RowUnit u;
    u.b = ub;
    u.s = us;
    const int h = step * rpw + sub;
    u.on = sub < rpw && h < htot;
    u.t = h >= heads0 ? 1 : 0;
    u.hh = u.t ? h - heads0 : h;
    u.in_off = ub * a.r.in_sb[u.t] + us * a.r.in_ss[u.t] + u.hh * a.r.in_sh[u.t];
    u.out_off = ub * a.r.out_sb[u.t] + us * a.r.out_ss[u.t] + u.hh * a.r.out_sh[u.t];
    u.x_off = BWD ? ub * a.x_sb[u.t] + us * a.x_ss[u.t] + u.hh * a.x_sh[u.t] : u.in_off;
    return u;
  };
  // Work items: (token, group of steps), a.step_groups contiguous groups of
  // spg steps per token (1 at prefill: the warp walks all of its token's heads;
  // always 1 backward, whose registers have no room for it).
  const int groups = BWD ? 1 : static_cast<int>(a.step_groups);
  const int spg = (steps + groups - 1) / groups;
  const long long items = tokens * groups;
  auto split = [&](long long item, unsigned& ub, unsigned& us, int& s0, int& s1) {
    long long tok = item;  // one division per token (two with groups)
    int g = 0;
    if (groups > 1) {
      tok = item / groups;
      g = static_cast<int>(item - tok * groups);
    }
    ub = static_cast<unsigned>(tok / a.r.n_seq);
    us = static_cast<unsigned>(tok - static_cast<long long>(ub) * a.r.n_seq);
    s0 = g * spg;
    s1 = min(steps, s0 + spg);
  };
  auto load_unit = [&](const RowUnit& u, RowPacks<T, VEC, BWD>& p) {  // without a ring
    if (!u.on) return;
    const long long src = BWD ? a.x_ptr[u.t] : a.r.in_ptr[u.t];
    p.x[0] = load_pack<T, VEC>(src, u.x_off + e0);
    p.x[1] = load_pack<T, VEC>(src, u.x_off + e1);
    if (BWD) {
      p.g[0] = load_pack<T, VEC>(a.r.in_ptr[u.t], u.in_off + e0);
      p.g[1] = load_pack<T, VEC>(a.r.in_ptr[u.t], u.in_off + e1);
    }
  };
  auto advance = [&](RowCursor& cu) {  // the next unit
    if (cu.item < items && ++cu.step == cu.end) {
      cu.item += static_cast<int>(n_warps);
      if (cu.item < items) split(cu.item, cu.b, cu.s, cu.step, cu.end);
    }
  };
  // the lane's packs of cu's unit into ring stage st (a group committed
  // even when empty, so that every wait counts the same groups)
  [[maybe_unused]] auto issue = [&](const RowCursor& cu, int st) {
    if (cu.item < items) {
      const RowUnit u = unit_at(cu.b, cu.s, cu.step);
      if (u.on) {
        uint4* dst = ring + st * kStage + lane;
        const T* x = reinterpret_cast<const T*>(BWD ? a.x_ptr[u.t] : a.r.in_ptr[u.t]) + u.x_off;
        cp_async16(dst, x + e0);
        cp_async16(dst + 32, x + e1);
        if (BWD) {
          const T* g = reinterpret_cast<const T*>(a.r.in_ptr[u.t]) + u.in_off;
          cp_async16(dst + 64, g + e0);
          cp_async16(dst + 96, g + e1);
        }
      }
    }
    cp_async_commit();
  };
  __syncthreads();
  sink.ready();  // (after the weights' loads)
  const bool tab = MODEL && a.table;  // the caller's tables: their rows in the slice
  [[maybe_unused]] T* tsm = reinterpret_cast<T*>(cs);
  long long pos0 = 0;
  bool fresh = true;  // the item's first step
  RowCursor cur{static_cast<int>(warp), 0, 0, 0u, 0u};
  if (cur.item < items) split(cur.item, cur.b, cur.s, cur.step, cur.end);
  [[maybe_unused]] RowCursor ld = cur;  // the next unit the ring takes
  [[maybe_unused]] int stage = 0;
  RowPacks<T, VEC, BWD> packs;
  if constexpr (kRing > 0) {
#pragma unroll
    for (int i = 0; i < kRing - 1; ++i) {
      issue(ld, i);
      advance(ld);
    }
  } else if (cur.item < items) {
    load_unit(unit_at(cur.b, cur.s, cur.step), packs);
  }
  while (cur.item < items) {
    const unsigned b = cur.b, s = cur.s;
    const RowUnit u = unit_at(b, s, cur.step);
    if constexpr (kRing > 0) {  // the ring's next unit, into the stage freed last step
      issue(ld, stage == 0 ? kRing - 1 : stage - 1);
      advance(ld);
    }
    if (fresh && tab) {  // the token's table rows: cos at pos_ptr, sin at seq_off_ptr
      table_rows<T, VEC>(a, tsm, b, s, lane, 2 * npairs);
      __syncwarp();
    } else if (fresh) {  // the token's cos/sin (its first loads are in flight)
      pos0 = a.r.stream_map_ptr ? 0 : token_position(a.r, b, s, 0);
      if (!a.r.freq_sh) {
        for (int p = lane; p < npairs; p += 32)
          cs[rows_cs_slot<INTERLEAVED, VEC>(p, npairs)] = pair_cos_sin(a.r, b, s, p, 0, pos0);
      }
      __syncwarp();
    }
    RowCursor nxt_at = cur;
    advance(nxt_at);
    RowPacks<T, VEC, BWD> nxt;  // without a ring: the next unit's loads
    if constexpr (kRing == 0) {
      if (nxt_at.item < items) load_unit(unit_at(nxt_at.b, nxt_at.s, nxt_at.step), nxt);
    }
    float2 csv[VEC];
    if (!tab) chunk_cos_sin<INTERLEAVED, VEC>(a, cs, cpr, c, u, pair_at, pos0, csv);
    const int t = u.t;
    if constexpr (kRing > 0) {  // this unit's packs, landed
      cp_async_wait<kRing - 1>();
      const uint4* src = ring + stage * kStage + lane;
      packs.x[0] = *reinterpret_cast<const Pack<T, VEC>*>(src);
      packs.x[1] = *reinterpret_cast<const Pack<T, VEC>*>(src + 32);
      if constexpr (BWD) {
        packs.g[0] = *reinterpret_cast<const Pack<T, VEC>*>(src + 64);
        packs.g[1] = *reinterpret_cast<const Pack<T, VEC>*>(src + 96);
      }
    }
    float x[2][VEC] = {}, g[2][VEC] = {};  // forward: x; backward: x and dy
    if (u.on) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        unpack_f32<T, VEC>(packs.x[k], x[k]);
        if (BWD) unpack_f32<T, VEC>(packs.g[k], g[k]);
      }
    }
    if (a.rope_first) {
      rotate_vals<INTERLEAVED, VEC>(x, csv, 1.f);
      if ((!BWD || MODEL) && a.rounding) {  // the model modes' rounding of R x
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int i = 0; i < VEC; ++i) x[k][i] = round_to<T>(x[k][i]);
      }
    }
    const float r = row_rsqrt<VEC>(x, c, cpr, sub, pow2_d, inv_d, fd, eps);
    const bool has_w = a.w_ptr[t] != 0;
    float w[2][VEC];
    lane_weights<VEC>(wsm, t, d, e0, e1, w);
    if constexpr (!BWD) {
      if (tab) {
        row_forward_table<T, INTERLEAVED, VEC>(a, u, x, w, tsm, 2 * npairs, r, has_w, e0, e1,
                                               sink);
      } else {
        row_forward<T, INTERLEAVED, VEC>(a, u, x, w, csv, r, has_w, e0, e1, sink);
      }
    } else if constexpr (MODEL) {
      row_backward_model<T, INTERLEAVED, VEC>(a, u, x, g, w, csv, tsm, tab, r, has_w, fd, c, cpr,
                                              sub, my_row, e0, e1);
    } else {
      const float mean =
          row_backward_mean<INTERLEAVED, VEC>(a, x, g, w, csv, r, inv_d, c, cpr, sub);
      if (u.on && has_w) {  // dw terms: float4 read-modify-writes of the lane's columns
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int i = 0; i < VEC; i += 4) {
            float4& dw = *reinterpret_cast<float4*>(my_row + a.w_col[t] + (k ? e1 : e0) + i);
            float4 v4 = dw;
            v4.x = fmaf(g[k][i], x[k][i], v4.x);
            v4.y = fmaf(g[k][i + 1], x[k][i + 1], v4.y);
            v4.z = fmaf(g[k][i + 2], x[k][i + 2], v4.z);
            v4.w = fmaf(g[k][i + 3], x[k][i + 3], v4.w);
            dw = v4;
          }
      }
      row_backward_store<T, INTERLEAVED, VEC>(a, u, x, g, w, csv, r, mean, e0, e1);
    }
    fresh = nxt_at.item != cur.item;
    if (fresh) __syncwarp();  // every lane is done with the token's cos/sin
    if constexpr (kRing == 0) packs = nxt;
    cur = nxt_at;
    stage = stage + 1 == kRing ? 0 : stage + 1;
  }
  if constexpr (BWD) block_dw_row(a, rows, (blockDim.x >> 5) * rpw);
}

// Blocks of kQkThreads threads that must fit an SM at once (also the flat
// entry's bound): CUPROPE_QKNORM_MIN_BLOCKS(_BWD).
template <bool BWD>
__host__ __device__ constexpr int qknorm_rows_min_blocks() {
  return BWD ? CUPROPE_QKNORM_MIN_BLOCKS_BWD : CUPROPE_QKNORM_MIN_BLOCKS;
}

template <typename T, bool INTERLEAVED, int VEC, bool BWD, bool MODEL = false>
__global__ void __launch_bounds__(kQkThreads, qknorm_rows_min_blocks<BWD>())
    qknorm_rows_kernel(const QkNormArgs a) {
  qknorm_rows_body<T, INTERLEAVED, VEC, BWD, WholeGrid, QkOutSink, MODEL>(a);
}

template <typename T, int VEC>
__device__ __forceinline__ void QkOutSink::vals(const QkNormArgs& a, int t, unsigned, unsigned,
                                                int, long long out_off, int e0, int e1,
                                                const float (&x)[2][VEC]) const {
  store_vals<T, VEC>(a.r.out_ptr[t], out_off, e0, e1, x);
}

// The weight gradients from the partial rows: column c of out is the sum of
// part[0..rows)[col0 + c] in a fixed order (kQkWarps slices of rows, each summed
// in order, then the slices in order), stored in out_dtype (0 f32, 1 f16, 2 bf16).
// Blocks of kQkThreads threads in one dimension (warp y of the block sums slice y of
// columns blockIdx.x * 32 + lane), so that a launcher with 1-D blocks (jaxlib's
// GPU kernel call) launches it as it is; part_ptr is its one input and out_ptr
// its one output, in that order.
__global__ void __launch_bounds__(kQkThreads)
    qknorm_dw_kernel(long long part_ptr, long long rows, long long stride, long long col0,
                     long long cols, long long out_ptr, long long out_dtype) {
  __shared__ float acc[kQkWarps][32];
  const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const long long c = static_cast<long long>(blockIdx.x) * 32 + lane;
  const float* part = reinterpret_cast<const float*>(part_ptr);
  float v = 0.f;
  if (c < cols) {
    for (long long row = slice; row < rows; row += kQkWarps) v += part[row * stride + col0 + c];
  }
  acc[slice][lane] = v;
  __syncthreads();
  if (slice != 0 || c >= cols) return;
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kQkWarps; ++k) sum += acc[k][lane];
  if (out_dtype == 1) {
    reinterpret_cast<__half*>(out_ptr)[c] = from_f32<__half>(sum);
  } else if (out_dtype == 2) {
    reinterpret_cast<__nv_bfloat16*>(out_ptr)[c] = from_f32<__nv_bfloat16>(sum);
  } else {
    reinterpret_cast<float*>(out_ptr)[c] = sum;
  }
}

}  // namespace cuprope
