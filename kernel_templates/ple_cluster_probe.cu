// ple_cluster_probe.cu: the end of a PLE layer's decode chain in one launch instead of two?
// (tests/gpu/gpu_test_ple_cluster_probe.cpp; issue 13.) A decode step of E2B / E4B ends every
// layer with the PLE projection (D x P, small: 368 KB at E4B in Q4_0) and then the post-norm
// launch: x = (x + rmsnorm(p) w_post) * scale, h = rmsnorm(x) w_next in Q8_1 (the next layer's
// input). The norm needs all D outputs of the projection, which one launch of many blocks
// cannot share without tickets (measured slower). A thread-block cluster can: its blocks reduce
// their sums of squares through distributed shared memory at a cluster barrier, no global
// memory round trip, no launch.
//
// ple_proj_norm: one cluster of CLUSTER blocks (the whole grid); block `rank` owns rows
// [rank * RPB, (rank + 1) * RPB). Before the grid wait it copies its rows of W (split Q4_0:
// [D][P/2] nibble bytes, then [D][P/32] fp16 scales) into shared memory and loads its slices of x,
// the norm weights and the PLE input; after it: q8(gelu_tanh(gate) * other) as the _gelu_in
// prologue makes it, its RPB products, then the two norms, each sum of squares reduced over the
// cluster; it writes its rows of x and of h's Q8_1 form.
// Constants: D (a multiple of 32 * CLUSTER), P (a multiple of 256), CLUSTER (2..16), THREADS
// (a multiple of 32, at least P / 4 and D / CLUSTER / 4), SMEM (the weight bytes of a block).
// Launch: grid CLUSTER, block THREADS, dynamic shared memory SMEM. sm_90 (clusters); on older
// targets the entry traps.
#include "gj_cluster.cuh"
#include "gj_ptx.cuh"

#define WARPS (THREADS / 32)
#define UNITS (P / 32)     // 32-element units of a row
#define QB (P / 2)         // nibble bytes of a row
#define SB (P / 16)        // scale bytes of a row
#define RPB (D / CLUSTER)  // rows of a block

static_assert(P % 256 == 0 && UNITS <= 32 && 32 % UNITS == 0, "ple_cluster_probe: P");
static_assert(D % (32 * CLUSTER) == 0, "ple_cluster_probe: D / CLUSTER whole Q8_1 blocks");
static_assert(CLUSTER >= 2 && CLUSTER <= 16,
              "ple_cluster_probe: CLUSTER 2..16 (above 8 the launch allows non-portable sizes)");
static_assert(THREADS % 32 == 0 && THREADS >= P / 4 && THREADS >= RPB / 4,
              "ple_cluster_probe: a float4 of the input and of the block's rows per thread");

#if __CUDA_ARCH__ >= 900
// v into `slot` (a shared variable) of block `rank` of the cluster.
GJ_DEVICE void gj_cluster_store(float* slot, unsigned rank, float v) {
    uint32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"(smem_addr(slot)), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}
// The sum of v over the cluster's threads, the same in every block (partials added in rank
// order). `wred`: WARPS floats; `cred`: CLUSTER floats; both this reduction's own.
GJ_DEVICE float gj_cluster_sum(float v, float* wred, float* cred) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) wred[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < CLUSTER) {
        float b = 0.0f;
#pragma unroll
        for (int k = 0; k < WARPS; ++k) b += wred[k];
        gj_cluster_store(cred + gj_cluster_rank(), threadIdx.x, b);
    }
    gj_cluster_sync();
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < CLUSTER; ++k) t += cred[k];
    return t;
}
#endif

GJ_DEVICE float4 f4_scale(float4 a, float s) {
    return make_float4(a.x * s, a.y * s, a.z * s, a.w * s);
}
GJ_DEVICE float4 f4_mul(float4 a, float4 b) {
    return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

extern "C" __global__ void
#if __CUDA_ARCH__ >= 900
__cluster_dims__(CLUSTER, 1, 1)
#endif
    __launch_bounds__(THREADS)
        ple_proj_norm(const uint8* __restrict__ w, const float* __restrict__ gate,
                      const float* __restrict__ other, const float* __restrict__ x,
                      const float* __restrict__ w_post, const float* __restrict__ scale,
                      const float* __restrict__ w_next, float* __restrict__ x_out,
                      uint32* __restrict__ yq, float2* __restrict__ yds, float eps) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ uint4 ple_smem[];
    __shared__ __align__(16) uint32 xs[P / 4];
    __shared__ float2 xd[UNITS];
    __shared__ __align__(16) float pout[RPB];
    __shared__ float wred[2][WARPS], cred[2][CLUSTER];
    uint8* ws = (uint8*)ple_smem;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int r0 = (int)gj_cluster_rank() * RPB;

    // Weights, the PLE input and this block's slices of x and the norm weights: nothing the
    // kernel before writes (x was written two kernels back), so all before the wait.
    constexpr int kQ = RPB * QB / 16, kS = RPB * SB / 16;
    for (int c = t; c < kQ + kS; c += THREADS) {
        const uint8* src = c < kQ ? w + (size_t)r0 * QB + 16 * c
                                  : w + (size_t)D * QB + (size_t)r0 * SB + 16 * (c - kQ);
        cp_async_cg16(smem_addr(ws + 16 * c), src);
    }
    cp_async_commit();
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    const bool in_live = t < P / 4, row_live = t < RPB / 4;
    const float4 o4 = in_live ? __ldg((const float4*)other + t) : zero;
    const float4 x4 = row_live ? ((const float4*)(x + r0))[t] : zero;
    const float4 wp4 = row_live ? __ldg((const float4*)(w_post + r0) + t) : zero;
    const float4 wn4 = row_live ? __ldg((const float4*)(w_next + r0) + t) : zero;
    const float sc = __ldg(scale);
    gj_grid_sync();

    // q8(gelu(gate) * other): whole warps (P / 4 a multiple of 32 when P % 256 == 0).
    if ((t & ~31) < P / 4) {
        const float4 g4 = in_live ? ((const float4*)gate)[t] : zero;
        float2 ds;
        const uint32 packed = quantize_q8_1_group8(gelu_mul4(g4, o4), &ds);
        if (in_live) {
            xs[t] = packed;
            if (t % 8 == 0) xd[t / 8] = ds;
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Products: UNITS lanes per row, 32 / UNITS rows per warp at a time.
    const int4* xs4 = (const int4*)xs;
    const uint16* scales = (const uint16*)(ws + RPB * QB);
    const int u = lane % UNITS;
    for (int rr = warp * (32 / UNITS) + lane / UNITS; rr < RPB; rr += WARPS * (32 / UNITS)) {
        const uint4 q = ((const uint4*)ws)[rr * (QB / 16) + u];
        const int4 lo = xs4[2 * u], hi = xs4[2 * u + 1];
        const float2 ds = xd[u];
        int32 s = gj_q4_dot8(q.x, q.y, lo.x, lo.y, hi.x, hi.y, 0);
        s = gj_q4_dot8(q.z, q.w, lo.z, lo.w, hi.z, hi.w, s);
        float part = f16_to_f32(scales[rr * UNITS + u]) * (ds.x * (float)s - 8.0f * ds.y);
        part = warp_sum<UNITS>(part);
        if (u == 0) pout[rr] = part;
    }
    __syncthreads();

    // x = (x + rmsnorm(p) w_post) * scale, h = rmsnorm(x) w_next.
    const float4 p4 = row_live ? ((const float4*)pout)[t] : zero;
    const float s1 = rsqrt_refined(gj_cluster_sum(f4_sum_sq(p4), wred[0], cred[0]) / D + eps);
    const float4 pw = f4_mul(f4_scale(p4, s1), wp4);
    const float4 xn =
        make_float4((x4.x + pw.x) * sc, (x4.y + pw.y) * sc, (x4.z + pw.z) * sc, (x4.w + pw.w) * sc);
    const float s2 = rsqrt_refined(gj_cluster_sum(f4_sum_sq(xn), wred[1], cred[1]) / D + eps);
    if ((t & ~31) < RPB / 4) {  // warps with rows (RPB / 4 groups of 8 lanes are whole)
        float2 ds;
        const uint32 packed = quantize_q8_1_group8(f4_mul(f4_scale(xn, s2), wn4), &ds);
        if (row_live) {
            ((float4*)(x_out + r0))[t] = xn;
            yq[r0 / 4 + t] = packed;
            if (t % 8 == 0) yds[(r0 + 4 * t) / 32] = ds;
        }
    }
#else
    __trap();
#endif
}
