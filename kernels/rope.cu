// Translation unit compiled by cuprope/_core/loader.py (CuPy RawModule with
// name_expressions, one per instantiation its records list: rope_kernel and
// lrpe_seq_stats_kernel in cuprope/_core/rope_kernels.py, the QK-norm kernels
// in cuprope/qknorm/kernels.py) and by cuprope/_core/ptx.py (PTX of one
// cuprope::rope_flat_kernel or qknorm_flat_kernel instantiation at a time, for
// cuprope.jax).
#include "rope.cuh"
#include "flat.cuh"
#include "qknorm.cuh"
#include "qknorm_flat.cuh"
