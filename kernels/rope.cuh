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
// with HF's formula and PyTorch's roundings (cuprope/rope/tables.py).
//
// Compile-time parameters: element type T, pairing (interleaved (2i, 2i+1) or
// half split (i, i + R/2)), VEC, the number of pairs a thread owns, chosen
// so a thread's loads are 16 bytes wide where alignment allows, and SRC, the
// angle source (shared table, per-head table, cos/sin tables).
//
// The LRPE dialect (cuprope/lrpe/api.py) reuses the same kernel: two
// more template parameters, ACT (an activation applied to x before the
// rotation) and BWD (the fused backward through rotation and activation, with
// x read beside dO). Their defaults, ACT = kActNone and BWD = false, compile
// every LRPE hook away, so the plain RoPE instantiations carry none of them.
//
// Here: where pairs sit, the rotations of a chunk, the warp's work, its three
// paths (staged_rows, token_runs, register_rows) and rope_kernel, which picks
// one. common.cuh has what every kernel needs (types, packs, exact angles,
// positions), lrpe.cuh the LRPE hooks, constants.cuh and args.cuh what the
// host shares.
#pragma once

#include "common.cuh"
#include "lrpe.cuh"

namespace cuprope {

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
    // explicit FMAs: a contracted a*b + c*d fused whichever product the compiler
    // chose, and its choice varied with VEC, so pack widths (an aligned and a
    // misaligned view) differed in the last bit; this way every kernel and width
    // rounds a pair alike
    e1 = from_f32<T>(fmaf(x1, cs.x, -(x2 * cs.y)));
    e2 = from_f32<T>(fmaf(x2, cs.x, x1 * cs.y));
  }
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

// ---------------------------------------------------------------- the warp's work
// Each warp owns one (token, head group): heads [g*heads_per_group, ...) of the
// concatenated head list (q heads, then k heads). A lane owns one chunk (VEC
// pairs of a head, or pass-through elements when copying dims >= R); the warp
// covers 32/cpr heads per step, cpr = min(chunks, 32) lanes per head. With
// token runs the warp owns one head h0 of the tokens [s, s + tok_tile) of
// sequence b instead, the units ordered (b, tile, head).
//
// rope_kernel decodes this into its locals, and the paths read them through
// Warp, TokenRows and Lane, structs of references. Their helpers per chunk and
// per head are function objects over references to the same locals: lambdas
// within a path, or the structs below where paths share one, built where
// they are called, with their members in the order the single kernel's
// lambdas captured them. That keeps every instantiation's PTX what it was
// before the kernel was split into paths (benchmarks/ptx_diff.py): the
// compiler optimises a called object on its own before inlining it but a
// function after, a struct of values escapes whole where a helper holds it,
// and the order of the locals orders some instructions.
struct Warp {
  const int &npairs, &chunks;
  const int &cpr, &rpw;   // lanes per head, heads per step
  const int &lane, &sub;  // sub: the head of the step this lane works on (idle if >= rpw)
  const int &heads0;      // q heads; h >= heads0 is head h - heads0 of k
  const unsigned &n_seq, &tile, &b, &s;
  const bool& runs;       // token runs
  const int &h0, &h1;
  float2* const& my_cs;   // the warp's cos/sin slice (kSrcShared; token runs: the step's rotations)
};

// (pointer, element offset) of head h's row in the inputs (OUT: outputs); h
// indexes the concatenated head list, so tensor 1 (k) from heads0 on.
template <bool OUT>
struct Rows {
  const RopeArgs& a;
  const int& heads0;
  const long long &base0, &base1;
  __device__ Row operator()(int h) const {
    const bool is_k = h >= heads0;
    const long long* ptr = OUT ? a.out_ptr : a.in_ptr;
    const long long* sh = OUT ? a.out_sh : a.in_sh;
    return Row{is_k ? ptr[1] : ptr[0], is_k ? base1 + (h - heads0) * sh[1] : base0 + h * sh[0]};
  }
};

// Element offsets of chunk c's packs; `two`: a second pack (every rotated
// chunk, and pass-through chunks of two packs). A region's chunks take its
// first half with their first pack and its second half with the second, so
// each load instruction of the warp covers whole contiguous sectors: rotated
// [0, R) splits at R/2 (interleaved too: pairs never straddle it, since
// R/2 is a multiple of VEC), pass-through [R, D) at its middle. The one
// exception, interleaved with one-element packs, keeps a pair's two
// elements side by side. e0, e1 are within a head: D < 2^31.
template <bool INTERLEAVED, int VEC>
struct ChunkGeometry {
  bool& rot;
  const int &c, &rot_chunks;
  bool& two;
  const int& cw;
  int &e0, &e1;
  const int &npairs, &chunks;
  __device__ void operator()() const {
    rot = c < rot_chunks;
    two = rot || cw == 2;
    if (rot) {
      e0 = (INTERLEAVED && VEC == 1) ? 2 * c : c * VEC;
      e1 = (INTERLEAVED && VEC == 1) ? e0 + 1 : e0 + npairs;
    } else {
      e0 = 2 * npairs + (c - rot_chunks) * VEC;
      e1 = e0 + (chunks - rot_chunks) * VEC;  // used when cw == 2
    }
  }
};

// The pair of the chunk at e0, e1 at pair_slot v.
template <bool INTERLEAVED, int VEC>
struct ChunkPairs {
  const int &e0, &e1;
  __device__ int operator()(int v) const {
    return INTERLEAVED ? ((2 * v < VEC ? e0 : e1) + (2 * v) % VEC) / 2 : e0 + v;
  }
};

// The token's rows (head h's in the inputs and outputs) and x's offset
// beside dO (LRPE backward).
struct TokenRows {
  const Rows<false>& in;
  const Rows<true>& out;
  const long long& aux;
};

// The lane's share: whether it works (lanes left over when cpr does not
// divide 32 idle), the heads it advances per trip in register rows, its
// chunk c (it advances by cpr) and that chunk's geometry, which `geometry`
// sets.
template <bool INTERLEAVED, int VEC>
struct Lane {
  const bool& active;
  const int& step;
  int& c;
  int &e0, &e1;
  bool &rot, &two;
  const ChunkGeometry<INTERLEAVED, VEC>& geometry;
  const ChunkPairs<INTERLEAVED, VEC>& pair_at;
};

// The token's position in stream 0: loaded once, not once per pair (with few
// tokens, as in decode, the launch is one dependent chain of loads).
struct Stream0Position {
  const RopeArgs& a;
  const unsigned &b, &s;
  __device__ long long operator()() const {
    return a.stream_map_ptr ? 0 : token_position(a, b, s, 0);
  }
};

// This lane's share of the token's cos/sin into the warp's slice
// (kSrcShared). pos0, f0: the token's stream-0 position and the inverse
// frequency of the lane's first pair, which the staged path loads before
// priming its ring.
template <bool INTERLEAVED, int VEC>
struct SliceCosSin {
  const int &lane, &npairs;
  const RopeArgs& a;
  const unsigned &b, &s;
  float2* const& my_cs;
  __device__ void operator()(long long pos0, double f0) const {
    for (int p = lane; p < npairs; p += 32) {
      const float2 cs = p == lane && !a.stream_map_ptr ? scaled_cos_sin(a, pos0, f0)
                                                       : pair_cos_sin(a, b, s, p, 0, pos0);
      my_cs[cs_slot<INTERLEAVED, VEC>(p, npairs)] = cs;
    }
    __syncwarp();
  }
};
// The same, loading pos0 and f0 first.
template <bool INTERLEAVED, int VEC>
struct TokenCosSin {
  const SliceCosSin<INTERLEAVED, VEC>& fill;
  const Stream0Position& stream0_position;
  const int &lane, &npairs;
  const RopeArgs& a;
  __device__ void operator()() const {
    fill(stream0_position(), lane < npairs ? inv_freq_at(a, 0, lane) : 0.0);
  }
};

// ---------------------------------------------------------------- staged path
// Loads through a per-warp shared-memory ring (kStages > 0: 16-byte packs,
// shared angles or cos/sin tables, plain RoPE), kStages - 1 heads ahead.
// Lane slots (stage st, pack k) at ring[(2 * st + k) * 32] of the warp's
// ring, which follows the block's cos/sin slices (kSrcShared). Head h + j *
// rpw of the lane's chunk goes to stage j mod kStages, one commit group per
// head. kSrcTable: four more slots after the stages hold the chunk's cos
// (packs 0, 1) and sin (2, 3), one group issued first.
template <typename T, bool INTERLEAVED, int VEC, int SRC, int kStages>
__device__ __forceinline__ void staged_rows(const RopeArgs& a, const Warp& w, const TokenRows& rows,
                                            const Lane<INTERLEAVED, VEC>& ln, float2* warp_cs) {
  constexpr bool TABLE = SRC == kSrcTable;
  // the names below; the lambdas hold them by reference, like all helpers (see Warp)
  const int &npairs = w.npairs, &lane = w.lane, &sub = w.sub, &rpw = w.rpw, &h0 = w.h0;
  const int& h1 = w.h1;
  const unsigned &b = w.b, &s = w.s;
  int &c = ln.c, &e0 = ln.e0, &e1 = ln.e1;
  bool &rot = ln.rot, &two = ln.two;
  const auto& geometry = ln.geometry;
  const auto& in_row = rows.in;
  const Stream0Position stream0_position{a, b, s};
  const SliceCosSin<INTERLEAVED, VEC> warp_cos_sin_from{lane, npairs, a, b, s, w.my_cs};
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
  auto prime = [&]() {  // chunk c's geometry, table packs and first kStages - 1 heads
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
  if (ln.active) prime();  // in flight while the cos/sin are computed
  if constexpr (!TABLE) warp_cos_sin_from(pos0, f0);
  if (!ln.active) return;
  for (bool primed = true; c < w.chunks; c += w.cpr, primed = false) {
    if (!primed) prime();
    // cos/sin (or the table packs) are re-read from shared memory per head:
    // fewer registers, and the wait's memory clobber keeps the compiler
    // from hoisting them
    const float2* cs0 = w.my_cs + cs_slot<INTERLEAVED, VEC>(ln.pair_at(0), npairs);
    const float2* cs1 = w.my_cs + cs_slot<INTERLEAVED, VEC>(ln.pair_at(VEC / 2), npairs);
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
      const Row r = rows.out(h);
      store_pack<T, VEC>(r.ptr, r.off + e0, x0);
      if (two) store_pack<T, VEC>(r.ptr, r.off + e1, x1);
      st = st + 1 == kStages ? 0 : st + 1;
    }
  }
}

// ---------------------------------------------------------------- token runs
// The warp's head h0 at its tokens [s, s_end); a lane takes every rpw-th
// (its rows k = 0, 1, ...). Its cos/sin are computed exactly at rows k % kRun
// == 0 and composed with the exact rotation by rpw positions in between
// (CUPROPE_RUN16/32: the error stays bounded at any position). The scale
// rides on the exact values (composing with a unit rotation keeps it;
// pair_cos_sin's value, without its stream-map branch and freq reload, which
// cost registers here).
//
// With 16-byte packs the rows load through a per-warp shared-memory ring
// (cp.async, kTokStages - 1 rows ahead), after the warp's step slice: the
// latency hides without holding rows in registers. Slots (stage st, pack k)
// at ring[(kPacks * st + k) * 32]: x at e0, e1, and in the LRPE backward x
// beside dO at e0, e1.
template <typename T, bool INTERLEAVED, int VEC, int ACT, bool BWD>
__device__ __forceinline__ void token_runs(const RopeArgs& a, const Warp& w, const TokenRows& rows,
                                           const Lane<INTERLEAVED, VEC>& ln, float2* warp_cs) {
  constexpr int kRun = sizeof(T) == 4 ? CUPROPE_RUN32 : CUPROPE_RUN16;
  // the names below; the lambda holds them by reference, like all helpers (see Warp)
  const unsigned& s = w.s;
  const int &e0 = ln.e0, &e1 = ln.e1;
  const bool& two = ln.two;
  const int &npairs = w.npairs, &lane = w.lane, &sub = w.sub, &rpw = w.rpw, &h0 = w.h0;
  const int& heads0 = w.heads0;
  int& c = ln.c;
  const int hh = h0 >= heads0 ? h0 - heads0 : h0;
  const double* freq = reinterpret_cast<const double*>(a.inv_freq_ptr) + hh * a.freq_sh;
  const float sign = static_cast<float>(a.sin_sign), sc = static_cast<float>(a.scale);
  // the step's rotation (rpw positions) per pair, in the warp's shared
  // slice (cs_slot's layout): computed once per warp, and not held in
  // registers, of which the 16-bit kernels have too few
  for (int p = lane; p < npairs; p += 32)
    w.my_cs[cs_slot<INTERLEAVED, VEC>(p, npairs)] = unit_rotation(rpw, freq[p], sign);
  __syncwarp();
  if (!ln.active) return;
  const int s_end = static_cast<int>(min(w.n_seq, s + w.tile));
  const bool is_k = h0 >= heads0;
  const Row ri = rows.in(h0), ro = rows.out(h0);
  const long long iss = is_k ? a.in_ss[1] : a.in_ss[0];
  const long long oss = is_k ? a.out_ss[1] : a.out_ss[0];
  const long long aux_off = rows.aux + hh * a.aux_sh;
  [[maybe_unused]] const long long scol =
      (static_cast<long long>(w.b) * a.heads[0] + hh) * a.head_dim;
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
  for (; c < w.chunks; c += w.cpr) {
    ln.geometry();
    float2 z[VEC];  // the row's cos/sin (scaled)
    const float2* w0 = w.my_cs + cs_slot<INTERLEAVED, VEC>(ln.pair_at(0), npairs);
    const float2* w1 = w.my_cs + cs_slot<INTERLEAVED, VEC>(ln.pair_at(VEC / 2), npairs);
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
      if (ln.rot) {
        if (k % kRun == 0) {
          const long long pos = token_position(a, w.b, t, 0);
#pragma unroll
          for (int v = 0; v < VEC; ++v) {
            const float2 u = unit_rotation(pos, freq[ln.pair_at(v)], sign);
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
}

// ---------------------------------------------------------------- register rows
// The lane loads kRows heads of its chunk into registers per trip (no ring:
// narrower packs, the per-head source without token runs, LRPE), with its
// cos/sin from the warp's slice (kSrcShared), per head (kSrcPerHead) or the
// table packs loaded once per chunk (kSrcTable). Token runs branch off here
// rather than in rope_kernel: inlined from here, their locals come before
// these, as in the single kernel (see Warp).
template <typename T, bool INTERLEAVED, int VEC, int SRC, int ACT, bool BWD, int kRows>
__device__ __forceinline__ void register_rows(const RopeArgs& a, const Warp& w,
                                              const TokenRows& rows,
                                              const Lane<INTERLEAVED, VEC>& ln, float2* warp_cs) {
  constexpr bool PER_HEAD = SRC == kSrcPerHead;
  constexpr bool TABLE = SRC == kSrcTable;
  if constexpr (PER_HEAD && ACT != kActSoftmax) {
    if (w.runs) {
      token_runs<T, INTERLEAVED, VEC, ACT, BWD>(a, w, rows, ln, warp_cs);
      return;
    }
  }
  // the names below; the lambda holds them by reference, like all helpers (see Warp)
  const int &rpw = w.rpw, &h1 = w.h1;
  const auto& in_row = rows.in;
  const int &e0 = ln.e0, &e1 = ln.e1;
  const bool& two = ln.two;
  const long long& aux_base = rows.aux;
  const int &npairs = w.npairs, &lane = w.lane, &heads0 = w.heads0;
  const unsigned &b = w.b, &s = w.s;
  int& c = ln.c;
  const Stream0Position stream0_position{a, b, s};
  const SliceCosSin<INTERLEAVED, VEC> warp_cos_sin_from{lane, npairs, a, b, s, w.my_cs};
  const TokenCosSin<INTERLEAVED, VEC> warp_cos_sin{warp_cos_sin_from, stream0_position, lane,
                                                   npairs, a};
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
  if (SRC == kSrcShared) warp_cos_sin();
  if (!ln.active) return;
  [[maybe_unused]] long long pos0 = 0;
  if constexpr (PER_HEAD) pos0 = stream0_position();

  for (; c < w.chunks; c += w.cpr) {
    ln.geometry();
    float2 cs[VEC];
    [[maybe_unused]] Pack<T, VEC> tc[2], ts[2];  // kSrcTable: cos and sin at e0 and e1
    if (ln.rot) {
      if constexpr (TABLE) {
        const long long toff = b * a.pos_sb + s * a.pos_ss;
        tc[0] = load_pack<T, VEC>(a.pos_ptr, toff + e0);
        tc[1] = load_pack<T, VEC>(a.pos_ptr, toff + e1);
        ts[0] = load_pack<T, VEC>(a.seq_off_ptr, toff + e0);
        ts[1] = load_pack<T, VEC>(a.seq_off_ptr, toff + e1);
      } else if constexpr (!PER_HEAD) {
#pragma unroll
        for (int v = 0; v < VEC; ++v)
          cs[v] = w.my_cs[cs_slot<INTERLEAVED, VEC>(ln.pair_at(v), npairs)];
      }
    }
    for (int h = w.h0 + w.sub; h < h1; h += ln.step) {
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
        const long long off =
            is_k ? rows.out.base1 + hh * a.out_sh[1] : rows.out.base0 + hh * a.out_sh[0];
        if (ln.rot) {
          if constexpr (PER_HEAD) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) cs[v] = pair_cos_sin(a, b, s, ln.pair_at(v), hh, pos0);
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

// ---------------------------------------------------------------- head softmax
// LRPE's softmax over the head dim: every lane stays (the row reductions
// shuffle), with the token's cos/sin in the warp's slice for shared angles.
template <typename T, bool INTERLEAVED, int VEC, bool PER_HEAD, bool BWD>
__device__ __forceinline__ void softmax_rows(const RopeArgs& a, const Warp& w) {
  const Stream0Position stream0_position{a, w.b, w.s};
  const SliceCosSin<INTERLEAVED, VEC> warp_cos_sin_from{w.lane, w.npairs, a, w.b, w.s, w.my_cs};
  const TokenCosSin<INTERLEAVED, VEC> warp_cos_sin{warp_cos_sin_from, stream0_position, w.lane,
                                                   w.npairs, a};
  if (!PER_HEAD) warp_cos_sin();
  softmax_head_rows<T, VEC, PER_HEAD, BWD>(a, w.my_cs, w.b, w.s, w.h0, w.h1, w.npairs, w.chunks,
                                           w.cpr, w.rpw, w.lane);
}

// ---------------------------------------------------------------- the kernel
// SRC, the angle source:
//   kSrcShared:  the warp computes cos/sin once per (token, pair) into its
//                slice of shared memory (cs_slot's layout); every head of q
//                and k reuses them.
//   kSrcPerHead: one frequency row per head (freq_sh != 0); cos/sin per
//                (token, head, pair). With implicit positions (tok_tile != 0)
//                a warp owns one head of tok_tile consecutive tokens instead
//                ("token runs", token_runs), so cos/sin advance by composition along
//                the tokens rather than by a sincos per row, and with
//                16-byte packs the rows load through a ring of their own.
//   kSrcTable:   cos and sin read from the caller's tables (HF layout), once
//                per (token, chunk), and applied as PyTorch evaluates HF's
//                formula (rotate_table).
// Per head a lane then only advances a pointer, loads one or two 16-byte
// packs, rotates and stores. Where packs are 16 bytes and the source is not
// per-head (kStages > 0), the loads go through a per-warp shared-memory ring
// (cp.async), kStages - 1 heads ahead, the first ones issued before the
// cos/sin are computed, and cos/sin (or the table packs) are re-read from
// shared memory per head (staged_rows); otherwise the lane loads kRows heads
// into registers (register_rows).
//
// ACT, BWD (LRPE, half split, one tensor, R = D): the activation is applied to
// x before the rotation (BWD: dx = act'(x) * R^T dO with x read from aux_ptr).
// The head-dim softmax takes its own warp-synchronous path (softmax_head_rows).
//
// Blocks that must fit an SM at once (CUPROPE_MIN_BLOCKS*, a register cap):
// the plain shared-angle kernels, and the per-head plain and elementwise LRPE
// kernels by element size and direction; the others are uncapped.
template <typename T, int SRC, int ACT, bool BWD>
__host__ __device__ constexpr int rope_min_blocks() {
  return (SRC == kSrcShared && ACT == kActNone) ? CUPROPE_MIN_BLOCKS
         : SRC != kSrcPerHead || ACT > kActSilu ? 1
         : BWD                                  ? CUPROPE_MIN_BLOCKS_PH_BWD
         : sizeof(T) == 4                       ? CUPROPE_MIN_BLOCKS_PH32
                                                : CUPROPE_MIN_BLOCKS_PH16;
}

// The kernel's body, shared with the flat entry points (kernels/flat.cuh).
template <typename T, bool INTERLEAVED, int VEC, int SRC, int ACT, bool BWD>
__device__ __forceinline__ void rope_body(const RopeArgs& a) {
  static_assert(ACT == kActNone || !INTERLEAVED, "LRPE pairs are half split");
  static_assert(ACT != kActNone || !BWD, "the plain backward is the forward with -sin");
  static_assert(ACT == kActNone || SRC != kSrcTable, "LRPE computes its angles");
  constexpr bool PER_HEAD = SRC == kSrcPerHead;
  constexpr int kStages = (SRC != kSrcPerHead && ACT == kActNone && sizeof(T) * VEC == 16)
                              ? (sizeof(T) == 4 ? CUPROPE_STAGES32 : CUPROPE_STAGES16)
                              : 0;
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
  const Warp w{npairs, chunks, cpr, rpw, lane, sub, heads0, n_seq, tile, b, s, runs, h0, h1, my_cs};
  if constexpr (ACT == kActSoftmax) {
    softmax_rows<T, INTERLEAVED, VEC, PER_HEAD, BWD>(a, w);
    return;
  }
  // rows (heads) a lane keeps in flight per step when it loads into registers
  // (no ring: narrower packs, the per-head source in head mode, LRPE with
  // shared angles)
  constexpr int kRows = sizeof(T) == 4 ? CUPROPE_ROWS32 : CUPROPE_ROWS16;
  const int step = kRows * rpw;  // heads a lane advances per trip
  const bool active = sub < rpw;  // lanes left over when cpr does not divide 32 idle
  const long long in_base0 = b * a.in_sb[0] + s * a.in_ss[0];
  const long long in_base1 = b * a.in_sb[1] + s * a.in_ss[1];
  const long long out_base0 = b * a.out_sb[0] + s * a.out_ss[0];
  const long long out_base1 = b * a.out_sb[1] + s * a.out_ss[1];
  const long long aux_base = b * a.aux_sb + s * a.aux_ss;
  int c = lane - sub * cpr;
  int e0 = 0, e1 = 0;
  bool rot = false, two = false;
  const ChunkGeometry<INTERLEAVED, VEC> geometry{rot, c, rot_chunks, two, cw, e0, e1, npairs,
                                                 chunks};
  const ChunkPairs<INTERLEAVED, VEC> pair_at{e0, e1};
  const Rows<false> in_row{a, heads0, in_base0, in_base1};
  const Rows<true> out_row{a, heads0, out_base0, out_base1};
  const TokenRows rows{in_row, out_row, aux_base};
  const Lane<INTERLEAVED, VEC> ln{active, step, c, e0, e1, rot, two, geometry, pair_at};
  if constexpr (kStages > 0) {
    staged_rows<T, INTERLEAVED, VEC, SRC, kStages>(a, w, rows, ln, warp_cs);
    return;
  }
  register_rows<T, INTERLEAVED, VEC, SRC, ACT, BWD, kRows>(a, w, rows, ln, warp_cs);
}

template <typename T, bool INTERLEAVED, int VEC, int SRC, int ACT = kActNone, bool BWD = false>
__global__ void __launch_bounds__(kThreads, rope_min_blocks<T, SRC, ACT, BWD>())
    rope_kernel(const RopeArgs a) {
  // (programmatic dependent launch: at entry, as the body loads q and k first)
  wait_prior_grids();
  let_dependents_launch();
  rope_body<T, INTERLEAVED, VEC, SRC, ACT, BWD>(a);
}

}  // namespace cuprope
