// split_k_reduce.cuh: the second pass of a split-K GEMM (mmq.cu, gemm_wgmma.cu). A template
// includes it after gj_ptx.cuh and names the entries with GJ_SPLIT_K_REDUCE_ENTRY(name) and
// GJ_SPLIT_K_REDUCE_BF16_ENTRY(name); SPLITS is its constant.
//   name(part, y, n): y[i] = sum of the SPLITS partial planes part[z][i] in order z = 0, 1, ...
//   (a fixed order, so the result does not depend on which split finished first), i < n =
//   T * n_rows. Launch: grid ceil(n / 256), block 256.
//   The bf16 entry writes the same sum rounded to bf16 (nearest even), bit-equal to rounding the
//   fp32 entry's output: a tensor-parallel prefill chunk's row-parallel product goes to its bf16
//   all-reduce in that form, without a conversion launch of its own.
#ifndef GJ_SPLIT_K_REDUCE_CUH
#define GJ_SPLIT_K_REDUCE_CUH

// One entry of output type YT, each sum stored as CONVERT(sum) (CONVERT empty: the float).
#define GJ_SPLIT_K_REDUCE_AS(NAME, YT, CONVERT)                                          \
    extern "C" __global__ void __launch_bounds__(256)                                    \
        NAME(const float* __restrict__ part, YT* __restrict__ y, int n) {                \
        gj_grid_sync();                                                                  \
        const int i = blockIdx.x * 256 + threadIdx.x;                                    \
        if (i >= n) return;                                                              \
        float s = part[i];                                                               \
        _Pragma("unroll") for (int z = 1; z < SPLITS; ++z) s += part[(size_t)z * n + i]; \
        y[i] = CONVERT(s);                                                               \
    }
#define GJ_SPLIT_K_REDUCE_ENTRY(NAME) GJ_SPLIT_K_REDUCE_AS(NAME, float, )
#define GJ_SPLIT_K_REDUCE_BF16_ENTRY(NAME) GJ_SPLIT_K_REDUCE_AS(NAME, bf16_bits, f32_to_bf16)

#endif  // GJ_SPLIT_K_REDUCE_CUH
