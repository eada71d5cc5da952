// quantize_q8_1: fp32 activations -> Q8_1 activations (int8 q plus float2 {d, d * sum(q)} per 32
// consecutive values; see quantize_q8_1_group8 in gj_ptx.cuh) for the dp4a matvecs, where the
// producer is not a norm that can quantize itself (attention output -> o-proj, GeGLU output ->
// down-proj, PLE gate product -> PLE proj).
//
// Constants: THREADS (block size, a multiple of 32; default 256).
// Launch: block THREADS, grid ceil(8 * n_blocks / THREADS).
// Entry: quantize_q8_1(x, xq, xds, n_blocks) over n_blocks 32-blocks of contiguous x (any number
// of rows of any width that is a multiple of 32); xq is written as 4-value words.
#include "gj_ptx.cuh"

#ifndef THREADS
#define THREADS 256
#endif
static_assert(THREADS % 32 == 0 && THREADS <= 1024,
              "quantize_q8_1: THREADS must be a multiple of 32");

extern "C" __global__ void __launch_bounds__(THREADS)
    quantize_q8_1(const float* __restrict__ x, uint32* __restrict__ xq, float2* __restrict__ xds,
                  int n_blocks) {
    gj_grid_sync();
    const int i = blockIdx.x * THREADS + threadIdx.x;  // index of 4 consecutive values
    // Groups of 8 lanes are whole 32-blocks, so liveness is uniform within each group and the
    // group shuffles inside quantize_q8_1_group8 see only their own block.
    const bool live = i < n_blocks * 8;
    const float4 v = live ? __ldg((const float4*)x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    float2 ds;
    const uint32 packed = quantize_q8_1_group8(v, &ds);
    if (!live) return;
    xq[i] = packed;
    if (i % 8 == 0) xds[i / 8] = ds;
}
