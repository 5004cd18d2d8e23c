// Translation unit compiled by cuprope/_loader.py (CuPy RawModule with
// name_expressions, one per instantiation of cuprope::rope_kernel).
#include "rope.cuh"
