// A tiny kernel for the JIT's own tests (compile, cache, load, launch). Specialized by SCALE and
// OFFSET; y[i] = x[i] * SCALE + OFFSET.
#include "jit_selftest.cuh"

extern "C" __global__ void gj_selftest_axpb(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gj_selftest_affine(x[i]);
}
