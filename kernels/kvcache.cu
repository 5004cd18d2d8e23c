// Translation unit of the KV-cache dialect (cuprope/_core/loader.py: the
// kvcache families, one instantiation of cuprope::kv_rope_kernel per name,
// and the decode family, cuprope::rope_decode_kernel).
#include "kvcache.cuh"
#include "decode.cuh"
