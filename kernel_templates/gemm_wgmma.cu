// gemm_wgmma: prompt-batch matrix product Y = X W^T on Hopper's warpgroup tensor cores
// (wgmma.mma_async, sm_90a) for Q8_0 / Q4_0 weights in the split layout, dequantized to bf16 in
// shared memory, against bf16 activations; fp32 accumulation over the whole K.
//
// Why bf16 and not int8 wgmma: int8 products of Q8_0 / Q4_0 blocks give one int32 dot per 32-block
// of K that must be scaled by both blocks' scales and folded into an fp32 accumulator: about four
// fp32-pipe instructions per output element and 32 K (1/8 per multiply-add), which caps any int8
// kernel near a quarter of the int8 tensor rate (mmq.cu, on mma.sync, is bound by exactly that).
// Dequantizing the weight tile once per block tile costs ~4 instructions per weight element,
// shared by the BM tokens of the tile (1/32 per multiply-add at BM = 128), and the bf16 wgmma then
// accumulates across all of K with no per-block work; it runs asynchronously while the same
// threads convert the next tile.
//
// Numerics: every weight the tensor core sees is bf16(d * q) (Q4_0: d * (nibble - 8)), the
// correctly rounded bf16 of the exactly dequantized weight (d * q is exact in fp32); activations
// are the caller's bf16 values; products and sums in fp32.
//
// Data flow per pipeline step (64 elements of K, two 32-blocks):
//  - cp.async: activations X [BM][64] bf16 into a 128-byte-swizzled tile (16-byte chunk c of row r
//    at r * 128 + ((c ^ r) & 7) * 16: the canonical SWIZZLE_128B K-major layout of wgmma, tiles
//    1024-byte aligned), the weight payload ([BN][64] int8 or [BN][32] nibble bytes) and the two
//    fp16 scales per row into a linear staging area; STAGES steps in flight.
//  - conversion: all threads turn one staged step into a bf16 tile [BN][64] (same swizzle) in one
//  of
//    two conversion buffers.
//  - wgmma: each warpgroup (128 threads) multiplies its 64 tokens by the converted tile, four k16
//    instructions per step, descriptors pointing into the swizzled tiles.
// Iteration s: issue the copies of step s + STAGES - 1; issue step s's wgmmas (async); convert
// step s + 1 meanwhile; wait for the wgmmas and for step s + 2's copies; proxy fence (the tiles
// were written by the generic proxy, wgmma reads through the async proxy); barrier.
// Rows past T or n_rows read the last valid row (clamped) and are never written. K % 64 == 32 ends
// with a half step.
//
// The converted tile holds BN weight rows in every entry: the plain entry BN rows of W (one
// m64nBN wgmma per k16), the GeGLU entries BN / 2 rows of the gate and the same BN / 2 rows of up
// (two m64n(BN/2) wgmmas), so both keep BN / 2 fp32 accumulators per thread and one shared-memory
// layout.
//
// Constants (prologue #defines):
//   K        inner dimension (multiple of 32)      WTYPE    0 = Q8_0, 1 = Q4_0 (split layout)
//   BM       tokens per block: 64 or 128 (one or two warpgroups)
//   BN       converted weight rows per block: 64, 128 or 256
//   STAGES   copy pipeline depth (3..6)            THREADS  2 * BM (128 per warpgroup)
//   SMEM     dynamic shared memory bytes (the layout below plus 1024 for alignment)
//   SPLITS   the plain entry splits K over SPLITS blocks (1: no split); see gemm_wgmma_reduce
// Launch: grid (ceil(n_rows / R), ceil(T / BM)) with R = BN (gemm_wgmma) or BN / 2 (the GeGLU
// entries), block THREADS, dynamic smem SMEM (above 48 KiB the engine opts in). With SPLITS > 1
// the plain entry takes grid z = SPLITS and y = a workspace of SPLITS planes [T][n_rows] fp32,
// block z summing its share of the pipeline steps into plane z; then
// gemm_wgmma_reduce(workspace, y, T * n_rows), grid ceil(T * n_rows / 256), block 256, adds the
// planes in a fixed order (or a consumer reads the planes itself: rmsnorm's PARTS). Split K fills
// the SMs when the tiles alone leave many idle (the n 5376 products of 31B: 84 tiles at T = 512).
//
// Entries, one signature:
//   (w, w_up, x, y, T, n_rows)
//     w, w_up  split-layout weights [n_rows][K] (w_up only for the GeGLU entries)
//     x        activations bf16 [T][K], 16-byte aligned rows
//   gemm_wgmma             y fp32 [T][n_rows] = X W^T
//   gemm_wgmma_geglu       y fp32 [T][n_rows] = gelu_tanh(X W^T) * (X W_up^T)
//   gemm_wgmma_geglu_bf16  the gemm_wgmma_geglu product rounded to bf16 [T][n_rows] (the input of
//                          the down projection), bit-equal to bf16(gemm_wgmma_geglu's output)
#include "gj_ptx.cuh"
#include "split_k_reduce.cuh"

static_assert(K % 32 == 0 && K > 0, "gemm_wgmma: K must be a positive multiple of 32");
static_assert(WTYPE == 0 || WTYPE == 1, "gemm_wgmma: WTYPE must be 0 (Q8_0) or 1 (Q4_0)");
static_assert(BM == 64 || BM == 128, "gemm_wgmma: BM must be 64 or 128");
static_assert(BN == 64 || BN == 128 || BN == 256, "gemm_wgmma: BN must be 64, 128 or 256");
static_assert(THREADS == 2 * BM, "gemm_wgmma: THREADS must be 2 * BM (a warpgroup per 64 tokens)");
static_assert(STAGES >= 3 && STAGES <= 6, "gemm_wgmma: STAGES must be in [3, 6]");
#ifndef SPLITS
#define SPLITS 1
#endif
static_assert(SPLITS >= 1 && SPLITS <= 8, "gemm_wgmma: SPLITS must be in [1, 8]");

constexpr int kKb = K / 32;                           // 32-blocks per row
constexpr int kSteps = (kKb + 1) / 2;                 // pipeline steps of 64 (the last may be half)
constexpr bool kRagged = kKb % 2 != 0;                // K % 64 == 32
constexpr int kRawRow = WTYPE == 0 ? 64 : 32;         // staged payload bytes per row and step
constexpr size_t kRowBytes = WTYPE == 0 ? K : K / 2;  // payload bytes per weight row
constexpr int kABytes = BM * 128;                     // bf16 [BM][64]
constexpr int kCBytes = BN * 128;                     // converted bf16 [BN][64]

__host__ __device__ constexpr int wg_align1k(int v) {
    return (v + 1023) / 1024 * 1024;
}
// Stage: activations, payloads [BN][kRawRow], fp16 scales [BN][2]; padded so that every stage
// (and its activation tile) starts 1024-byte aligned, as the 128-byte swizzle needs.
constexpr int kRaw = kABytes;
constexpr int kScale = kRaw + BN * kRawRow;
constexpr int kStage = wg_align1k(kScale + BN * 4);
constexpr int kConv = STAGES * kStage;       // two conversion buffers of kCBytes
constexpr int kBytes = kConv + 2 * kCBytes;  // + up to 1024 bytes to align the base
static_assert(SMEM >= kBytes + 1024, "gemm_wgmma: SMEM is smaller than the pipeline needs");

// Byte offset of 16-byte chunk c (0..7) of row r in a tile of 128-byte rows (SWIZZLE_128B).
GJ_DEVICE uint32 wg_swizzle(int r, int c) {
    return (uint32)(r * 128 + ((c ^ r) & 7) * 16);
}

GJ_DEVICE void wg_cp_async4(uint32 smem_dst, const void* gmem_src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_dst), "l"(gmem_src)
                 : "memory");
}

// Two floats -> bf16x2 word, round to nearest even; lo in bits 0..15.
GJ_DEVICE uint32 wg_pack_bf16x2(float lo, float hi) {
    uint32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Byte i of `bytes` (0..255) placed in the mantissa of 2^23: the float 2^23 + byte.
GJ_DEVICE float wg_magic(uint32 bytes, int i) {
    return __uint_as_float(__byte_perm(bytes, 0x4b000000u, 0x7440u + i));
}

// ---- wgmma (sm_90a) --------------------------------------------------------------------------
// Shared-memory matrix descriptor of a K-major SWIZZLE_128B tile at shared address `addr`
// (1024-byte aligned, or advanced by 32 bytes per k16 within a 128-byte row): start address >> 4,
// leading byte offset 1 (unused by swizzled K-major tiles), stride 1024 bytes between 8-row groups,
// swizzle mode 1 (128 B) in bits 62-63.
GJ_DEVICE uint64 wg_desc(uint32 addr) {
    return (uint64)((addr & 0x3ffff) >> 4) | ((uint64)1 << 16) | ((uint64)(1024 >> 4) << 32) |
           ((uint64)1 << 62);
}
GJ_DEVICE void wg_fence() {  // orders register accesses to the accumulators before the wgmmas
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
GJ_DEVICE void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
GJ_DEVICE void wg_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the async
// proxy that wgmma reads through; a barrier must follow before other warps' wgmmas.
GJ_DEVICE void wg_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Keeps the compiler from moving accumulator accesses across the asynchronous window.
template <int N>
GJ_DEVICE void wg_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64][N] += A[64][16] * B[N][16]^T, A and B K-major bf16 tiles in shared memory (descriptors).
// Accumulator layout: register 4 j + e of lane l of warp w (of the warpgroup) holds row
// 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2.
GJ_DEVICE void wg_mma_bf16_n32(float (&d)[16], uint64 da, uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}
GJ_DEVICE void wg_mma_bf16_n64(float (&d)[32], uint64 da, uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}
GJ_DEVICE void wg_mma_bf16_n128(float (&d)[64], uint64 da, uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}
GJ_DEVICE void wg_mma_bf16_n256(float (&d)[128], uint64 da, uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "
        "%111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
        "%127"
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
          "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
          "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}

template <int N>
GJ_DEVICE void wg_mma(float (&d)[N / 2], uint64 da, uint64 db) {
    if constexpr (N == 32)
        wg_mma_bf16_n32(d, da, db);
    else if constexpr (N == 64)
        wg_mma_bf16_n64(d, da, db);
    else if constexpr (N == 128)
        wg_mma_bf16_n128(d, da, db);
    else
        wg_mma_bf16_n256(d, da, db);
}

// ---- Copies and conversion ---------------------------------------------------------------------

// Issues the copies of step `step` into the stage at shared address `st`: tokens m0.., rows of the
// converted tile r < kRows from w[0] (row n0 + r), the rest (GeGLU) from w[1] (row n0 + r - kRows).
template <int kMats>
GJ_DEVICE void wg_load_stage(uint32 st, const uint8* w0, const uint8* w1, const uint16* x, int m0,
                             int n0, int T, int n_rows, int step) {
    constexpr int kRows = BN / kMats;  // rows per matrix
    const int kb0 = step * 2;
#pragma unroll
    for (int j = 0; j < BM * 8 / THREADS; ++j) {
        const int i = threadIdx.x + j * THREADS;
        const int r = i / 8, c = i % 8;
        if (!kRagged || kb0 + c / 4 < kKb) {
            const int t = min(m0 + r, T - 1);
            cp_async_cg16(st + wg_swizzle(r, c), x + (size_t)t * K + kb0 * 32 + c * 8);
        }
    }
    constexpr int kCpr = kRawRow / 16;  // payload chunks per row
#pragma unroll
    for (int j = 0; j < (BN * kCpr + THREADS - 1) / THREADS; ++j) {
        const int i = threadIdx.x + j * THREADS;
        if ((BN * kCpr) % THREADS != 0 && i >= BN * kCpr) break;
        const int r = i / kCpr, c = i % kCpr;
        const uint8* w = kMats == 2 && r >= kRows ? w1 : w0;  // a select, not an indexed array
        const int n = min(n0 + r % kRows, n_rows - 1);
        if (!kRagged || kb0 + c * 2 / kCpr < kKb)
            cp_async_cg16(st + kRaw + r * kRawRow + c * 16,
                          w + n * kRowBytes + (size_t)step * kRawRow + c * 16);
    }
    // The step's two fp16 scales per row, from the scale plane after the payload plane: one 4-byte
    // copy when rows hold an even number of blocks (aligned), else plain loads and stores (ordered
    // for the readers by the barriers between this step and its conversion).
    for (int r = threadIdx.x; r < BN; r += THREADS) {
        const uint8* w = kMats == 2 && r >= kRows ? w1 : w0;
        const int n = min(n0 + r % kRows, n_rows - 1);
        const uint16* scales = (const uint16*)(w + (size_t)n_rows * kRowBytes);
        const uint16* src = scales + (size_t)n * kKb + kb0;
        if (!kRagged) {
            wg_cp_async4(st + kScale + r * 4, src);
        } else {
            const uint16 lo = src[0], hi = kb0 + 1 < kKb ? src[1] : (uint16)0;
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(st + kScale + r * 4),
                         "r"(pack_u16x2(lo, hi))
                         : "memory");
        }
    }
}

// Converts the staged payload of one step (generic pointer `st`) into the bf16 tile at `conv`.
// Units: Q8_0 8 int8 -> one 16-byte chunk; Q4_0 8 bytes -> the two chunks of their low and high
// nibbles (elements i and i + 16 of a block).
GJ_DEVICE void wg_convert(const uint8* st, uint8* conv, bool half_step) {
    constexpr int kUnitsPerRow = WTYPE == 0 ? 8 : 4;
    constexpr int kUnits = BN * kUnitsPerRow;
    static_assert(kUnits % THREADS == 0, "gemm_wgmma: conversion units must split evenly");
#pragma unroll 4
    for (int j = 0; j < kUnits / THREADS; ++j) {
        const int i = threadIdx.x + j * THREADS;
        const int r = i / kUnitsPerRow, c = i % kUnitsPerRow;
        const int blk = WTYPE == 0 ? c / 4 : c / 2;
        if (kRagged && half_step && blk > 0) continue;  // the half step has no second block
        const uint2 raw = *(const uint2*)(st + kRaw + r * kRawRow + c * 8);
        const float d = f16_to_f32(*(const uint16*)(st + kScale + r * 4 + blk * 2));
        if (WTYPE == 0) {
            const uint32 x0 = raw.x ^ 0x80808080u, x1 = raw.y ^ 0x80808080u;  // q + 128
            const float off = 8388736.0f;                                     // 2^23 + 128
            uint4 o;
            o.x = wg_pack_bf16x2((wg_magic(x0, 0) - off) * d, (wg_magic(x0, 1) - off) * d);
            o.y = wg_pack_bf16x2((wg_magic(x0, 2) - off) * d, (wg_magic(x0, 3) - off) * d);
            o.z = wg_pack_bf16x2((wg_magic(x1, 0) - off) * d, (wg_magic(x1, 1) - off) * d);
            o.w = wg_pack_bf16x2((wg_magic(x1, 2) - off) * d, (wg_magic(x1, 3) - off) * d);
            *(uint4*)(conv + wg_swizzle(r, c)) = o;
        } else {
            const float off = 8388616.0f;  // 2^23 + 8
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // low nibbles, then high
                const uint32 x0 = (raw.x >> (4 * h)) & 0x0f0f0f0fu;
                const uint32 x1 = (raw.y >> (4 * h)) & 0x0f0f0f0fu;
                uint4 o;
                o.x = wg_pack_bf16x2((wg_magic(x0, 0) - off) * d, (wg_magic(x0, 1) - off) * d);
                o.y = wg_pack_bf16x2((wg_magic(x0, 2) - off) * d, (wg_magic(x0, 3) - off) * d);
                o.z = wg_pack_bf16x2((wg_magic(x1, 0) - off) * d, (wg_magic(x1, 1) - off) * d);
                o.w = wg_pack_bf16x2((wg_magic(x1, 2) - off) * d, (wg_magic(x1, 3) - off) * d);
                // Bytes 8 (c % 2).. of block blk hold elements 8 (c % 2).. (low nibbles) and
                // 16 + 8 (c % 2).. (high): chunk 4 blk + 2 h + c % 2 of the 64-element row.
                *(uint4*)(conv + wg_swizzle(r, 4 * blk + 2 * h + c % 2)) = o;
            }
        }
    }
}

// ---- The kernel --------------------------------------------------------------------------------

enum { wg_epi_store = 0, wg_epi_geglu = 1, wg_epi_geglu_bf16 = 2 };

template <int kEpi>
GJ_DEVICE void gemm_wgmma_body(const void* w_gate, const void* w_up, const uint16* __restrict__ x,
                               void* y, int T, int n_rows) {
    constexpr int kMats = kEpi == wg_epi_store ? 1 : 2;
    constexpr int kRows = BN / kMats;  // weight rows per matrix and block
    constexpr int kAcc = kRows / 2;    // fp32 accumulators per thread and matrix
    extern __shared__ __align__(1024) uint8 smem_raw[];
    // The swizzle is a function of the address bits, so the tiles must sit 1024-byte aligned.
    const uint32 raw_base = smem_addr(smem_raw);
    const uint32 pad = ((raw_base + 1023u) & ~1023u) - raw_base;
    uint8* smem = smem_raw + pad;
    const uint32 base = raw_base + pad;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int n0 = blockIdx.x * kRows, m0 = blockIdx.y * BM;
    const uint8* w0 = (const uint8*)w_gate;
    const uint8* w1 = (const uint8*)w_up;

    // Split K (plain entry only): block z takes pipeline steps [s_begin, s_begin + n_steps) and
    // writes its partial product to plane z of y.
    constexpr int kSplits = kEpi == wg_epi_store ? SPLITS : 1;
    const int z = kSplits > 1 ? (int)blockIdx.z : 0;
    const int s_begin = z * kSteps / kSplits, n_steps = (z + 1) * kSteps / kSplits - s_begin;
    if (kSplits > 1) y = (float*)y + (size_t)z * T * n_rows;

    float acc[kMats][kAcc];
#pragma unroll
    for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[m][i] = 0.0f;

            // Prologue: steps 0 .. STAGES - 2 in flight (empty groups past the end keep the count),
            // step 0 converted, step 1's copies landed.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_steps)
            wg_load_stage<kMats>(base + s * kStage, w0, w1, x, m0, n0, T, n_rows, s_begin + s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (n_steps > 0) wg_convert(smem, smem + kConv, s_begin == kSteps - 1);
    cp_async_wait<STAGES - 3>();
    wg_fence_proxy_async();
    __syncthreads();

#pragma unroll 1
    for (int ls = 0; ls < n_steps; ++ls) {  // ls: the block's step; s_begin + ls: the step of K
        {  // refill the stage of ls - 1 (read by the last iteration's wgmmas and conversion)
            const int next = ls + STAGES - 1;
            if (next < n_steps)
                wg_load_stage<kMats>(base + (next % STAGES) * kStage, w0, w1, x, m0, n0, T, n_rows,
                                     s_begin + next);
            cp_async_commit();
        }
        const uint32 sa = base + (ls % STAGES) * kStage + wg * 64 * 128;
        const uint32 sb = base + kConv + (ls % 2) * kCBytes;
        const int k16s = kRagged && s_begin + ls == kSteps - 1 ? 2 : 4;
#pragma unroll
        for (int m = 0; m < kMats; ++m) wg_pin(acc[m]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            if (kk >= k16s) break;
#pragma unroll
            for (int m = 0; m < kMats; ++m)
                wg_mma<kRows>(acc[m], wg_desc(sa + kk * 32),
                              wg_desc(sb + m * kRows * 128 + kk * 32));
        }
        wg_commit();
        if (ls + 1 < n_steps)
            wg_convert(smem + ((ls + 1) % STAGES) * kStage, smem + kConv + ((ls + 1) % 2) * kCBytes,
                       s_begin + ls + 1 == kSteps - 1);
        wg_wait_all();
#pragma unroll
        for (int m = 0; m < kMats; ++m) wg_pin(acc[m]);
        cp_async_wait<STAGES - 3>();
        wg_fence_proxy_async();
        __syncthreads();
    }
    cp_async_wait<0>();

    // Epilogue: register 4 j + e holds token 16 warp + lane / 4 + 8 (e / 2), weight row
    // 8 j + 2 (lane % 4) + e % 2.
    const int g = lane / 4, tq = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int t = m0 + wg * 64 + warp * 16 + h * 8 + g;
        if (t >= T) continue;
#pragma unroll
        for (int j = 0; j < kRows / 8; ++j) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float z = acc[0][4 * j + 2 * h + e];
                v[e] = kEpi == wg_epi_store ? z : gelu_tanh(z) * acc[kMats - 1][4 * j + 2 * h + e];
            }
            const int n = n0 + j * 8 + 2 * tq;
            if (kEpi == wg_epi_geglu_bf16) {
                uint16* yr = (uint16*)y + (size_t)t * n_rows;
                const uint32 p = wg_pack_bf16x2(v[0], v[1]);
                if (n_rows % 2 == 0) {  // 4-byte aligned pairs, both in or both out
                    if (n < n_rows) *(uint32*)(yr + n) = p;
                } else {
                    if (n < n_rows) yr[n] = (uint16)(p & 0xffffu);
                    if (n + 1 < n_rows) yr[n + 1] = (uint16)(p >> 16);
                }
            } else {
                float* yr = (float*)y + (size_t)t * n_rows;
                if (n_rows % 2 == 0) {  // 8-byte aligned pairs, both in or both out
                    if (n < n_rows) *(float2*)(yr + n) = make_float2(v[0], v[1]);
                } else {
                    if (n < n_rows) yr[n] = v[0];
                    if (n + 1 < n_rows) yr[n + 1] = v[1];
                }
            }
        }
    }
}

#define GEMM_WGMMA_ENTRY(NAME, EPI)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                 \
        NAME(const void* w, const void* w_up, const uint16* x, void* y, int T, int n_rows) { \
        gj_grid_sync();                                                                      \
        gemm_wgmma_body<EPI>(w, w_up, x, y, T, n_rows);                                      \
    }
GEMM_WGMMA_ENTRY(gemm_wgmma, wg_epi_store)
GEMM_WGMMA_ENTRY(gemm_wgmma_geglu, wg_epi_geglu)
GEMM_WGMMA_ENTRY(gemm_wgmma_geglu_bf16, wg_epi_geglu_bf16)

GJ_SPLIT_K_REDUCE_ENTRY(gemm_wgmma_reduce)
