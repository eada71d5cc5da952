// convert_f32: fp32 activations -> fp16 / bf16, round to nearest even, for the cuBLAS products
// whose weights are F16 / BF16 (cuBLAS multiplies two matrices of one type; the fp32 residual
// stream stays fp32 everywhere else).
//
// Constants: THREADS (block size).
// Launch: block THREADS, grid ceil(n / 4 / THREADS); n % 4 == 0 (rows of a multiple of 4 values).
// Entries: f32_to_f16(x, y, n), f32_to_bf16(x, y, n): y[i] = round(x[i]) for i < n, y 8-byte
// aligned (f32_to_bf16 also for the bf16 all-reduces of tensor-parallel prefill, whose sums the
// post-norms read as bf16: rmsnorm's X_BF16).
#include "gj_ptx.cuh"

#ifndef THREADS
#define THREADS 256
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
    f32_to_f16(const float4* __restrict__ x, uint2* __restrict__ y, int n) {
    gj_grid_sync();
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= n / 4) return;
    const float4 v = __ldg(x + i);
    y[i] = make_uint2(pack_f16x2(v.x, v.y), pack_f16x2(v.z, v.w));
}

extern "C" __global__ void __launch_bounds__(THREADS)
    f32_to_bf16(const float4* __restrict__ x, uint2* __restrict__ y, int n) {
    gj_grid_sync();
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i >= n / 4) return;
    const float4 v = __ldg(x + i);
    y[i] = make_uint2(pack_u16x2(f32_to_bf16(v.x), f32_to_bf16(v.y)),
                      pack_u16x2(f32_to_bf16(v.z), f32_to_bf16(v.w)));
}
