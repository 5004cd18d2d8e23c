// Translation unit of the decode prologue (cuprope/_core/loader.py: the
// prologue families, one instantiation of cuprope::prologue_kernel per name).
#include "prologue.cuh"
