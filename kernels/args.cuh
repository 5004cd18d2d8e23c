// Kernel arguments, passed by value as one struct to every kernel. Every
// field is 8 bytes so the host's packing has the same layout with no padding
// rules involved. Strides are in elements. In a file of its own because the
// host mirrors it field by field (ROPE_ARGS in the rotation's args module; a test
// compares the two): a change here goes with one there.
#pragma once

namespace cuprope {

struct RopeArgs {
  long long in_ptr[2];   // tensor 0 (q or x) and tensor 1 (k; unused if heads[1] == 0)
  long long out_ptr[2];
  long long in_sb[2], in_ss[2], in_sh[2];     // batch, sequence, head strides of the inputs
  long long out_sb[2], out_ss[2], out_sh[2];  // ... of the outputs
  long long heads[2];
  long long n_batch, n_seq;  // tokens = n_batch * n_seq; token t -> (t / n_seq, t % n_seq)
  long long head_dim;        // D
  long long rot_dim;         // R (even, <= D)
  long long copy_rest;       // packs per pass-through chunk copying dims [R, D) to the
                             // output (1 or 2, out-of-place); 0: none (in-place)
  // positions (cos/sin tables for kSrcTable: see below)
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
  // LRPE (appended; plain RoPE never reads these)
  long long aux_ptr;                 // x beside dO in the fused backward (tensor 0's geometry)
  long long aux_sb, aux_ss, aux_sh;  // its batch, sequence, head strides
  long long stats_ptr;               // float*, sequence-softmax statistics [2 or 3][B*H*D]
  long long stats_plane;             // B*H*D, the length of one plane of stats
  // token runs (kSrcPerHead with implicit positions): tokens per warp, the
  // warp owning one head of them (see rope_kernel); 0: heads per warp
  long long tok_tile;
};
// The cos/sin-table angle source (SRC == kSrcTable) reuses the position
// fields: cos at pos_ptr, sin at seq_off_ptr, two [B, S, R] tables in T with
// a contiguous last dim and batch / sequence strides pos_sb / pos_ss.

// The KV-cache dialect's extra arguments (kernels/kvcache.cuh; host mirror
// KV_ARGS beside ROPE_ARGS). The RopeArgs beside it carries q
// (tensor 0) and k (tensor 1) with their outputs, positions and angles.
struct KvArgs {
  long long v_ptr;                     // v, tensor 1's geometry (0: no v)
  long long v_sb, v_ss, v_sh;          // its batch, sequence, head strides
  long long k_cache, v_cache;          // caches (0: not written)
  long long kc_sp, kc_sr, kc_sh;       // page, row, head strides of the k cache
  long long vc_sp, vc_sr, vc_sh;       // ... of the v cache
  long long num_pages, page_size;
  long long slot_ptr;                  // int64 [T] flat slots; 0: paged addressing
  long long batch_ptr, cpos_ptr;       // [T] batch index and cache position of each token
  long long indices_ptr, indptr_ptr;   // kv_indices [n_indices], kv_indptr [n_seqs + 1]
  long long n_indices;
  long long index_is64;                // bit 0 batch, 1 cpos, 2 indices, 3 indptr
  long long n_seqs;
  long long q_scale, k_scale, v_scale;  // const float*: fp8 scales (device scalars)
  long long kv_scale_sh;               // 0: one k and one v scale; 1: one per k head
  long long cs_ptr, cs_st, cs_rows;    // cos_sin_cache [rows, R]: cos [0, R/2), sin [R/2, R)
  long long write_rest;                // bit 0: q's dims >= R to q_out; bit 1: k's to k_out
};

}  // namespace cuprope
