// The body of the sequence-softmax statistics pass (kernels/lrpe.cuh), shared
// by lrpe_seq_stats_kernel and lrpe_seq_stats_flat_kernel: included inside
// both kernels' braces (no include guard), it reads ``a`` (RopeArgs) and
// threadIdx.x/.y of a (32, kSeqSlices) block, which the flat entry maps from
// its one-dimensional block. Text inclusion keeps the by-value kernel's PTX
// what it was before the flat entry existed (an inlined function did not).
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
