// rmsnorm: y = x / sqrt(mean(x^2) + eps) [* w] [+ residual] over rows of N floats, optionally
// also emitting the result as Q8_1 activations (int8 + per-32 {scale, scale * sum}) for the dp4a
// matvecs, so a norm that feeds a matmul costs one launch and no fp32 round trip.
//
// Uses: the model's pre-norms (attn_norm, ffn_norm, output_norm: WEIGHT=1 QUANT=1), post-norms
// with the residual add (post_attention_norm, post_ffw_norm, PLE post_norm: WEIGHT=1 ADD=1),
// per-head Q/K norms (N = head_dim, rows = heads, weight shared by all heads) and the weightless
// V-norm (WEIGHT=0).
//
// Constants (prologue #defines):
//   N       row width in floats; a multiple of 4 (of 32 when QUANT=1)
//   TPR     threads per row: 8, 16 or 32, or a multiple of 32 up to 1024
//   RPB     rows per block (>1 only when TPR <= 32, so a row never spans warps partially)
//   WEIGHT  1: multiply by w[N] (fp32, no +1 offset: Gemma 4 stores norm weights as-is)
//   QUANT   1: also write yq/yds (requires N % 32 == 0 and TPR % 8 == 0)
//   ADD     1: y = residual + normed (residual may alias y); excludes QUANT
// Launch: block TPR * RPB threads, grid ceil(rows / RPB).
// Entry: rmsnorm(x, w, residual, y, yq, yds, rows, eps). Rows are contiguous (stride N). y may be
// null when only the quantized output is wanted; y may alias x (every element is read and written
// by the same thread).
#include "gj_ptx.cuh"

#ifndef TPR
#define TPR 32
#endif
#ifndef RPB
#define RPB 1
#endif
#ifndef WEIGHT
#define WEIGHT 1
#endif
#ifndef QUANT
#define QUANT 0
#endif
#ifndef ADD
#define ADD 0
#endif

static_assert(N % 4 == 0, "rmsnorm: N must be a multiple of 4 (float4 rows)");
static_assert((TPR <= 32 && (32 % TPR) == 0) || (TPR % 32 == 0 && TPR <= 1024),
              "rmsnorm: TPR must divide 32 or be a multiple of 32 up to 1024");
static_assert(RPB == 1 || TPR <= 32, "rmsnorm: several rows per block need TPR <= 32");
static_assert(TPR * RPB <= 1024, "rmsnorm: block too large");
static_assert(!QUANT || (N % 32 == 0 && TPR % 8 == 0),
              "rmsnorm: QUANT needs N % 32 == 0 and TPR % 8 == 0 (8 lanes per 32-block)");
static_assert(!(QUANT && ADD), "rmsnorm: QUANT and ADD together make no sense (quantize the "
                               "next norm's output instead)");

#define VEC (N / 4)                      // float4 per row
#define VPT ((VEC + TPR - 1) / TPR)      // float4 per thread
#define WARPS_PER_ROW (TPR > 32 ? TPR / 32 : 1)

extern "C" __global__ void __launch_bounds__(TPR * RPB)
    rmsnorm(const float* __restrict__ x, const float* __restrict__ w, const float* residual,
            float* y, uint32* __restrict__ yq, float2* __restrict__ yds, int rows, float eps) {
    const int tr = threadIdx.x % TPR;  // thread within its row
    const int row = blockIdx.x * RPB + threadIdx.x / TPR;
    // Rows past the end still run the shuffles below (they must stay converged), reading row 0.
    const bool live = row < rows;
    const int r = live ? row : 0;
    const float4* xr = (const float4*)(x + (size_t)r * N);

    float4 v[VPT];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = k * TPR + tr;
        v[k] = (VEC % TPR == 0 || i < VEC) ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }

    constexpr int kReduceWidth = TPR < 32 ? TPR : 32;
    ss = warp_sum<kReduceWidth>(ss);
#if TPR > 32
    __shared__ float partial[WARPS_PER_ROW];
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0.0f;
#pragma unroll
    for (int k = 0; k < WARPS_PER_ROW; ++k) ss += partial[k];
#endif
    // IEEE sqrt and division: one per row, and it keeps the kernel within ~1 ulp of the CPU.
    const float scale = 1.0f / sqrtf(ss * (1.0f / N) + eps);

#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = k * TPR + tr;
        const bool in_row = VEC % TPR == 0 || i < VEC;
        float4 o = make_float4(v[k].x * scale, v[k].y * scale, v[k].z * scale, v[k].w * scale);
#if WEIGHT
        if (in_row) {
            const float4 g = __ldg((const float4*)w + i);
            o.x *= g.x, o.y *= g.y, o.z *= g.z, o.w *= g.w;
        }
#endif
#if ADD
        if (in_row && live) {
            const float4 res = ((const float4*)(residual + (size_t)r * N))[i];
            o.x += res.x, o.y += res.y, o.z += res.z, o.w += res.w;
        }
#endif
        if (in_row && live && y != nullptr) ((float4*)(y + (size_t)r * N))[i] = o;
#if QUANT
        // Groups of 8 lanes hold whole 32-blocks (TPR % 8 == 0, VEC % 8 == 0), so a group is
        // entirely inside or outside the row and the group shuffles stay uniform.
        float2 ds;
        const uint32 packed = quantize_q8_1_group8(o, &ds);
        if (in_row && live) {
            yq[(size_t)r * VEC + i] = packed;
            if (i % 8 == 0) yds[(size_t)r * (N / 32) + i / 8] = ds;
        }
#endif
    }
}
