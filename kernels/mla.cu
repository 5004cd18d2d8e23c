// Translation unit of DeepSeek MLA's rope + latent-cache append (its
// record, cuprope/mla/kernels.py: the mla family, one instantiation of
// cuprope::mla_rope_kernel per name).
#include "mla.cuh"
