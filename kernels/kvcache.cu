// Translation unit of the KV-cache dialect (its records: the kvcache
// families in cuprope/kvcache/kernels.py, one instantiation of
// cuprope::kv_rope_kernel per name, and the decode family in
// cuprope/_core/rope_kernels.py, cuprope::rope_decode_kernel).
#include "kvcache.cuh"
#include "decode.cuh"
