// flash_prefill: attention of a prefill chunk of T query tokens over a layer's KV cache on
// tensor cores (mma.sync m16n8k16 in the cache's type, fp32 accumulation, fp32 online softmax;
// a q8_0 cache is dequantized to fp16 in shared memory, tile by tile, and multiplied in fp16).
// The chunk's own K/V rows are already in the cache (attn_prep appended them).
//
// Semantics (those of flash_decode.cu's exact path): query head h of token t at position
// p = positions[t] uses KV head h / GROUP and sees keys j in [lo, p], lo = WINDOW ? max(0,
// p - WINDOW + 1) : 0, stored in ring slot j % slots; out = sum_j softmax_j(q . k_j) v_j,
// scale 1.0. Positions of a chunk are consecutive (positions[t] = positions[0] + t); any
// positions[0] >= 0.
//
// Work decomposition. The T * GROUP query rows of one KV head are numbered R = t * GROUP + g
// (g = head within the group), so a run of consecutive rows is a run of tokens times all the
// heads that read the same K/V rows. A block takes BLOCK_ROWS consecutive rows of one KV head and
// streams the key range its rows can see, [lo of its first token, p of its last], through shared
// memory once (cp.async, STAGES deep, KT keys per tile) for all of them. Its warps are
// WM row warps (16 rows each: the mma M) x DS head-dim slices x KS key sets:
//   - key set ks takes keys [ks * KW, (ks + 1) * KW) of every tile (KW = KT / KS); the KS partial
//     softmax states of a row are merged at the end through shared memory (this multiplies the
//     warps per row without a per-tile exchange: a chunk of 512 tokens of an 8-head model has only
//     256 row warps, too few for 132 SMs);
//   - head-dim slice ds accumulates O for dims [ds * DSLICE, (ds + 1) * DSLICE) (DSLICE =
//     HEAD_DIM / DS). Its O accumulator of 16 rows x DSLICE fp32 is DSLICE / 2 registers per
//     thread: HEAD_DIM 512 would need 256 with the whole head, so the builder splits it in two
//     (128 registers, like HEAD_DIM 256 unsplit). The DS warps of a (row warp, key set) share the
//     scores: each computes S for its KWS = KW / DS of the KW keys, the row maxima are exchanged
//     through shared memory (a named barrier over those DS warps), and each writes its part of P
//     (in the cache type) to a shared 16 x KW buffer, from which every one of them reads all of
//     P as A fragments for its slice of O += P V. No Q K^T work is repeated.
//     With DIM_SCORES = 1 they split Q K^T by head dims instead: each computes fp32 partial
//     scores of all KW keys over its DSLICE dims, the group adds them up through shared memory
//     (one named barrier; every warp sums in the same order, so all hold the same S), and each
//     runs the softmax itself with P straight from its registers. Per mma that reads fewer
//     shared bytes than re-reading Q for a few keys, and needs no P buffer or maxima exchange.
//   - key splits (SPLITS > 1, sm_90+): a row block is handled by a cluster of SPLITS blocks, block
//     `split` of the cluster streaming tiles [split, split + 1) * n / SPLITS of the block's n key
//     tiles. Each ends with its rows' unnormalized O and (m, l) in its own shared memory; after a
//     cluster barrier block `split` combines rows [split, split + 1) * BLOCK_ROWS / SPLITS over
//     all SPLITS partials (distributed shared memory reads) and writes them. This lets larger row
//     blocks (fewer K/V bytes from L2 per flop) still fill the SMs when T * GROUP / BLOCK_ROWS *
//     N_KV_HEADS is small. Before sm_90 (no clusters) split 0 takes all tiles and the others exit.
// Per warp and tile: S (16 x KWS) = Q K^T with Q (rounded to the cache type when staged) and K
// rows through ldmatrix, the k-steps spread over S_SETS accumulator sets (independent mma chains
// for latency hiding, added up at the end); masked scores -> -inf; online softmax in fp32 (exp2
// with log2(e) folded in; O is rescaled only on tiles where some row's maximum moved); P rounded
// to the cache type goes straight from the S accumulators into A fragments (the m16n8k16 C and A
// layouts line up) unless it is shared (DS > 1, DIM_SCORES 0: through the shared P buffer);
// O += P V with V through ldmatrix.trans. Rows are stored with their 16-byte chunks XOR-swizzled
// so every ldmatrix phase hits 8 distinct bank groups.
// Skipping: a warp skips a tile slice none of its rows can see (the causal upper triangle, keys
// left of the window), and applies the per-element mask only to slices that straddle an edge, so
// the work is proportional to the visible keys. Blocks run in reverse row order: the last tokens
// see the most keys and start first.
// Zero-filled rows: tile rows past the block's key range are filled with zeros (never stale bits:
// P = 0 times a NaN would still be NaN). Within the range every slot holds a live position: its
// length is at most WINDOW + T - 1 <= slots on ring layers. A NaN in a K row reaches exactly the
// rows that see it (masking replaces it, fmaxf ignores it in the row max, exp2 keeps it); one in a
// V row also reaches the other rows of the warps that load it (P = 0 times NaN), and with key
// splits the rows of the block whose combine weight for that split is 0.
//
// Constants (prologue #defines):
//   HEAD_DIM 32, 64, 128, 256 or 512     GROUP  query heads per KV head (models: 1..16)
//   N_KV_HEADS                           WINDOW sliding window (0 = causal over the whole cache)
//   KV_TYPE  cache element type (attn_kv.cuh: 0 f16, 1 bf16, 2 q8_0). q8_0: a stage holds the
//            tile's int8 payload rows and fp16 scales (K plane, then V plane); after the tile
//            lands all threads dequantize it into one fp16 tile (d * q rounded to fp16, laid out
//            like an f16 stage) that the warps then read, one extra barrier per tile.
//   WM       row warps, BLOCK_ROWS = 16 * WM query rows per block
//   DS       head-dim slices             KS  key sets
//   DIM_SCORES  with DS > 1: 0 the group's warps split the scores by keys, 1 by head dims
//   KT       keys per tile (KS * KW, KW a multiple of 16; KW / DS a multiple of 8 unless
//            DIM_SCORES)
//   STAGES   pipeline depth              S_SETS  accumulator sets of S (1, 2 or 4)
//   SPLITS   blocks per row block (1, 2, 4, 8: the cluster size; key tiles split among them)
//   THREADS  32 * WM * DS * KS           SMEM  dynamic shared memory bytes (checked here)
// Launch flash_prefill: grid (ceil(T * GROUP / BLOCK_ROWS) * SPLITS, N_KV_HEADS), block THREADS,
//   SMEM dynamic bytes (the engine opts in above 48 KiB); the cluster shape (SPLITS, 1, 1) is
//   compiled into the kernel, so a plain launch works. No workspace. A grid sized for a larger T
//   is fine: blocks whose rows all lie past T * GROUP exit.
// Entry:
//   flash_prefill(q [T][GROUP * N_KV_HEADS][HEAD_DIM] fp32, k_cache, v_cache, positions [T], T,
//                 slots, out [T][GROUP * N_KV_HEADS][HEAD_DIM] fp32, out_h)
//   out_h: null, or the same output rounded to f16 (round to nearest even, as f32_to_f16) in the
//   same layout, written as well: the input of an F16 cuBLAS output projection (no conversion
//   pass).
#include "attn_kv.cuh"
#include "gj_ptx.cuh"

static_assert(HEAD_DIM == 32 || HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256 ||
                  HEAD_DIM == 512,
              "flash_prefill: HEAD_DIM must be 32, 64, 128, 256 or 512");
static_assert(GROUP >= 1 && N_KV_HEADS >= 1, "flash_prefill: bad head counts");
static_assert(WINDOW >= 0, "flash_prefill: WINDOW must be >= 0");
static_assert(STAGES >= 2, "flash_prefill: STAGES must be >= 2");
static_assert(THREADS == 32 * WM * DS * KS, "flash_prefill: THREADS must be 32 * WM * DS * KS");
static_assert(BLOCK_ROWS == 16 * WM, "flash_prefill: BLOCK_ROWS must be 16 * WM");

#define N_HEADS_TOTAL (GROUP * N_KV_HEADS)
#define ROW_BYTES (HEAD_DIM * 2)
#define CPR (HEAD_DIM / 8)  // 16-byte chunks per row
#define KW (KT / KS)        // keys per (row warp, key set) and tile
// Score work of the DS warps of a group: split by keys (P shared) or by head dims (S shared).
#define SHARE_P (DS > 1 && !DIM_SCORES)
#define SHARE_S (DS > 1 && DIM_SCORES)
#define KWS (SHARE_P ? KW / DS : KW)                             // keys of this warp's scores
#define NT (KWS / 8)                                             // score n-tiles per warp
#define S_KSTEPS (SHARE_S ? HEAD_DIM / DS / 16 : HEAD_DIM / 16)  // its k-steps of Q K^T
#define DSLICE (HEAD_DIM / DS)
#define Q_BYTES (BLOCK_ROWS * ROW_BYTES)
#if KV_Q8
// A q8_0 plane's share of a stage: KT payload rows of HEAD_DIM bytes, then their scales.
#define RAW_PLANE_BYTES ((KT * (KV_ROW_BYTES + KV_SCALE_ROW_BYTES) + 15) / 16 * 16)
#define STAGE_BYTES (2 * RAW_PLANE_BYTES)  // K plane, then V plane
#define CONV_BYTES (2 * KT * ROW_BYTES)    // the dequantized tile: fp16 K rows, then V rows
#else
#define STAGE_BYTES (2 * KT * ROW_BYTES)  // K rows, then V rows
#define CONV_BYTES 0
#endif
// Where the score-sharing buffers start: after Q, the stages and the dequantized tile.
#define SHARE_OFFSET (Q_BYTES + STAGES * STAGE_BYTES + CONV_BYTES)
// Score sharing between the DS warps of a group (row warp, key set): row maxima [group][DS][16]
// (after the loop: the partial sums l), then P [group][16][KW] in the cache type.
#define N_GROUPS (WM * KS)
// With head-dim score splits instead: fp32 partial scores [group][DS][NT][32 lanes] float4.
#define RED_BYTES (SHARE_P ? N_GROUPS * DS * 16 * 4 : 0)
#define P_ROW_BYTES (KW * 2)
#define P_BYTES (SHARE_P ? N_GROUPS * 16 * P_ROW_BYTES : 0)
#define S_PART_BYTES (SHARE_S ? N_GROUPS * DS * 16 * KW * 4 : 0)
#define PIPE_BYTES (SHARE_OFFSET + RED_BYTES + P_BYTES + S_PART_BYTES)
// Merge area (reuses the pipeline's): O slices and (m, l) of key sets 1 .. KS - 1.
#define MERGE_O_BYTES ((KS - 1) * BLOCK_ROWS * HEAD_DIM * 4)
#define MERGE_BYTES (MERGE_O_BYTES + (KS - 1) * BLOCK_ROWS * 8)
// Key splits (SPLITS > 1): the block's unnormalized O [BLOCK_ROWS][HEAD_DIM] fp32 and (m, l)
// [BLOCK_ROWS] for the other blocks of its cluster, then its combine weights [BLOCK_ROWS].
#define SPLIT_O_BYTES (BLOCK_ROWS * HEAD_DIM * 4)
#define SPLIT_BYTES (SPLITS > 1 ? SPLIT_O_BYTES + BLOCK_ROWS * 12 : 0)
#define SMEM_NEED2 (PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES)
#define SMEM_NEED (SMEM_NEED2 > SPLIT_BYTES ? SMEM_NEED2 : SPLIT_BYTES)
#define LOG2E 1.4426950408889634f

static_assert(KW % 16 == 0 && KT == KS * KW, "flash_prefill: KT / KS must be a multiple of 16");
static_assert(KWS % 8 == 0, "flash_prefill: KW / DS must be a multiple of 8 (keys split)");
static_assert(DIM_SCORES == 0 || DIM_SCORES == 1, "flash_prefill: DIM_SCORES is 0 or 1");
static_assert(S_SETS == 1 || S_SETS == 2 || S_SETS == 4, "flash_prefill: S_SETS 1, 2 or 4");
static_assert(DS == 1 || N_GROUPS <= 15, "flash_prefill: one named barrier per group (1..15)");
static_assert(DSLICE % 16 == 0 && (DS == 1 || DSLICE % 64 == 0),
              "flash_prefill: head-dim slices of 16 dims (64 when sliced, for the swizzle)");
static_assert(SPLITS == 1 || SPLITS == 2 || SPLITS == 4 || SPLITS == 8,
              "flash_prefill: SPLITS must be 1, 2, 4 or 8 (a portable cluster)");
static_assert(SMEM == SMEM_NEED, "flash_prefill: SMEM differs from what the template needs");

// Key splits run as thread-block clusters (sm_90+): the SPLITS blocks of a row block each take a
// share of its key tiles and combine through distributed shared memory. Before sm_90 there are
// no clusters: the block of split 0 takes every tile and the others exit (same launch, same
// result, no speedup).
#if SPLITS > 1 && __CUDA_ARCH__ >= 900
#define CLUSTER SPLITS
#define CLUSTER_ATTR __cluster_dims__(SPLITS, 1, 1)
#else
#define CLUSTER 1
#define CLUSTER_ATTR
#endif

#if CLUSTER > 1
// Barrier over every thread of the cluster; release/acquire orders the shared-memory writes
// before it with the remote reads after it.
GJ_DEVICE void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
            : "memory");
}
// The address of this block's shared byte `addr` in the shared memory of cluster block `rank`.
GJ_DEVICE uint32 cluster_map(uint32 addr, uint32 rank) {
    uint32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
GJ_DEVICE float4 ld_cluster_f4(uint32 addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
GJ_DEVICE float2 ld_cluster_f2(uint32 addr) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(addr)
                 : "memory");
    return v;
}
#endif

// Swizzle of a row: chunk c of row r sits at chunk c ^ swz_key(r). ldmatrix reads 8 rows at one
// chunk column per phase; with 8+ chunks per row (128+ bytes) the low 3 bits of r spread them
// over the 8 bank groups; with 4 chunks (HEAD_DIM 32: two rows per 128 bytes) bits 1..2 do.
GJ_DEVICE int swz_key(int r) {
    return CPR >= 8 ? (r & 7) : ((r >> 1) & 3);
}
GJ_DEVICE int chunk_offset(int r, int c) {
    return r * ROW_BYTES + ((c ^ swz_key(r)) << 4);
}
// The same for the shared P rows of KW / 8 chunks (2, 4, 8 or more: as many rows share 128 bytes
// as the key's low bits skip).
GJ_DEVICE int p_chunk_offset(int r, int c) {
    const int key = KW >= 64 ? (r & 7) : KW == 32 ? ((r >> 1) & 3) : ((r >> 2) & 1);
    return r * P_ROW_BYTES + ((c ^ key) << 4);
}

// Barrier over the DS warps of one group (named barrier 1 + group; 0 is __syncthreads).
GJ_DEVICE void group_sync(int group) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "n"(32 * DS) : "memory");
}

// The tensor-core operand type: the cache's (f16 or bf16); fp16 for a q8_0 cache.
// d += a * b on one m16n8k16 tile in that type with fp32 accumulators.
GJ_DEVICE void mma_kv(float d[4], const uint32 a[4], const uint32 b[2]) {
#if KV_TYPE == 1
    mma_bf16_16x8x16(d, a, b, d);
#else
    mma_f16_16x8x16(d, a, b, d);
#endif
}
// Two floats -> one 32-bit word of two operands (lo in bits 0..15), round to nearest even.
GJ_DEVICE uint32 op_pack2(float lo, float hi) {
#if KV_TYPE == 1
    return pack_u16x2(f32_to_bf16(lo), f32_to_bf16(hi));
#else
    return pack_f16x2(lo, hi);
#endif
}

#if KV_Q8
// q8_0: the payload rows (16-byte chunks) and scales of the KT cache rows of K and V for positions
// first .. first + count - 1 into a stage (K plane, V plane); rows past `count` become zeros.
GJ_DEVICE void issue_tile(uint32 stage, uint8* stage_generic, const uint8* k_cache,
                          const uint8* v_cache, int first, int count, int slots, int kvh) {
    constexpr int kCpr = KV_ROW_BYTES / 16;  // payload chunks per row
    constexpr int kChunks = KT * kCpr;
#pragma unroll
    for (int k = 0; k < (kChunks + THREADS - 1) / THREADS; ++k) {
        const int i = k * THREADS + threadIdx.x;
        if (kChunks % THREADS == 0 || i < kChunks) {
            const int r = i / kCpr, c = i % kCpr;
            const bool live = r < count;
            const int slot = live ? (first + r) % slots : 0;
            const size_t off = ((size_t)slot * N_KV_HEADS + kvh) * KV_ROW_BYTES + c * 16;
            const uint32 dst = stage + r * KV_ROW_BYTES + c * 16;
            cp_async16_or_zero(dst, k_cache + off, live);
            cp_async16_or_zero(dst + RAW_PLANE_BYTES, v_cache + off, live);
        }
    }
    const uint8* k_scales = kv_scale_plane(k_cache, slots);
    const uint8* v_scales = kv_scale_plane(v_cache, slots);
    constexpr int kGrainsPerRow = KV_SCALE_ROW_BYTES / KV_SCALE_GRAIN;
    constexpr int kGrains = KT * kGrainsPerRow;
#pragma unroll
    for (int k = 0; k < (kGrains + THREADS - 1) / THREADS; ++k) {
        const int i = k * THREADS + threadIdx.x;
        if (kGrains % THREADS == 0 || i < kGrains) {
            const int r = i / kGrainsPerRow, c = i % kGrainsPerRow;
            const bool live = r < count;
            const int slot = live ? (first + r) % slots : 0;
            const size_t off =
                ((size_t)slot * N_KV_HEADS + kvh) * KV_SCALE_ROW_BYTES + c * KV_SCALE_GRAIN;
            const int dst = KT * KV_ROW_BYTES + r * KV_SCALE_ROW_BYTES + c * KV_SCALE_GRAIN;
            kv_copy_scale_or_zero(stage_generic + dst, k_scales + off, live);
            kv_copy_scale_or_zero(stage_generic + RAW_PLANE_BYTES + dst, v_scales + off, live);
        }
    }
}

// Dequantizes a landed q8_0 stage into the fp16 tile `conv` (K rows, then V rows, swizzled like
// an f16 stage): element = fp16(d * q), exact q times the block's fp16 scale, rounded once. The
// int8 -> float step places the biased byte in the mantissa of 2^23 (one subtraction).
GJ_DEVICE void dequantize_tile(const uint8* stage, uint8* conv) {
    constexpr int kUnits = 2 * KT * CPR;  // 16-byte output chunks (8 elements)
#pragma unroll 4
    for (int i = threadIdx.x; i < kUnits; i += THREADS) {
        const int plane = i / (KT * CPR), r = (i / CPR) % KT, c = i % CPR;
        const uint8* raw = stage + plane * RAW_PLANE_BYTES;
        const uint2 q = *(const uint2*)(raw + r * KV_ROW_BYTES + 8 * c);
        const float d = f16_to_f32(
            *(const uint16*)(raw + KT * KV_ROW_BYTES + r * KV_SCALE_ROW_BYTES + 2 * (c / 4)));
        const uint32 x0 = q.x ^ 0x80808080u, x1 = q.y ^ 0x80808080u;  // q + 128 per byte
        const float off = 8388736.0f;                                 // 2^23 + 128
        float v[8];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            v[b] = (__uint_as_float(__byte_perm(x0, 0x4b000000u, 0x7440u + b)) - off) * d;
            v[4 + b] = (__uint_as_float(__byte_perm(x1, 0x4b000000u, 0x7440u + b)) - off) * d;
        }
        *(uint4*)(conv + plane * KT * ROW_BYTES + chunk_offset(r, c)) = make_uint4(
            op_pack2(v[0], v[1]), op_pack2(v[2], v[3]), op_pack2(v[4], v[5]), op_pack2(v[6], v[7]));
    }
}
#else
// cp.async of the KT cache rows of K and V for positions first .. first + count - 1 (ring slots)
// into a stage; rows past `count` become zeros.
GJ_DEVICE void issue_tile(uint32 stage, uint8* /*stage_generic*/, const uint8* k_cache,
                          const uint8* v_cache, int first, int count, int slots, int kvh) {
    constexpr int kChunks = KT * CPR;
#pragma unroll
    for (int k = 0; k < (kChunks + THREADS - 1) / THREADS; ++k) {
        const int i = k * THREADS + threadIdx.x;
        if (kChunks % THREADS == 0 || i < kChunks) {
            const int r = i / CPR, c = i % CPR;
            const bool live = r < count;
            const int slot = live ? (first + r) % slots : 0;
            const size_t off = ((size_t)slot * N_KV_HEADS + kvh) * ROW_BYTES + c * 16;
            const uint32 dst = stage + chunk_offset(r, c);
            cp_async16_or_zero(dst, k_cache + off, live);
            cp_async16_or_zero(dst + KT * ROW_BYTES, v_cache + off, live);
        }
    }
}
#endif

GJ_DEVICE int window_lo(int p) {
    return WINDOW > 0 ? max(0, p - WINDOW + 1) : 0;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) CLUSTER_ATTR
    flash_prefill(const float* __restrict__ q, const void* __restrict__ k_cache,
                  const void* __restrict__ v_cache, const int* __restrict__ positions, int T,
                  int slots, float* __restrict__ out, uint32* __restrict__ out_h) {
    gj_grid_sync();
    extern __shared__ __align__(16) uint8 smem[];
    const int total_rows = T * GROUP;
    // Cluster rank (the split) and row block, last tokens first. A whole cluster shares row0, so
    // blocks past the rows exit together.
    const int split = blockIdx.x % SPLITS;
    const int row0 = (gridDim.x / SPLITS - 1 - blockIdx.x / SPLITS) * BLOCK_ROWS;
    const int kvh = blockIdx.y;
    if (row0 >= total_rows || (CLUSTER == 1 && split != 0)) return;
    const uint8* kc = (const uint8*)k_cache;
    const uint8* vc = (const uint8*)v_cache;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp % WM, ds = (warp / WM) % DS, ks = warp / (WM * DS);
    const int g = lane >> 2, tq = lane & 3;

    // The block's key range: from the window start of its first token to its last token.
    const int last_row = min(row0 + BLOCK_ROWS, total_rows) - 1;
    const int key_lo = window_lo(positions[row0 / GROUP]);
    const int key_hi = positions[last_row / GROUP];
    // This split's share of the range's tiles (all of them without clusters).
    const int n_all = (key_hi - key_lo + KT) / KT;
    const int t_begin = CLUSTER > 1 ? split * n_all / CLUSTER : 0;
    const int n_tiles = (CLUSTER > 1 ? (split + 1) * n_all / CLUSTER : n_all) - t_begin;
    const int first_key = key_lo + t_begin * KT, n_keys = key_hi - first_key + 1;

    const uint32 smem0 = smem_addr(smem);
    const uint32 stages0 = smem0 + Q_BYTES;
    // Start the first tiles' copies, then stage Q while they fly.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles)
            issue_tile(stages0 + s * STAGE_BYTES, smem + Q_BYTES + s * STAGE_BYTES, kc, vc,
                       first_key + s * KT, min(KT, n_keys - s * KT), slots, kvh);
        cp_async_commit();  // possibly empty: keeps the group count uniform
    }
    // Q rows, rounded to the cache type, swizzled like the cache rows; rows past T * GROUP zero.
    for (int i = threadIdx.x; i < BLOCK_ROWS * CPR; i += THREADS) {
        const int r = i / CPR, c = i % CPR;
        const int row = row0 + r;
        uint4 w = make_uint4(0u, 0u, 0u, 0u);
        if (row < total_rows) {
            const int t = row / GROUP, gh = row % GROUP;
            const float* src =
                q + ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP + gh) * HEAD_DIM + 8 * c;
            const float4 x = ((const float4*)src)[0], y = ((const float4*)src)[1];
            w = make_uint4(op_pack2(x.x, x.y), op_pack2(x.z, x.w), op_pack2(y.x, y.y),
                           op_pack2(y.z, y.w));
        }
        *(uint4*)(smem + chunk_offset(r, c)) = w;
    }

    // This lane's two rows (g and g + 8 of the warp's 16): positions and window starts; rows past
    // T * GROUP get p = -1, lo = 0 (they see nothing).
    const int wrow0 = row0 + wm * 16;
    const int rows_ab[2] = {wrow0 + g, wrow0 + g + 8};
    int pos_r[2], lo_r[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        pos_r[i] = rows_ab[i] < total_rows ? positions[rows_ab[i] / GROUP] : -1;
        lo_r[i] = rows_ab[i] < total_rows ? window_lo(pos_r[i]) : 0;
    }
    // The warp's extremes over its live rows (rows are in token order).
    const bool warp_live = wrow0 < total_rows;
    const int wlast = min(wrow0 + 15, total_rows - 1);
    const int wp_min = warp_live ? positions[wrow0 / GROUP] : -1;
    const int wp_max = warp_live ? positions[wlast / GROUP] : -1;
    const int wlo_min = window_lo(wp_min), wlo_max = window_lo(wp_max);

    // ldmatrix lane roles. A operands (Q rows; V rows for the .trans B operand): matrix
    // i = lane / 8 is rows (i & 1) * 8 .. + 7 at chunk 2s + (i >> 1). B operand K: rows
    // (lane >> 4) * 8 .. + 7 at chunk 2s + ((lane >> 3) & 1). Row bases are multiples of 16, so
    // the swizzle key is the lane's own; chunk 2s + lchunk lies at off[s % 4] + 128 * (s / 4)
    // (the XOR touches the low 3 bits only; with 4 chunks per row s < 2).
    const int row_a = ((lane >> 3) & 1) * 8 + (lane & 7), lchunk_a = (lane >> 4) & 1;
    const int row_b = (lane >> 4) * 8 + (lane & 7), lchunk_b = (lane >> 3) & 1;
    constexpr int kOffs = CPR / 2 < 4 ? CPR / 2 : 4;
    uint32 off_a[kOffs], off_b[kOffs];
#pragma unroll
    for (int j = 0; j < kOffs; ++j) {
        off_a[j] = (uint32)(((2 * j + lchunk_a) ^ swz_key(row_a)) << 4);
        off_b[j] = (uint32)(((2 * j + lchunk_b) ^ swz_key(row_b)) << 4);
    }
    // Q and K rows from the warp's first score dim (a multiple of 64 dims when sliced: the
    // swizzle keeps 8-chunk runs in place) and its first score key.
    const uint32 dim0 = SHARE_S ? ds * DSLICE * 2 : 0;
    const uint32 q_lane = smem0 + (wm * 16 + row_a) * ROW_BYTES + dim0;
    const uint32 k_lane = (ks * KW + (SHARE_P ? ds * KWS : 0) + row_b) * ROW_BYTES + dim0;
    const uint32 v_lane = KT * ROW_BYTES + (ks * KW + row_a) * ROW_BYTES + ds * DSLICE * 2;

    // O accumulators of the slice: o[n] = {O[g][8n + 2tq], O[g][8n + 2tq + 1], O[g + 8][8n + 2tq],
    // O[g + 8][8n + 2tq + 1]}; m, l per row (l: this lane's share of the sum).
    float o[DSLICE / 8][4];
#pragma unroll
    for (int n = 0; n < DSLICE / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};
    // Score sharing (DS > 1): this group's row maxima and P buffer, or its partial scores.
    const int group = wm + WM * ks;
    float* red = (float*)(smem + SHARE_OFFSET) + group * DS * 16;
    uint8* p_rows = smem + SHARE_OFFSET + RED_BYTES + group * 16 * P_ROW_BYTES;
    float4* s_parts = (float4*)(smem + SHARE_OFFSET) + group * DS * NT * 32;

    for (int it = 0; it < n_tiles; ++it) {
        const int nt_issue = it + STAGES - 1;
        if (nt_issue < n_tiles)
            issue_tile(stages0 + (nt_issue % STAGES) * STAGE_BYTES,
                       smem + Q_BYTES + (nt_issue % STAGES) * STAGE_BYTES, kc, vc,
                       first_key + nt_issue * KT, min(KT, n_keys - nt_issue * KT), slots, kvh);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();  // tile `it` has landed (this thread's copies)
        __syncthreads();              // ... everyone's, and Q's stores
#if KV_Q8
        // Every warp is past the previous tile's reads of the fp16 tile (the barrier above).
        dequantize_tile(smem + Q_BYTES + (it % STAGES) * STAGE_BYTES,
                        smem + Q_BYTES + STAGES * STAGE_BYTES);
        __syncthreads();
#endif

        const int a = first_key + it * KT + ks * KW;  // the warp's first key of this tile
        const int b = a + KW - 1;
        // Warp-uniform: skip a slice no row sees; mask only slices that straddle an edge.
        if (warp_live && b >= wlo_min && a <= wp_max) {
            const bool full = a >= wlo_max && b <= wp_min;
            const uint32 stage = KV_Q8 ? stages0 + STAGES * STAGE_BYTES  // the fp16 tile
                                       : stages0 + (it % STAGES) * STAGE_BYTES;

            // S for this warp's KWS keys; k-step i accumulates into set i % S_SETS.
            float acc[S_SETS][NT][4];
#pragma unroll
            for (int set = 0; set < S_SETS; ++set)
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    acc[set][n][0] = acc[set][n][1] = acc[set][n][2] = acc[set][n][3] = 0.0f;
#pragma unroll
            for (int kstep = 0; kstep < S_KSTEPS; ++kstep) {
                const uint32 coff = 128 * (kstep / 4);
                float(&sk)[NT][4] = acc[kstep % S_SETS];
                uint32 qa[4];
                ldmatrix_x4(qa, q_lane + off_a[kstep % 4] + coff);
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    uint32 kb[4];
                    ldmatrix_x4(kb, stage + k_lane + np * 16 * ROW_BYTES + off_b[kstep % 4] + coff);
                    mma_kv(sk[2 * np], qa, kb);
                    mma_kv(sk[2 * np + 1], qa, kb + 2);
                }
                if (NT % 2) {  // 8 keys: lanes 0..15 address their two chunks
                    uint32 kb[2];
                    ldmatrix_x2(
                        kb, stage + k_lane + (NT - 1) * 8 * ROW_BYTES + off_b[kstep % 4] + coff);
                    mma_kv(sk[NT - 1], qa, kb);
                }
            }
            float(&s)[NT][4] = acc[0];
#pragma unroll
            for (int set = 1; set < S_SETS; ++set)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[n][e] += acc[set][n][e];
            if (SHARE_S) {  // add the group's partial scores, in the same order in every warp
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    s_parts[(ds * NT + n) * 32 + lane] =
                        make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
                group_sync(group);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    float4 sum = s_parts[n * 32 + lane];
#pragma unroll
                    for (int d = 1; d < DS; ++d) {
                        const float4 v = s_parts[(d * NT + n) * 32 + lane];
                        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
                    }
                    s[n][0] = sum.x, s[n][1] = sum.y, s[n][2] = sum.z, s[n][3] = sum.w;
                }
            }
            const int a_own = a + (SHARE_P ? ds * KWS : 0);  // first key of this warp's scores
            if (!full) {
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int j = a_own + 8 * n + 2 * tq + (e & 1), r = e >> 1;
                        if (j < lo_r[r] || j > pos_r[r]) s[n][e] = neg_inf();
                    }
            }
            // Row maxima of this warp's scores, then over the group's DS warps.
            float mx[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = neg_inf();
#pragma unroll
                for (int n = 0; n < NT; ++n)
                    mx[r] = fmaxf(mx[r], fmaxf(s[n][2 * r], s[n][2 * r + 1]));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(GJ_FULL_MASK, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(GJ_FULL_MASK, mx[r], 2));
            }
            if (SHARE_P) {
                if (tq == 0) red[ds * 16 + g] = mx[0], red[ds * 16 + g + 8] = mx[1];
                group_sync(group);
#pragma unroll
                for (int d = 0; d < DS; ++d)
                    mx[0] = fmaxf(mx[0], red[d * 16 + g]),
                    mx[1] = fmaxf(mx[1], red[d * 16 + g + 8]);
            }
            // Online softmax per row (the 4 lanes of a row hold 2 * NT scores each).
            float scale[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float m_new = fmaxf(m[r], mx[r]);
                // A row that has seen nothing yet keeps -inf: exponents relative to 0 then give
                // p = 0 for its masked scores instead of NaN from -inf - -inf.
                const float m_use = m_new == neg_inf() ? 0.0f : m_new;
                scale[r] = exp2_approx((m[r] - m_use) * LOG2E);
                m[r] = m_new;
                const float ml = m_use * LOG2E;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    s[n][2 * r] = exp2_approx(fmaf(s[n][2 * r], LOG2E, -ml));
                    s[n][2 * r + 1] = exp2_approx(fmaf(s[n][2 * r + 1], LOG2E, -ml));
                    sum += s[n][2 * r] + s[n][2 * r + 1];
                }
                l[r] = fmaf(l[r], scale[r], sum);
            }
            // Rescale O only when some row's maximum moved (mostly only on the first tiles).
            if (__any_sync(GJ_FULL_MASK, scale[0] != 1.0f || scale[1] != 1.0f)) {
#pragma unroll
                for (int n = 0; n < DSLICE / 8; ++n) {
                    o[n][0] *= scale[0], o[n][1] *= scale[0];
                    o[n][2] *= scale[1], o[n][3] *= scale[1];
                }
            }
            if (SHARE_P) {  // this warp's part of P into the group's buffer
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const int col = ds * KWS + 8 * n + 2 * tq;  // (col % 8) * 2 = 4 * tq bytes
#pragma unroll
                    for (int r = 0; r < 2; ++r)
                        *(uint32*)(p_rows + p_chunk_offset(g + 8 * r, col / 8) + 4 * tq) =
                            op_pack2(s[n][2 * r], s[n][2 * r + 1]);
                }
                group_sync(group);
            }
            // O += P V: unless P is shared, P's A fragments are the S accumulators of n-tiles 2kk,
            // 2kk + 1 (NT = KW / 8 then; the "% NT" only keeps the other form of this dead branch
            // in bounds); else they come from the shared P rows (like Q's: rows row_a at chunk
            // 2kk + lchunk_a).
#pragma unroll
            for (int kk = 0; kk < KW / 16; ++kk) {
                uint32 pa[4];
                if (!SHARE_P) {
                    pa[0] = op_pack2(s[2 * kk % NT][0], s[2 * kk % NT][1]);
                    pa[1] = op_pack2(s[2 * kk % NT][2], s[2 * kk % NT][3]);
                    pa[2] = op_pack2(s[(2 * kk + 1) % NT][0], s[(2 * kk + 1) % NT][1]);
                    pa[3] = op_pack2(s[(2 * kk + 1) % NT][2], s[(2 * kk + 1) % NT][3]);
                } else {
                    ldmatrix_x4(pa, smem_addr(p_rows + p_chunk_offset(row_a, 2 * kk + lchunk_a)));
                }
#pragma unroll
                for (int dp = 0; dp < DSLICE / 16; ++dp) {
                    uint32 vb[4];
                    ldmatrix_x4_trans(
                        vb, stage + v_lane + kk * 16 * ROW_BYTES + off_a[dp % 4] + 128 * (dp / 4));
                    mma_kv(o[2 * dp], pa, vb);
                    mma_kv(o[2 * dp + 1], pa, vb + 2);
                }
            }
        }
        __syncthreads();  // the stage is refilled by a later iteration's issue
    }
    cp_async_wait<0>();
    // A key split with no tiles (n_tiles is block-uniform) passed no barrier: order the Q
    // staging stores before the merge areas below reuse that memory.
    if (n_tiles == 0) __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(GJ_FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(GJ_FULL_MASK, l[r], 2);
    }
    // With shared P each warp summed its own keys' weights: add the group's partial sums
    // (through the row-maxima buffer, idle now; the barriers keep it clear of the merge below).
    if (SHARE_P) {
        if (tq == 0) red[ds * 16 + g] = l[0], red[ds * 16 + g + 8] = l[1];
        __syncthreads();
        l[0] = l[1] = 0.0f;
#pragma unroll
        for (int d = 0; d < DS; ++d) l[0] += red[d * 16 + g], l[1] += red[d * 16 + g + 8];
        __syncthreads();
    }

    // Merge the KS key sets of each row through the idle pipeline memory: sets 1.. store, set 0
    // folds them in (and alone carries on).
    if (KS > 1) {
        float* mo = (float*)smem;                       // [KS - 1][BLOCK_ROWS][HEAD_DIM]
        float2* mml = (float2*)(smem + MERGE_O_BYTES);  // [KS - 1][BLOCK_ROWS]
        if (ks > 0) {
            float* mine = mo + (size_t)(ks - 1) * BLOCK_ROWS * HEAD_DIM;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int br = wm * 16 + g + 8 * r;
#pragma unroll
                for (int n = 0; n < DSLICE / 8; ++n)
                    *(float2*)(mine + br * HEAD_DIM + ds * DSLICE + 8 * n + 2 * tq) =
                        make_float2(o[n][2 * r], o[n][2 * r + 1]);
                if (ds == 0 && tq == 0) mml[(ks - 1) * BLOCK_ROWS + br] = make_float2(m[r], l[r]);
            }
        }
        __syncthreads();
        if (ks == 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int br = wm * 16 + g + 8 * r;
                float mx = m[r];
#pragma unroll
                for (int k = 1; k < KS; ++k) mx = fmaxf(mx, mml[(k - 1) * BLOCK_ROWS + br].x);
                const float m_use = mx == neg_inf() ? 0.0f : mx;
                const float f = exp2_approx((m[r] - m_use) * LOG2E);
                l[r] *= f;
#pragma unroll
                for (int n = 0; n < DSLICE / 8; ++n) o[n][2 * r] *= f, o[n][2 * r + 1] *= f;
#pragma unroll
                for (int k = 1; k < KS; ++k) {
                    const float2 ml = mml[(k - 1) * BLOCK_ROWS + br];
                    const float fk = exp2_approx((ml.x - m_use) * LOG2E);
                    l[r] = fmaf(fk, ml.y, l[r]);
                    const float* theirs = mo + ((size_t)(k - 1) * BLOCK_ROWS + br) * HEAD_DIM;
#pragma unroll
                    for (int n = 0; n < DSLICE / 8; ++n) {
                        const float2 v = *(const float2*)(theirs + ds * DSLICE + 8 * n + 2 * tq);
                        o[n][2 * r] = fmaf(fk, v.x, o[n][2 * r]);
                        o[n][2 * r + 1] = fmaf(fk, v.y, o[n][2 * r + 1]);
                    }
                }
                m[r] = mx;
            }
        }
    }

#if CLUSTER == 1
    // Normalize and write the live rows of the slice.
    if (ks > 0) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = rows_ab[r];
        if (row >= total_rows) continue;
        const int t = row / GROUP, gh = row % GROUP;
        const size_t at = ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP + gh) * HEAD_DIM +
                          ds * DSLICE + 2 * tq;  // even: f16 pairs are whole words
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int n = 0; n < DSLICE / 8; ++n) {
            const float2 v = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
            *(float2*)(out + at + 8 * n) = v;
            if (out_h) out_h[(at + 8 * n) / 2] = pack_f16x2(v.x, v.y);
        }
    }
#else
    // Combine the key splits: every block leaves its unnormalized O and (m, l) in its own shared
    // memory; block `split` then finishes rows [split, split + 1) * BLOCK_ROWS / SPLITS reading
    // all SPLITS partials through the cluster. Columns are XOR-swizzled by the row (bits 3..4)
    // so the fragment stores of a half warp (4 rows x 8 floats) hit 32 distinct banks.
    float* po = (float*)smem;                                      // [BLOCK_ROWS][HEAD_DIM]
    float2* pml = (float2*)(smem + SPLIT_O_BYTES);                 // [BLOCK_ROWS]
    float* wts = (float*)(smem + SPLIT_O_BYTES + BLOCK_ROWS * 8);  // [BLOCK_ROWS / SPLITS][SPLITS]
    __syncthreads();  // the key-set merge has read the memory these stores reuse
    if (ks == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int br = wm * 16 + g + 8 * r;
#pragma unroll
            for (int n = 0; n < DSLICE / 8; ++n)
                *(float2*)(po + br * HEAD_DIM +
                           ((ds * DSLICE + 8 * n + 2 * tq) ^ ((br & 3) << 3))) =
                    make_float2(o[n][2 * r], o[n][2 * r + 1]);
            if (ds == 0 && tq == 0) pml[br] = make_float2(m[r], l[r]);
        }
    }
    cluster_sync();
    constexpr int kRows = BLOCK_ROWS / SPLITS;
    const int br0 = split * kRows;
    // Per row: weight of split s = e_s / sum_s e_s l_s with e_s = exp(m_s - max m). A split that
    // saw none of the row's keys has m = -inf, l = 0: weight 0.
    for (int i = threadIdx.x; i < kRows; i += THREADS) {
        float ms[SPLITS], ls[SPLITS];
        float mx = neg_inf();
#pragma unroll
        for (int sp = 0; sp < SPLITS; ++sp) {
            const float2 ml = ld_cluster_f2(cluster_map(smem_addr(pml + br0 + i), sp));
            ms[sp] = ml.x, ls[sp] = ml.y;
            mx = fmaxf(mx, ml.x);
        }
        const float m_use = mx == neg_inf() ? 0.0f : mx;
        float sum = 0.0f;
#pragma unroll
        for (int sp = 0; sp < SPLITS; ++sp) {
            ms[sp] = exp2_approx((ms[sp] - m_use) * LOG2E);
            sum = fmaf(ms[sp], ls[sp], sum);
        }
        const float inv = 1.0f / sum;
#pragma unroll
        for (int sp = 0; sp < SPLITS; ++sp) wts[i * SPLITS + sp] = ms[sp] * inv;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * (HEAD_DIM / 4); i += THREADS) {
        const int r = i / (HEAD_DIM / 4), c = 4 * (i % (HEAD_DIM / 4));
        const int br = br0 + r, row = row0 + br;
        if (row >= total_rows) continue;
        const uint32 src = smem_addr(po + br * HEAD_DIM + (c ^ ((br & 3) << 3)));
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int sp = 0; sp < SPLITS; ++sp) {
            const float w = wts[r * SPLITS + sp];
            const float4 v = ld_cluster_f4(cluster_map(src, sp));
            acc.x = fmaf(w, v.x, acc.x), acc.y = fmaf(w, v.y, acc.y);
            acc.z = fmaf(w, v.z, acc.z), acc.w = fmaf(w, v.w, acc.w);
        }
        const int t = row / GROUP, gh = row % GROUP;
        const size_t at = ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP + gh) * HEAD_DIM + c;
        *(float4*)(out + at) = acc;
        if (out_h)
            *(uint2*)(out_h + at / 2) =
                make_uint2(pack_f16x2(acc.x, acc.y), pack_f16x2(acc.z, acc.w));
    }
    cluster_sync();  // every block's partial stays in place until the others have read it
#endif
}
