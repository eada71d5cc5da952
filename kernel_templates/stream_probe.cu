// stream_probe.cu: can a decode matvec with few, resident blocks keep HBM busy, and so afford to
// make its own input (a norm) in every block? (tests/gpu/gpu_test_stream_probe.cpp; issue 13: the
// norm launches left in a decode layer, and step 2's per-model decode kernel.)
//
// The engine's matvecs load weights into registers and run many blocks in waves (E4B's GeGLU:
// 10240 blocks): HBM stays busy because new blocks take over as others finish. A prologue per
// block would then be repeated 10240 times, and a grid of fewer blocks looping over row groups
// measured slower (2026-11-28: -7..-11% end to end at 4 blocks per SM). This probe streams the
// weights through shared memory instead: each block keeps STAGES row groups of copies in flight
// (cp.async, issued before the grid wait, since no kernel writes weights), so a grid of a few
// blocks per SM has as many bytes in flight as the waves had, and a prologue runs once per block.
//
// One FFN gate|up pair, y = gelu_tanh(W_gate h) * (W_up h), split Q4_0 weights (the engine's
// split planes, matvec_q4_0.cu: [n][K/2] nibble bytes, then [n][K/32] fp16 scales), h in Q8_1:
//   stream_geglu_q8    h's Q8_1 form read from memory (as the engine's GeGLU reads it);
//   stream_geglu_norm  h made by the block itself from the attention output u and the residual
//                      x: x' = x + rmsnorm(u) w1, h = rmsnorm(x') w2 (the engine's post-attention
//                      norm pair, rmsnorm.cu ADD NORM2 QUANT), then quantized to Q8_1 in shared
//                      memory; block 0 stores x' (to x_out: the other blocks still read x).
// Constants: K (a multiple of 256), THREADS (a multiple of 32; one warp per gate|up row pair of a
// row group, so a group is THREADS / 32 rows), STAGES (row groups in flight per block, >= 2).
// Launch: any grid (a few blocks per SM), block THREADS, dynamic shared memory SMEM (the spec's:
// STAGES * STAGE_BYTES + K + K / 32 * 8 + 2 * WARPS * 4); n_rows a multiple of the group.
//
// A second question, the launch after the GeGLU: the down projection reads the GeGLU product's
// Q8_1 form, made by a quantize_q8_1 launch, because a block of the engine's GeGLU holds 2-4
// rows and a Q8_1 block is 32 (the tickets that let one block of 32 rows quantize them measured
// slower, 2026-11-29). A block that computes 32 whole rows quantizes them itself:
//   geglu_rows32_q8   block 256 threads, grid n_rows / 32; warp w computes rows 4w .. 4w + 3 of
//                     the block's 32 (its lanes over the row's units, one row's weights in
//                     flight while the row before is summed), then warp 0 quantizes the 32
//                     products (yq: 8 words, yds: one {d, d * sum} per block), as quantize_q8_1
//                     does, bit for bit.
#include "gj_ptx.cuh"

#define WARPS (THREADS / 32)
#define GROUP_ROWS WARPS  // rows of each matrix per row group
#define UNITS (K / 32)
#define QBYTES (K / 2)   // nibble bytes of a row
#define DBYTES (K / 16)  // scale bytes of a row
#define STAGE_BYTES (2 * GROUP_ROWS * (QBYTES + DBYTES))
#define VEC (K / 4)  // float4 of a row

static_assert(K % 256 == 0, "stream_probe: K must be a multiple of 256 (16-byte scale rows)");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "stream_probe: THREADS");
static_assert(STAGES >= 2 && STAGES <= 8, "stream_probe: STAGES must be 2..8");
static_assert(VEC % 32 == 0, "stream_probe: whole warps per float4 pass (quantize groups)");

// Row group `group`'s weights into stage `st`: [gate nibbles][up nibbles][gate scales][up scales],
// each part GROUP_ROWS rows, contiguous in both places, in 16-byte copies spread over the block.
GJ_DEVICE void stream_issue(uint8* st, const uint8* gate, const uint8* up, int n_rows, int group) {
    constexpr int kQ = GROUP_ROWS * QBYTES / 16, kD = GROUP_ROWS * DBYTES / 16;
    const size_t r0 = (size_t)group * GROUP_ROWS;
    for (int c = threadIdx.x; c < 2 * (kQ + kD); c += THREADS) {
        const uint8* src;
        if (c < kQ)
            src = gate + r0 * QBYTES + 16 * c;
        else if (c < 2 * kQ)
            src = up + r0 * QBYTES + 16 * (c - kQ);
        else if (c < 2 * kQ + kD)
            src = gate + (size_t)n_rows * QBYTES + r0 * DBYTES + 16 * (c - 2 * kQ);
        else
            src = up + (size_t)n_rows * QBYTES + r0 * DBYTES + 16 * (c - 2 * kQ - kD);
        cp_async_cg16(smem_addr(st + 16 * c), src);
    }
}

// Sum of v over the block; every thread gets it. `red` is WARPS floats of its own.
GJ_DEVICE float stream_block_sum(float v, float* red) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < WARPS; ++k) t += red[k];
    return t;
}

GJ_DEVICE float4 f4_fma(float4 a, float s, float4 b, float4 c) {  // a + s * b * c
    return make_float4(a.x + s * b.x * c.x, a.y + s * b.y * c.y, a.z + s * b.z * c.z,
                       a.w + s * b.w * c.w);
}

template <bool kNorm>
GJ_DEVICE void stream_geglu(const uint8* __restrict__ gate, const uint8* __restrict__ up,
                            int n_rows, const uint32* __restrict__ xq_in,
                            const float2* __restrict__ xds_in, const float* __restrict__ u_in,
                            const float* __restrict__ x_in, const float* __restrict__ w1,
                            const float* __restrict__ w2, float* __restrict__ x_out, float eps,
                            float* __restrict__ y) {
    extern __shared__ uint4 stream_smem[];
    uint8* stages = (uint8*)stream_smem;
    uint32* xs = (uint32*)(stages + STAGES * STAGE_BYTES);  // h's int8, 4 per word
    float2* xds = (float2*)(xs + K / 4);                    // {d, d * sum} per 32
    float* red = (float*)(xds + UNITS);                     // 2 x WARPS
    const int groups = n_rows / GROUP_ROWS;
    const int first = blockIdx.x, step = gridDim.x;

    // Weights first, before the wait: no kernel writes them.
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
        if (first + s * step < groups)
            stream_issue(stages + s * STAGE_BYTES, gate, up, n_rows, first + s * step);
        cp_async_commit();
    }

    constexpr int kPasses = (VEC + THREADS - 1) / THREADS;
    const float4* x4 = (const float4*)x_in;
    float4 xv[kPasses], w1v[kPasses];
    if constexpr (kNorm) {
        // The residual was written two kernels back, the norm weights never: safe before the
        // wait (gj_ptx.cuh, programmatic dependent launch).
#pragma unroll
        for (int j = 0; j < kPasses; ++j) {
            const int f = threadIdx.x + j * THREADS;
            if (f < VEC) {
                xv[j] = x4[f];
                w1v[j] = ((const float4*)w1)[f];
            }
        }
    }
    gj_grid_sync();

    if constexpr (kNorm) {
        float4 uv[kPasses];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < kPasses; ++j) {
            const int f = threadIdx.x + j * THREADS;
            if (f < VEC) {
                uv[j] = ((const float4*)u_in)[f];
                ss += f4_sum_sq(uv[j]);
            }
        }
        const float s1 = rsqrtf(stream_block_sum(ss, red) / K + eps);
        float ss2 = 0.0f;
#pragma unroll
        for (int j = 0; j < kPasses; ++j) {
            const int f = threadIdx.x + j * THREADS;
            if (f < VEC) {
                xv[j] = f4_fma(xv[j], s1, uv[j], w1v[j]);
                ss2 += f4_sum_sq(xv[j]);
                if (blockIdx.x == 0) ((float4*)x_out)[f] = xv[j];
            }
        }
        const float s2 = rsqrtf(stream_block_sum(ss2, red + WARPS) / K + eps);
#pragma unroll
        for (int j = 0; j < kPasses; ++j) {
            const int f = threadIdx.x + j * THREADS;
            if (j * THREADS + (int)(threadIdx.x & ~31u) < VEC) {  // whole warps (VEC % 32 == 0)
                const float4 w2v = ((const float4*)w2)[f];
                const float4 h = make_float4(xv[j].x * s2 * w2v.x, xv[j].y * s2 * w2v.y,
                                             xv[j].z * s2 * w2v.z, xv[j].w * s2 * w2v.w);
                float2 ds;
                xs[f] = quantize_q8_1_group8(h, &ds);
                if (f % 8 == 0) xds[f / 8] = ds;
            }
        }
    } else {
        for (int f = threadIdx.x; f < K / 4; f += THREADS) xs[f] = xq_in[f];
        for (int u = threadIdx.x; u < UNITS; u += THREADS) xds[u] = xds_in[u];
    }
    __syncthreads();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int4* xs4 = (const int4*)xs;
    for (int i = 0; first + i * step < groups; ++i) {
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        const uint8* st = stages + (i % STAGES) * STAGE_BYTES;
        const uint4* gq = (const uint4*)(st + warp * QBYTES);
        const uint4* uq = (const uint4*)(st + GROUP_ROWS * QBYTES + warp * QBYTES);
        const uint16* gd = (const uint16*)(st + 2 * GROUP_ROWS * QBYTES + warp * DBYTES);
        const uint16* ud = gd + GROUP_ROWS * DBYTES / 2;
        float sg = 0.0f, su = 0.0f;
        for (int u = lane; u < UNITS; u += 32) {
            const int4 lo = xs4[2 * u], hi = xs4[2 * u + 1];
            const float2 ds = xds[u];
            const uint4 a = gq[u], b = uq[u];
            int32 s = gj_q4_dot8(a.x, a.y, lo.x, lo.y, hi.x, hi.y, 0);
            s = gj_q4_dot8(a.z, a.w, lo.z, lo.w, hi.z, hi.w, s);
            sg += f16_to_f32(gd[u]) * (ds.x * (float)s - 8.0f * ds.y);
            s = gj_q4_dot8(b.x, b.y, lo.x, lo.y, hi.x, hi.y, 0);
            s = gj_q4_dot8(b.z, b.w, lo.z, lo.w, hi.z, hi.w, s);
            su += f16_to_f32(ud[u]) * (ds.x * (float)s - 8.0f * ds.y);
        }
        sg = warp_sum(sg);
        su = warp_sum(su);
        if (lane == 0) y[(size_t)(first + i * step) * GROUP_ROWS + warp] = gelu_tanh(sg) * su;
        __syncthreads();  // the stage is read: refill it
        const int next = first + (i + STAGES) * step;
        if (next < groups)
            stream_issue(stages + (i % STAGES) * STAGE_BYTES, gate, up, n_rows, next);
        cp_async_commit();
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    stream_geglu_q8(const uint8* gate, const uint8* up, int n_rows, const uint32* xq,
                    const float2* xds, float* y) {
    stream_geglu<false>(gate, up, n_rows, xq, xds, nullptr, nullptr, nullptr, nullptr, nullptr,
                        0.0f, y);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    stream_geglu_norm(const uint8* gate, const uint8* up, int n_rows, const float* u,
                      const float* x, const float* w1, const float* w2, float* x_out, float eps,
                      float* y) {
    stream_geglu<true>(gate, up, n_rows, nullptr, nullptr, u, x, w1, w2, x_out, eps, y);
}

// 32 rows per block, their Q8_1 form out (above). Each lane holds its units of one row's gate and
// up weights, the next row's loaded before this one is summed.
#define R32_PER ((UNITS + 31) / 32)  // units per lane

struct gj_r32_row {
    uint4 g[R32_PER], u[R32_PER];
    uint16 dg[R32_PER], du[R32_PER];
};

GJ_DEVICE void r32_load(gj_r32_row& w, const uint8* gate, const uint8* up, int n_rows, int row,
                        int lane) {
#pragma unroll
    for (int i = 0; i < R32_PER; ++i) {
        const int u = min(lane + 32 * i, UNITS - 1);  // a lane past the row end repeats a unit
        w.g[i] = ld_stream_u32x4(gate + (size_t)row * QBYTES + 16 * u);
        w.u[i] = ld_stream_u32x4(up + (size_t)row * QBYTES + 16 * u);
        w.dg[i] = ld_nc_u16(gate + (size_t)n_rows * QBYTES + ((size_t)row * UNITS + u) * 2);
        w.du[i] = ld_nc_u16(up + (size_t)n_rows * QBYTES + ((size_t)row * UNITS + u) * 2);
    }
}

extern "C" __global__ void __launch_bounds__(256)
    geglu_rows32_q8(const uint8* __restrict__ gate, const uint8* __restrict__ up, int n_rows,
                    const uint32* __restrict__ xq, const float2* __restrict__ xds,
                    float* __restrict__ y, uint32* __restrict__ yq, float2* __restrict__ yds) {
    __shared__ float4 out4[8];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = blockIdx.x * 32 + warp * 4;
    gj_r32_row w[2];
    r32_load(w[0], gate, up, n_rows, r0, lane);  // weights first: no kernel writes them
    gj_grid_sync();
    int4 lo[R32_PER], hi[R32_PER];
    float2 ds[R32_PER];
#pragma unroll
    for (int i = 0; i < R32_PER; ++i) {
        const int u = min(lane + 32 * i, UNITS - 1);
        lo[i] = __ldg((const int4*)xq + 2 * u);
        hi[i] = __ldg((const int4*)xq + 2 * u + 1);
        ds[i] = __ldg(xds + u);
    }
    float* out = (float*)out4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (j + 1 < 4) r32_load(w[(j + 1) % 2], gate, up, n_rows, r0 + j + 1, lane);
        const gj_r32_row& c = w[j % 2];
        float sg = 0.0f, su = 0.0f;
#pragma unroll
        for (int i = 0; i < R32_PER; ++i) {
            if (lane + 32 * i >= UNITS) continue;
            int32 s = gj_q4_dot8(c.g[i].x, c.g[i].y, lo[i].x, lo[i].y, hi[i].x, hi[i].y, 0);
            s = gj_q4_dot8(c.g[i].z, c.g[i].w, lo[i].z, lo[i].w, hi[i].z, hi[i].w, s);
            sg += f16_to_f32(c.dg[i]) * (ds[i].x * (float)s - 8.0f * ds[i].y);
            s = gj_q4_dot8(c.u[i].x, c.u[i].y, lo[i].x, lo[i].y, hi[i].x, hi[i].y, 0);
            s = gj_q4_dot8(c.u[i].z, c.u[i].w, lo[i].z, lo[i].w, hi[i].z, hi[i].w, s);
            su += f16_to_f32(c.du[i]) * (ds[i].x * (float)s - 8.0f * ds[i].y);
        }
        sg = warp_sum(sg);
        su = warp_sum(su);
        if (lane == 0) out[warp * 4 + j] = gelu_tanh(sg) * su;
    }
    __syncthreads();
    if (warp == 0) {  // lanes 8..31 repeat lanes 0..7's groups; their shuffles stay in-group
        const float4 v = out4[lane % 8];
        float2 d;
        const uint32 packed = quantize_q8_1_group8(v, &d);
        if (lane < 8) {
            yq[blockIdx.x * 8 + lane] = packed;
            if (y) ((float4*)y)[blockIdx.x * 8 + lane] = v;
            if (lane == 0) yds[blockIdx.x] = d;
        }
    }
}
