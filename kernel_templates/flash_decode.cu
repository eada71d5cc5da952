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
// Work split inside a block: warps form QSETS query sets of QW queries (the group's queries, in
// registers) times KSETS key sets. Every warp reads whole cache rows from shared memory, 32 lanes
// across the head dim (DPL = HEAD_DIM / 32 dims each), KB rows per step: QW x KB partial dot
// products are reduced across the warp with one butterfly reduce-scatter (VALS - 1 shuffles for
// VALS = QW * KB values, each lane ends with one full score), then each score is broadcast back
// for P.V. Each warp keeps its own online softmax; the KSETS warps of a query set merge at the end.
//
// Constants (prologue #defines):
//   HEAD_DIM   32, 64, 128 or k * 256    GROUP   query heads per KV head (any value >= 1)
//   N_KV_HEADS                           WINDOW  sliding window (0 = global causal)
//   KV_TYPE    cache element type (attn_kv.cuh)
//   CHUNK      minimum positions per split (a multiple of TILE)
//   TILE       cache rows per pipeline stage       STAGES  pipeline depth (>= 2)
//   THREADS    block size, 32 * QSETS * KSETS      QW      queries per warp (power of two)
//   KB         rows per warp step (power of two, QW * KB <= 32)
//   SMEM       dynamic shared memory bytes (checked against what the template needs)
//   COMBINE_THREADS  flash_combine block size (a multiple of 128)
// Launch flash_decode:  grid (max_splits, N_KV_HEADS, max_T), block THREADS, SMEM dynamic bytes
//                       (opt in above 48 KiB: ModuleSet::set_max_dynamic_smem).
// Launch flash_combine: grid (GROUP * N_KV_HEADS * HEAD_DIM / 16, max_T), block COMBINE_THREADS.
// Blocks with blockIdx.z (decode) / blockIdx.y (combine) >= T exit.
// Entries:
//   flash_decode(q [T][H][HEAD_DIM], k_cache, v_cache, positions [T], T, slots, max_splits,
//                part_o [T][H][max_splits][HEAD_DIM], part_ml [T][H][max_splits] {m, l})
//   flash_combine(part_o, part_ml, out [T][H][HEAD_DIM], T, max_splits)
// The caller keeps slots >= WINDOW + T - 1 on ring layers and slots > every position on global
// layers, so every visible key is still in the cache.
#include "attn_kv.cuh"
#include "gj_ptx.cuh"

static_assert(HEAD_DIM == 32 || HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM % 256 == 0,
              "flash_decode: HEAD_DIM must be 32, 64, 128 or a multiple of 256 (lane layout)");
static_assert(GROUP >= 1 && N_KV_HEADS >= 1, "flash_decode: bad head counts");
static_assert(WINDOW >= 0, "flash_decode: WINDOW must be >= 0");
static_assert((QW & (QW - 1)) == 0 && (KB & (KB - 1)) == 0, "flash_decode: QW, KB powers of two");
static_assert(QW * KB <= 32, "flash_decode: QW * KB must be <= 32 (one score per lane)");
static_assert(STAGES >= 2, "flash_decode: STAGES must be >= 2");
static_assert(CHUNK % TILE == 0, "flash_decode: CHUNK must be a multiple of TILE");

#define N_HEADS_TOTAL (GROUP * N_KV_HEADS)
#define DPL (HEAD_DIM / 32)            // dims per lane
#define QSETS ((GROUP + QW - 1) / QW)  // warps sets splitting the group's queries
#define NWARPS (THREADS / 32)
#define KSETS (NWARPS / QSETS)       // warps of a query set splitting the rows
#define VALS (QW * KB)               // scores per warp step
#define STEPS (TILE / (KSETS * KB))  // steps per warp per tile
#define ROW_BYTES (HEAD_DIM * 2)
#define STAGE_BYTES (2 * TILE * ROW_BYTES)  // K rows, then V rows
#define MERGE_BYTES (NWARPS * QW * (HEAD_DIM + 2) * 4)
#define SMEM_NEED (STAGES * STAGE_BYTES > MERGE_BYTES ? STAGES * STAGE_BYTES : MERGE_BYTES)
#define LOG2_VALS \
    (VALS >= 32 ? 5 : VALS >= 16 ? 4 : VALS >= 8 ? 3 : VALS >= 4 ? 2 : VALS >= 2 ? 1 : 0)
#define LOG2E 1.4426950408889634f

static_assert(NWARPS == QSETS * KSETS, "flash_decode: THREADS must be 32 * QSETS * KSETS");
static_assert(TILE % (KSETS * KB) == 0, "flash_decode: TILE must be a multiple of KSETS * KB");
static_assert(SMEM == SMEM_NEED, "flash_decode: SMEM differs from what the template needs");
static_assert(COMBINE_THREADS % 128 == 0, "flash_combine: COMBINE_THREADS multiple of 128");

GJ_DEVICE float neg_inf() {
    return __int_as_float(0xff800000);
}

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

// The lane's DPL elements of a cache row in shared memory, as floats.
GJ_DEVICE void load_row(const uint8* row, int lane, float (&out)[DPL]) {
#if DPL >= 8
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

// Keys per split for a query that sees n keys (see the header).
GJ_DEVICE int split_len(int n, int max_splits) {
    int len = (n + max_splits - 1) / max_splits;
    len = (len + TILE - 1) / TILE * TILE;
    return len > CHUNK ? len : CHUNK;
}

// cp.async of `count` cache rows (positions first .. first + count - 1, ring slots) of K and V
// into a stage buffer. Rows past `count` are left as they are (the compute masks them).
GJ_DEVICE void issue_tile(uint8* stage, const uint8* k_cache, const uint8* v_cache, int first,
                          int count, int slots, int kvh) {
    constexpr int kChunksPerRow = ROW_BYTES / 16;
    constexpr int kChunks = TILE * kChunksPerRow;
#pragma unroll
    for (int k = 0; k < (kChunks + THREADS - 1) / THREADS; ++k) {
        const int i = k * THREADS + threadIdx.x;
        const int r = i / kChunksPerRow, c = i % kChunksPerRow;
        if ((kChunks % THREADS == 0 || i < kChunks) && r < count) {
            const int slot = (first + r) % slots;
            const size_t off = ((size_t)slot * N_KV_HEADS + kvh) * ROW_BYTES + c * 16;
            cp_async_cg16(smem_addr(stage + r * ROW_BYTES + c * 16), k_cache + off);
            cp_async_cg16(smem_addr(stage + (TILE + r) * ROW_BYTES + c * 16), v_cache + off);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    flash_decode(const float* __restrict__ q, const void* __restrict__ k_cache,
                 const void* __restrict__ v_cache, const int* __restrict__ positions, int T,
                 int slots, int max_splits, float* __restrict__ part_o,
                 float2* __restrict__ part_ml) {
    extern __shared__ __align__(16) uint8 smem[];
    const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    if (t >= T) return;
    const int pos = positions[t];
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

    const uint8* kc = (const uint8*)k_cache;
    const uint8* vc = (const uint8*)v_cache;
    const int n_tiles = (end - start + TILE - 1) / TILE;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles)
            issue_tile(smem + s * STAGE_BYTES, kc, vc, start + s * TILE,
                       min(TILE, end - start - s * TILE), slots, kvh);
        cp_async_commit();  // possibly empty: keeps the group count uniform for the wait below
    }

    for (int it = 0; it < n_tiles; ++it) {
        {
            const int nt = it + STAGES - 1;
            if (nt < n_tiles)
                issue_tile(smem + (nt % STAGES) * STAGE_BYTES, kc, vc, start + nt * TILE,
                           min(TILE, end - start - nt * TILE), slots, kvh);
            cp_async_commit();
        }
        cp_async_wait<STAGES - 1>();  // tile `it` has landed (for this thread's copies)
        __syncthreads();              // ... and for everyone's

        const uint8* k_rows = smem + (it % STAGES) * STAGE_BYTES;
        const uint8* v_rows = k_rows + TILE * ROW_BYTES;
        const int tile_rows = min(TILE, end - start - it * TILE);
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
                load_row(k_rows + (row0 + k) * ROW_BYTES, lane, kf);
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
                load_row(v_rows + (row0 + k) * ROW_BYTES, lane, vf);
#pragma unroll
                for (int qi = 0; qi < QW; ++qi) {
                    const float pk = __shfl_sync(GJ_FULL_MASK, p, (qi * KB + k) << kShift);
                    l[qi] += pk;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) o[qi][i] = fmaf(pk, vf[i], o[qi][i]);
                }
            }
        }
        __syncthreads();  // the stage is refilled by the next iteration's issue
    }

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

// One block per (token, head, 16-dim slice): thread (j, d) with d = tid % 4 (float4 of the
// slice) and j = tid / 4 folds splits j, j + COMBINE_THREADS / 4, ... with the online-softmax
// merge; the partial states are then merged across j (shuffles within a warp, shared memory
// across warps). Skips empty splits (l == 0), whose partial outputs were never written.
#define COMBINE_LANES (COMBINE_THREADS / 4)  // split lanes per block
#define SLICES (HEAD_DIM / 16)

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    flash_combine(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                  float* __restrict__ out, int T, int max_splits) {
    const int t = blockIdx.y;
    if (t >= T) return;
    const int head = blockIdx.x / SLICES, slice = blockIdx.x % SLICES;
    const int d = threadIdx.x % 4, j = threadIdx.x / 4;
    const size_t row0 = ((size_t)t * N_HEADS_TOTAL + head) * max_splits;
    const int dim = slice * 16 + 4 * d;

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
    for (int off = 4; off < 32; off <<= 1) {
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
    __shared__ float4 so[kWarps][4];
    __shared__ float2 sml[kWarps][4];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane < 4) {
        so[warp][lane] = o;
        sml[warp][lane] = make_float2(m, l);
    }
    __syncthreads();
    if (threadIdx.x >= 4) return;
#pragma unroll
    for (int w = 1; w < kWarps; ++w) merge(sml[w][d].x, sml[w][d].y, so[w][d]);
    const float inv = 1.0f / l;
    *(float4*)(out + ((size_t)t * N_HEADS_TOTAL + head) * HEAD_DIM + dim) =
        make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
}
