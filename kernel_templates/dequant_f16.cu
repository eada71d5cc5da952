// dequant_f16: K-quant rows -> fp16 rows, for the prefill products of K-quant matrices: a chunk
// of T > 8 tokens multiplies the dequantized copy with cuBLAS (tensor cores, fp32 accumulation)
// instead of running T / 8 batched matvecs, each of which would read the weights again. The copy
// lives in a per-session scratch buffer; the model keeps the K-quant bytes.
//
// Constants (prologue #defines):
//   K        row width in elements (a multiple of 256)
//   WTYPE    ggml type id: 12 Q4_K, 13 Q5_K, 14 Q6_K
//   THREADS  threads per block (multiple of 32)
// Launch: block THREADS, grid ceil(n_rows * K / 4 / THREADS).
// Entry: dequant_f16(src /*GGUF blocks [n_rows][K / 256]*/, dst /*fp16 [n_rows][K]*/, n_rows).
// Values are the CPU's dequantized floats (kquant.cuh), rounded to fp16 as the CPU's F16 upload
// rounds them.
#include "kquant.cuh"

#ifndef THREADS
#define THREADS 256
#endif
static_assert(K % 256 == 0 && K > 0, "dequant_f16: K must be a positive multiple of 256");
static_assert(WTYPE == 12 || WTYPE == 13 || WTYPE == 14,
              "dequant_f16: WTYPE must be 12 (q4_k), 13 (q5_k) or 14 (q6_k)");
static_assert(THREADS % 32 == 0 && THREADS <= 1024,
              "dequant_f16: THREADS must be a multiple of 32");

extern "C" __global__ void __launch_bounds__(THREADS)
    dequant_f16(const uint8* __restrict__ src, uint2* __restrict__ dst, int n_rows) {
    constexpr int kBlockBytes = WTYPE == 12   ? GJ_Q4_K_BYTES
                                : WTYPE == 13 ? GJ_Q5_K_BYTES
                                              : GJ_Q6_K_BYTES;
    const size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;  // group of 4 elements
    if (i >= (size_t)n_rows * (K / 4)) return;
    const size_t blk = i / 64;  // super-blocks are contiguous across rows
    const float4 v = gj_kq_dequant4<WTYPE>(src + blk * kBlockBytes, (int)(i % 64));
    dst[i] = make_uint2(pack_f16x2(v.x, v.y), pack_f16x2(v.z, v.w));
}
