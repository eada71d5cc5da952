// gemm_wgmma: prompt-batch matrix product Y = X W^T on Hopper's warpgroup tensor cores
// (wgmma.mma_async, sm_90a) for Q8_0 / Q4_0 weights in the split layout, dequantized to bf16 in
// registers, against bf16 activations in shared memory; fp32 accumulation over the whole K.
//
// Why bf16 and not int8 wgmma: int8 products of Q8_0 / Q4_0 blocks give one int32 dot per 32-block
// of K that must be scaled by both blocks' scales and folded into an fp32 accumulator: about four
// fp32-pipe instructions per output element and 32 K (1/8 per multiply-add), which caps any int8
// kernel near a quarter of the int8 tensor rate (mmq.cu, on mma.sync, is bound by exactly that).
// Dequantizing weights costs ~4 instructions per weight element, shared by the BM tokens of the
// tile, and the bf16 wgmma then accumulates across all of K with no per-block work.
//
// Why the weights are the register operand: wgmma takes its A operand (64 rows x 16 of K) from
// registers or shared memory, B only from shared memory. With the weight rows as A, each thread
// turns the quantized bytes of its own fragment into bf16 pairs in registers: no converted tile is
// written to shared memory, no proxy fence or barrier orders it, and the conversion of step s + 1
// runs while the tensor cores work through step s (in part only: the same threads issue the
// wgmmas and the copies; docs/PERFORMANCE.md measures what each costs). (The first form converted a
// bf16 weight tile in shared memory for the activations-as-A product: 310-370 TFLOP/s on the 31B
// shapes of an H200, its tensor cores waiting on every step's conversion and fence.)
//
// Numerics: every weight the tensor core sees is bf16(d * q) (Q4_0: d * (nibble - 8)), the
// correctly rounded bf16 of the exactly dequantized weight (d * q is exact in fp32); activations
// are the caller's bf16 values; products and sums in fp32.
//
// Data flow per pipeline step (64 elements of K, two 32-blocks):
//  - cp.async: activations X [BM][64] bf16 into a 128-byte-swizzled tile (16-byte chunk c of row r
//    at r * 128 + ((c ^ r) & 7) * 16: the canonical SWIZZLE_128B K-major layout of wgmma, tiles
//    1024-byte aligned), the weight payload ([BN][64] int8 or [BN][32] nibble bytes, rows padded by
//    16 bytes so the fragment loads hit distinct banks) and the two fp16 scales per row; STAGES
//    steps in flight.
//  - conversion: warpgroup g's 128 threads load their fragment of weight rows 64 g .. 64 g + 63
//    and make the four k16 A operands of the step (16 registers) in one of two register sets.
//  - wgmma: four m64nNk16 per warpgroup and step (A registers, B = the activation tile), N = BM
//    or, for a block with at most 128 / 64 tokens, 128 / 64 (the block's branch, uniform).
// Iteration s: issue step s's wgmmas (async); wait for step s - 1's (its stage and register set
// are free); wait for step s + 1's copies, proxy fence (wgmma reads through the async proxy),
// barrier; issue the copies of step s + STAGES - 1 into the stage of s - 1; convert step s + 1.
//
// PRODUCER 1 (warp specialization, as flash_prefill_wgmma.cu; BN 64 only): a second warpgroup
// issues every copy, and the consumer warpgroup only converts and multiplies. Why: in the form
// above the threads that issue the wgmmas also issue ~20 cp.async per step and meet at a block
// barrier every step. Per stage a `full` mbarrier (the hardware arrives for each producer thread
// once its copies of the step have landed; the consumer fences them for the async proxy after its
// wait) and an `empty` one (every consumer thread arrives once its wgmmas of the step have
// completed). Consumer iteration s: issue step s's wgmmas; wait for step s - 1's and release its
// stage; wait for step s + 1's `full` and convert it. At BM <= 128 two blocks share an SM, each
// compiled for 128 registers per thread, the producer giving the consumer 72 of them
// (setmaxnreg). With BN 128 the form measured slower on every shape (two consumers at 216
// registers where this form takes 248; docs/PERFORMANCE.md), so it is not built for it.
// Rows past T or n_rows read the last valid row (clamped) and are never written. K % 64 == 32
// ends with a half step.
//
// The weight tile holds BN rows in every entry: the plain entry BN rows of W, the GeGLU entries
// BN / 2 rows of the gate then the same BN / 2 rows of up; the epilogue stages the fp32 tile
// [BM][BN] in shared memory and writes whole output rows (the GeGLU pairs gate row r with up row
// r + BN / 2 there).
//
// Constants (prologue #defines):
//   K        inner dimension (multiple of 32)      WTYPE    0 = Q8_0, 1 = Q4_0 (split layout)
//   BM       tokens per block (the wgmma N): 64, 128 or 256
//   BN       weight rows per block: 64 or 128 (one warpgroup per 64)
//   STAGES   copy pipeline depth (3..6)            PRODUCER 0 or 1 (the form above; default 0)
//   THREADS  2 * BN + 128 * PRODUCER (128 per warpgroup)
//   SMEM     dynamic shared memory bytes (the larger of the pipeline and the epilogue tile, plus
//            16 * STAGES for the mbarriers with PRODUCER 1, plus 1024 for alignment)
//   SPLITS   the plain entry splits K over SPLITS blocks (1: no split); see gemm_wgmma_reduce
// Launch: grid (ceil(n_rows / R), ceil(T / BM)) with R = BN (gemm_wgmma) or BN / 2 (the GeGLU
// entries), block THREADS, dynamic smem SMEM (above 48 KiB the engine opts in). With SPLITS > 1
// the plain entry takes grid z = SPLITS and y = a workspace of SPLITS planes [T][n_rows] fp32,
// block z summing its share of the pipeline steps into plane z; then
// gemm_wgmma_reduce(workspace, y, T * n_rows), grid ceil(T * n_rows / 256), block 256, adds the
// planes in a fixed order (gemm_wgmma_reduce_bf16: the sum rounded to bf16, the input of a
// tensor-parallel bf16 all-reduce; or a consumer reads the planes itself: rmsnorm's PARTS). Split
// K fills the SMs when the tiles alone leave many idle (the n 5376 products of 31B).
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
#include "gj_wgmma.cuh"
#include "split_k_reduce.cuh"

static_assert(K % 32 == 0 && K > 0, "gemm_wgmma: K must be a positive multiple of 32");
static_assert(WTYPE == 0 || WTYPE == 1, "gemm_wgmma: WTYPE must be 0 (Q8_0) or 1 (Q4_0)");
static_assert(BM == 64 || BM == 128 || BM == 256, "gemm_wgmma: BM must be 64, 128 or 256");
static_assert(BN == 64 || BN == 128, "gemm_wgmma: BN must be 64 or 128");
#ifndef PRODUCER
#define PRODUCER 0
#endif
static_assert(PRODUCER == 0 || (PRODUCER == 1 && BN == 64),
              "gemm_wgmma: PRODUCER must be 0, or 1 with BN 64");
static_assert(THREADS == 2 * BN + 128 * PRODUCER,
              "gemm_wgmma: THREADS must be 2 * BN + 128 * PRODUCER (a warpgroup per 64 rows, and "
              "the producer's)");
constexpr int kConsumers = 2 * BN;  // threads that convert and multiply
// BM <= 128 with a producer: two 256-thread blocks per SM (128 registers each at launch; the
// consumer takes 200 of the producer's). A 256-token wgmma needs more than 128.
constexpr int kMinBlocks = PRODUCER && BM <= 128 ? 2 : 1;
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
constexpr int kRowStride = kRawRow + 16;              // staged row pitch: conflict-free loads
constexpr int kABytes = BM * 128;                     // bf16 [BM][64]

__host__ __device__ constexpr int wg_align1k(int v) {
    return (v + 1023) / 1024 * 1024;
}
// Stage: activations, payloads [BN][kRowStride], fp16 scales [BN][2]; padded so that every stage
// (and its activation tile) starts 1024-byte aligned, as the 128-byte swizzle needs.
constexpr int kRaw = kABytes;
constexpr int kScale = kRaw + BN * kRowStride;
constexpr int kStage = wg_align1k(kScale + BN * 4);
// Epilogue tile fp32 [BM][kOutPitch], over the stages once the pipeline has drained; the pitch
// of BN + 4 puts the 32 lanes of every accumulator store in 32 distinct banks.
constexpr int kOutPitch = BN + 4;
constexpr int kPipeBytes = STAGES * kStage;
constexpr int kOutBytes = BM * kOutPitch * 4;
constexpr int kBytes = kPipeBytes > kOutBytes ? kPipeBytes : kOutBytes;  // + 1024 to align
// PRODUCER 1: the full and empty mbarriers of the stages, after both (never overlaid).
constexpr int kBarBytes = PRODUCER ? 16 * STAGES : 0;
static_assert(SMEM >= kBytes + kBarBytes + 1024,
              "gemm_wgmma: SMEM is smaller than the kernel needs");

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
// D[64][N] += A[64][16] * B[N][16]^T: A bf16 in registers, B a K-major bf16 tile in shared memory
// (descriptor). A fragment (per warp w of the warpgroup, rows 16 w ..): register j of lane l holds
// row 16 w + l / 4 + 8 (j % 2), columns 2 (l % 4) + 8 (j / 2) and the next (low half first).
// Accumulator: register 4 j + e holds row 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2.
GJ_DEVICE void wg_mma_rs_n64(float (&d)[32], const uint32 (&a)[4], uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
        : "memory");
}
GJ_DEVICE void wg_mma_rs_n128(float (&d)[64], const uint32 (&a)[4], uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
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
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
        : "memory");
}
GJ_DEVICE void wg_mma_rs_n256(float (&d)[128], const uint32 (&a)[4], uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
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
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
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
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
        : "memory");
}

template <int N>
GJ_DEVICE void wg_mma_rs(float (&d)[N / 2], const uint32 (&a)[4], uint64 db) {
    if constexpr (N == 64)
        wg_mma_rs_n64(d, a, db);
    else if constexpr (N == 128)
        wg_mma_rs_n128(d, a, db);
    else
        wg_mma_rs_n256(d, a, db);
}

// ---- Copies and conversion ---------------------------------------------------------------------

// Issues the copies of step `step` into the stage at shared address `st`, thread `tid` of the kThr
// that copy: tokens m0 .. m0 + kN - 1 (the block's wgmma N), weight rows r < kRows from w[0] (row
// n0 + r), the rest (GeGLU) from w[1] (row n0 + r - kRows).
template <int kMats, int kN, int kThr>
GJ_DEVICE void wg_load_stage(uint32 st, const uint8* w0, const uint8* w1, const uint16* x, int m0,
                             int n0, int T, int n_rows, int step, int tid) {
    constexpr int kRows = BN / kMats;  // rows per matrix
    const int kb0 = step * 2;
    static_assert(kN * 8 % kThr == 0, "gemm_wgmma: activation chunks must split evenly");
    // The producer (kThr 128) keeps this loop rolled: unrolled, its 16 row addresses would not fit
    // the 56 registers it keeps at BM <= 128, and it has a whole step of wgmmas to issue them in.
    constexpr int kUnroll = kThr == 128 ? 1 : kN * 8 / kThr;
#pragma unroll kUnroll
    for (int j = 0; j < kN * 8 / kThr; ++j) {
        const int i = tid + j * kThr;
        const int r = i / 8, c = i % 8;
        if (!kRagged || kb0 + c / 4 < kKb) {
            const int t = min(m0 + r, T - 1);
            cp_async_cg16(st + wg_swizzle(r, c), x + (size_t)t * K + kb0 * 32 + c * 8);
        }
    }
    constexpr int kCpr = kRawRow / 16;  // payload chunks per row
#pragma unroll
    for (int j = 0; j < (BN * kCpr + kThr - 1) / kThr; ++j) {
        const int i = tid + j * kThr;
        if ((BN * kCpr) % kThr != 0 && i >= BN * kCpr) break;
        const int r = i / kCpr, c = i % kCpr;
        const uint8* w = kMats == 2 && r >= kRows ? w1 : w0;  // a select, not an indexed array
        const int n = min(n0 + r % kRows, n_rows - 1);
        if (!kRagged || kb0 + c * 2 / kCpr < kKb)
            cp_async_cg16(st + kRaw + r * kRowStride + c * 16,
                          w + n * kRowBytes + (size_t)step * kRawRow + c * 16);
    }
    // The step's two fp16 scales per row, from the scale plane after the payload plane: one 4-byte
    // copy when rows hold an even number of blocks (aligned), else plain loads and stores (ordered
    // for the readers by the barriers between this step and its conversion).
    for (int r = tid; r < BN; r += kThr) {
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

// Two bf16 weights bf16(d * (byte - off)) from bytes 0 and 1 of `b` (each < 256).
GJ_DEVICE uint32 wg_pair(uint32 b, float off, float d) {
    return wg_pack_bf16x2((wg_magic(b, 0) - off) * d, (wg_magic(b, 1) - off) * d);
}

// The four k16 A operands of one step for this thread's weight rows r0 and r0 + 8 (local to the
// block), from the staged payload at generic pointer `st`: a[kk][j] per the fragment layout of
// wg_mma_rs (k16 kk covers elements 16 (kk % 2) .. of block kk / 2). Lane l needs elements
// 2 (l % 4) + {0, 1, 8, 9} of each k16: Q4_0 bytes 2 (l % 4) + {0, 1, 8, 9} of the block (low
// nibbles for the first k16, high for the second), Q8_0 the int8 at 16 (kk % 2) + those.
GJ_DEVICE void wg_convert_regs(const uint8* st, int r0, int tq, uint32 (&a)[4][4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // rows r0, r0 + 8: registers j = i and i + 2
        const int r = r0 + 8 * i;
        const uint32 sc = *(const uint32*)(st + kScale + r * 4);
        const uint8* row = st + kRaw + r * kRowStride + 2 * tq;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            const float d = f16_to_f32((uint16)(b == 0 ? sc & 0xffffu : sc >> 16));
            if (WTYPE == 1) {
                const uint32 lo = *(const uint16*)(row + 16 * b);
                const uint32 hi = *(const uint16*)(row + 16 * b + 8);
                const float off = 8388616.0f;  // 2^23 + 8
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    a[2 * b + h][i] = wg_pair((lo >> (4 * h)) & 0x0f0fu, off, d);
                    a[2 * b + h][i + 2] = wg_pair((hi >> (4 * h)) & 0x0f0fu, off, d);
                }
            } else {
                const float off = 8388736.0f;  // 2^23 + 128: q + 128 from the flipped sign bit
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32 lo = *(const uint16*)(row + 32 * b + 16 * h) ^ 0x8080u;
                    const uint32 hi = *(const uint16*)(row + 32 * b + 16 * h + 8) ^ 0x8080u;
                    a[2 * b + h][i] = wg_pair(lo, off, d);
                    a[2 * b + h][i + 2] = wg_pair(hi, off, d);
                }
            }
        }
    }
}

// ---- The kernel --------------------------------------------------------------------------------

enum { wg_epi_store = 0, wg_epi_geglu = 1, wg_epi_geglu_bf16 = 2 };

template <int kMats, int kN>
struct WgPipe {
    uint32 base;  // shared address of the stages
    const uint8* smem;
    const uint8 *w0, *w1;
    const uint16* x;
    int m0, n0, T, n_rows, s_begin, n_steps;
    int r0, tq;          // this thread's fragment rows (local) and lane % 4
    uint32 full, empty;  // PRODUCER 1: the stages' mbarriers

    // PRODUCER 0: every thread's copies of the block's step ls (a group, maybe empty).
    GJ_DEVICE void load(int ls) const {
        if (ls < n_steps)
            wg_load_stage<kMats, kN, kConsumers>(base + (ls % STAGES) * kStage, w0, w1, x, m0, n0,
                                                 T, n_rows, s_begin + ls, threadIdx.x);
        cp_async_commit();
    }
    GJ_DEVICE void convert(int ls, uint32 (&a)[4][4]) const {
        wg_convert_regs(smem + (ls % STAGES) * kStage, r0, tq, a);
    }
    // Issues step ls's wgmmas on registers `a` (converted) and waits for step ls - 1's: its stage
    // and register set are free when this returns.
    GJ_DEVICE void multiply(int ls, float (&acc)[kN / 2], const uint32 (&a)[4][4]) const {
        const uint32 sb = base + (ls % STAGES) * kStage;
        const int k16s = kRagged && s_begin + ls == kSteps - 1 ? 2 : 4;
        wg_pin(acc);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            if (kk >= k16s) break;
            wg_mma_rs<kN>(acc, a[kk], wg_desc(sb + kk * 32));
        }
        wg_commit();
        wg_wait<1>();  // step ls - 1 done: its stage and register set are free
        wg_pin(acc);
    }
    // Step ls on registers `a` (converted), then step ls + 1 converted into `next` once it has
    // landed: PRODUCER 1 releases step ls - 1's stage to the producer and waits for step ls + 1's
    // `full`; PRODUCER 0 waits for its own copies, meets the block and issues the copies of step
    // ls + STAGES - 1 into the stage of ls - 1.
    GJ_DEVICE void step(int ls, float (&acc)[kN / 2], const uint32 (&a)[4][4],
                        uint32 (&next)[4][4]) const {
        multiply(ls, acc, a);
        if (PRODUCER) {
            if (ls >= 1) wg_mbar_arrive(empty + 8 * ((ls - 1) % STAGES));
            if (ls + 1 < n_steps) wait_full(ls + 1);
        } else {
            cp_async_wait<STAGES - 3>();  // this thread's copies of step ls + 1
            wg_fence_proxy_async();
            __syncthreads();
            load(ls + STAGES - 1);
        }
        if (ls + 1 < n_steps) convert(ls + 1, next);
    }

    // ---- PRODUCER 1 ----
    // The producer warpgroup (thread tid of 128): waits for the consumers to release a stage,
    // issues the step's copies and has the hardware arrive on the stage's `full` barrier once
    // they have landed (cp.async.mbarrier.arrive.noinc), so it never waits for its own copies and
    // streams as far ahead as the stages allow. (A first form waited for the copies of the step
    // before and arrived itself: the consumers then waited on that round trip every step, and
    // the GEMM ran at two thirds of the all-threads form.) With a ragged K the scales of the last
    // step are plain stores, published by a second, ordinary arrival.
    GJ_DEVICE void produce(int tid) const {
#pragma unroll 1
        for (int ls = 0; ls < n_steps; ++ls) {
            const int stage = ls % STAGES;
            if (ls >= STAGES) wg_mbar_wait(empty + 8 * stage, (uint32)(ls / STAGES - 1) & 1u);
            wg_load_stage<kMats, kN, 128>(base + stage * kStage, w0, w1, x, m0, n0, T, n_rows,
                                          s_begin + ls, tid);
            asm volatile(
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(full + 8 * stage)
                : "memory");
            if (kRagged) wg_mbar_arrive(full + 8 * stage);
        }
        cp_async_wait<0>();  // the thread stays until its copies have landed
    }
    // Waits for step ls's copies; they were written through the generic proxy (cp.async) and
    // wgmma reads the activations through the async proxy, so the reader fences.
    GJ_DEVICE void wait_full(int ls) const {
        wg_mbar_wait(full + 8 * (ls % STAGES), (uint32)(ls / STAGES) & 1u);
        wg_fence_proxy_async();
    }
};

// Barrier over the consumer threads only (PRODUCER 1: the producer may have left).
GJ_DEVICE void wg_consumers_sync() {
    if (PRODUCER)
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
    else
        __syncthreads();
}

// One block's product with kN tokens (the wgmma N: BM, or less for a last block of few tokens).
template <int kEpi, int kN>
GJ_DEVICE void gemm_wgmma_body(const void* w_gate, const void* w_up, const uint16* __restrict__ x,
                               void* y, int T, int n_rows) {
    constexpr int kMats = kEpi == wg_epi_store ? 1 : 2;
    constexpr int kRows = BN / kMats;  // output rows per block
    constexpr int kAcc = kN / 2;       // fp32 accumulators per thread
    extern __shared__ __align__(1024) uint8 smem_raw[];
    // The swizzle is a function of the address bits, so the tiles must sit 1024-byte aligned.
    const uint32 raw_base = smem_addr(smem_raw);
    const uint32 pad = ((raw_base + 1023u) & ~1023u) - raw_base;
    uint8* smem = smem_raw + pad;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;

    // Split K (plain entry only): block z takes pipeline steps [s_begin, s_begin + n_steps) and
    // writes its partial product to plane z of y.
    constexpr int kSplits = kEpi == wg_epi_store ? SPLITS : 1;
    const int z = kSplits > 1 ? (int)blockIdx.z : 0;
    WgPipe<kMats, kN> p;
    p.base = raw_base + pad;
    p.smem = smem;
    p.w0 = (const uint8*)w_gate;
    p.w1 = (const uint8*)w_up;
    p.x = x;
    p.m0 = blockIdx.y * BM;
    p.n0 = blockIdx.x * kRows;
    p.T = T;
    p.n_rows = n_rows;
    p.s_begin = z * kSteps / kSplits;
    p.n_steps = (z + 1) * kSteps / kSplits - p.s_begin;
    p.r0 = wg * 64 + warp * 16 + lane / 4;
    p.tq = lane % 4;
    p.full = p.base + kBytes;
    p.empty = p.full + 8 * STAGES;
    if (kSplits > 1) y = (float*)y + (size_t)z * T * n_rows;

    if (PRODUCER) {
        if (threadIdx.x == 0) {
            wg_mbar_init_all(p.full, STAGES, kRagged ? 256 : 128);  // the producer's threads
            wg_mbar_init_all(p.empty, STAGES, kConsumers);          // the consumers' threads
        }
        __syncthreads();
        if (wg == 1) {  // the second warpgroup produces
            if (kMinBlocks == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;" ::: "memory");
            p.produce(threadIdx.x - kConsumers);
            return;
        }
        if (kMinBlocks == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 200;" ::: "memory");
    }

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    uint32 a0[4][4], a1[4][4];

    if (PRODUCER) {
        if (p.n_steps > 0) p.wait_full(0);
    } else {
        // Prologue: steps 0 .. STAGES - 2 in flight, step 0 landed.
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) p.load(s);
        cp_async_wait<STAGES - 2>();
        wg_fence_proxy_async();
        __syncthreads();
    }
    if (p.n_steps > 0) p.convert(0, a0);

        // Two steps per trip: the register sets alternate by name (registers cannot be indexed).
#pragma unroll 1
    for (int ls = 0; ls < p.n_steps; ls += 2) {
        p.step(ls, acc, a0, a1);
        if (ls + 1 < p.n_steps) p.step(ls + 1, acc, a1, a0);
    }
    wg_wait<0>();
    wg_pin(acc);
    cp_async_wait<0>();  // PRODUCER 0: this thread's (empty) last groups
    // Every consumer is past the pipeline (and every copy has landed: the last step's were
    // waited for), so the stages' shared memory becomes the out tile.
    wg_consumers_sync();

    float* out = (float*)smem;
    {
        const int g = lane / 4, tq = lane % 4;
        const int r = wg * 64 + warp * 16 + g;
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                out[(8 * j + 2 * tq + e % 2) * kOutPitch + r + 8 * (e / 2)] = acc[4 * j + e];
    }
    wg_consumers_sync();
    // Whole output rows: token t, four consecutive weight rows per thread and pass.
    constexpr int kQuads = kRows / 4;
    const bool vec = n_rows % 4 == 0;
#pragma unroll 4
    for (int i = threadIdx.x; i < kN * kQuads; i += kConsumers) {
        const int tl = i / kQuads, rl = (i % kQuads) * 4;
        const int t = p.m0 + tl, n = p.n0 + rl;
        if (t >= T || n >= n_rows) continue;
        const float4 g4 = *(const float4*)(out + tl * kOutPitch + rl);
        float v[4] = {g4.x, g4.y, g4.z, g4.w};
        if (kEpi != wg_epi_store) {
            const float4 u4 = *(const float4*)(out + tl * kOutPitch + rl + kRows);
            const float u[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = gelu_tanh(v[e]) * u[e];
        }
        if (kEpi == wg_epi_geglu_bf16) {
            uint16* yr = (uint16*)y + (size_t)t * n_rows + n;
            const uint32 p01 = wg_pack_bf16x2(v[0], v[1]), p23 = wg_pack_bf16x2(v[2], v[3]);
            if (vec) {
                *(uint2*)yr = make_uint2(p01, p23);
            } else {
                const uint16 h[4] = {(uint16)(p01 & 0xffffu), (uint16)(p01 >> 16),
                                     (uint16)(p23 & 0xffffu), (uint16)(p23 >> 16)};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (n + e < n_rows) yr[e] = h[e];
            }
        } else {
            float* yr = (float*)y + (size_t)t * n_rows + n;
            if (vec) {
                *(float4*)yr = make_float4(v[0], v[1], v[2], v[3]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (n + e < n_rows) yr[e] = v[e];
            }
        }
    }
}

// The wgmma N of a block: the smallest of 64 / 128 / 256 (at most BM) that covers its tokens, so
// a short chunk (a chat turn, the end of a prompt) does not multiply rows that are not there.
template <int kEpi>
GJ_DEVICE void gemm_wgmma_tokens(const void* w, const void* w_up, const uint16* x, void* y, int T,
                                 int n_rows) {
    const int tokens = T - (int)blockIdx.y * BM;  // uniform across the block
    if (BM >= 256 && tokens > 128)
        gemm_wgmma_body<kEpi, BM >= 256 ? 256 : 64>(w, w_up, x, y, T, n_rows);
    else if (BM >= 128 && tokens > 64)
        gemm_wgmma_body<kEpi, BM >= 128 ? 128 : 64>(w, w_up, x, y, T, n_rows);
    else
        gemm_wgmma_body<kEpi, 64>(w, w_up, x, y, T, n_rows);
}

#define GEMM_WGMMA_ENTRY(NAME, EPI)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, kMinBlocks)                        \
        NAME(const void* w, const void* w_up, const uint16* x, void* y, int T, int n_rows) { \
        gj_grid_sync();                                                                      \
        gemm_wgmma_tokens<EPI>(w, w_up, x, y, T, n_rows);                                    \
    }
GEMM_WGMMA_ENTRY(gemm_wgmma, wg_epi_store)
GEMM_WGMMA_ENTRY(gemm_wgmma_geglu, wg_epi_geglu)
GEMM_WGMMA_ENTRY(gemm_wgmma_geglu_bf16, wg_epi_geglu_bf16)

GJ_SPLIT_K_REDUCE_ENTRY(gemm_wgmma_reduce)
GJ_SPLIT_K_REDUCE_BF16_ENTRY(gemm_wgmma_reduce_bf16)
