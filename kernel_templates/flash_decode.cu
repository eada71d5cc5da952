// flash_decode + flash_combine: split-K attention of T query tokens (each at its own position)
// over a layer's KV cache, for decode (T = 1) and batched prefill alike.
//
// For query head i of token t at position p, with KV head i / GROUP:
//   visible keys j in [lo, p], lo = WINDOW ? max(0, p - WINDOW + 1) : 0 (ring slot j % slots)
//   out = sum_j softmax_j(q . k_j) v_j        (scale 1.0: Gemma 4 normalizes q and k instead)
// flash_decode: one block per (split, KV head, token) streams the split's K/V rows once for the
//   whole GQA group through shared memory (cp.async, STAGES deep) and keeps an fp32 online
//   softmax per query; it writes unnormalized partial outputs and their (max, sum).
// flash_combine: merges the splits of each (token, head) into the output.
//
// Split sizing: a query seeing n keys uses splits of
//   len = max(CHUNK, round_up(ceil(n / max_splits), TILE))
// positions, split s covering [lo + s * len, lo + (s + 1) * len) ∩ [lo, p]. So the grid is fixed
// (max_splits, sized by the caller for the device and the deepest context) and every depth works:
// shallow queries leave trailing splits empty, deep ones make each split longer. An empty split
// writes (m, l) = (-inf, 0) and no partial output; flash_combine skips it.
//
// Warps form QSETS query sets of QW queries times KSETS key sets; each warp keeps its own online
// softmax over its rows of every tile, and the KSETS warps of a query set merge at the end.
// Two ways to do the arithmetic (MMA):
//   MMA = 1 (GEMMAJIT_FLASH_MMA=1, opt-in): tensor cores. A warp takes 16 rows of a tile: S = Q K^T
//   with
//     mma.m16n8k16 (the group's queries are the M rows, in fp16/bf16 like the cache; K rows come
//     straight from shared memory through ldmatrix), fp32 softmax on the accumulators, then
//     O^T += V^T P^T (V through ldmatrix.trans, P rounded to the cache type). Rows are stored
//     with their 16-byte chunks XOR-swizzled by row so the ldmatrix reads are conflict-free.
//     QW = 8 (the mma N), KB = 16 rows per warp. Needs HEAD_DIM % 64 == 0.
//     Measured on the H200 at E4B decode shapes it is slower than the fp32 path (one 2-warp block
//     per SM: too little parallelism to hide the mma and copy-issue latency), so not the default.
//   MMA = 0 (default): CUDA cores in fp32, the exact path. Every warp reads whole
//     rows, 32 lanes across the head dim (DPL = HEAD_DIM / 32 dims each), KB rows per step:
//     QW x KB partial dot products are reduced with one butterfly reduce-scatter (VALS - 1
//     shuffles for VALS = QW * KB values, one full score per lane), then each score is broadcast
//     back for P.V.
//
// Constants (prologue #defines):
//   HEAD_DIM   32, 64, 128 or k * 256    GROUP   query heads per KV head (any value >= 1)
//   N_KV_HEADS                           WINDOW  sliding window (0 = global causal)
//   KV_TYPE    cache element type (attn_kv.cuh). q8_0 (fp32 path only): a stage holds the tile's
//              int8 payload rows and their fp16 scales (both by cp.async); rows are dequantized
//              to fp32 as they are read from shared memory, so the arithmetic is that of an fp32
//              cache holding the dequantized values.
//   MMA        1: tensor cores, 0: fp32 CUDA cores
//   CHUNK      minimum positions per split (a multiple of TILE)
//   TILE       cache rows per pipeline stage       STAGES  pipeline depth (>= 2)
//   THREADS    block size, 32 * QSETS * KSETS      QW      queries per warp (power of two)
//   KB         rows per warp step (power of two; MMA = 0: QW * KB <= 32)
//   SMEM       dynamic shared memory bytes (checked against what the template needs)
//   COMBINE_THREADS  flash_combine block size (a multiple of 128)
// Launch flash_decode:  grid (max_splits, N_KV_HEADS, max_T), block THREADS, SMEM dynamic bytes
//                       (opt in above 48 KiB: ModuleSet::set_max_dynamic_smem).
// Launch flash_combine: grid (GROUP * N_KV_HEADS * HEAD_DIM / 32, max_T), block COMBINE_THREADS.
// Blocks with blockIdx.z (decode) / blockIdx.y (combine) >= T exit.
// Entries:
//   flash_decode(q [T][H][HEAD_DIM], kv, seqs [T], positions [T], T, slots, max_splits,
//                part_o [T][H][max_splits][HEAD_DIM], part_ml [T][H][max_splits] {m, l})
//   kv: the layer's cache planes of every sequence, [n_seqs][2] addresses (K, V); query t reads
//   the planes of sequence seqs[t] (seqs null: sequence 0), so one launch serves queries of
//   several sequences (batched decode of a server's slots) at their own positions.
//   flash_combine(part_o, part_ml, out [T][H][HEAD_DIM], outq, outds, T, max_splits)
//   outq / outds (both or neither may be null): the output's Q8_1 form as well, int8 [T][H *
//   HEAD_DIM] and float2 {d, d * sum} per 32 values (bit-identical to quantize_q8_1 over out),
//   the int8 input of the attention output projection (no quantize pass of its own).
// The caller keeps slots >= WINDOW + T - 1 on ring layers and slots > every position on global
// layers, so every visible key is still in the cache.
#include "attn_kv.cuh"
#include "gj_ptx.cuh"

#ifndef MMA
#define MMA 0
#endif

static_assert(HEAD_DIM == 32 || HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM % 256 == 0,
              "flash_decode: HEAD_DIM must be 32, 64, 128 or a multiple of 256 (lane layout)");
static_assert(GROUP >= 1 && N_KV_HEADS >= 1, "flash_decode: bad head counts");
static_assert(WINDOW >= 0, "flash_decode: WINDOW must be >= 0");
static_assert((QW & (QW - 1)) == 0 && (KB & (KB - 1)) == 0, "flash_decode: QW, KB powers of two");
static_assert(STAGES >= 2, "flash_decode: STAGES must be >= 2");
static_assert(CHUNK % TILE == 0, "flash_decode: CHUNK must be a multiple of TILE");
static_assert(!MMA || (QW == 8 && KB == 16 && HEAD_DIM % 64 == 0),
              "flash_decode: the tensor-core path needs QW 8, KB 16, HEAD_DIM % 64 == 0");
static_assert(MMA || QW * KB <= 32, "flash_decode: QW * KB must be <= 32 (one score per lane)");
static_assert(!(MMA && KV_Q8), "flash_decode: the tensor-core path does not read a q8_0 cache");

#define N_HEADS_TOTAL (GROUP * N_KV_HEADS)
#define QSETS ((GROUP + QW - 1) / QW)  // warp sets splitting the group's queries
#define NWARPS (THREADS / 32)
#define KSETS (NWARPS / QSETS)              // warps of a query set splitting the rows
#define ROW_BYTES KV_ROW_BYTES              // a cache row's elements (q8_0: payload)
#define SCALE_ROW_BYTES KV_SCALE_ROW_BYTES  // a cache row's scales (0 without)
// A stage: TILE K rows then their scales, then TILE V rows and their scales (16-byte aligned
// pieces: TILE >= 16).
#define PLANE_TILE_BYTES (TILE * (ROW_BYTES + SCALE_ROW_BYTES))
#define STAGE_BYTES (2 * PLANE_TILE_BYTES)
#define MERGE_BYTES (NWARPS * QW * (HEAD_DIM + 2) * 4)
// The tensor-core path keeps the queries in shared memory too (after the stages), as A operands.
#define Q_BYTES (MMA ? QSETS * QW * ROW_BYTES : 0)
#define PIPE_BYTES (STAGES * STAGE_BYTES + Q_BYTES)
#define SMEM_NEED (PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES)
#define LOG2E 1.4426950408889634f

static_assert(NWARPS == QSETS * KSETS, "flash_decode: THREADS must be 32 * QSETS * KSETS");
static_assert(TILE % (KSETS * KB) == 0, "flash_decode: TILE must be a multiple of KSETS * KB");
static_assert(SMEM == SMEM_NEED, "flash_decode: SMEM differs from what the template needs");
static_assert(COMBINE_THREADS % 128 == 0, "flash_combine: COMBINE_THREADS multiple of 128");

// Keys per split for a query that sees n keys (see the header).
GJ_DEVICE int split_len(int n, int max_splits) {
    int len = (n + max_splits - 1) / max_splits;
    len = (len + TILE - 1) / TILE * TILE;
    return len > CHUNK ? len : CHUNK;
}

// Byte offset of 16-byte chunk c of row r in a stage's K or V rows. The tensor-core path reads
// 8 rows at one chunk column per ldmatrix; XOR-ing the chunk with the row's low bits puts them in
// 8 different bank groups.
GJ_DEVICE int chunk_offset(int r, int c) {
#if MMA
    return r * ROW_BYTES + ((c ^ (r & 7)) << 4);
#else
    return r * ROW_BYTES + (c << 4);
#endif
}

#if KV_Q8
// The scales of the tile's rows (see issue_tile) after the stage's K and V payload rows.
GJ_DEVICE void issue_tile_scales(uint8* stage, const uint8* k_scales, const uint8* v_scales,
                                 int first, int count, int slots, int kvh) {
    constexpr int kGrainsPerRow = SCALE_ROW_BYTES / KV_SCALE_GRAIN;
    constexpr int kGrains = TILE * kGrainsPerRow;
#pragma unroll
    for (int k = 0; k < (kGrains + THREADS - 1) / THREADS; ++k) {
        const int i = k * THREADS + threadIdx.x;
        const int r = i / kGrainsPerRow, c = i % kGrainsPerRow;
        if (kGrains % THREADS == 0 || i < kGrains) {
            const bool live = r < count;
            const int slot = live ? (first + r) % slots : 0;
            const size_t off =
                ((size_t)slot * N_KV_HEADS + kvh) * SCALE_ROW_BYTES + c * KV_SCALE_GRAIN;
            const int dst = TILE * ROW_BYTES + r * SCALE_ROW_BYTES + c * KV_SCALE_GRAIN;
            kv_copy_scale_or_zero(stage + dst, k_scales + off, live);
            kv_copy_scale_or_zero(stage + PLANE_TILE_BYTES + dst, v_scales + off, live);
        }
    }
}
#endif

// cp.async of the TILE cache rows of K and V for positions first .. first + count - 1 (ring
// slots) into a stage buffer; rows past `count` become zeros (q8_0: payload and scales).
GJ_DEVICE void issue_tile(uint8* stage, const uint8* k_cache, const uint8* v_cache, int first,
                          int count, int slots, int kvh) {
    constexpr int kChunksPerRow = ROW_BYTES / 16;
    constexpr int kChunks = TILE * kChunksPerRow;
#pragma unroll
    for (int k = 0; k < (kChunks + THREADS - 1) / THREADS; ++k) {
        const int i = k * THREADS + threadIdx.x;
        const int r = i / kChunksPerRow, c = i % kChunksPerRow;
        if (kChunks % THREADS == 0 || i < kChunks) {
            const bool live = r < count;
            const int slot = live ? (first + r) % slots : 0;
            const size_t off = ((size_t)slot * N_KV_HEADS + kvh) * ROW_BYTES + c * 16;
            const int dst = chunk_offset(r, c);
            cp_async16_or_zero(smem_addr(stage + dst), k_cache + off, live);
            cp_async16_or_zero(smem_addr(stage + PLANE_TILE_BYTES + dst), v_cache + off, live);
        }
    }
#if KV_Q8
    issue_tile_scales(stage, kv_scale_plane(k_cache, slots), kv_scale_plane(v_cache, slots), first,
                      count, slots, kvh);
#endif
}

// Streams the split's rows [start, end) through the STAGES-deep pipeline, calling
// compute(k_rows, v_rows, rows) for each tile once every thread's copies have landed.
template <class Compute>
GJ_DEVICE void stream_tiles(uint8* smem, const uint8* kc, const uint8* vc, int start, int end,
                            int slots, int kvh, Compute&& compute) {
    const int n_tiles = (end - start + TILE - 1) / TILE;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles)
            issue_tile(smem + s * STAGE_BYTES, kc, vc, start + s * TILE,
                       min(TILE, end - start - s * TILE), slots, kvh);
        cp_async_commit();  // possibly empty: keeps the group count uniform for the wait below
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int nt = it + STAGES - 1;
        if (nt < n_tiles)
            issue_tile(smem + (nt % STAGES) * STAGE_BYTES, kc, vc, start + nt * TILE,
                       min(TILE, end - start - nt * TILE), slots, kvh);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();  // tile `it` has landed (for this thread's copies)
        __syncthreads();              // ... and for everyone's
        const uint8* k_rows = smem + (it % STAGES) * STAGE_BYTES;
        compute(k_rows, k_rows + PLANE_TILE_BYTES, min(TILE, end - start - it * TILE));
        __syncthreads();  // the stage is refilled by a later iteration's issue
    }
}

// ---------------------------------------------------------------------------------------------
#if !MMA
// fp32 CUDA-core path.
#define DPL (HEAD_DIM / 32)  // dims per lane
#define VALS (QW * KB)       // scores per warp step
#define STEPS (TILE / (KSETS * KB))
#define LOG2_VALS \
    (VALS >= 32 ? 5 : VALS >= 16 ? 4 : VALS >= 8 ? 3 : VALS >= 4 ? 2 : VALS >= 2 ? 1 : 0)

// Dimension of the i-th value a lane holds. Lanes take 8 consecutive dims (16 bytes of a cache
// row) per 256-dim stripe, so a warp's 16-byte shared-memory reads are conflict-free; narrow
// heads (DPL < 8) give each lane DPL consecutive dims.
GJ_DEVICE int lane_dim(int lane, int i) {
    return DPL >= 8 ? (i / 8) * 256 + 8 * lane + i % 8 : DPL * lane + i;
}

// The lane's DPL dims of an fp32 row (a query) into registers, and back (a partial output), with
// the widest accesses the layout allows.
GJ_DEVICE void load_lane_f32(const float* row, int lane, float (&out)[DPL]) {
#if DPL >= 4
#pragma unroll
    for (int c = 0; c < DPL / 4; ++c) {
        const float4 v = *(const float4*)(row + lane_dim(lane, 4 * c));
        out[4 * c] = v.x, out[4 * c + 1] = v.y, out[4 * c + 2] = v.z, out[4 * c + 3] = v.w;
    }
#elif DPL == 2
    const float2 v = *(const float2*)(row + 2 * lane);
    out[0] = v.x, out[1] = v.y;
#else
    out[0] = row[lane];
#endif
}

GJ_DEVICE void store_lane_f32(float* row, int lane, const float (&v)[DPL]) {
#if DPL >= 4
#pragma unroll
    for (int c = 0; c < DPL / 4; ++c)
        *(float4*)(row + lane_dim(lane, 4 * c)) =
            make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
#elif DPL == 2
    *(float2*)(row + 2 * lane) = make_float2(v[0], v[1]);
#else
    row[lane] = v[0];
#endif
}

// The lane's DPL elements of row r of a stage's K or V rows, as floats (q8_0: dequantized with
// the row's scales, which follow the TILE payload rows).
GJ_DEVICE void load_row(const uint8* rows, int r, int lane, float (&out)[DPL]) {
    const uint8* row = rows + r * ROW_BYTES;
#if KV_Q8
    // The lane's dims never straddle a 32-block: 8 per 256-dim stripe (block 8c + lane / 4), or
    // DPL <= 4 consecutive ones (block DPL * lane / 32).
    const f16_bits* scales = (const f16_bits*)(rows + TILE * ROW_BYTES + r * SCALE_ROW_BYTES);
#if DPL >= 8
#pragma unroll
    for (int c = 0; c < DPL / 8; ++c) {
        const uint2 w = *(const uint2*)(row + c * 256 + 8 * lane);
        const float d = f16_to_f32(scales[8 * c + lane / 4]);
        q8_dequant4(w.x, d, &out[8 * c]);
        q8_dequant4(w.y, d, &out[8 * c + 4]);
    }
#elif DPL == 4
    q8_dequant4(*(const uint32*)(row + 4 * lane), f16_to_f32(scales[lane / 8]), out);
#elif DPL == 2
    const uint32 w = *(const uint16*)(row + 2 * lane);
    const float d = f16_to_f32(scales[lane / 16]);
    out[0] = q8_byte(w, 0) * d, out[1] = q8_byte(w, 1) * d;
#else
    out[0] = (float)(int8)row[lane] * f16_to_f32(scales[0]);
#endif
#elif DPL >= 8
#pragma unroll
    for (int c = 0; c < DPL / 8; ++c) {
        const uint4 w = *(const uint4*)(row + (c * 256 + 8 * lane) * 2);
        const float2 a = kv_unpack2(w.x), b = kv_unpack2(w.y), d = kv_unpack2(w.z),
                     e = kv_unpack2(w.w);
        out[8 * c + 0] = a.x, out[8 * c + 1] = a.y, out[8 * c + 2] = b.x, out[8 * c + 3] = b.y;
        out[8 * c + 4] = d.x, out[8 * c + 5] = d.y, out[8 * c + 6] = e.x, out[8 * c + 7] = e.y;
    }
#elif DPL == 4
    const uint2 w = *(const uint2*)(row + 8 * lane);
    const float2 a = kv_unpack2(w.x), b = kv_unpack2(w.y);
    out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
#elif DPL == 2
    const float2 a = kv_unpack2(*(const uint32*)(row + 4 * lane));
    out[0] = a.x, out[1] = a.y;
#else
    out[0] = kv_to_f32(*(const uint16*)(row + 2 * lane));
#endif
}

// Butterfly reduce-scatter over the warp: v[] holds VALS partial sums per lane; afterwards v[0]
// on lane l is the warp-wide sum of value l >> (5 - log2(VALS)). Each level keeps the half the
// lane's bit selects and adds the partner's copy of it: VALS - 1 shuffles, then plain
// butterflies for the lanes that still share a value. Templated on the level so that every index
// is a compile-time constant (v stays in registers).
template <int kOff, int kHeld>
GJ_DEVICE void reduce_scatter_level(float (&v)[VALS], int lane) {
    if constexpr (kOff > 0) {
        if constexpr (kHeld > 1) {
            const bool upper = (lane & kOff) != 0;
#pragma unroll
            for (int i = 0; i < kHeld / 2; ++i) {
                const float a = v[i], b = v[kHeld / 2 + i];
                const float keep = upper ? b : a;
                const float send = upper ? a : b;
                v[i] = keep + __shfl_xor_sync(GJ_FULL_MASK, send, kOff);
            }
            reduce_scatter_level<kOff / 2, kHeld / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(GJ_FULL_MASK, v[0], kOff);
            reduce_scatter_level<kOff / 2, 1>(v, lane);
        }
    }
}

GJ_DEVICE float reduce_scatter(float (&v)[VALS], int lane) {
    reduce_scatter_level<16, VALS>(v, lane);
    return v[0];
}

GJ_DEVICE void attend_split(uint8* smem, const float* __restrict__ q, const uint8* kc,
                            const uint8* vc, int t, int kvh, int start, int end, int slots,
                            int max_splits, size_t part0, float* __restrict__ part_o,
                            float2* __restrict__ part_ml) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int qset = warp / KSETS, kset = warp % KSETS;
    constexpr int kShift = 5 - LOG2_VALS;  // lane l holds score l >> kShift
    const int my_val = lane >> kShift, my_q = my_val / KB, my_k = my_val % KB;

    // This warp's queries (padding queries past GROUP are zero and never written).
    float qr[QW][DPL];
#pragma unroll
    for (int qi = 0; qi < QW; ++qi) {
        const int g = qset * QW + qi;
        if (GROUP % QW == 0 || g < GROUP) {
            load_lane_f32(q + ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP + g) * HEAD_DIM,
                          lane, qr[qi]);
        } else {
#pragma unroll
            for (int i = 0; i < DPL; ++i) qr[qi][i] = 0.0f;
        }
    }

    float m[QW], l[QW], o[QW][DPL];
#pragma unroll
    for (int qi = 0; qi < QW; ++qi) {
        m[qi] = neg_inf();
        l[qi] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[qi][i] = 0.0f;
    }

    auto compute_tile = [&](const uint8* k_rows, const uint8* v_rows, int tile_rows) {
#pragma unroll 1
        for (int step = 0; step < STEPS; ++step) {
            const int row0 = (step * KSETS + kset) * KB;
            const int valid = tile_rows - row0;  // warp-uniform
            if (valid <= 0) break;

            // Scores: QW x KB partial dots per lane, reduced to one score per lane.
            float part[VALS];
#pragma unroll
            for (int k = 0; k < KB; ++k) {
                float kf[DPL];
                load_row(k_rows, row0 + k, lane, kf);
#pragma unroll
                for (int qi = 0; qi < QW; ++qi) {
                    float acc = 0.0f;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) acc = fmaf(qr[qi][i], kf[i], acc);
                    part[qi * KB + k] = acc;
                }
            }
            float s = reduce_scatter(part, lane);
            if (my_k >= valid) s = neg_inf();  // rows past the tile's live part

            // Running max per query: reduce over the lanes holding that query's scores, then
            // give every lane every query's new max.
            float mx = s;
#pragma unroll
            for (int off = 1 << kShift; off < (KB << kShift); off <<= 1)
                mx = fmaxf(mx, __shfl_xor_sync(GJ_FULL_MASK, mx, off));
            float m_new[QW];
            bool grew = false;
#pragma unroll
            for (int qi = 0; qi < QW; ++qi) {
                m_new[qi] = fmaxf(m[qi], __shfl_sync(GJ_FULL_MASK, mx, (qi * KB) << kShift));
                grew |= m_new[qi] > m[qi];
            }
            float my_m = m_new[0];
#pragma unroll
            for (int qi = 1; qi < QW; ++qi)
                if (my_q == qi) my_m = m_new[qi];
            const float p = my_k < valid ? exp2_approx((s - my_m) * LOG2E) : 0.0f;

            // Rescale what was accumulated under the old max (warp-uniform: m is replicated).
            if (grew) {
#pragma unroll
                for (int qi = 0; qi < QW; ++qi) {
                    const float alpha = exp2_approx((m[qi] - m_new[qi]) * LOG2E);  // 0 from -inf
                    l[qi] *= alpha;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) o[qi][i] *= alpha;
                    m[qi] = m_new[qi];
                }
            }

            // P.V over the step's live rows.
#pragma unroll
            for (int k = 0; k < KB; ++k) {
                if (k >= valid) break;
                float vf[DPL];
                load_row(v_rows, row0 + k, lane, vf);
#pragma unroll
                for (int qi = 0; qi < QW; ++qi) {
                    const float pk = __shfl_sync(GJ_FULL_MASK, p, (qi * KB + k) << kShift);
                    l[qi] += pk;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) o[qi][i] = fmaf(pk, vf[i], o[qi][i]);
                }
            }
        }
    };
    stream_tiles(smem, kc, vc, start, end, slots, kvh, compute_tile);

    // Merge the KSETS warps of each query set (through the now idle stage buffers), then write.
    if (KSETS > 1) {
        float* mo = (float*)smem;                                    // [NWARPS][QW][HEAD_DIM]
        float2* mml = (float2*)(smem + NWARPS * QW * HEAD_DIM * 4);  // [NWARPS][QW]
#pragma unroll
        for (int qi = 0; qi < QW; ++qi) {
            store_lane_f32(mo + (warp * QW + qi) * HEAD_DIM, lane, o[qi]);
            if (lane == 0) mml[warp * QW + qi] = make_float2(m[qi], l[qi]);
        }
        __syncthreads();
        if (kset != 0) return;
#pragma unroll
        for (int qi = 0; qi < QW; ++qi) {
            float mm = neg_inf();
#pragma unroll
            for (int ks = 0; ks < KSETS; ++ks) mm = fmaxf(mm, mml[(warp + ks) * QW + qi].x);
            l[qi] = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) o[qi][i] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSETS; ++ks) {
                const float2 ml = mml[(warp + ks) * QW + qi];
                const float a = exp2_approx((ml.x - mm) * LOG2E);  // 0 for a warp with no rows
                l[qi] = fmaf(a, ml.y, l[qi]);
                float other[DPL];
                load_lane_f32(mo + ((warp + ks) * QW + qi) * HEAD_DIM, lane, other);
#pragma unroll
                for (int i = 0; i < DPL; ++i) o[qi][i] = fmaf(a, other[i], o[qi][i]);
            }
            m[qi] = mm;
        }
    }

#pragma unroll
    for (int qi = 0; qi < QW; ++qi) {
        const int g = qset * QW + qi;
        if (GROUP % QW != 0 && g >= GROUP) break;
        const size_t idx = part0 + (size_t)g * max_splits;
        store_lane_f32(part_o + idx * HEAD_DIM, lane, o[qi]);
        if (lane == 0) part_ml[idx] = make_float2(m[qi], l[qi]);
    }
}

#endif  // !MMA

// ---------------------------------------------------------------------------------------------
#if MMA
// Tensor-core path. Fragment names follow gj_ptx.cuh: lane = 4 g + tq.
#define KSTEPS (HEAD_DIM / 16)  // 16-dim k-steps of Q K^T, and 16-dim m-tiles of O^T

// d += a * b on one m16n8k16 tile with operands of the cache's type and fp32 accumulators.
GJ_DEVICE void mma_kv(float d[4], const uint32 a[4], const uint32 b[2]) {
#if KV_TYPE == 0
    mma_f16_16x8x16(d, a, b, d);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(d[0]), "f"(d[1]),
          "f"(d[2]), "f"(d[3]));
#endif
}

GJ_DEVICE void attend_split(uint8* smem, const float* __restrict__ q, const uint8* kc,
                            const uint8* vc, int t, int kvh, int start, int end, int slots,
                            int max_splits, size_t part0, float* __restrict__ part_o,
                            float2* __restrict__ part_ml) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int qset = warp / KSETS, kset = warp % KSETS;
    const int g = lane >> 2, tq = lane & 3;

    // The group's queries, rounded to the cache type, go to shared memory as rows like the
    // cache's (QSETS * 8 rows, padding queries zero, chunks swizzled): the A operand of
    // S = Q K^T (M rows 0..7 by ldmatrix; rows 8..15 are zero registers). Registers stay for O.
    {
        uint8* q_rows = smem + STAGES * STAGE_BYTES;
        constexpr int kChunksPerRow = ROW_BYTES / 16;
        for (int i = threadIdx.x; i < QSETS * QW * kChunksPerRow; i += THREADS) {
            const int r = i / kChunksPerRow, c = i % kChunksPerRow;
            uint4 w = make_uint4(0u, 0u, 0u, 0u);
            if (GROUP % QW == 0 || r < GROUP) {
                const float* src =
                    q + ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP + r) * HEAD_DIM + 8 * c;
                const float4 x = ((const float4*)src)[0], y = ((const float4*)src)[1];
                w = make_uint4(kv_pack2(x.x, x.y), kv_pack2(x.z, x.w), kv_pack2(y.x, y.y),
                               kv_pack2(y.z, y.w));
            }
            *(uint4*)(q_rows + chunk_offset(r, c)) = w;
        }
        // Visible to every warp after stream_tiles' first barrier, before the first compute.
    }

    // O^T accumulators: o[mt] = {O[2tq][16mt + g], O[2tq + 1][16mt + g], O[2tq][16mt + 8 + g],
    // O[2tq + 1][16mt + 8 + g]}. m and l belong to query g (l is this lane's share of the sum).
    float o[KSTEPS][4];
#pragma unroll
    for (int mt = 0; mt < KSTEPS; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    float m = neg_inf(), l = 0.0f;

    // ldmatrix row addresses: lanes 8i .. 8i + 7 give the rows of matrix i; matrices 0/1 are
    // rows 0..7 at chunks 2s / 2s + 1, matrices 2/3 rows 8..15 at the same chunks.
    // The swizzled offset of chunk 2s + lchunk of a row is row * ROW_BYTES + 128 * (s / 4) +
    // 16 * ((2 * (s % 4) + lchunk) ^ (row & 7)): four per-lane values plus an immediate, so no
    // per-step address registers stay live across the loops.
    const int lrow = kset * KB + (lane >> 4) * 8 + (lane & 7), lchunk = (lane >> 3) & 1;
    // ldmatrix.x2 of this query set's rows: lanes 0..7 at chunk 2s, lanes 8..15 at 2s + 1.
    const int lqrow = qset * QW + (lane & 7);
    uint32 kv_off[4], q_off[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        kv_off[j] = chunk_offset(lrow, 2 * j + lchunk);
        q_off[j] = chunk_offset(lqrow, 2 * j + lchunk);
    }
    const uint32 smem0 = smem_addr(smem);
    const uint32 q_base = smem0 + STAGES * STAGE_BYTES;

    auto compute_tile = [&](const uint8* k_rows, const uint8* v_rows, int tile_rows) {
        const int valid = tile_rows - kset * KB;  // live rows of this warp's 16 (warp-uniform)
        if (valid <= 0) return;
        const uint32 k_base = smem0 + (uint32)(k_rows - smem);
        const uint32 v_base = smem0 + (uint32)(v_rows - smem);

        // S = Q K^T for 16 rows: n-tile 0 = rows 0..7, n-tile 1 = rows 8..15.
        float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            uint32 b[4], qa[2];
            ldmatrix_x4(b, k_base + kv_off[ks % 4] + 128 * (ks / 4));
            ldmatrix_x2(qa, q_base + q_off[ks % 4] + 128 * (ks / 4));
            const uint32 a[4] = {qa[0], 0u, qa[1], 0u};
            mma_kv(s0, a, b);
            mma_kv(s1, a, b + 2);
        }
        // Lane's scores for query g: rows 2tq, 2tq + 1, 8 + 2tq, 9 + 2tq.
        float sc[4] = {s0[0], s0[1], s1[0], s1[1]};
        const int rows[4] = {2 * tq, 2 * tq + 1, 8 + 2 * tq, 9 + 2 * tq};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (rows[i] >= valid) sc[i] = neg_inf();

        float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
        mx = fmaxf(mx, __shfl_xor_sync(GJ_FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(GJ_FULL_MASK, mx, 2));
        const float m_new = fmaxf(m, mx);                      // finite: row 0 is live
        const float alpha = exp2_approx((m - m_new) * LOG2E);  // 0 from -inf
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = exp2_approx((sc[i] - m_new) * LOG2E);  // 0 masked
        l = l * alpha + (p[0] + p[1]) + (p[2] + p[3]);
        m = m_new;

        // The accumulators hold queries 2tq and 2tq + 1: their lanes' factors.
        const float a_lo = __shfl_sync(GJ_FULL_MASK, alpha, 8 * tq);
        const float a_hi = __shfl_sync(GJ_FULL_MASK, alpha, 8 * tq + 4);
        if (__any_sync(GJ_FULL_MASK, alpha != 1.0f)) {
#pragma unroll
            for (int mt = 0; mt < KSTEPS; ++mt) {
                o[mt][0] *= a_lo, o[mt][1] *= a_hi, o[mt][2] *= a_lo, o[mt][3] *= a_hi;
            }
        }

        // O^T += V^T P^T: P^T as the B operand is exactly this lane's p (query g, rows
        // 2tq..), V^T as A through ldmatrix.trans (rows -> k, dims -> m).
        const uint32 pb[2] = {kv_pack2(p[0], p[1]), kv_pack2(p[2], p[3])};
#pragma unroll
        for (int mt = 0; mt < KSTEPS; ++mt) {
            uint32 va[4];
            ldmatrix_x4_trans(va, v_base + kv_off[mt % 4] + 128 * (mt / 4));
            mma_kv(o[mt], va, pb);
        }
    };
    stream_tiles(smem, kc, vc, start, end, slots, kvh, compute_tile);
    l += __shfl_xor_sync(GJ_FULL_MASK, l, 1);
    l += __shfl_xor_sync(GJ_FULL_MASK, l, 2);

    // Merge the KSETS warps of a query set through the idle stage buffers.
    if (KSETS > 1) {
        float* mo = (float*)smem;                                    // [NWARPS][QW][HEAD_DIM]
        float2* mml = (float2*)(smem + NWARPS * QW * HEAD_DIM * 4);  // [NWARPS][QW]
        float* mine = mo + warp * QW * HEAD_DIM;
#pragma unroll
        for (int mt = 0; mt < KSTEPS; ++mt) {
            mine[(2 * tq) * HEAD_DIM + 16 * mt + g] = o[mt][0];
            mine[(2 * tq + 1) * HEAD_DIM + 16 * mt + g] = o[mt][1];
            mine[(2 * tq) * HEAD_DIM + 16 * mt + 8 + g] = o[mt][2];
            mine[(2 * tq + 1) * HEAD_DIM + 16 * mt + 8 + g] = o[mt][3];
        }
        if (tq == 0) mml[warp * QW + g] = make_float2(m, l);
        __syncthreads();
        if (kset != 0) return;
        const int w0 = warp;  // first warp of the query set
        float m_lo = neg_inf(), m_hi = neg_inf(), m_g = neg_inf();
#pragma unroll
        for (int ks = 0; ks < KSETS; ++ks) {
            m_lo = fmaxf(m_lo, mml[(w0 + ks) * QW + 2 * tq].x);
            m_hi = fmaxf(m_hi, mml[(w0 + ks) * QW + 2 * tq + 1].x);
            m_g = fmaxf(m_g, mml[(w0 + ks) * QW + g].x);
        }
#pragma unroll
        for (int mt = 0; mt < KSTEPS; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
        l = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSETS; ++ks) {
            const float* theirs = mo + (w0 + ks) * QW * HEAD_DIM;
            const float f_lo = exp2_approx((mml[(w0 + ks) * QW + 2 * tq].x - m_lo) * LOG2E);
            const float f_hi = exp2_approx((mml[(w0 + ks) * QW + 2 * tq + 1].x - m_hi) * LOG2E);
            const float2 ml_g = mml[(w0 + ks) * QW + g];
            l = fmaf(exp2_approx((ml_g.x - m_g) * LOG2E), ml_g.y, l);
#pragma unroll
            for (int mt = 0; mt < KSTEPS; ++mt) {
                o[mt][0] = fmaf(f_lo, theirs[(2 * tq) * HEAD_DIM + 16 * mt + g], o[mt][0]);
                o[mt][1] = fmaf(f_hi, theirs[(2 * tq + 1) * HEAD_DIM + 16 * mt + g], o[mt][1]);
                o[mt][2] = fmaf(f_lo, theirs[(2 * tq) * HEAD_DIM + 16 * mt + 8 + g], o[mt][2]);
                o[mt][3] = fmaf(f_hi, theirs[(2 * tq + 1) * HEAD_DIM + 16 * mt + 8 + g], o[mt][3]);
            }
        }
        m = m_g;
    }

    // Write the live queries of the set: outputs by (2tq, 2tq + 1), (m, l) by query g.
    const int q_lo = qset * QW + 2 * tq, q_hi = q_lo + 1, q_g = qset * QW + g;
    float* out_lo = part_o + (part0 + (size_t)q_lo * max_splits) * HEAD_DIM;
    float* out_hi = part_o + (part0 + (size_t)q_hi * max_splits) * HEAD_DIM;
#pragma unroll
    for (int mt = 0; mt < KSTEPS; ++mt) {
        if (GROUP % QW == 0 || q_lo < GROUP) {
            out_lo[16 * mt + g] = o[mt][0];
            out_lo[16 * mt + 8 + g] = o[mt][2];
        }
        if (GROUP % QW == 0 || q_hi < GROUP) {
            out_hi[16 * mt + g] = o[mt][1];
            out_hi[16 * mt + 8 + g] = o[mt][3];
        }
    }
    if (tq == 0 && (GROUP % QW == 0 || q_g < GROUP))
        part_ml[part0 + (size_t)q_g * max_splits] = make_float2(m, l);
}
#endif  // MMA

// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
    flash_decode(const float* __restrict__ q, const unsigned long long* __restrict__ kv,
                 const int* __restrict__ seqs, const int* __restrict__ positions, int T, int slots,
                 int max_splits, float* __restrict__ part_o, float2* __restrict__ part_ml) {
    gj_grid_sync();
    extern __shared__ __align__(16) uint8 smem[];
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    if (t >= T) return;
    const int pos = positions[t];
    const int seq = seqs != nullptr ? seqs[t] : 0;
    const int lo = WINDOW > 0 ? max(0, pos - WINDOW + 1) : 0;
    const int len = split_len(pos - lo + 1, max_splits);
    const int start = lo + split * len;
    const int end = min(start + len, pos + 1);  // exclusive
    // Partial results of head (kvh, g): index ((t * H + kvh * GROUP + g) * max_splits + split).
    const size_t part0 = ((size_t)t * N_HEADS_TOTAL + (size_t)kvh * GROUP) * max_splits + split;
    if (start > pos) {
        for (int g = threadIdx.x; g < GROUP; g += THREADS)
            part_ml[part0 + (size_t)g * max_splits] = make_float2(neg_inf(), 0.0f);
        return;
    }
    attend_split(smem, q, (const uint8*)kv[2 * seq], (const uint8*)kv[2 * seq + 1], t, kvh, start,
                 end, slots, max_splits, part0, part_o, part_ml);
}

// ---------------------------------------------------------------------------------------------
// One block per (token, head, 32-dim slice: one Q8_1 block): thread (j, d) with d = tid % 8
// (float4 of the slice) and j = tid / 8 folds splits j, j + COMBINE_THREADS / 8, ... with the
// online-softmax merge; the partial states are then merged across j (shuffles within a warp,
// shared memory across warps). Skips empty splits (l == 0), whose partial outputs were never
// written.
#define COMBINE_LANES (COMBINE_THREADS / 8)  // split lanes per block
#define SLICES (HEAD_DIM / 32)

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    flash_combine(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                  float* __restrict__ out, uint32* __restrict__ outq, float2* __restrict__ outds,
                  int T, int max_splits) {
    gj_grid_sync();
    const int t = blockIdx.y;
    if (t >= T) return;
    const int head = blockIdx.x / SLICES, slice = blockIdx.x % SLICES;
    const int d = threadIdx.x % 8, j = threadIdx.x / 8;
    const size_t row0 = ((size_t)t * N_HEADS_TOTAL + head) * max_splits;
    const int dim = slice * 32 + 4 * d;

    float m = neg_inf(), l = 0.0f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int s = j; s < max_splits; s += COMBINE_LANES) {
        const float2 ml = part_ml[row0 + s];
        if (ml.y == 0.0f) continue;  // empty split (a NaN sum is not skipped: it must show)
        const float4 po = *(const float4*)(part_o + (row0 + s) * HEAD_DIM + dim);
        const float mn = fmaxf(m, ml.x);
        const float a = exp2_approx((m - mn) * LOG2E), b = exp2_approx((ml.x - mn) * LOG2E);
        l = a * l + b * ml.y;
        o = make_float4(a * o.x + b * po.x, a * o.y + b * po.y, a * o.z + b * po.z,
                        a * o.w + b * po.w);
        m = mn;
    }

    // Merge states (m, l, o) across the split lanes: lanes d, d + 4, ... of a warp first.
    auto merge = [&](float m2, float l2, float4 o2) {
        const float mn = fmaxf(m, m2);
        if (mn == neg_inf()) return;  // both empty
        const float a = exp2_approx((m - mn) * LOG2E), b = exp2_approx((m2 - mn) * LOG2E);
        l = a * l + b * l2;
        o = make_float4(a * o.x + b * o2.x, a * o.y + b * o2.y, a * o.z + b * o2.z,
                        a * o.w + b * o2.w);
        m = mn;
    };
#pragma unroll
    for (int off = 8; off < 32; off <<= 1) {
        const float m2 = __shfl_xor_sync(GJ_FULL_MASK, m, off);
        const float l2 = __shfl_xor_sync(GJ_FULL_MASK, l, off);
        float4 o2;
        o2.x = __shfl_xor_sync(GJ_FULL_MASK, o.x, off);
        o2.y = __shfl_xor_sync(GJ_FULL_MASK, o.y, off);
        o2.z = __shfl_xor_sync(GJ_FULL_MASK, o.z, off);
        o2.w = __shfl_xor_sync(GJ_FULL_MASK, o.w, off);
        merge(m2, l2, o2);
    }
    constexpr int kWarps = COMBINE_THREADS / 32;
    __shared__ float4 so[kWarps][8];
    __shared__ float2 sml[kWarps][8];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane < 8) {
        so[warp][lane] = o;
        sml[warp][lane] = make_float2(m, l);
    }
    __syncthreads();
    if (warp != 0) return;
    // Warp 0: lanes 0..7 hold the slice (the other lanes only keep the group shuffles of the
    // quantization uniform).
    const bool mine = lane < 8;
    if (mine)
#pragma unroll
        for (int w = 1; w < kWarps; ++w) merge(sml[w][d].x, sml[w][d].y, so[w][d]);
    const float inv = mine ? 1.0f / l : 0.0f;
    const float4 r = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
    const size_t at = ((size_t)t * N_HEADS_TOTAL + head) * HEAD_DIM + dim;  // a multiple of 4
    if (mine) *(float4*)(out + at) = r;
    if (outq != nullptr) {
        float2 ds;
        const uint32 packed = quantize_q8_1_group8(r, &ds);
        if (mine) {
            outq[at / 4] = packed;
            if (lane == 0) outds[at / 32] = ds;
        }
    }
}
