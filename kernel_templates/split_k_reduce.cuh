// split_k_reduce.cuh: the second pass of a split-K GEMM (mmq.cu, gemm_wgmma.cu). A template
// includes it after gj_ptx.cuh and names the entry with GJ_SPLIT_K_REDUCE_ENTRY(name); SPLITS is
// its constant.
//   name(part, y, n): y[i] = sum of the SPLITS partial planes part[z][i] in order z = 0, 1, ...
//   (a fixed order, so the result does not depend on which split finished first), i < n =
//   T * n_rows. Launch: grid ceil(n / 256), block 256.
#ifndef GJ_SPLIT_K_REDUCE_CUH
#define GJ_SPLIT_K_REDUCE_CUH

#define GJ_SPLIT_K_REDUCE_ENTRY(NAME)                                                    \
    extern "C" __global__ void __launch_bounds__(256)                                    \
        NAME(const float* __restrict__ part, float* __restrict__ y, int n) {             \
        gj_grid_sync();                                                                  \
        const int i = blockIdx.x * 256 + threadIdx.x;                                    \
        if (i >= n) return;                                                              \
        float s = part[i];                                                               \
        _Pragma("unroll") for (int z = 1; z < SPLITS; ++z) s += part[(size_t)z * n + i]; \
        y[i] = s;                                                                        \
    }

#endif  // GJ_SPLIT_K_REDUCE_CUH
