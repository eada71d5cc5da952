// dequant_f16: K-quant (and Q4_1 / Q5_0 / Q5_1, and split Q8_0 / Q4_0) rows -> fp16 rows, for the
// prefill products of quantized matrices: a chunk of T > 8 tokens (for Q8_0 / Q4_0, which have a
// GEMM of their own: from GpuModel::copy_min_rows()) multiplies the dequantized copy with cuBLAS
// (tensor cores, fp32 accumulation) instead of running T / 8 batched matvecs, each of which would
// read the weights again. The copy lives in a per-session scratch buffer; the model keeps the
// quantized bytes.
//
// Constants (prologue #defines):
//   K        row width in elements (a multiple of 256; of 32 for the 32-element block types)
//   WTYPE    ggml type id: 12 Q4_K, 13 Q5_K, 14 Q6_K, 3 Q4_1, 6 Q5_0, 7 Q5_1, or (split layout
//            only) 8 Q8_0, 2 Q4_0
//   ELEMS    elements per thread: 8 (consecutive lanes write consecutive 16-byte runs)
//   THREADS  threads per block (multiple of 32)
//   LAYOUT   0: src holds the GGUF blocks; 1 (Q4_K, Q5_K, Q6_K): the split planes (kquant.cuh);
//            1 (Q4_1, Q5_0, Q5_1): the split planes of q32_blocks.cuh;
//            1 (Q8_0, Q4_0): the split planes of matvec_common.cuh (quants [n_rows][K] int8 or
//            [n_rows][K / 2] nibble bytes in the Q4_0 order, then fp16 scales [n_rows][K / 32])
// Launch: block THREADS, grid ceil(n_rows * K / ELEMS / THREADS).
// Entry: dequant_f16(src /*GGUF blocks [n_rows][K / 256], or split planes*/,
//                    dst /*fp16 [n_rows][K]*/, n_rows).
// Values are the CPU's dequantized floats (engine/gguf/dequant.cpp: the same products in the same
// order, unfused), rounded to fp16 as the CPU's F16 upload rounds them. Each thread makes 8
// consecutive halves (one 16-byte store, so a warp writes 512 contiguous bytes) from the 8 quant
// bytes under them and the block's scale bytes (shared with its neighbours through L1).
#include "kquant.cuh"
#include "q32_blocks.cuh"

#ifndef THREADS
#define THREADS 256
#endif
#ifndef LAYOUT
#define LAYOUT 0
#endif
#define GJ_Q32_TYPE (WTYPE == 3 || WTYPE == 6 || WTYPE == 7)
#define GJ_SPLIT32_TYPE (WTYPE == 8 || WTYPE == 2)
static_assert(LAYOUT == 0 || LAYOUT == 1, "dequant_f16: LAYOUT must be 0 (GGUF) or 1 (split)");
static_assert(!GJ_SPLIT32_TYPE || LAYOUT == 1,
              "dequant_f16: Q8_0 / Q4_0 are read in their split layout (LAYOUT 1) only");
static_assert(K % (GJ_Q32_TYPE || GJ_SPLIT32_TYPE ? 32 : 256) == 0 && K > 0,
              "dequant_f16: K must be a positive multiple of the block size");
static_assert(WTYPE == 12 || WTYPE == 13 || WTYPE == 14 || GJ_Q32_TYPE || GJ_SPLIT32_TYPE,
              "dequant_f16: WTYPE must be 12 (q4_k), 13 (q5_k), 14 (q6_k), 3 (q4_1), 6 (q5_0), "
              "7 (q5_1), 8 (q8_0) or 2 (q4_0)");
static_assert(ELEMS == 8, "dequant_f16: ELEMS must be 8");
static_assert(THREADS % 32 == 0 && THREADS <= 1024,
              "dequant_f16: THREADS must be a multiple of 32");

extern "C" __global__ void __launch_bounds__(THREADS)
    dequant_f16(const uint8* __restrict__ src, uint4* __restrict__ dst, int n_rows) {
    gj_grid_sync();
    const size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;  // group of 8 elements
    if (i >= (size_t)n_rows * (K / 8)) return;
    float f[8];
#if GJ_Q32_TYPE && LAYOUT == 1
    // Split Q4_1 / Q5_0 / Q5_1: the 8 elements are elements p .. p+7 of flat block b.
    const size_t units = (size_t)n_rows * (K / 32), b = i / 4;
    const int p = 8 * (int)(i % 4);
    const float4 a = gj_q32_split_dequant4<WTYPE>(src, units, b, p),
                 c = gj_q32_split_dequant4<WTYPE>(src, units, b, p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = c.x, f[5] = c.y, f[6] = c.z, f[7] = c.w;
#elif GJ_Q32_TYPE
    // 32-element blocks, contiguous across rows: 4 threads per block.
    const uint8* blk = src + (i / 4) * gj_q32_layout<WTYPE>::kBytes;
    const float4 a = gj_q32_dequant4<WTYPE>(blk, 2 * (int)(i % 4)),
                 c = gj_q32_dequant4<WTYPE>(blk, 2 * (int)(i % 4) + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = c.x, f[5] = c.y, f[6] = c.z, f[7] = c.w;
#elif GJ_SPLIT32_TYPE
    // Split Q8_0 / Q4_0: the 8 elements are elements p .. p+7 of flat block b (rows are
    // contiguous in both planes); x = d * q (Q4_0: d * (nibble - 8)), as the CPU computes it.
    const size_t b = i / 4;
    const int p = 8 * (int)(i % 4);
    constexpr size_t kQBytes = WTYPE == 8 ? 32 : 16;  // quant bytes per block
    const float d =
        f16_to_f32(__ldg((const uint16*)(src + (size_t)n_rows * (K / 32) * kQBytes) + b));
#if WTYPE == 8
    const uint2 q = __ldg((const uint2*)(src + 32 * b + p));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[k] = __fmul_rn((float)(int8)((q.x >> (8 * k)) & 0xffu), d);
        f[k + 4] = __fmul_rn((float)(int8)((q.y >> (8 * k)) & 0xffu), d);
    }
#else
    const uint2 q = __ldg((const uint2*)(src + 16 * b + (p & 15)));
    const int sh = p >= 16 ? 4 : 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[k] = __fmul_rn((float)((int)((q.x >> (8 * k + sh)) & 0xfu) - 8), d);
        f[k + 4] = __fmul_rn((float)((int)((q.y >> (8 * k + sh)) & 0xfu) - 8), d);
    }
#endif
#elif LAYOUT == 1
    // Split Q4_K / Q5_K / Q6_K (kquant.cuh): the 8 elements are elements p .. p+7 of one unit.
    const size_t units = (size_t)n_rows * (K / 32), unit = i / 4;
    const int p = 8 * (int)(i % 4);
    const float4 a = gj_kq_split_dequant4<WTYPE>(src, units, unit, p),
                 c = gj_kq_split_dequant4<WTYPE>(src, units, unit, p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = c.x, f[5] = c.y, f[6] = c.z, f[7] = c.w;
#elif WTYPE == 12 || WTYPE == 13
    const size_t b = i / 32;          // super-blocks are contiguous across rows
    const int e = 8 * (int)(i % 32);  // first element in the block
    constexpr int kBytes = WTYPE == 12 ? GJ_Q4_K_BYTES : GJ_Q5_K_BYTES;
    constexpr int kQs = WTYPE == 12 ? 16 : 48;
    const uint8* blk = src + b * kBytes;  // 16-byte aligned: blocks are 16-byte multiples
    const int j = e / 64, hi = (e % 64) >= 32, l = e % 32;
    const uint4 head = __ldg((const uint4*)blk);
    const uint2 q = __ldg((const uint2*)(blk + kQs + 32 * j + l));
    int sc, m;
    gj_kq_scale_min(head.y, head.z, head.w, 2 * j + hi, sc, m);
    const float d1 = __fmul_rn(f16_to_f32((uint16)(head.x & 0xffffu)), (float)sc);
    const float m1 = __fmul_rn(f16_to_f32((uint16)(head.x >> 16)), (float)m);
    uint32 v0 = (q.x >> (4 * hi)) & 0x0f0f0f0fu, v1 = (q.y >> (4 * hi)) & 0x0f0f0f0fu;
#if WTYPE == 13
    const uint2 qh = __ldg((const uint2*)(blk + 16 + l));
    v0 |= ((qh.x >> (2 * j + hi)) & 0x01010101u) << 4;
    v1 |= ((qh.y >> (2 * j + hi)) & 0x01010101u) << 4;
#endif
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[k] = __fsub_rn(__fmul_rn(d1, (float)((v0 >> (8 * k)) & 0xffu)), m1);
        f[k + 4] = __fsub_rn(__fmul_rn(d1, (float)((v1 >> (8 * k)) & 0xffu)), m1);
    }
#else
    const size_t b = i / 32;
    const int e = 8 * (int)(i % 32);
    const uint8* blk = src + b * GJ_Q6_K_BYTES;  // 2-byte aligned
    const int n = e / 128, g = (e % 128) / 32, l = e % 32;
    const uint2 ql = gj_ld_u32x2_align2(blk + 64 * n + 32 * (g & 1) + l);
    const uint2 qh = gj_ld_u32x2_align2(blk + 128 + 32 * n + l);
    const int sc = (int)(int8)blk[192 + 8 * n + l / 16 + 2 * g];
    const float ds = __fmul_rn(f16_to_f32(*(const uint16*)(blk + 208)), (float)sc);
    const int sh = g & 2 ? 4 : 0;
    const uint32 v0 = ((ql.x >> sh) & 0x0f0f0f0fu) | (((qh.x >> (2 * g)) & 0x03030303u) << 4);
    const uint32 v1 = ((ql.y >> sh) & 0x0f0f0f0fu) | (((qh.y >> (2 * g)) & 0x03030303u) << 4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[k] = __fmul_rn(ds, (float)((int)((v0 >> (8 * k)) & 0xffu) - 32));
        f[k + 4] = __fmul_rn(ds, (float)((int)((v1 >> (8 * k)) & 0xffu) - 32));
    }
#endif
    dst[i] = make_uint4(pack_f16x2(f[0], f[1]), pack_f16x2(f[2], f[3]), pack_f16x2(f[4], f[5]),
                        pack_f16x2(f[6], f[7]));
}
