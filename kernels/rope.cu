// Translation unit compiled by cuprope/_core/loader.py (CuPy RawModule with
// name_expressions, one per instantiation of cuprope::rope_kernel and
// cuprope::lrpe_seq_stats_kernel).
#include "rope.cuh"
#include "qknorm.cuh"
