// flash_prefill_wgmma: the prefill attention of flash_prefill.cu (same semantics, entry, arguments
// and launch) on Hopper's warpgroup tensor cores (wgmma.mma_async, sm_90a), for head dims 64, 128,
// 256 and 512 over an f16 or bf16 cache.
//
// Why: flash_prefill.cu runs on mma.sync, whose operands pass through registers. At head dim 256
// a warp keeps O (16 rows x 256 dims: 128 fp32 registers) and re-reads Q and every K and V
// fragment from shared memory through ldmatrix for each tile: about 320 shared-memory bytes per
// m16n8k16, more than the SM's 128 bytes per clock feed at the tensor rate, and only one or two
// blocks of 4-8 warps fit an SM. It ran at 50-80 TFLOP/s on the 512-token chunks of the model
// shapes (FlashPrefillBench, H200). wgmma reads Q, K and V straight from shared memory for a
// whole warpgroup (64 rows) at once: per 64 x 64 x 16 product one 2 KiB K or V fragment, shared
// by the 64 rows instead of 16.
//
// Work decomposition: as flash_prefill.cu, the T * GROUP query rows of a KV head are numbered
// R = t * GROUP + g; a block takes BLOCK_ROWS = 64 * WG consecutive rows and streams the key range
// its rows can see, [lo of its first token, p of its last], through shared memory in tiles of
// KT = 64 keys (rows past the range zero-filled), last row blocks first.
//
// Roles (warp specialization, as FlashAttention-3): warpgroup 0 produces, warpgroups 1 .. WG
// consume 64 rows each.
//   - The producer gives up registers (setmaxnreg.dec to 40) and streams the tiles with cp.async
//     into STAGES stages. Per stage a `full` mbarrier (its 128 threads arrive once the tile's
//     copies have landed and been fenced for the async proxy) and an `empty` one (every consumer
//     thread arrives when it is done with the tile).
//   - A consumer takes the registers (setmaxnreg.inc to 232: per SM sub-partition one producer
//     warp at 40 and two consumer warps at 232 fill 16128 of the 16384 registers; without the
//     split, 9 or 12 warps per block cap every thread at 168 and O spills). It waits for each
//     tile's `full` barrier alone, so the two consumers drift apart and one's softmax overlaps
//     the other's tensor-core work. Per tile:
//   S [64][KT] = Q K^T     16-dim steps of wgmma m64n64k16, A = the warpgroup's Q rows and B = the
//                          K tile, both K-major in shared memory (SWIZZLE_128B panels of 64 dims);
//   mask (only on tiles crossing some row's window or causal edge: keys outside [lo, p] -> -inf),
//   online softmax in fp32 (exp2, log2(e) folded in), O rescaled where a row's maximum moved;
//   O [64][HEAD_DIM] += P V  16-key steps of wgmma m64nHEAD_DIMk16, A = P rounded to the cache
//                          type, straight from the S accumulators (the m64nN accumulator and the
//                          k16 A fragment share their layout), B = the V tile read MN-major
//                          (transposed) from the same panel layout as K.
// The end: O / l per row, written as fp32 and optionally as f16 (out_h), like flash_prefill.cu.
//
// Head dim 512 (DSPLIT 2): O of 64 rows x 512 dims would take 256 registers per thread, so the two
// consumers take the same 64 rows and one half of the head dims each: each computes S over its
// half of Q and K, the two partial S meet in shared memory (a named barrier over both consumers;
// each adds the other's to its own: the same sum, so both hold the same S and softmax), and each
// accumulates O for its half of V's dims. Tiles of 32 keys (two stages of 64 would not fit beside
// the 64 KiB of Q rows).
//
// Shared memory (1 KiB aligned): Q [BLOCK_ROWS rows] then STAGES x (K tile, V tile) [KT rows],
// each as HEAD_DIM / 64 panels of 128-byte rows, 16-byte chunk c of row r at r * 128 + ((c ^ r) &
// 7) * 16 within its panel (the canonical SWIZZLE_128B layout); then the full and empty barriers;
// with DSPLIT 2 the partial scores [tile parity][consumer][KT / 8][128 threads] float4.
//
// Constants (prologue #defines):
//   HEAD_DIM 64, 128, 256 or 512     GROUP, N_KV_HEADS, WINDOW as flash_prefill.cu
//   KV_TYPE  0 f16, 1 bf16           WG  consumer warpgroups per block (1 or 2)
//   DSPLIT   1, or 2 at head dim 512 (the consumers split the head dims; WG 2)
//   KT       keys per tile: 64, 32 at head dim 512      STAGES  2 or 3
//   THREADS  128 * (WG + 1)          BLOCK_ROWS 64 * WG / DSPLIT    SPLITS 1
//   SMEM     1024 + BLOCK_ROWS * HEAD_DIM * 2 + STAGES * (2 * KT * HEAD_DIM * 2 + 16)
//            (+ 2 * WG * 64 * KT * 4 with DSPLIT 2)
// Launch flash_prefill: grid (ceil(T * GROUP / BLOCK_ROWS), N_KV_HEADS), block THREADS, SMEM
// dynamic bytes (opt in). Entry and arguments: those of flash_prefill.cu.
#include "attn_kv.cuh"
#include "gj_ptx.cuh"
#include "gj_wgmma.cuh"

static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256 || HEAD_DIM == 512,
              "flash_prefill_wgmma: HEAD_DIM must be 64, 128, 256 or 512");
static_assert(KV_TYPE == 0 || KV_TYPE == 1, "flash_prefill_wgmma: f16 or bf16 caches only");
static_assert(GROUP >= 1 && N_KV_HEADS >= 1 && WINDOW >= 0, "flash_prefill_wgmma: bad shape");
static_assert(WG == 1 || WG == 2, "flash_prefill_wgmma: WG must be 1 or 2");
static_assert(DSPLIT == 1 || (DSPLIT == 2 && WG == 2),
              "flash_prefill_wgmma: DSPLIT 2 (head-dim halves) takes two consumers");
static_assert(HEAD_DIM / DSPLIT <= 256, "flash_prefill_wgmma: O of at most 256 dims per consumer");
static_assert(KT == 32 || KT == 64, "flash_prefill_wgmma: KT must be 32 or 64");
static_assert(STAGES == 2 || STAGES == 3, "flash_prefill_wgmma: STAGES must be 2 or 3");
static_assert(THREADS == 128 * (WG + 1) && BLOCK_ROWS == 64 * WG / DSPLIT && SPLITS == 1,
              "flash_prefill_wgmma: THREADS 128 * (WG + 1), BLOCK_ROWS 64 * WG / DSPLIT, SPLITS 1");

#if KV_TYPE == 1
#define FW_TYPE "bf16"
#else
#define FW_TYPE "f16"
#endif

#define N_HEADS_TOTAL (GROUP * N_KV_HEADS)
constexpr int kChunks = HEAD_DIM / 8;               // 16-byte chunks per row
constexpr int kQBytes = BLOCK_ROWS * HEAD_DIM * 2;  // Q rows
constexpr int kTileBytes = KT * HEAD_DIM * 2;       // a K or a V tile
constexpr int kStageBytes = 2 * kTileBytes;
constexpr int kODim = HEAD_DIM / DSPLIT;  // O dims (and S's share of Q K^T) per consumer
// DSPLIT 2: each consumer's partial S [64][KT] fp32, two buffers (tile parity).
constexpr int kXBytes = DSPLIT == 2 ? 2 * WG * 64 * KT * 4 : 0;
static_assert(SMEM == 1024 + kQBytes + STAGES * kStageBytes + 16 * STAGES + kXBytes,
              "flash_prefill_wgmma: SMEM differs from what the template needs");
constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of 16-byte chunk c of row r in a tile of `rows` rows (panels of 64 elements).
GJ_DEVICE uint32 fw_offset(int rows, int r, int c) {
    return (uint32)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ r) & 7) * 16);
}

// The shared-memory descriptor of V as the MN-major (transposed) B of O += P V (N = head dims):
// SWIZZLE_128B panels of 64 dims; the leading byte offset (bits 16-29, >> 4) is the stride between
// panels (KT rows of 128 bytes), the stride byte offset (bits 32-45) that between 8-key groups.
// Q and K take gj_wgmma.cuh's K-major wg_desc.
GJ_DEVICE uint64 fw_desc_mn(uint32 addr) {
    return (uint64)((addr & 0x3ffff) >> 4) | ((uint64)((KT * 128) >> 4) << 16) |
           ((uint64)(1024 >> 4) << 32) | ((uint64)1 << 62);
}

// D[64][64] (+)= A[64][16] B[64][16]^T, A and B K-major tiles in shared memory (descriptors);
// accumulate = 0 overwrites D. Accumulator: register 4 j + e of lane l (warp w of the warpgroup)
// holds row 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2.
GJ_DEVICE void fw_mma_ss_n64(float (&d)[32], uint64 da, uint64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." FW_TYPE "." FW_TYPE
        " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
        "0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate)
        : "memory");
}

GJ_DEVICE void fw_mma_ss_n32(float (&d)[16], uint64 da, uint64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32." FW_TYPE "." FW_TYPE
        " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, "
        "1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(accumulate)
        : "memory");
}
template <int N>
GJ_DEVICE void fw_mma_s(float (&d)[N / 2], uint64 da, uint64 db, int accumulate) {
    if constexpr (N == 32)
        fw_mma_ss_n32(d, da, db, accumulate);
    else
        fw_mma_ss_n64(d, da, db, accumulate);
}

GJ_DEVICE void fw_mma_rs_t_n64(float (&d)[32], const uint32 (&a)[4], uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." FW_TYPE "." FW_TYPE
        " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, "
        "%36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
        : "memory");
}

GJ_DEVICE void fw_mma_rs_t_n128(float (&d)[64], const uint32 (&a)[4], uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." FW_TYPE "." FW_TYPE
        " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
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

GJ_DEVICE void fw_mma_rs_t_n256(float (&d)[128], const uint32 (&a)[4], uint64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." FW_TYPE "." FW_TYPE
        " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, "
        "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
        "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, "
        "%107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "
        "%122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
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
GJ_DEVICE void fw_mma_pv(float (&d)[N / 2], const uint32 (&a)[4], uint64 db) {
    if constexpr (N == 64)
        fw_mma_rs_t_n64(d, a, db);
    else if constexpr (N == 128)
        fw_mma_rs_t_n128(d, a, db);
    else
        fw_mma_rs_t_n256(d, a, db);
}

// cp.async of the cache rows of K and V for positions first .. first + count - 1 (ring slots) into
// the stage at `st` by the producer warpgroup's 128 threads; rows past `count` become zeros
// (never stale bits: P = 0 times NaN is NaN).
// A block's key range never exceeds the ring (count <= slots), so a live row's slot wraps at
// most once.
GJ_DEVICE void issue_tile(uint32 st, const uint8* kc, const uint8* vc, int first, int count,
                          int slots, int kvh, int pt) {
    const int slot0 = first % slots;
#pragma unroll 1
    for (int i = pt; i < KT * kChunks; i += 128) {
        const int r = i / kChunks, c = i % kChunks;
        const bool live = r < count;
        const int slot = !live ? 0 : slot0 + r < slots ? slot0 + r : slot0 + r - slots;
        const size_t off = ((size_t)slot * N_KV_HEADS + kvh) * (HEAD_DIM * 2) + c * 16;
        const uint32 dst = st + fw_offset(KT, r, c);
        cp_async16_or_zero(dst, kc + off, live);
        cp_async16_or_zero(dst + kTileBytes, vc + off, live);
    }
}

GJ_DEVICE int window_lo(int p) {
    return WINDOW > 0 ? max(0, p - WINDOW + 1) : 0;
}

// Named barrier over one consumer warpgroup (ids 1, 2; 0 is __syncthreads).
GJ_DEVICE void fw_wg_sync(int wg) {
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
}

// The producer warpgroup: streams the block's key tiles into the stages. It waits for the
// consumers to release a stage (empty), issues the tile's copies, and once the copies of the tile
// before have landed (cp.async groups complete in order), makes them visible to the async proxy
// and marks that tile full.
GJ_DEVICE void produce(uint32 stages, uint32 full, uint32 empty, const uint8* kc, const uint8* vc,
                       int key_lo, int n_keys, int n_tiles, int slots, int kvh, int pt) {
    for (int it = 0; it < n_tiles; ++it) {
        const int stage = it % STAGES;
        if (it >= STAGES) wg_mbar_wait(empty + 8 * stage, (uint32)(it / STAGES - 1) & 1u);
        issue_tile(stages + stage * kStageBytes, kc, vc, key_lo + it * KT,
                   min(KT, n_keys - it * KT), slots, kvh, pt);
        cp_async_commit();
        if (it >= 1) {
            cp_async_wait<1>();
            wg_fence_proxy_async();
            wg_mbar_arrive(full + 8 * ((it - 1) % STAGES));
        }
    }
    cp_async_wait<0>();
    wg_fence_proxy_async();
    wg_mbar_arrive(full + 8 * ((n_tiles - 1) % STAGES));
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    flash_prefill(const float* __restrict__ q, const void* __restrict__ k_cache,
                  const void* __restrict__ v_cache, const int* __restrict__ positions, int T,
                  int slots, float* __restrict__ out, uint32* __restrict__ out_h) {
    gj_grid_sync();
    extern __shared__ __align__(16) uint8 smem_raw[];
    const uint32 raw0 = smem_addr(smem_raw);
    const uint32 base = (raw0 + 1023u) & ~1023u;  // the swizzle needs 1 KiB aligned panels
    uint8* smem = smem_raw + (base - raw0);
    const int total_rows = T * GROUP;
    const int row0 = (int)(gridDim.x - 1 - blockIdx.x) * BLOCK_ROWS;  // last tokens first
    const int kvh = blockIdx.y;
    if (row0 >= total_rows) return;

    // The block's key range: from the window start of its first token to its last token.
    const int last_row = min(row0 + BLOCK_ROWS, total_rows) - 1;
    const int key_lo = window_lo(positions[row0 / GROUP]);
    const int key_hi = positions[last_row / GROUP];
    const int n_tiles = (key_hi - key_lo + KT) / KT, n_keys = key_hi - key_lo + 1;

    const uint32 stages = base + kQBytes;
    const uint32 full = stages + STAGES * kStageBytes, empty = full + 8 * STAGES;
    if (threadIdx.x == 0) {
        wg_mbar_init_all(full, STAGES, 128);        // the producer's threads
        wg_mbar_init_all(empty, STAGES, 128 * WG);  // the consumers' threads
    }
    __syncthreads();

    // Warpgroup 0 produces with few registers and gives the rest to the consumers (per SM
    // sub-partition one producer warp at 40 and two consumer warps at 232: 16128 of 16384).
    const int wg = threadIdx.x / 128 - 1;  // -1: the producer
    if (wg < 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        produce(stages, full, empty, (const uint8*)k_cache, (const uint8*)v_cache, key_lo, n_keys,
                n_tiles, slots, kvh, threadIdx.x);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
    const int ct = threadIdx.x - 128;  // 0 .. 128 * WG - 1
    const int warp = (ct / 32) % 4, lane = ct % 32;
    // DSPLIT 1: consumer wg takes rows 64 wg ..; DSPLIT 2: both take the block's 64 rows, consumer
    // wg the head dims [wg, wg + 1) * kODim of Q K^T (partial S, added up through shared memory)
    // and of O.
    const int wrow = DSPLIT == 2 ? 0 : 64 * wg;
    const int panel0 = DSPLIT == 2 ? wg * (kODim / 64) : 0;  // first 64-dim panel

    // This consumer's Q rows and dims rounded to the cache type; rows past T * GROUP zero.
    for (int i = ct % 128; i < 64 * (kODim / 8); i += 128) {
        const int r = wrow + i / (kODim / 8), c = 8 * panel0 + i % (kODim / 8), row = row0 + r;
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (row < total_rows) {
            const int t = row / GROUP, gh = row % GROUP;
            const float* src =
                q + ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP + gh) * HEAD_DIM + 8 * c;
            const float4 x = ((const float4*)src)[0], y = ((const float4*)src)[1];
            w = make_uint4(kv_pack2(x.x, x.y), kv_pack2(x.z, x.w), kv_pack2(y.x, y.y),
                           kv_pack2(y.z, y.w));
        }
        *(uint4*)(smem + fw_offset(BLOCK_ROWS, r, c)) = w;
    }
    wg_fence_proxy_async();
    fw_wg_sync(wg);

    // This lane's two rows (l / 4 and l / 4 + 8 of its warp's 16): positions and window starts;
    // rows past T * GROUP get p = -1 (they see nothing and are not written).
    const int row_a = row0 + wrow + 16 * warp + lane / 4;
    int pos_r[2], lo_r[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = row_a + 8 * i;
        pos_r[i] = row < total_rows ? positions[row / GROUP] : -1;
        lo_r[i] = row < total_rows ? window_lo(pos_r[i]) : 0;
    }
    float o[kODim / 2];
#pragma unroll
    for (int i = 0; i < kODim / 2; ++i) o[i] = 0.0f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
    float s[KT / 2];
    const uint32 q_wg = base + wrow * 128 + panel0 * (BLOCK_ROWS * 128);
    float4* xbuf = (float4*)(smem + (full - base) + 16 * STAGES);  // DSPLIT 2 only

    for (int it = 0; it < n_tiles; ++it) {
        const int stage = it % STAGES;
        wg_mbar_wait(full + 8 * stage, (uint32)(it / STAGES) & 1u);
        const uint32 k_tile = stages + stage * kStageBytes, v_tile = k_tile + kTileBytes;

        // S = Q K^T over this consumer's head dims, 16 dims per step.
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < kODim / 16; ++kk)
            fw_mma_s<KT>(s, wg_desc(q_wg + (kk / 4) * (BLOCK_ROWS * 128) + (kk % 4) * 32),
                         wg_desc(k_tile + (panel0 + kk / 4) * (KT * 128) + (kk % 4) * 32), kk > 0);
        wg_commit();
        wg_wait<0>();
        wg_pin(s);
        if (DSPLIT == 2) {
            // Each consumer adds the other's partial S to its own: one sum of the same two values
            // (fp32 addition is commutative), so both hold the same S and run the same softmax.
            float4* mine = xbuf + ((it & 1) * WG + wg) * (KT / 8) * 128 + ct % 128;
            float4* other = xbuf + ((it & 1) * WG + (1 - wg)) * (KT / 8) * 128 + ct % 128;
#pragma unroll
            for (int j = 0; j < KT / 8; ++j)
                mine[j * 128] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
            asm volatile("bar.sync 3, %0;" ::"n"(128 * WG) : "memory");
#pragma unroll
            for (int j = 0; j < KT / 8; ++j) {
                const float4 x = other[j * 128];
                s[4 * j] += x.x, s[4 * j + 1] += x.y, s[4 * j + 2] += x.z, s[4 * j + 3] += x.w;
            }
        }
        // Mask (only on tiles that cross some row's window or causal edge: warp-uniform),
        // row maxima (a row's 64 scores lie in the 4 lanes of a quad), online softmax.
        const int kb = key_lo + it * KT;
        const bool edge =
            kb + KT - 1 > pos_r[0] || kb + KT - 1 > pos_r[1] || kb < lo_r[0] || kb < lo_r[1];
        float mx[2] = {m[0], m[1]};
        if (__any_sync(0xffffffffu, edge)) {
            const int kbase = kb + 2 * (lane & 3);
#pragma unroll
            for (int j = 0; j < KT / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = e >> 1, key = kbase + 8 * j + (e & 1);
                    const float v =
                        key > pos_r[i] || key < lo_r[i] ? neg_inf() : s[4 * j + e] * kLog2e;
                    s[4 * j + e] = v;
                    mx[i] = fmaxf(mx[i], v);
                }
        } else {
#pragma unroll
            for (int j = 0; j < KT / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[4 * j + e] *= kLog2e;
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
                }
        }
        float mu[2], corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            mu[i] = mx[i] == neg_inf() ? 0.0f : mx[i];  // a row that sees nothing yet
            corr[i] = exp2f(m[i] - mu[i]);
            m[i] = mx[i];
            l[i] *= corr[i];
        }
#pragma unroll
        for (int j = 0; j < KT / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[4 * j + e] - mu[e >> 1]);
                l[e >> 1] += p;
                s[4 * j + e] = p;
            }
        uint32 pa[KT / 16][4];
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk) {
            pa[kk][0] = kv_pack2(s[8 * kk + 0], s[8 * kk + 1]);
            pa[kk][1] = kv_pack2(s[8 * kk + 2], s[8 * kk + 3]);
            pa[kk][2] = kv_pack2(s[8 * kk + 4], s[8 * kk + 5]);
            pa[kk][3] = kv_pack2(s[8 * kk + 6], s[8 * kk + 7]);
        }
        // O is rescaled only where some row's maximum moved (corr < 1).
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int j = 0; j < kODim / 8; ++j) {
                o[4 * j + 0] *= corr[0], o[4 * j + 1] *= corr[0];
                o[4 * j + 2] *= corr[1], o[4 * j + 3] *= corr[1];
            }
        }

        // O += P V, 16 keys per step (2 groups of 8 key rows: 2 KiB of each panel).
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk)
            fw_mma_pv<kODim>(o, pa[kk], fw_desc_mn(v_tile + panel0 * (KT * 128) + kk * 2048));
        wg_commit();
        wg_wait<0>();
        wg_pin(o);
        wg_mbar_arrive(empty + 8 * stage);  // this thread is done with the stage
    }

    // O / l, the quad's partial sums added up first.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const int row = row_a + 8 * i;
        if (row >= total_rows) continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        const int t = row / GROUP, gh = row % GROUP;
        const size_t at = ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP + gh) * HEAD_DIM +
                          64 * panel0 + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < kODim / 8; ++j) {
            const float2 v = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            *(float2*)(out + at + 8 * j) = v;
            if (out_h) out_h[(at + 8 * j) / 2] = pack_f16x2(v.x, v.y);
        }
    }
}
