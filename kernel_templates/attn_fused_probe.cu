// attn_fused_probe.cu: a sliding decode layer's attention, from h's Q8_1 form to the attention
// output and its Q8_1 form, as one launch of one thread-block cluster per KV head
// (tests/gpu/gpu_test_attn_fused_probe.cpp; issue 13: "Q, K and V projections (and their norms,
// RoPE and KV append) in one launch", "flash decode with its split combine in the same kernel").
//
// The engine runs four dependent launches there: the Q|K|V matvec, attn_prep (norms, RoPE, the
// K/V append), flash_decode over splits of the window, flash_combine. Each passes its result to
// the next through global memory and a grid boundary. Every piece after the matvec is per KV head
// (its GROUP query heads, its K and V rows), and a small model has 1-2 KV heads, so here a
// cluster of CL blocks owns one KV head end to end and passes results through distributed shared
// memory instead:
//   before the grid wait: each block copies its RPB = (GROUP + 2) * HEAD_DIM / CL rows of the
//     cluster's Q|K|V weights (split Q4_0) and its split of the window's cached K/V rows into
//     shared memory (cp.async; neither is written by the kernel before), and makes the RoPE table;
//   1. its rows' dot products with h, and the sums of squares of each head it touches;
//   cluster barrier;
//   2. every block reads all raw rows and head sums through DSMEM, normalizes and rotates the
//     GROUP query heads (and, in the block whose split holds the new position, K and V: stored
//     into the cache and into its own tile);
//   3. attention of the GROUP queries over its split (<= CHUNK keys): partial output, max, sum;
//   cluster barrier;
//   4. block b merges the splits of its 1/CL of the group's outputs (DSMEM), stores them in fp32
//     and their Q8_1 form (as flash_combine does);
//   cluster barrier (no block leaves while others read its shared memory).
// sm_90 only (clusters of 16: a non-portable size, opted in by the loader); on sm_80 the entry
// traps. A probe: f16 cache, one sequence, decode (T = 1), sliding layers with a V projection.
//
// RAW_IN 1: the two-launch form. The engine's Q|K|V matvec runs first (all SMs); step 1 reads
// its fp32 outputs (q_raw, k_raw, v_raw: [H][HEAD_DIM], [N_KV_HEADS][HEAD_DIM] twice) instead of
// multiplying, and no weights are copied.
// Constants: K (model width, a multiple of 256), HEAD_DIM (256), GROUP (1, 2, 4 or 8),
// N_KV_HEADS, WINDOW (a multiple of CL * 32), CL (blocks per cluster), THREADS (512), RAW_IN,
// SMEM.
// Launch: grid CL * N_KV_HEADS, block THREADS, dynamic shared memory SMEM.
// Entry: attn_fused(wq, wk, wv, xq, xds, q_norm_w, k_norm_w, k_cache, v_cache, positions, slots,
//                   rope_base, eps, out, outq, outds, stop, q_raw, k_raw, v_raw)
// stop (timing only; 0 in use): 1, 2, 3 run steps 1 .. stop only, 5 none of them (every
// barrier still runs, so the launch keeps its shape; the results are then incomplete). This
// encoding, odd as it is, compiles without spills at E4B's shape; the plainer "number of steps"
// (or 4 minus it, or it clamped) made ptxas spill 4 bytes there at 128 registers a thread.
#include "attn_kv.cuh"
#include "gj_cluster.cuh"
#include "gj_ptx.cuh"

#define HD HEAD_DIM
#define R_ROWS ((GROUP + 2) * HD)  // a cluster's Q, K and V rows
#define RPB (R_ROWS / CL)          // of them per block
#define UNITS (K / 32)
#define CHUNK (WINDOW / CL)  // keys per block at a full window
#define E_OUT (GROUP * HD)   // a cluster's output values
#define NWARPS (THREADS / 32)
#define PV_SETS (THREADS / (HD / 2))  // query sets of the P V step

static_assert(HD == 256, "attn_fused_probe: HEAD_DIM 256 (8 dims per lane)");
static_assert(GROUP == 1 || GROUP == 2 || GROUP == 4 || GROUP == 8,
              "attn_fused_probe: GROUP a power of two <= 8 (the scores' reduce-scatter)");
static_assert(K % 256 == 0 && R_ROWS % CL == 0 && RPB <= HD, "attn_fused_probe: row split");
static_assert(WINDOW % (CL * 32) == 0 && CHUNK <= 32, "attn_fused_probe: <= 32 keys per block");
static_assert(E_OUT % (CL * 32) == 0 && E_OUT / CL <= THREADS, "attn_fused_probe: merge split");

// Shared memory, in this order (16-byte aligned pieces).
#define W_ROWS (RAW_IN ? 0 : RPB)  // weight rows in shared memory
#define OFF_WQ 0
#define OFF_WD (OFF_WQ + W_ROWS * (K / 2))
#define OFF_K (OFF_WD + W_ROWS * (K / 16))
#define OFF_V (OFF_K + CHUNK * HD * 2)
#define OFF_XQ (OFF_V + CHUNK * HD * 2)
#define OFF_XDS (OFF_XQ + K)
#define OFF_RAW (OFF_XDS + UNITS * 8)
#define OFF_SS (OFF_RAW + RPB * 4)
#define OFF_SCALE (OFF_SS + 64)
#define OFF_QN (OFF_SCALE + 64)
#define OFF_O (OFF_QN + (GROUP + 2) * HD * 4)
#define OFF_ML (OFF_O + E_OUT * 4)
#define OFF_ROT (OFF_ML + GROUP * 8)
#define OFF_P (OFF_ROT + HD / 2 * 8)
#define OFF_WSUM (OFF_P + GROUP * 32 * 4)
#define SMEM_NEEDED (OFF_WSUM + NWARPS * 8)
static_assert(GROUP * 32 >= E_OUT / CL, "attn_fused_probe: merge scratch");
static_assert(SMEM_NEEDED <= SMEM, "attn_fused_probe: SMEM too small");
static_assert(GROUP + 2 <= 16, "attn_fused_probe: head sums fit 64 bytes");

#if __CUDA_ARCH__ >= 900
// Where the cluster-local row r comes from: matrix `which` (0 Q, 1 K, 2 V) of `n_rows` rows, row
// `row` of it.
GJ_DEVICE void afp_source(int kvh, int r, int& which, int& n_rows, int& row) {
    if (r < GROUP * HD) {
        which = 0, n_rows = N_KV_HEADS * GROUP * HD, row = kvh * GROUP * HD + r;
    } else if (r < (GROUP + 1) * HD) {
        which = 1, n_rows = N_KV_HEADS * HD, row = kvh * HD + r - GROUP * HD;
    } else {
        which = 2, n_rows = N_KV_HEADS * HD, row = kvh * HD + r - (GROUP + 1) * HD;
    }
}

// The cluster-local row r's weights (nibbles, scales) in the split Q4_0 planes.
GJ_DEVICE void afp_row(const uint8* wq, const uint8* wk, const uint8* wv, int kvh, int r,
                       const uint8*& q, const uint8*& d) {
    int which, n_rows, row;
    afp_source(kvh, r, which, n_rows, row);
    const uint8* w = which == 0 ? wq : which == 1 ? wk : wv;
    q = w + (size_t)row * (K / 2);
    d = w + (size_t)n_rows * (K / 2) + (size_t)row * (K / 16);
}
#endif

#if __CUDA_ARCH__ >= 900
#define AFP_CLUSTER __cluster_dims__(CL, 1, 1)
#else
#define AFP_CLUSTER
#endif
extern "C" __global__ void AFP_CLUSTER __launch_bounds__(THREADS)
    attn_fused(const uint8* __restrict__ wq, const uint8* __restrict__ wk,
               const uint8* __restrict__ wv, const int8* __restrict__ xq,
               const float2* __restrict__ xds, const float* __restrict__ q_norm_w,
               const float* __restrict__ k_norm_w, uint8* __restrict__ k_cache,
               uint8* __restrict__ v_cache, const int* __restrict__ positions, int slots,
               float rope_base, float eps, float* __restrict__ out, int8* __restrict__ outq,
               float2* __restrict__ outds, int stop, const float* __restrict__ q_raw,
               const float* __restrict__ k_raw, const float* __restrict__ v_raw) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) uint8 smem[];
    const unsigned rank = gj_cluster_rank();
    const int kvh = blockIdx.x / CL;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    float* raw = (float*)(smem + OFF_RAW);
    float* ss_part = (float*)(smem + OFF_SS);
    float* head_scale = (float*)(smem + OFF_SCALE);
    float* qn = (float*)(smem + OFF_QN);
    float* o_part = (float*)(smem + OFF_O);
    float2* ml = (float2*)(smem + OFF_ML);
    float2* rot = (float2*)(smem + OFF_ROT);
    float* p_sc = (float*)(smem + OFF_P);
    float* wsum = (float*)(smem + OFF_WSUM);
    f16_bits* k_tile = (f16_bits*)(smem + OFF_K);
    f16_bits* v_tile = (f16_bits*)(smem + OFF_V);

    // The step state (copied by the host before the step) and the weights: before the wait.
    const int pos = positions[0];
    const int lo = max(0, pos - WINDOW + 1);
    const int k0 = lo + (int)rank * CHUNK, k1 = min(k0 + CHUNK, pos + 1);  // this block's keys
    const int r0 = (int)rank * RPB;
    for (int c = tid; !RAW_IN && c < RPB * (UNITS + K / 256); c += THREADS) {
        const int row = c < RPB * UNITS ? c / UNITS : (c - RPB * UNITS) / (K / 256);
        const uint8 *q, *d;
        afp_row(wq, wk, wv, kvh, r0 + row, q, d);
        if (c < RPB * UNITS)
            cp_async_cg16(smem_addr(smem + OFF_WQ + (size_t)c * 16), q + 16 * (c % UNITS));
        else
            cp_async_cg16(smem_addr(smem + OFF_WD + (size_t)(c - RPB * UNITS) * 16),
                          d + 16 * ((c - RPB * UNITS) % (K / 256)));
    }
    // The window's cached rows of this split, except the new position's.
    const int cached = max(0, min(k1, pos) - k0);
    for (int c = tid; c < 2 * cached * (HD / 8); c += THREADS) {
        const bool is_v = c >= cached * (HD / 8);
        const int i = is_v ? c - cached * (HD / 8) : c;
        const int j = i / (HD / 8), part = i % (HD / 8);
        const size_t row = (size_t)((k0 + j) % slots) * N_KV_HEADS + kvh;
        const uint8* src = (is_v ? v_cache : k_cache) + row * HD * 2 + 16 * part;
        cp_async_cg16(smem_addr(smem + (is_v ? OFF_V : OFF_K) + (size_t)j * HD * 2 + 16 * part),
                      src);
    }
    cp_async_commit();
    for (int j = tid; j < HD / 2; j += THREADS) rot[j] = rope_sin_cos(j, pos, rope_base);
    gj_grid_sync();

    // h's Q8_1 form, written by the kernel before.
    for (int c = tid; !RAW_IN && c < K / 16 + UNITS / 2; c += THREADS) {
        if (c < K / 16)
            cp_async_cg16(smem_addr(smem + OFF_XQ + 16 * c), xq + 16 * c);
        else
            cp_async_cg16(smem_addr(smem + OFF_XDS + 16 * (c - K / 16)), xds + 2 * (c - K / 16));
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // Timing only: the steps a block runs (all, or through step `stop`; stop 5: none).
    const int last = stop == 0 ? 4 : (stop == 5 ? 0 : stop);
    if (last >= 1) {
        // 1. This block's rows: its dot products with h, two rows a warp at a time (their loads and
        // reductions interleaved); or, RAW_IN, read from the Q|K|V matvec's outputs.
#if RAW_IN
        if (tid < RPB) {
            int which, n_rows, row;
            afp_source(kvh, r0 + tid, which, n_rows, row);
            raw[tid] = (which == 0 ? q_raw : which == 1 ? k_raw : v_raw)[row];
        }
#else
        const int4* x4 = (const int4*)(smem + OFF_XQ);
        const float2* ds = (const float2*)(smem + OFF_XDS);
        for (int row = warp; row < RPB; row += 2 * NWARPS) {
            const int row2 = min(row + NWARPS, RPB - 1);  // a repeat past the end, not stored
            float acc = 0.0f, acc2 = 0.0f;
#pragma unroll 1
            for (int u = lane; u < UNITS; u += 32) {
                const int4 a = x4[2 * u], b = x4[2 * u + 1];
                const float2 xd = ds[u];
                const uint4 w = *(const uint4*)(smem + OFF_WQ + ((size_t)row * UNITS + u) * 16);
                const uint4 w2 = *(const uint4*)(smem + OFF_WQ + ((size_t)row2 * UNITS + u) * 16);
                const float dw =
                    f16_to_f32(*(const f16_bits*)(smem + OFF_WD + ((size_t)row * UNITS + u) * 2));
                const float dw2 =
                    f16_to_f32(*(const f16_bits*)(smem + OFF_WD + ((size_t)row2 * UNITS + u) * 2));
                int32 s1 = gj_q4_dot8(w.x, w.y, a.x, a.y, b.x, b.y, 0);
                int32 s2 = gj_q4_dot8(w2.x, w2.y, a.x, a.y, b.x, b.y, 0);
                s1 = gj_q4_dot8(w.z, w.w, a.z, a.w, b.z, b.w, s1);
                s2 = gj_q4_dot8(w2.z, w2.w, a.z, a.w, b.z, b.w, s2);
                acc += dw * (xd.x * (float)s1 - 8.0f * xd.y);
                acc2 += dw2 * (xd.x * (float)s2 - 8.0f * xd.y);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                acc += __shfl_xor_sync(GJ_FULL_MASK, acc, o);
                acc2 += __shfl_xor_sync(GJ_FULL_MASK, acc2, o);
            }
            if (lane == 0) {
                raw[row] = acc;
                if (row + NWARPS < RPB) raw[row + NWARPS] = acc2;
            }
        }
#endif
        __syncthreads();
        // Sums of squares of the (at most two) heads this block's rows touch.
        const int head_a = r0 / HD;
        {
            float sa = 0.0f, sb = 0.0f;
            if (tid < RPB) {
                const float v = raw[tid] * raw[tid];
                if ((r0 + tid) / HD == head_a)
                    sa = v;
                else
                    sb = v;
            }
            sa = warp_sum(sa);
            sb = warp_sum(sb);
            if (lane == 0) wsum[2 * warp] = sa, wsum[2 * warp + 1] = sb;
            __syncthreads();
            if (tid < 2) {
                float s = 0.0f;
                for (int w = 0; w < NWARPS; ++w) s += wsum[2 * w + tid];
                ss_part[tid] = s;
            }
        }
    }
    gj_cluster_sync();

    if (last >= 2) {
        // 2. Head scales from every block's sums, then the normalized, rotated rows.
        if (tid < GROUP + 2) {
            const int h = tid;
            float ss = 0.0f;
            for (int b = (h * HD) / RPB; b <= ((h + 1) * HD - 1) / RPB; ++b)
                ss += gj_cluster_map(ss_part, (unsigned)b)[h - (b * RPB) / HD];
            head_scale[h] = 1.0f / sqrtf(ss * (1.0f / HD) + eps);
        }
        __syncthreads();
        const int owner = (pos - lo) / CHUNK;  // the block whose split holds the new position
        const int heads_here = rank == (unsigned)owner ? GROUP + 2 : GROUP;
        constexpr int kPairIters = ((GROUP + 2) * (HD / 2) + THREADS - 1) / THREADS;
        float pa[kPairIters], pb[kPairIters];
#pragma unroll
        for (int it = 0; it < kPairIters; ++it) {  // every remote load first, then the math
            const int i = tid + it * THREADS;
            if (i < heads_here * (HD / 2)) {
                const int ra = (i / (HD / 2)) * HD + i % (HD / 2), rb = ra + HD / 2;
                pa[it] = gj_cluster_map(raw, (unsigned)(ra / RPB))[ra % RPB];
                pb[it] = gj_cluster_map(raw, (unsigned)(rb / RPB))[rb % RPB];
            }
        }
#pragma unroll
        for (int it = 0; it < kPairIters; ++it) {
            const int i = tid + it * THREADS;
            if (i >= heads_here * (HD / 2)) continue;
            const int h = i / (HD / 2), j = i % (HD / 2);
            float a = pa[it] * head_scale[h], b = pb[it] * head_scale[h];
            if (h <= GROUP) {  // a query or K: weighted and rotated (V: neither)
                const float* w = h < GROUP ? q_norm_w : k_norm_w;
                a *= w[j];
                b *= w[j + HD / 2];
                const float s = rot[j].x, c = rot[j].y;
                const float x0 = a, x1 = b;
                a = x0 * c - x1 * s;
                b = x1 * c + x0 * s;
            }
            qn[h * HD + j] = a;
            qn[h * HD + j + HD / 2] = b;
        }
        __syncthreads();
        if (rank == (unsigned)owner) {  // append the new K and V rows: cache and own tile
            const size_t row = (size_t)(pos % slots) * N_KV_HEADS + kvh;
            const int jt = pos - k0;
            for (int i = tid; i < HD; i += THREADS) {
                const f16_bits kb = f32_to_f16(qn[GROUP * HD + i]),
                               vb = f32_to_f16(qn[(GROUP + 1) * HD + i]);
                ((f16_bits*)k_cache)[row * HD + i] = kb;
                ((f16_bits*)v_cache)[row * HD + i] = vb;
                k_tile[jt * HD + i] = kb;
                v_tile[jt * HD + i] = vb;
            }
        }
        __syncthreads();
    }

    if (last >= 3) {
        // 3. Attention of the group's queries over this split.
        const int nk = max(0, k1 - k0);
        // Scores: a warp per key, each lane 8 dims of it against the same 8 dims of every query,
        // the GROUP partial sums then reduce-scattered over the lanes (GROUP - 1 + log2(32 /
        // GROUP) shuffles for all of them, as flash_decode reduces its scores).
        for (int j = warp; j < nk; j += NWARPS) {
            const uint4 kv = *(const uint4*)(k_tile + j * HD + 8 * lane);
            const float2 k01 = unpack_f16x2(kv.x), k23 = unpack_f16x2(kv.y),
                         k45 = unpack_f16x2(kv.z), k67 = unpack_f16x2(kv.w);
            float v[GROUP];
#pragma unroll
            for (int g = 0; g < GROUP; ++g) {
                const float4* q = (const float4*)(qn + g * HD + 8 * lane);
                const float4 qa = q[0], qb = q[1];
                v[g] = qa.x * k01.x + qa.y * k01.y + qa.z * k23.x + qa.w * k23.y + qb.x * k45.x +
                       qb.y * k45.y + qb.z * k67.x + qb.w * k67.y;
            }
            // Halve the values each step: lanes with the offset bit set keep the upper half.
            int o = 16;
#pragma unroll
            for (int n = GROUP; n > 1; n /= 2, o /= 2) {
                const bool upper = lane & o;
#pragma unroll
                for (int i = 0; i < n / 2; ++i) {
                    const float send = upper ? v[i] : v[i + n / 2];
                    const float keep = upper ? v[i + n / 2] : v[i];
                    v[i] = keep + __shfl_xor_sync(GJ_FULL_MASK, send, o);
                }
            }
            for (; o > 0; o /= 2) v[0] += __shfl_xor_sync(GJ_FULL_MASK, v[0], o);
            // Lane L now holds query (L / (32 / GROUP))'s score.
            if (lane % (32 / GROUP) == 0) p_sc[(lane / (32 / GROUP)) * 32 + j] = v[0];
        }
        __syncthreads();
        if (warp < GROUP) {
            const int g = warp;
            const float s = lane < nk ? p_sc[g * 32 + lane] : neg_inf();
            const float m = warp_max(s);
            const float p = lane < nk ? expf(s - m) : 0.0f;
            const float l = warp_sum(p);
            if (lane < nk) p_sc[g * 32 + lane] = p;
            if (lane == 0) ml[g] = make_float2(nk > 0 ? m : neg_inf(), l);
        }
        __syncthreads();
        // P V: a thread takes a pair of dims of every GROUP / (THREADS / (HD / 2))-th query, so one
        // read of the V pair serves several queries.
        {
            const int d2 = tid % (HD / 2), gq = tid / (HD / 2);
            float2 acc[(GROUP + PV_SETS - 1) / PV_SETS];
#pragma unroll
            for (int i = 0; i < (GROUP + PV_SETS - 1) / PV_SETS; ++i)
                acc[i] = make_float2(0.f, 0.f);
            for (int j = 0; j < nk; ++j) {
                const float2 v = unpack_f16x2(*(const uint32*)(v_tile + j * HD + 2 * d2));
#pragma unroll
                for (int i = 0; i < (GROUP + PV_SETS - 1) / PV_SETS; ++i) {
                    const int g = gq + PV_SETS * i;
                    if (g < GROUP) {
                        const float p = p_sc[g * 32 + j];
                        acc[i].x += p * v.x;
                        acc[i].y += p * v.y;
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < (GROUP + PV_SETS - 1) / PV_SETS; ++i) {
                const int g = gq + PV_SETS * i;
                if (g < GROUP) *(float2*)(o_part + g * HD + 2 * d2) = acc[i];
            }
        }
    }
    gj_cluster_sync();

    if (last >= 4) {
        // 4. Merge this block's slice of the outputs over the splits (the slice lies in one query
        // head): each split's weight exp(m_b - M) / sum_b' exp(m_b' - M) l_b' once, then 4 threads
        // an output, 4 splits each; fp32 and Q8_1 (as flash_combine).
        // 4 threads an output, 4 splits each: their (max, sum) and partials read in one round,
        // the maximum and both sums completed over the 4 lanes.
        float* slice = p_sc;  // the slice's outputs, for its Q8_1 form
        const int e0 = (int)rank * (E_OUT / CL), g_slice = e0 / HD;
        if (tid < 4 * (E_OUT / CL)) {
            const int e = e0 + tid / 4, part = tid % 4;
            float2 mb[CL / 4];
            float ob[CL / 4];
#pragma unroll
            for (int i = 0; i < CL / 4; ++i) {
                const unsigned b = (unsigned)(part * (CL / 4) + i);
                mb[i] = gj_cluster_map(ml, b)[g_slice];
                ob[i] = gj_cluster_map(o_part, b)[e];
            }
            float m = neg_inf();
#pragma unroll
            for (int i = 0; i < CL / 4; ++i) m = fmaxf(m, mb[i].x);
            m = fmaxf(m, __shfl_xor_sync(GJ_FULL_MASK, m, 1));
            m = fmaxf(m, __shfl_xor_sync(GJ_FULL_MASK, m, 2));
            float num = 0.0f, den = 0.0f;
#pragma unroll
            for (int i = 0; i < CL / 4; ++i) {
                const float w = mb[i].y > 0.0f ? expf(mb[i].x - m) : 0.0f;
                num += w * ob[i];
                den += w * mb[i].y;
            }
            num += __shfl_xor_sync(GJ_FULL_MASK, num, 1);
            num += __shfl_xor_sync(GJ_FULL_MASK, num, 2);
            den += __shfl_xor_sync(GJ_FULL_MASK, den, 1);
            den += __shfl_xor_sync(GJ_FULL_MASK, den, 2);
            if (part == 0) slice[tid / 4] = num / den;
        }
        __syncthreads();
        if (tid < E_OUT / CL) {
            const float v = slice[tid];
            const int oi = kvh * E_OUT + e0 + tid;
            out[oi] = v;
            const float amax = warp_max(fabsf(v));
            const float inv = amax > 0.0f ? q8_inv_scale(amax) : 0.0f;
            const int32 qv = f32_to_s8_sat(v * inv);
            const int32 sum = warp_sum_i32(qv);
            outq[oi] = (int8)qv;
            const float d = amax * (1.0f / 127.0f);
            if (lane == 0) outds[oi / 32] = make_float2(d, d * (float)sum);
        }
    }
    gj_cluster_sync();
#else
    __trap();  // clusters are sm_90's
#endif
}
