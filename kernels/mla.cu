// Translation unit of DeepSeek MLA's rope + latent-cache append
// (cuprope/_core/loader.py: the mla family, one instantiation of
// cuprope::mla_rope_kernel per name).
#include "mla.cuh"
