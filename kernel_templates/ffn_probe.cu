// ffn_probe.cu: a decode FFN as one launch, each block owning C rows of the intermediate width
// end to end (tests/gpu/gpu_test_ffn_probe.cpp; issue 13: the launches left in a decode layer).
//
// A decode layer's FFN runs three dependent launches: the GeGLU matvec (gelu(W_gate h) * W_up h,
// thousands of blocks of 2-4 rows), quantize_q8_1 of its product (a Q8_1 block is 32 rows, more
// than a GeGLU block holds), and the down projection. Every weight byte of the three is known
// before the layer starts; only h is not. Here a block computes C whole rows of the GeGLU, makes
// their Q8_1 form itself, and multiplies them by its C columns of W_down at once: the down
// projection as split K over the intermediate width, each block adding its partial D-vector into
// y with fp32 reductions (red.global.add; y zeroed by an earlier launch). So the HBM stream does
// not stop between the GeGLU and the down projection, and two dependent steps go.
//
// Weights, split Q4_0 as the engine's (matvec_q4_0.cu, LAYOUT 1):
//   gate, up  [n_ff][K/2] nibble bytes, then [n_ff][K/32] fp16 scales (the engine's planes);
//   down      column-block major, rows interleaved by 4: the 16 nibble bytes of GGUF block
//             (j, cb) of the matrix [D][n_ff] at slot cb * D + (j % 4) * (D / 4) + j / 4 (16
//             bytes each), then the fp16 scales in the same slot order. A block's C columns are
//             two contiguous runs, and a thread reading rows 4g .. 4g + 3 reads, across a warp,
//             consecutive 16-byte slots of shared memory.
// h in Q8_1 (xq: K int8, xds: {d, d * sum} per 32). y: D floats, accumulated into (sm_90: one
// 4-float reduction per 4 rows).
// Constants: K (= D, the model width, a multiple of 256), C (32 or 64: rows per block), THREADS
// (256), GU_SMEM (1: the block's gate|up rows also stream into shared memory ahead of the wait;
// 0: each warp holds DEPTH rows of them in registers, 1..C/8, the next loaded as one is summed).
// CLUSTER (1 or 8): with 8 (sm_90), the blocks of a thread-block cluster first sum their partial
// D-vectors through distributed shared memory (block r of the cluster takes the r-th eighth of
// the rows, in rank order), so each float of y takes n_ff / C / 8 reductions instead of n_ff / C:
// the reductions into the same addresses are what serializes at L2.
// Launch: grid n_ff / C (a multiple of CLUSTER), block THREADS, dynamic shared memory SMEM
// (C / 32 * K * 18, plus C * K * 9 / 8 with GU_SMEM, plus D * 4 with CLUSTER 8).
// Entries:
//   ffn_geglu_down(gate, up, down, xq, xds, y, g_out): g_out (optional) gets the GeGLU products;
//   ffn_geglu_down_noadd: the same without the reductions into y (timing only: what they cost).
#include "gj_cluster.cuh"
#include "gj_ptx.cuh"

#define D K
#define WARPS (THREADS / 32)
#define RW (C / WARPS)           // gate|up row pairs per warp
#define UNITS (K / 32)           // Q4_0 blocks of a gate|up row
#define PER ((UNITS + 31) / 32)  // of them per lane
#define SB (C / 32)              // 32-column blocks of the down slice
#define GROUPS (D / 4)           // 4-row groups of the down product

static_assert(K % 256 == 0, "ffn_probe: K must be a multiple of 256");
static_assert(C == 32 || C == 64, "ffn_probe: C must be 32 or 64");
static_assert(THREADS == 256, "ffn_probe: 8 warps");
static_assert(GU_SMEM || (DEPTH >= 1 && DEPTH <= RW), "ffn_probe: DEPTH must be 1..C/8");
static_assert(CLUSTER == 1 || (CLUSTER == 8 && GROUPS % 8 == 0), "ffn_probe: CLUSTER 1 or 8");
#define FFN_CLUSTERED (CLUSTER > 1 && __CUDA_ARCH__ >= 900)

struct gj_ffn_row {
    uint4 g[PER], u[PER];
    uint16 dg[PER], du[PER];
};

GJ_DEVICE void ffn_load_row(gj_ffn_row& w, const uint8* gate, const uint8* up, int n_ff, int row,
                            int lane) {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int u = min(lane + 32 * i, UNITS - 1);  // a lane past the row end repeats a unit
        w.g[i] = ld_stream_u32x4(gate + (size_t)row * (K / 2) + 16 * u);
        w.u[i] = ld_stream_u32x4(up + (size_t)row * (K / 2) + 16 * u);
        w.dg[i] = ld_nc_u16(gate + (size_t)n_ff * (K / 2) + ((size_t)row * UNITS + u) * 2);
        w.du[i] = ld_nc_u16(up + (size_t)n_ff * (K / 2) + ((size_t)row * UNITS + u) * 2);
    }
}

// bytes from global src to shared dst in 16-byte copies spread over the block.
GJ_DEVICE void ffn_copy(uint8* dst, const uint8* src, int bytes) {
    for (int c = threadIdx.x; c < bytes / 16; c += THREADS)
        cp_async_cg16(smem_addr(dst + 16 * c), src + 16 * (size_t)c);
}

// y[0..3] += v as one reduction at L2 (sm_90), else four.
GJ_DEVICE void ffn_red_add4(float* p, float4 v) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
#else
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v.x) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p + 1), "f"(v.y) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p + 2), "f"(v.z) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p + 3), "f"(v.w) : "memory");
#endif
}

#if FFN_CLUSTERED
// The float4 at `p` (shared memory) of block `rank` of the cluster.
GJ_DEVICE float4 ffn_cluster_load4(const float4* p, unsigned rank) {
    uint32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"(smem_addr(p)), "r"(rank));
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
    return v;
}
#endif

// One gate|up row pair's GeGLU product over this lane's units (summed over the warp by the
// caller): gq / uq the rows' nibble bytes, gd / ud their scales.
struct gj_ffn_frag {
    int4 lo[PER], hi[PER];
    float2 ds[PER];
};
GJ_DEVICE float2 ffn_row_dots(const uint4* gq, const uint4* uq, const uint16* gd, const uint16* ud,
                              const gj_ffn_frag& x, int lane) {
    float sg = 0.0f, su = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int u = lane + 32 * i;
        if (u >= UNITS) continue;
        const uint4 a = gq[i], b = uq[i];
        int32 s = gj_q4_dot8(a.x, a.y, x.lo[i].x, x.lo[i].y, x.hi[i].x, x.hi[i].y, 0);
        s = gj_q4_dot8(a.z, a.w, x.lo[i].z, x.lo[i].w, x.hi[i].z, x.hi[i].w, s);
        sg += f16_to_f32(gd[i]) * (x.ds[i].x * (float)s - 8.0f * x.ds[i].y);
        s = gj_q4_dot8(b.x, b.y, x.lo[i].x, x.lo[i].y, x.hi[i].x, x.hi[i].y, 0);
        s = gj_q4_dot8(b.z, b.w, x.lo[i].z, x.lo[i].w, x.hi[i].z, x.hi[i].w, s);
        su += f16_to_f32(ud[i]) * (x.ds[i].x * (float)s - 8.0f * x.ds[i].y);
    }
    return make_float2(sg, su);
}

template <bool kAdd>
GJ_DEVICE void ffn_geglu_down_body(const uint8* __restrict__ gate, const uint8* __restrict__ up,
                                   const uint8* __restrict__ down, const uint32* __restrict__ xq,
                                   const float2* __restrict__ xds, float* __restrict__ y,
                                   float* __restrict__ g_out) {
    extern __shared__ uint4 ffn_smem[];
    uint8* dq = (uint8*)ffn_smem;              // SB x D x 16 nibble bytes
    uint16* dd = (uint16*)(dq + SB * D * 16);  // SB x D fp16 scales
    float4* part = (float4*)(dd + SB * D);     // CLUSTER 8: this block's partial D-vector
    uint8* gu = (uint8*)(part + (CLUSTER > 1 ? GROUPS : 0));  // GU_SMEM: gate, up nibbles, scales
    __shared__ float4 g4[C / 4];                              // the block's GeGLU products
    __shared__ uint32 gq[C / 4];                              // their Q8_1 form
    __shared__ float2 gds[SB];
    const int n_ff = gridDim.x * C;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int cb0 = blockIdx.x * SB;
    const int r0 = blockIdx.x * C + warp * RW;

    // Every weight this block reads, before the wait: no kernel writes them.
#if GU_SMEM
    ffn_copy(gu, gate + (size_t)blockIdx.x * C * (K / 2), C * K / 2);
    ffn_copy(gu + C * K / 2, up + (size_t)blockIdx.x * C * (K / 2), C * K / 2);
    ffn_copy(gu + C * K, gate + (size_t)n_ff * (K / 2) + (size_t)blockIdx.x * C * (K / 16),
             C * K / 16);
    ffn_copy(gu + C * K + C * K / 16,
             up + (size_t)n_ff * (K / 2) + (size_t)blockIdx.x * C * (K / 16), C * K / 16);
    cp_async_commit();
#else
    gj_ffn_row w[DEPTH];
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) ffn_load_row(w[j], gate, up, n_ff, r0 + j, lane);
#endif
    ffn_copy(dq, down + (size_t)cb0 * D * 16, SB * D * 16);
    ffn_copy((uint8*)dd, down + (size_t)n_ff / 32 * D * 16 + (size_t)cb0 * D * 2, SB * D * 2);
    cp_async_commit();
    gj_grid_sync();

    gj_ffn_frag x;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int u = min(lane + 32 * i, UNITS - 1);
        x.lo[i] = __ldg((const int4*)xq + 2 * u);
        x.hi[i] = __ldg((const int4*)xq + 2 * u + 1);
        x.ds[i] = __ldg(xds + u);
    }
    float* g = (float*)g4;
#if GU_SMEM
    cp_async_wait<1>();
    __syncthreads();
#pragma unroll
    for (int j = 0; j < RW; ++j) {
        const int rl = warp * RW + j;  // the block's row
        uint4 a[PER], b[PER];
        uint16 da[PER], db[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int u = min(lane + 32 * i, UNITS - 1);
            a[i] = *(const uint4*)(gu + (size_t)rl * (K / 2) + 16 * u);
            b[i] = *(const uint4*)(gu + C * K / 2 + (size_t)rl * (K / 2) + 16 * u);
            da[i] = *(const uint16*)(gu + C * K + ((size_t)rl * UNITS + u) * 2);
            db[i] = *(const uint16*)(gu + C * K + C * K / 16 + ((size_t)rl * UNITS + u) * 2);
        }
        const float2 s = ffn_row_dots(a, b, da, db, x, lane);
        const float sg = warp_sum(s.x), su = warp_sum(s.y);
        if (lane == 0) g[rl] = gelu_tanh(sg) * su;
    }
#else
#pragma unroll
    for (int j = 0; j < RW; ++j) {
        const gj_ffn_row& c = w[j % DEPTH];
        const float2 s = ffn_row_dots(c.g, c.u, c.dg, c.du, x, lane);
        // The row DEPTH ahead takes this row's registers once they are summed.
        if (j + DEPTH < RW) ffn_load_row(w[j % DEPTH], gate, up, n_ff, r0 + j + DEPTH, lane);
        const float sg = warp_sum(s.x), su = warp_sum(s.y);
        if (lane == 0) g[warp * RW + j] = gelu_tanh(sg) * su;
    }
#endif
    __syncthreads();
    if (warp == 0) {  // lanes past C / 4 repeat the groups below them; their shuffles stay in-group
        const float4 v = g4[lane % (C / 4)];
        float2 d;
        const uint32 packed = quantize_q8_1_group8(v, &d);
        if (lane < C / 4) {
            gq[lane] = packed;
            if (lane % 8 == 0) gds[lane / 8] = d;
            if (g_out) ((float4*)g_out)[blockIdx.x * (C / 4) + lane] = v;
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // The down slice: y[j] += sum over this block's 32-column blocks of W_down[j, cb] . q8(g),
    // rows 4t .. 4t + 3 per thread and pass.
    const int4* gq4 = (const int4*)gq;
    for (int t = threadIdx.x; t < GROUPS; t += THREADS) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int sb = 0; sb < SB; ++sb) {
            const int4 xl = gq4[2 * sb], xh = gq4[2 * sb + 1];
            const float2 xd = gds[sb];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int slot = sb * D + i * GROUPS + t;
                const uint4 q = *(const uint4*)(dq + (size_t)slot * 16);
                int32 s = gj_q4_dot8(q.x, q.y, xl.x, xl.y, xh.x, xh.y, 0);
                s = gj_q4_dot8(q.z, q.w, xl.z, xl.w, xh.z, xh.w, s);
                acc[i] += f16_to_f32(dd[slot]) * (xd.x * (float)s - 8.0f * xd.y);
            }
        }
        const float4 v = make_float4(acc[0], acc[1], acc[2], acc[3]);
#if FFN_CLUSTERED
        part[t] = v;
#else
        if (kAdd)
            ffn_red_add4(y + 4 * t, v);
        else if (v.x == 12345.0f)  // keep the sums live (timing only)
            ((float4*)y)[t] = v;
#endif
    }
#if FFN_CLUSTERED
    // The cluster's partials summed in rank order, this block's eighth of the rows each.
    gj_cluster_sync();
    constexpr int kShare = GROUPS / CLUSTER;
    const int first = (int)gj_cluster_rank() * kShare;
    for (int t = threadIdx.x; t < kShare; t += THREADS) {
        float4 v = ffn_cluster_load4(part + first + t, 0);
#pragma unroll
        for (int r = 1; r < CLUSTER; ++r) {
            const float4 o = ffn_cluster_load4(part + first + t, r);
            v = make_float4(v.x + o.x, v.y + o.y, v.z + o.z, v.w + o.w);
        }
        if (kAdd)
            ffn_red_add4(y + 4 * (first + t), v);
        else if (v.x == 12345.0f)
            ((float4*)y)[first + t] = v;
    }
    gj_cluster_sync();  // no block leaves while another reads its partial
#endif
}

#if FFN_CLUSTERED
#define FFN_ENTRY \
    extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
#else
#define FFN_ENTRY extern "C" __global__ void __launch_bounds__(THREADS)
#endif

FFN_ENTRY ffn_geglu_down(const uint8* gate, const uint8* up, const uint8* down, const uint32* xq,
                         const float2* xds, float* y, float* g_out) {
    ffn_geglu_down_body<true>(gate, up, down, xq, xds, y, g_out);
}

FFN_ENTRY ffn_geglu_down_noadd(const uint8* gate, const uint8* up, const uint8* down,
                               const uint32* xq, const float2* xds, float* y, float* g_out) {
    ffn_geglu_down_body<false>(gate, up, down, xq, xds, y, g_out);
}
