// embed_rows: gathers one table row per token and scales it: out[t][i] = table[rows[t]][i] * scale.
// Used for token_embd (N = d, scale sqrtf(d)) and per_layer_token_embd (N = L * P, scale
// sqrt(P)). The table is read in its GGUF type; it may live in device memory or in mapped pinned
// host memory (a PLE table too large for the GPU): the kernel only reads the gathered rows.
// Values equal the CPU's dequantized row times scale bit for bit (same two float products).
//
// Constants (prologue #defines):
//   N        row width in elements: a multiple of 4 (of 32 for the quantized types)
//   WTYPE    ggml type id of the table: 0 f32, 1 f16, 2 q4_0, 3 q4_1, 6 q5_0, 7 q5_1, 8 q8_0,
//            12 q4_k, 13 q5_k, 14 q6_k, 30 bf16 (K-quant rows hold whole 256-element super-blocks)
//   VOCAB    rows in the table. A token id outside [0, VOCAB) yields a row of NaN (never an
//            out-of-bounds read), which the logits kernels report as token -1.
//   THREADS  threads per block (multiple of 32)
//   LAYOUT   0: the table as the GGUF stores it; 1 (Q4_K, Q5_K, Q6_K): the split planes of
//            kquant.cuh (the tied LM head's matvec reads the same buffer)
// Launch: block THREADS, grid (ceil(N / 4 / THREADS), T_max); blocks with blockIdx.y >= T exit,
// so a grid sized for the largest batch serves every smaller one.
// Entry: embed_rows(rows /*[T] int32 token ids*/, T, table, out /*fp32 [T][N]*/, scale).
// Each thread writes 4 consecutive outputs with one 16-byte store (out 16-byte aligned).
#include "kquant.cuh"
#include "q32_blocks.cuh"

#ifndef THREADS
#define THREADS 128
#endif
#ifndef LAYOUT
#define LAYOUT 0
#endif
static_assert(LAYOUT == 0 || WTYPE == 12 || WTYPE == 13 || WTYPE == 14,
              "embed_rows: the split layout (LAYOUT 1) exists for Q4_K, Q5_K and Q6_K tables only");
static_assert(WTYPE == 0 || WTYPE == 1 || WTYPE == 2 || WTYPE == 3 || WTYPE == 6 || WTYPE == 7 ||
                  WTYPE == 8 || WTYPE == 12 || WTYPE == 13 || WTYPE == 14 || WTYPE == 30,
              "embed_rows: WTYPE must be one of 0 (f32), 1 (f16), 2 (q4_0), 3 (q4_1), 6 (q5_0), "
              "7 (q5_1), 8 (q8_0), 12 (q4_k), 13 (q5_k), 14 (q6_k), 30 (bf16)");
static_assert(N % 4 == 0 && N > 0, "embed_rows: N must be a positive multiple of 4");
static_assert((WTYPE != 2 && WTYPE != 3 && WTYPE != 6 && WTYPE != 7 && WTYPE != 8) || N % 32 == 0,
              "embed_rows: quantized rows hold whole 32-element blocks");
static_assert(WTYPE < 12 || WTYPE > 14 || N % 256 == 0,
              "embed_rows: K-quant rows hold whole 256-element super-blocks");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "embed_rows: THREADS must be a multiple of 32");

// The 4 table values of group g (elements 4g .. 4g+3) of row `id`, dequantized.
GJ_DEVICE float4 gj_embed_group(const uint8* table, size_t id, int g) {
#if WTYPE == 0
    return __ldg((const float4*)table + id * (N / 4) + g);
#elif WTYPE == 1 || WTYPE == 30
    const uint2 h = __ldg((const uint2*)table + id * (N / 4) + g);
#if WTYPE == 1
    const float2 a = unpack_f16x2(h.x), b = unpack_f16x2(h.y);
#else
    const float2 a =
        make_float2(bf16_to_f32((bf16_bits)(h.x & 0xffffu)), bf16_to_f32((bf16_bits)(h.x >> 16)));
    const float2 b =
        make_float2(bf16_to_f32((bf16_bits)(h.y & 0xffffu)), bf16_to_f32((bf16_bits)(h.y >> 16)));
#endif
    return make_float4(a.x, a.y, b.x, b.y);
#elif WTYPE == 3 || WTYPE == 6 || WTYPE == 7
    return gj_q32_dequant4<WTYPE>(table + (id * (N / 32) + g / 8) * gj_q32_layout<WTYPE>::kBytes,
                                  g % 8);
#elif LAYOUT == 1
    const size_t units = (size_t)VOCAB * (N / 32);
    return gj_kq_split_dequant4<WTYPE>(table, units, id * (N / 32) + g / 8, 4 * (g % 8));
#elif WTYPE >= 12 && WTYPE <= 14
    constexpr int kBlockBytes = WTYPE == 12   ? GJ_Q4_K_BYTES
                                : WTYPE == 13 ? GJ_Q5_K_BYTES
                                              : GJ_Q6_K_BYTES;
    return gj_kq_dequant4<WTYPE>(table + (id * (N / 256) + g / 64) * kBlockBytes, g % 64);
#else
    // Blocks are 34 (q8_0) or 18 (q4_0) bytes: only 2-byte alignment is guaranteed.
    constexpr int kBlockBytes = WTYPE == 8 ? 34 : 18;
    const int part = g % 8;  // which 4 of the block's 32 elements
    const uint8* blk = table + (id * (N / 32) + g / 8) * kBlockBytes;
    const float d = f16_to_f32(__ldg((const uint16*)blk));
#if WTYPE == 8
    const uint32 q = load_u32_align2(blk + 2 + 4 * part);
    return make_float4((float)(int8)(q & 0xff) * d, (float)(int8)((q >> 8) & 0xff) * d,
                       (float)(int8)((q >> 16) & 0xff) * d, (float)(int8)(q >> 24) * d);
#else
    // Elements 0..15 are the low nibbles of bytes 0..15, elements 16..31 the high nibbles.
    const uint32 q = load_u32_align2(blk + 2 + 4 * (part % 4));
    const uint32 nib = part < 4 ? q & 0x0f0f0f0fu : (q >> 4) & 0x0f0f0f0fu;
    return make_float4(
        (float)((int)(nib & 0xff) - 8) * d, (float)((int)((nib >> 8) & 0xff) - 8) * d,
        (float)((int)((nib >> 16) & 0xff) - 8) * d, (float)((int)(nib >> 24) - 8) * d);
#endif
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
    embed_rows(const int* __restrict__ rows, int T, const void* __restrict__ table,
               float* __restrict__ out, float scale) {
    gj_grid_sync();
    const int t = blockIdx.y;
    const int g = blockIdx.x * THREADS + threadIdx.x;
    if (t >= T || g >= N / 4) return;
    const int id = __ldg(rows + t);
    float4 v;
    if (id < 0 || id >= VOCAB) {
        const float nan = __int_as_float(0x7fc00000);
        v = make_float4(nan, nan, nan, nan);
    } else {
        v = gj_embed_group((const uint8*)table, (size_t)id, g);
        v.x *= scale, v.y *= scale, v.z *= scale, v.w *= scale;
    }
    ((float4*)out)[(size_t)t * (N / 4) + g] = v;
}
