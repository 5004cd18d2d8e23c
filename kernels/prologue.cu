// Translation unit of the decode prologue (its record,
// cuprope/prologue/kernels.py: the prologue families, one instantiation of
// cuprope::prologue_kernel per name).
#include "prologue.cuh"
