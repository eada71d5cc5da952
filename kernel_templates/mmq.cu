// mmq: prompt-batch matrix product C = X W^T on int8 tensor cores (mma.sync m16n8k32 s8) for
// block-quantized weights against Q8_1 activations, fp32 results.
//
// Per 32-element block b of the inner dimension, the tensor core forms the exact integer dot
//   dot(t, n, b) = sum_{j < 32} qx[t][32b + j] * qw[n][32b + j]
// of the weights' unsigned quants qw (Q8_0: the signed bytes), and the fp32 accumulator of (token
// t, row n) takes, with {dx, s} the activation block's Q8_1 scales (s = dx * sum(qx)):
//   offset types, x = d (q + c):  acc += d[n][b] * (dx[t][b] * dot + c * s[t][b])
//       Q8_0 (c 0), Q4_0 (c -8), Q5_0 (c -16); d the block's fp16 scale
//   min types, x = A q + B:       acc += A[n][b] * (dx[t][b] * dot) + B[n][b] * s[t][b]
//       Q4_1, Q5_1 (A, B = the block's fp16 d, m); Q4_K, Q5_K (A = d sc, B = -dmin m of the
//       sub-block's 6-bit scale and min and the super-block's fp16 d, dmin)
//   Q6_K, x = d sc_h (q - 32), one int8 scale per 16 elements (h = 0, 1): the signed quants
//       q - 32 go to the tensor core, one mma per half (the other half's B register zero):
//       acc += dx[t][b] * (A0 dot0 + A1 dot1), A_h = d sc_h
// The int32 accumulator of each mma starts at the bit pattern of 1.5 * 2^23, so its result read
// as a float is 1.5 * 2^23 + dot (|dot| < 2^22) and one exact subtraction gives float(dot): no int
// -> float conversion.
//
// Weight layouts read (WTYPE is the ggml type id): the split layouts of the matvecs, planes over
// the matrix's n_rows * K / 32 blocks, whose payload is 16 nibble bytes a block in the Q4_0 order
// (Q8_0: 32 int8):
//   Q8_0 (8), Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7): the payload, Q5_0 / Q5_1's fifth-bit words,
//     the fp16 d or d | m << 16 (kernel_templates/q32_blocks.cuh);
//   Q4_K (12), Q5_K (13), Q6_K (14): kquant.cuh's planes (rows of whole super-blocks, K % 256 ==
//     0): Q5_K's fifth-bit words (the order of Q5_0's), Q6_K's top-bit pairs; the sub-blocks'
//     sc | m bytes (Q6_K: int8 scale pairs); the super-blocks' d | dmin (Q6_K: d), of which a
//     stage takes the aligned word holding its one. Each warp decodes its rows' {A, B} ({A0, A1})
//     into a table of its own once per stage.
//
// Data: a block computes a BM (tokens) x BN (weight rows) tile. Each pipeline stage holds KBS
// 32-blocks of K: activations [rows][KBS * 32] int8, per matrix the weight payload [BN][KBS * 32]
// int8 (Q8_0) or [BN][KBS * 16] nibble bytes (the rest), the fifth bits (Q5_0 / Q5_1 / Q5_K
// [BN][KBS] words, Q6_K [BN][KBS] 8-byte top-bit pairs), the K-quants' super-block words ([BN]:
// d | dmin, Q6_K d) and the block scales ([BN][KBS] fp16 d, d | m words, the K-quants' 2-byte
// sc | m or int8 scale pairs), and the {dx, s} [KBS][rows].
// Everything is copied with cp.async (16-byte chunks for the payloads), STAGES stages in flight.
// Payload rows are stored as 16-byte chunks XOR-swizzled within each 128-byte line, so ldmatrix
// reads (8 rows at one chunk column) and the copies hit distinct banks. ldmatrix.x4 on the
// activation tile gives the mma A fragment directly; on the Q8_0 tile it gives two n8 B
// fragments; for the nibble types one 32-bit word of a row holds the nibbles of both B registers
// (bytes 4t..4t+3: low nibbles are elements 4t..4t+3, high nibbles 16+4t..16+4t+3): a mask and a
// shift, then the fifth bits or'ed in at bit 4 (Q6_K: the top two bits, then q - 32).
// Warps form a WARPS_M x WARPS_N grid over the tile. The GeGLU entries compute two matrices; with
// GEGLU_PASSES = 2 they take the BM tokens in two passes of BM / 2 (the same registers and mma
// work per warp and step as the plain entry, the weights read twice).
// Rows past T or n_rows read the last valid row (clamped) and are never written.
//
// Constants (prologue #defines):
//   K        inner dimension (multiple of 32; of 256 for the K-quants)
//   WTYPE    ggml type id: 8 Q8_0, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 12 Q4_K, 13 Q5_K, 14 Q6_K
//   BM, BN   block tile: tokens x weight rows       WARPS_M, WARPS_N  warp grid (see above)
//   KBS      32-blocks of K per stage (1, 2, 4, 8)  STAGES   pipeline depth (>= 2)
//   THREADS  32 * WARPS_M * WARPS_N                 MIN_BLOCKS  __launch_bounds__ blocks per SM
//   GEGLU_PASSES  1 or 2 passes over the tokens in the GeGLU entries (see above)
//   SMEM     dynamic shared memory bytes: the larger of the plain and the GeGLU layouts' STAGES
//            stages plus (K-quants) the warps' scale tables (checked against the layout below)
//   SPLITS   the plain entry splits K over SPLITS blocks (1: no split); see mmq_reduce
// Launch (every entry): grid (ceil(n_rows / BN), ceil(T / BM)), block THREADS, dynamic smem SMEM
// (above 48 KiB the engine opts every entry in). With SPLITS > 1 the plain
// entry takes grid z = SPLITS and y = a workspace of SPLITS planes [T][n_rows] fp32; then
// mmq_reduce(workspace, y, T * n_rows), grid ceil(T * n_rows / 256), block 256, sums them in a
// fixed order (deterministic; mmq_reduce_bf16 writes the sum rounded to bf16). Split K fills the
// SMs when ceil(n_rows / BN) * ceil(T / BM) is well below their count (the n 2560 products of
// E4B: 80 tiles at T = 512).
//
// Entries, one signature:
//   (w, w_up, xq, xds, y, yds, T, n_rows)
//     w, w_up  weights [n_rows][K] (w_up only for the GeGLU entries; layouts above)
//     xq, xds  Q8_1 activations int8 [T][K], float2 {d, d * sum(q)} [T][K / 32]
//   mmq           y fp32 [T][n_rows] = X W^T                              (yds unused)
//   mmq_geglu     y fp32 [T][n_rows] = gelu_tanh(X W^T) * (X W_up^T)      (yds unused)
//   mmq_geglu_q8  the mmq_geglu product as Q8_1: y int8 [T][n_rows], yds float2 [T][n_rows / 32],
//                 bit-identical to quantize_q8_1 over mmq_geglu's output; needs n_rows % 32 == 0
//
// With MOE = 1 the module holds the grouped expert forms instead (a MoE layer's routed experts in
// prefill, every expert a matrix of its own (layouts above), expert e at w + e * expert_bytes):
//   mmq_moe, mmq_moe_geglu, mmq_moe_geglu_q8
//     (w, w_up, expert_bytes, xq, xds, groups, n_groups, slots, in_div, y, yds, n_rows)
//     block (row tile, g) multiplies expert groups[g].x by the groups[g].z <= BM slots of group g
//     (moe_group in groups of BM): tile row i is slot s = slots[groups[g].y + i], which reads
//     activation row s / in_div (the token of a slot for gate|up, the slot itself for down) and
//     writes output row s. Blocks with g >= *n_groups exit (the grid is sized for the most
//     groups a batch can form). Launch: grid (ceil(n_rows / BN), that bound), block THREADS,
//     dynamic smem SMEM. No split K.
#include "gj_ptx.cuh"
#include "q32_blocks.cuh"  // (and kquant.cuh): the split planes' offsets
#include "split_k_reduce.cuh"

#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef GEGLU_PASSES
#define GEGLU_PASSES 1
#endif
#ifndef SPLITS
#define SPLITS 1
#endif
#ifndef MOE
#define MOE 0
#endif

// How the kernel reads each weight type (WTYPE: its ggml type id).
constexpr bool kQ8 = WTYPE == 8;                  // int8 payload, 32 bytes a block
constexpr bool kKq = WTYPE == 12 || WTYPE == 13;  // Q4_K, Q5_K
constexpr bool kFifth32 = WTYPE == 6 || WTYPE == 7 || WTYPE == 13;  // fifth-bit words
constexpr bool kQ6 = WTYPE == 14;                           // split Q6_K: two scales per block
constexpr bool kTable = kKq || kQ6;                         // per-warp scale tables
constexpr bool kMinForm = WTYPE == 3 || WTYPE == 7 || kKq;  // x = A q + B (else d (q + c))
constexpr float kOffset = WTYPE == 2 ? -8.0f : WTYPE == 6 ? -16.0f : 0.0f;  // c
// Scale bytes per (row, block): d | m (Q4_1 / Q5_1), else fp16 d, the K-quants' sc | m or int8
// pair.
constexpr int kDwElem = WTYPE == 3 || WTYPE == 7 ? 4 : 2;

static_assert(K % 32 == 0 && K > 0, "mmq: K must be a positive multiple of 32");
static_assert(kQ8 || kKq || kQ6 || WTYPE == 2 || WTYPE == 3 || WTYPE == 6 || WTYPE == 7,
              "mmq: WTYPE must be 8 (Q8_0), 2 (Q4_0), 3 (Q4_1), 6 (Q5_0), 7 (Q5_1), 12 (Q4_K), "
              "13 (Q5_K) or 14 (Q6_K)");
static_assert(!kTable || K % 256 == 0, "mmq: K-quant rows are whole super-blocks (K % 256 == 0)");
static_assert(THREADS == 32 * WARPS_M * WARPS_N, "mmq: THREADS must be 32 * WARPS_M * WARPS_N");
static_assert(BM % (16 * WARPS_M) == 0, "mmq: a warp's token rows must be whole m16 tiles");
static_assert(BN % (32 * WARPS_N) == 0,
              "mmq: a warp's weight rows must be whole 32-row groups (one Q8_1 block of the "
              "quantized GeGLU output)");
static_assert(KBS == 1 || KBS == 2 || KBS == 4 || KBS == 8, "mmq: KBS must be 1, 2, 4 or 8");
static_assert(STAGES >= 2 && STAGES <= 8, "mmq: STAGES must be in [2, 8]");
static_assert(SPLITS >= 1 && SPLITS <= 8, "mmq: SPLITS must be in [1, 8]");
static_assert(MOE == 0 || SPLITS == 1, "mmq: the grouped expert entries do not split K");
static_assert((GEGLU_PASSES == 1 || GEGLU_PASSES == 2) && BM % (16 * WARPS_M * GEGLU_PASSES) == 0,
              "mmq: GEGLU_PASSES must be 1 or 2, each pass whole m16 tiles per warp");

constexpr int kKb = K / 32;                    // 32-blocks per row
constexpr int kSteps = (kKb + KBS - 1) / KBS;  // pipeline steps over K
constexpr int kWn = BN / WARPS_N;
constexpr int kNf = kWn / 8;    // n8 fragments per warp
constexpr int kXCpr = KBS * 2;  // 16-byte chunks per activation row
constexpr int kWBytesPerKb = kQ8 ? 32 : 16;
constexpr int kWCpr = KBS * kWBytesPerKb / 16;    // 16-byte chunks per weight row
constexpr int kWBytes = BN * KBS * kWBytesPerKb;  // one matrix's payload per stage
constexpr int kQhBytes = kFifth32 ? BN * KBS * 4 : kQ6 ? BN * KBS * 8 : 0;  // its fifth / top bits
constexpr int kHdBytes = kTable ? BN * 4 : 0;  // its super-block words (d | dmin, Q6_K's d)
constexpr int kDwBytes = BN * KBS * kDwElem;   // its block scales
constexpr int32 kMagic = 0x4b400000;           // bits of 1.5 * 2^23
constexpr float kMagicF = 12582912.0f;         // 1.5 * 2^23

// The stage layout of an entry that computes kMats matrices for kRows tokens per pass, and (the
// K-quants) the warps' scale tables after the stages: float2 {A, B} [warp][matrix][KBS][kWn].
template <int kMats>
struct MmqLayout {
    static constexpr int kPasses = kMats == 2 ? GEGLU_PASSES : 1;
    static constexpr int kRows = BM / kPasses;   // tokens per pass
    static constexpr int kWm = kRows / WARPS_M;  // a warp's tokens per pass
    static constexpr int kMf = kWm / 16;         // its m16 fragments
    static constexpr int kXBytes = kRows * KBS * 32;
    static constexpr int kW = kXBytes;                     // payloads, kMats x kWBytes
    static constexpr int kQ = kW + kMats * kWBytes;        // fifth / top bits, kMats x kQhBytes
    static constexpr int kHd = kQ + kMats * kQhBytes;      // super-block words, kMats x kHdBytes
    static constexpr int kDx = kHd + kMats * kHdBytes;     // float2 [KBS][kRows]
    static constexpr int kDw = kDx + KBS * kRows * 8;      // scales, kMats x kDwBytes
    static constexpr int kStage = kDw + kMats * kDwBytes;  // bytes per stage
    static constexpr int kTabWarp = KBS * kWn * 8;         // one warp's table of one matrix
    static constexpr int kSmem =
        STAGES * kStage + (kTable ? WARPS_M * WARPS_N * kMats * kTabWarp : 0);
    static_assert(kXBytes % 128 == 0 && kWBytes % 128 == 0 && kQ % 16 == 0 && kHd % 16 == 0 &&
                      kDx % 16 == 0 && kDw % 16 == 0 && kStage % 16 == 0,
                  "mmq: tile pieces must keep 128-byte lines and 16-byte alignment");
    static_assert(SMEM >= kSmem, "mmq: SMEM is smaller than the pipeline needs");
};

// Byte offset of 16-byte chunk c of row r in a tile of `cpr` chunks per row: the chunk's position
// within its 128-byte line is XORed with the line index (rows of 128 bytes or less) or the row
// (longer rows), so any 8 consecutive rows at one chunk column (an ldmatrix read) land in 8
// different bank groups.
GJ_DEVICE uint32 mmq_swizzle(int r, int c, int cpr) {
    if (cpr >= 8) return (uint32)((r * cpr + (c & ~7) + ((c ^ r) & 7)) * 16);
    const int f = r * cpr + c;
    return (uint32)(((f & ~7) | ((f ^ (f >> 3)) & 7)) * 16);
}

// mmq_swizzle(r, c + dc, cpr) from off = mmq_swizzle(r, c, cpr), for c below dc's lowest set bit
// (c and dc share no bits, c + dc < cpr): the chunk's position within its line is XORed and lines
// past the first are added. The ldmatrix offsets of later 32-blocks of a stage then cost one XOR
// of a per-lane value with a constant.
GJ_DEVICE uint32 mmq_swizzle_add(uint32 off, int dc) {
    return (off ^ (uint32)((dc & 7) * 16)) + (uint32)((dc & ~7) * 16);
}

// The activation row of tile row i (already clamped to the tile's live rows): i itself, or with
// MOE the row the block's slot table gives it.
GJ_DEVICE int mmq_in_row(const int* rows_in, int i) {
    return MOE ? rows_in[i] : i;
}

// Asynchronous 8- and 4-byte copies (the activation scales; the weight scale rows of a stage).
GJ_DEVICE void mmq_cp_async8(uint32 smem_dst, const void* gmem_src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_dst), "l"(gmem_src)
                 : "memory");
}
GJ_DEVICE void mmq_cp_async4(uint32 smem_dst, const void* gmem_src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_dst), "l"(gmem_src)
                 : "memory");
}

// Calls f(i) for each i = threadIdx.x + j * THREADS below N: a count fixed at compile time, so the
// copies unroll and their per-thread address arithmetic leaves the pipeline loop.
template <int N, typename F>
GJ_DEVICE void mmq_per_thread(F&& f) {
#pragma unroll
    for (int j = 0; j < (N + THREADS - 1) / THREADS; ++j) {
        const int i = (int)threadIdx.x + j * THREADS;
        if (N % THREADS == 0 || i < N) f(i);
    }
}

// kBytes (4, 8, 16 or 32) from global to shared memory asynchronously, both aligned to
// min(kBytes, 16).
template <int kBytes>
GJ_DEVICE void mmq_cp_async_row(uint32 dst, const uint8* src) {
    if (kBytes >= 16) {
#pragma unroll
        for (int i = 0; i < kBytes / 16; ++i) cp_async_ca16(dst + 16 * i, src + 16 * i);
    } else if (kBytes == 8) {
        mmq_cp_async8(dst, src);
    } else {
        mmq_cp_async4(dst, src);
    }
}

// The stage's per-block words of the tile's rows (fifth-bit words, block scales): the kElem bytes
// of each of its KBS blocks of row n, from a plane of [n_rows][kKb] elements, to [BN][KBS] at dst.
// Whole steps of aligned rows copy asynchronously; otherwise (odd block counts, the ragged last
// step) plain loads and stores, which the __syncthreads before the stage is read also order.
template <int kElem>
GJ_DEVICE void mmq_load_blocks(uint32 dst, const uint8* plane, int n0, int n_rows, int kb0) {
    constexpr int kRowBytes = KBS * kElem;
    if (kRowBytes >= 4 && kKb % KBS == 0) {
        mmq_per_thread<BN>([&](int r) {
            const int n = min(n0 + r, n_rows - 1);
            mmq_cp_async_row<kRowBytes>(dst + r * kRowBytes,
                                        plane + ((size_t)n * kKb + kb0) * kElem);
        });
    } else {
        for (int i = threadIdx.x; i < BN * KBS; i += THREADS) {
            const int r = i / KBS, kk = i % KBS;
            if (kb0 + kk < kKb) {
                const int n = min(n0 + r, n_rows - 1);
                const uint8* src = plane + ((size_t)n * kKb + kb0 + kk) * kElem;
                const uint32 at = dst + (r * KBS + kk) * kElem;
                if (kElem == 2) {
                    asm volatile("st.shared.u16 [%0], %1;" ::"r"(at), "h"(*(const uint16*)src)
                                 : "memory");
                } else {  // 4 or 8 bytes (Q6_K's top-bit pairs): whole words
#pragma unroll
                    for (int b = 0; b < kElem; b += 4)
                        asm volatile("st.shared.u32 [%0], %1;" ::"r"(at + b),
                                     "r"(*(const uint32*)(src + b))
                                     : "memory");
                }
            }
        }
    }
}

// Byte offsets of a split matrix's planes after its payload (`units` blocks), from the layouts'
// own helpers: the fifth-bit words (Q5_0 / Q5_1 / Q5_K) or top-bit pairs (Q6_K), the block
// scales, and the K-quants' super-block words (d | dmin, Q6_K's d).
GJ_DEVICE size_t mmq_bits_plane(size_t units) {
    if constexpr (WTYPE == 6 || WTYPE == 7)
        return gj_q32_split_planes<WTYPE>::qh(units);
    else if constexpr (WTYPE == 13)
        return gj_q5_k_qh_plane(units);
    else
        return gj_q6_k_qh_plane(units);
}
GJ_DEVICE size_t mmq_scale_plane(size_t units) {
    if constexpr (WTYPE == 3 || WTYPE == 6 || WTYPE == 7)
        return gj_q32_split_planes<WTYPE>::dm(units);
    else if constexpr (WTYPE == 12)
        return gj_q4_k_scm_plane(units);
    else if constexpr (WTYPE == 13)
        return gj_q5_k_scm_plane(units);
    else if constexpr (WTYPE == 14)
        return gj_q6_k_sc_plane(units);
    else
        return units * kWBytesPerKb;  // Q8_0 / Q4_0: the fp16 d after the payload
}
GJ_DEVICE size_t mmq_word_plane(size_t units) {
    if constexpr (WTYPE == 12)
        return gj_q4_k_dm_plane(units);
    else if constexpr (WTYPE == 13)
        return gj_q5_k_dm_plane(units);
    else
        return gj_q6_k_d_plane(units);
}

// Issues the copies of pipeline step `step` (tokens m0.., weight rows n0..) into the stage at
// shared address `st`.
template <int kMats>
GJ_DEVICE void mmq_load_stage(uint32 st, const uint8* const* w, const int8* xq, const float2* xds,
                              const int* rows_in, int m0, int n0, int T, int n_rows, int step) {
    using L = MmqLayout<kMats>;
    const int kb0 = step * KBS;
    constexpr bool kWhole = kKb % KBS == 0;  // every step holds KBS blocks
    mmq_per_thread<L::kRows * kXCpr>([&](int i) {
        const int r = i / kXCpr, c = i % kXCpr;
        if (kWhole || kb0 + c / 2 < kKb) {
            const int t = mmq_in_row(rows_in, min(m0 + r, T - 1));
            cp_async_cg16(st + mmq_swizzle(r, c, kXCpr), xq + (size_t)t * K + kb0 * 32 + c * 16);
        }
    });
    const size_t row_bytes = (size_t)K * kWBytesPerKb / 32;  // a row's payload
    const size_t units = (size_t)n_rows * kKb;  // blocks per matrix (the planes' length)
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
        const uint32 wt = st + L::kW + m * kWBytes;
        mmq_per_thread<BN * kWCpr>([&](int i) {
            const int r = i / kWCpr, c = i % kWCpr;
            if (kWhole || kb0 + c * 16 / kWBytesPerKb < kKb) {
                const int n = min(n0 + r, n_rows - 1);
                cp_async_cg16(wt + mmq_swizzle(r, c, kWCpr),
                              w[m] + n * row_bytes + kb0 * kWBytesPerKb + c * 16);
            }
        });
        if (kFifth32 || kQ6)  // fifth-bit words, Q6_K's top-bit pairs
            mmq_load_blocks<kQ6 ? 8 : 4>(st + L::kQ + m * kQhBytes, w[m] + mmq_bits_plane(units),
                                         n0, n_rows, kb0);
        mmq_load_blocks<kDwElem>(st + L::kDw + m * kDwBytes, w[m] + mmq_scale_plane(units), n0,
                                 n_rows, kb0);
        if (kTable)  // the aligned word holding the stage's super-block's d | dmin (Q6_K: d)
            mmq_per_thread<BN>([&](int r) {
                const size_t sb = (size_t)min(n0 + r, n_rows - 1) * (K / 256) + kb0 / 8;
                mmq_cp_async4(
                    st + L::kHd + m * kHdBytes + r * 4,
                    w[m] + mmq_word_plane(units) + (kQ6 ? (2 * sb) & ~(size_t)3 : 4 * sb));
            });
    }
    mmq_per_thread<L::kRows * KBS>([&](int i) {
        const int kk = i / L::kRows, r = i % L::kRows;
        if (kWhole || kb0 + kk < kKb) {
            const int t = mmq_in_row(rows_in, min(m0 + r, T - 1));
            mmq_cp_async8(st + L::kDx + (kk * L::kRows + r) * 8, xds + (size_t)t * kKb + kb0 + kk);
        }
    });
}

// K-quants: the scales of the stage's KBS blocks of the warp's kWn rows (wn * kWn ..) of matrix m,
// into the warp's table [KBS][kWn]: Q4_K / Q5_K {A, B} = {d sc, -dmin m}, Q6_K {A0, A1} =
// {d sc0, d sc1}. The exact products of the CPU's dequantization
// (engine/gguf/dequant.cpp).
template <int kMats>
GJ_DEVICE void mmq_table(const uint8* st_gen, float2* tab, int m, int wn, int lane, int step,
                         int n0, int n_rows) {
    using L = MmqLayout<kMats>;
#pragma unroll
    for (int r = lane; r < kWn; r += 32) {
        const int row = wn * kWn + r;
        if (kQ6) {
            const uint32 word = *(const uint32*)(st_gen + L::kHd + m * kHdBytes + row * 4);
            const size_t i = (size_t)min(n0 + row, n_rows - 1) * (K / 256) + step * KBS / 8;
            const float d = f16_to_f32((uint16)(word >> (16 * (uint32)(i & 1))));
            const uint16* sc = (const uint16*)(st_gen + L::kDw + m * kDwBytes) + row * KBS;
#pragma unroll
            for (int kk = 0; kk < KBS; ++kk)
                tab[kk * kWn + r] = make_float2(__fmul_rn(d, (float)(int8)(sc[kk] & 0xffu)),
                                                __fmul_rn(d, (float)(int8)(sc[kk] >> 8)));
        } else {  // Q4_K / Q5_K: sc | m << 8
            const float2 dm =
                unpack_f16x2(*(const uint32*)(st_gen + L::kHd + m * kHdBytes + row * 4));
            const uint16* scm = (const uint16*)(st_gen + L::kDw + m * kDwBytes) + row * KBS;
#pragma unroll
            for (int kk = 0; kk < KBS; ++kk)
                tab[kk * kWn + r] = make_float2(__fmul_rn(dm.x, (float)(scm[kk] & 0xffu)),
                                                -__fmul_rn(dm.y, (float)(scm[kk] >> 8)));
        }
    }
}

// Four unsigned 6-bit quants (one per byte) as signed bytes q - 32: each byte's top bit set, 32
// taken off without a borrow, the top bit cleared again.
GJ_DEVICE uint32 mmq_q6_signed(uint32 q) {
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

enum { mmq_epi_store = 0, mmq_epi_geglu = 1, mmq_epi_geglu_q8 = 2 };

template <int kEpi>
GJ_DEVICE void mmq_body(const void* w_gate, const void* w_up, const int8* __restrict__ xq,
                        const float2* __restrict__ xds, void* y, float2* yds, int T, int n_rows,
                        const int* rows_in = nullptr, const int* rows_out = nullptr) {
    constexpr int kMats = kEpi == mmq_epi_store ? 1 : 2;
    using L = MmqLayout<kMats>;
    constexpr int kMf = L::kMf, kWm = L::kWm;
    extern __shared__ __align__(128) uint8 smem[];
    const uint32 base = smem_addr(smem);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int g = lane / 4, tq = lane % 4;
    const int n0 = blockIdx.x * BN;
    const uint8* w[2] = {(const uint8*)w_gate, (const uint8*)w_up};
    // Split K (plain entry only): block z takes pipeline steps [s_begin, s_begin + n_steps) and
    // writes its partial product to plane z of y.
    constexpr int kSplits = kEpi == mmq_epi_store ? SPLITS : 1;
    const int z = kSplits > 1 ? (int)blockIdx.z : 0;
    const int s_begin = z * kSteps / kSplits, n_steps = (z + 1) * kSteps / kSplits - s_begin;
    if (kSplits > 1) y = (float*)y + (size_t)z * T * n_rows;

    // Per-lane ldmatrix row/chunk selections (see the fragment layouts in gj_ptx.cuh). One
    // ldmatrix.x4 of the weight tile covers kG n8 fragments: 2 (Q8_0: 16 rows x 32 bytes) or 4
    // (32 rows x 16 nibble bytes).
    constexpr int kG = kQ8 ? 2 : 4;
    constexpr int kB = kMf >= 4 ? 1 : (4 / kMf < kG ? 4 / kMf : kG);  // fragments per mma batch
    const int a_row = wm * kWm + (lane % 8) + ((lane / 8) % 2) * 8;   // + i * 16
    const int a_chunk = lane / 16;                                    // + kk * 2
    const int b_row = wn * kWn + (kQ8 ? (lane % 8) + (lane / 16) * 8 : lane);
    const int b_chunk = kQ8 ? (lane / 8) % 2 : 0;  // + kk * kBStep
    constexpr int kBStep = kWCpr / KBS;            // weight chunks per 32-block
    // The lane's ldmatrix offsets within a stage's tiles at its first 32-block (a chunk below 2 or
    // kBStep, so mmq_swizzle_add reaches the later ones).
    uint32 a_off[kMf], b_off[kNf / kG];
#pragma unroll
    for (int i = 0; i < kMf; ++i) a_off[i] = mmq_swizzle(a_row + i * 16, a_chunk, kXCpr);
#pragma unroll
    for (int q = 0; q < kNf / kG; ++q) b_off[q] = mmq_swizzle(b_row + q * 8 * kG, b_chunk, kWCpr);
    // The lane's {d, s} row g (+ 8 h + 16 i) and weight scale rows 2 tq (+ 1, + 8 j) of a stage.
    const int dx_row = wm * kWm + g;
    const int dw_row = wn * kWn + 2 * tq;
    // K-quants: the warp's scale tables, one per matrix.
    float2* const tab = (float2*)(smem + STAGES * L::kStage) + warp * kMats * KBS * kWn;

#pragma unroll 1
    for (int pass = 0; pass < L::kPasses; ++pass) {
        // Tile rows: tokens blockIdx.y * BM.. of T, or with MOE the group's T slots from 0.
        const int m0 = (MOE ? 0 : blockIdx.y * BM) + pass * L::kRows;
        if (m0 >= T) break;             // the second pass of a partial last tile
        if (pass > 0) __syncthreads();  // every warp is done with the stages of the first pass

        float acc[kMats][kMf][kNf][4];
#pragma unroll
        for (int m = 0; m < kMats; ++m)
#pragma unroll
            for (int i = 0; i < kMf; ++i)
#pragma unroll
                for (int j = 0; j < kNf; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[m][i][j][e] = 0.0f;

                        // Prologue: STAGES - 1 steps in flight (empty groups past the end keep the
                        // count).
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < n_steps)
                mmq_load_stage<kMats>(base + s * L::kStage, w, xq, xds, rows_in, m0, n0, T, n_rows,
                                      s_begin + s);
            cp_async_commit();
        }

        int stage = 0;  // ls % STAGES, the pipeline stage of step ls (kept without a division)
#pragma unroll 1
        for (int ls = 0; ls < n_steps; ++ls) {
            const int step = s_begin + ls;  // the step of K
            cp_async_wait<STAGES - 2>();
            __syncthreads();
            {  // refill the stage everyone finished with in the previous step
                const int next = ls + STAGES - 1;
                const int next_stage = stage == 0 ? STAGES - 1 : stage - 1;  // next % STAGES
                if (next < n_steps)
                    mmq_load_stage<kMats>(base + next_stage * L::kStage, w, xq, xds, rows_in, m0,
                                          n0, T, n_rows, s_begin + next);
                cp_async_commit();
            }
            const uint32 st = base + stage * L::kStage;
            const uint8* st_gen = smem + stage * L::kStage;
            stage = stage == STAGES - 1 ? 0 : stage + 1;
            const float2* sdx = (const float2*)(st_gen + L::kDx);
            const uint8* sdw = st_gen + L::kDw;
            const uint32* sqh = (const uint32*)(st_gen + L::kQ);  // fifth bits, Q6_K high bits
            if (kTable) {  // this stage's sub-block scales, for the warp's rows
                __syncwarp();
#pragma unroll
                for (int m = 0; m < kMats; ++m)
                    mmq_table<kMats>(st_gen, tab + m * KBS * kWn, m, wn, lane, step, n0, n_rows);
                __syncwarp();
            }
#pragma unroll 1  // one 32-block at a time: bounds the registers ptxas spends on overlap
            for (int kk = 0; kk < KBS; ++kk) {
                if (kKb % KBS != 0 && step * KBS + kk >= kKb) break;  // ragged last step
                uint32 a[kMf][4];
#pragma unroll
                for (int i = 0; i < kMf; ++i)
                    ldmatrix_x4(a[i], st + mmq_swizzle_add(a_off[i], kk * 2));
                // Q8_1 d of rows g, g + 8, and their s (min types) or c * s (offset types).
                float dx[kMf][2], cs[kMf][2];
#pragma unroll
                for (int i = 0; i < kMf; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float2 ds = sdx[kk * L::kRows + dx_row + i * 16 + h * 8];
                        dx[i][h] = ds.x;
                        cs[i][h] = kMinForm ? ds.y : kOffset * ds.y;
                    }
#pragma unroll
                for (int m = 0; m < kMats; ++m)
#pragma unroll
                    for (int q = 0; q < kNf / kG; ++q) {
                        uint32 r[4];
                        ldmatrix_x4(
                            r, st + L::kW + m * kWBytes + mmq_swizzle_add(b_off[q], kk * kBStep));
                        // Batches of kB fragments: their kB * kMf mmas are issued together
                        // (independent), then scaled.
#pragma unroll
                        for (int jb = 0; jb < kG; jb += kB) {
                            int32 d[kB][kMf][4], d2[kQ6 ? kB : 1][kMf][4];  // Q6_K: 2 halves
#pragma unroll
                            for (int jj = 0; jj < kB; ++jj) {
                                const int x = jb + jj;  // fragment of the ldmatrix group
                                uint32 b[2];
                                if (kQ8) {
                                    b[0] = r[2 * x];
                                    b[1] = r[2 * x + 1];
                                } else if (kQ6) {  // nibble word tq, high-bit word tq / 2
                                    const uint32 h =
                                        sqh[m * (kQhBytes / 4) +
                                            ((wn * kWn + q * 8 * kG + 8 * x + g) * KBS + kk) * 2 +
                                            tq / 2];
                                    b[0] = mmq_q6_signed(gj_q6_k_split_q(r[x], h, tq, 0));
                                    b[1] = mmq_q6_signed(gj_q6_k_split_q(r[x], h, tq, 1));
                                } else {
                                    b[0] = r[x] & 0x0f0f0f0fu;
                                    b[1] = (r[x] >> 4) & 0x0f0f0f0fu;
                                    if (kFifth32) {  // the word of row 8 x + g: bits tq, 4 + tq
                                        const uint32 h =
                                            sqh[m * (kQhBytes / 4) +
                                                (wn * kWn + q * 8 * kG + 8 * x + g) * KBS + kk];
                                        b[0] |= ((h >> tq) & 0x01010101u) << 4;
                                        b[1] |= ((h >> (4 + tq)) & 0x01010101u) << 4;
                                    }
                                }
                                const int32 bias[4] = {kMagic, kMagic, kMagic, kMagic};
                                if (kQ6) {  // elements 0..15 (b[0] across the quad), 16..31
                                    const uint32 lo[2] = {b[0], 0u}, hi[2] = {0u, b[1]};
#pragma unroll
                                    for (int i = 0; i < kMf; ++i) {
                                        mma_s8_16x8x32(d[jj][i], a[i], lo, bias);
                                        mma_s8_16x8x32(d2[kQ6 ? jj : 0][i], a[i], hi, bias);
                                    }
                                } else {
#pragma unroll
                                    for (int i = 0; i < kMf; ++i)
                                        mma_s8_16x8x32(d[jj][i], a[i], b, bias);
                                }
                            }
#pragma unroll
                            for (int jj = 0; jj < kB; ++jj) {
                                const int j = q * kG + jb + jj;
                                // The scales {A, B} of rows col and col + 1 (Q6_K: {A0, A1}):
                                // the warp's table (K-quants), else the stage's [BN][KBS] d | m
                                // words or fp16 d.
                                float A[2], B[2] = {0.0f, 0.0f};
                                if (kTable) {
                                    const float4 ab = *(const float4*)(tab + (m * KBS + kk) * kWn +
                                                                       2 * tq + 8 * j);
                                    A[0] = ab.x, B[0] = ab.y, A[1] = ab.z, B[1] = ab.w;
                                } else {
                                    const int at = (dw_row + j * 8) * KBS + kk;
#pragma unroll
                                    for (int e = 0; e < 2; ++e) {
                                        if (kMinForm) {
                                            const float2 dm = unpack_f16x2((
                                                (const uint32*)(sdw + m * kDwBytes))[at + e * KBS]);
                                            A[e] = dm.x, B[e] = dm.y;
                                        } else {
                                            A[e] = f16_to_f32((
                                                (const uint16*)(sdw + m * kDwBytes))[at + e * KBS]);
                                        }
                                    }
                                }
#pragma unroll
                                for (int i = 0; i < kMf; ++i)
#pragma unroll
                                    for (int e = 0; e < 4; ++e) {
                                        const float dot = __int_as_float(d[jj][i][e]) - kMagicF;
                                        float& c = acc[m][i][j][e];
                                        if (kQ6) {
                                            const float dot2 =
                                                __int_as_float(d2[kQ6 ? jj : 0][i][e]) - kMagicF;
                                            c = fmaf(fmaf(dot, A[e % 2], dot2 * B[e % 2]),
                                                     dx[i][e / 2], c);
                                        } else if (kMinForm)
                                            c = fmaf(dot * dx[i][e / 2], A[e % 2],
                                                     fmaf(B[e % 2], cs[i][e / 2], c));
                                        else
                                            c = fmaf(kOffset != 0.0f
                                                         ? fmaf(dot, dx[i][e / 2], cs[i][e / 2])
                                                         : dot * dx[i][e / 2],
                                                     A[e % 2], c);
                                    }
                            }
                        }
                    }
            }
        }
        cp_async_wait<0>();

        // Epilogue. Element e of fragment (i, j): token g + 8 * (e / 2), weight row 2 tq + e % 2.
#pragma unroll
        for (int i = 0; i < kMf; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int t = m0 + wm * kWm + i * 16 + h * 8 + g;
                const int t_out = MOE ? rows_out[min(t, T - 1)] : t;  // its output row
                float v[kNf][2];
#pragma unroll
                for (int j = 0; j < kNf; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float z = acc[0][i][j][2 * h + e];
                        v[j][e] = kEpi == mmq_epi_store
                                      ? z
                                      : gelu_tanh(z) * acc[kMats - 1][i][j][2 * h + e];
                    }
                if (kEpi == mmq_epi_geglu_q8) {
                    // Four n8 fragments across the lane quad are one 32-row Q8_1 block: the same
                    // operations as quantize_q8_1_group8, with the quad's shuffles.
#pragma unroll
                    for (int q = 0; q < kNf / 4; ++q) {
                        float amax = 0.0f;
#pragma unroll
                        for (int j = 4 * q; j < 4 * q + 4; ++j)
                            amax = fmaxf(amax, fmaxf(fabsf(v[j][0]), fabsf(v[j][1])));
                        amax = warp_max<4>(amax);
                        const float d = amax * (1.0f / 127.0f);
                        const float inv = amax > 0.0f ? q8_inv_scale(amax) : 0.0f;
                        int32 sum = 0;
                        int32 qv[4][2];
#pragma unroll
                        for (int j = 0; j < 4; ++j)
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                qv[j][e] = f32_to_s8_sat(v[4 * q + j][e] * inv);
                                sum += qv[j][e];
                            }
                        sum = warp_sum_i32<4>(sum);
                        const int nb = n0 + wn * kWn + q * 32;  // first row of the 32-row block
                        if (t < T && nb < n_rows) {
                            int8* yq = (int8*)y + (size_t)t_out * n_rows + nb;
#pragma unroll
                            for (int j = 0; j < 4; ++j)
                                *(uint16*)(yq + j * 8 + 2 * tq) =
                                    (uint16)((qv[j][0] & 0xff) | ((qv[j][1] & 0xff) << 8));
                            if (tq == 0)
                                yds[(size_t)t_out * (n_rows / 32) + nb / 32] =
                                    make_float2(d, d * (float)sum);
                        }
                    }
                } else if (t < T) {
                    float* yr = (float*)y + (size_t)t_out * n_rows;
#pragma unroll
                    for (int j = 0; j < kNf; ++j) {
                        const int n = n0 + wn * kWn + j * 8 + 2 * tq;
                        if (n_rows % 2 == 0) {  // 8-byte aligned pairs, both in or both out
                            if (n < n_rows) *(float2*)(yr + n) = make_float2(v[j][0], v[j][1]);
                        } else {
                            if (n < n_rows) yr[n] = v[j][0];
                            if (n + 1 < n_rows) yr[n + 1] = v[j][1];
                        }
                    }
                }
            }
    }
}

#define MMQ_ENTRY(NAME, EPI)                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                     \
        NAME(const void* w, const void* w_up, const int8* xq, const float2* xds, void* y, \
             float2* yds, int T, int n_rows) {                                            \
        gj_grid_sync();                                                                   \
        mmq_body<EPI>(w, w_up, xq, xds, y, yds, T, n_rows);                               \
    }

// The grouped expert entries: the group's slot table in shared memory, then the product of its
// expert's matrices over those rows.
#define MMQ_MOE_ENTRY(NAME, EPI)                                                                 \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                            \
        NAME(const void* w, const void* w_up, long long expert_bytes, const int8* xq,            \
             const float2* xds, const int4* groups, const int* n_groups, const int* slots,       \
             int in_div, void* y, float2* yds, int n_rows) {                                     \
        __shared__ int rows_in[BM], rows_out[BM];                                                \
        gj_grid_sync();                                                                          \
        if ((int)blockIdx.y >= __ldg(n_groups)) return;                                          \
        const int4 grp = __ldg(groups + blockIdx.y); /* {expert, first slot, count, 0} */        \
        for (int i = threadIdx.x; i < BM; i += THREADS) {                                        \
            const int s = __ldg(slots + grp.y + min(i, grp.z - 1));                              \
            rows_in[i] = s / in_div;                                                             \
            rows_out[i] = s;                                                                     \
        }                                                                                        \
        __syncthreads();                                                                         \
        const size_t off = (size_t)grp.x * (size_t)expert_bytes;                                 \
        mmq_body<EPI>((const uint8*)w + off, w_up ? (const uint8*)w_up + off : nullptr, xq, xds, \
                      y, yds, grp.z, n_rows, rows_in, rows_out);                                 \
    }

#if MOE
MMQ_MOE_ENTRY(mmq_moe, mmq_epi_store)
MMQ_MOE_ENTRY(mmq_moe_geglu, mmq_epi_geglu)
MMQ_MOE_ENTRY(mmq_moe_geglu_q8, mmq_epi_geglu_q8)
#else
MMQ_ENTRY(mmq, mmq_epi_store)
GJ_SPLIT_K_REDUCE_ENTRY(mmq_reduce)
GJ_SPLIT_K_REDUCE_BF16_ENTRY(mmq_reduce_bf16)
MMQ_ENTRY(mmq_geglu, mmq_epi_geglu)
MMQ_ENTRY(mmq_geglu_q8, mmq_epi_geglu_q8)
#endif
