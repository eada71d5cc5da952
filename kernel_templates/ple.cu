// ple: the per-layer-embedding (PLE) elementwise steps of E2B/E4B.
//
// ple_finish, once per token before layer 0 (spec section 2.2): from the context projection
// ctx = per_layer_model_proj . e and the gathered, sqrt(P)-scaled token rows tok (embed_rows),
//   ple[t][l] = (RMSNorm(ctx[t][l] * inv_sqrt_d) * proj_norm_w + tok[t][l]) * (1 / sqrt(2))
// with the norm over each layer's P-slice. One warp per slice.
//
// gelu_mul / gelu_mul_q8, the PLE injection of layer l (spec section 2.3 step 8):
//   g[t][j] = gelu_tanh(gate[t][j]) * other[t * other_stride + j]
// where gate = inp_gate . x ([T][P]) and other = ple + l * P with stride L * P. gelu_mul writes
// fp32 g (float-weight models); gelu_mul_q8 writes g as Q8_1 activations (int8 [T][P] plus
// float2 {d, d * sum} per 32) for the int8 matvec of the PLE projection, saving a quantize launch.
//
// Constants (prologue #defines):
//   P         PLE width: a multiple of 32
//   N_LAYERS  L (only specs with ple_finish define it; gelu_mul does not depend on it)
// Launch: block 128 threads for every entry.
//   ple_finish:  grid ceil(T * L / 4)      (one warp per P-slice)
//   gelu_mul:    grid ceil(T * P / 128)    (one element per thread)
//   gelu_mul_q8: grid ceil(T * P / 512)    (4 consecutive elements per thread)
//   gelu_mul_inplace: grid ceil(T * P / 128)
// Entries (ple_finish when N_LAYERS is defined, else gelu_mul and gelu_mul_q8):
//   ple_finish(ctx, tok, proj_norm_w, ple_out, T, inv_sqrt_d, eps)   ple_out may alias ctx
//   gelu_mul(gate, other, other_stride, out, T)
//   gelu_mul_q8(gate, other, other_stride, yq, yds, T)
//   gelu_mul_inplace(gate, y, T): y = gelu_tanh(gate) * y over [T][P]; the GeGLU of an FFN whose
//     float gate and up products come from two cuBLAS calls (P is then the FFN width)
//   gelu_mul_f16(gate, up, out, T): out = f16(gelu_tanh(gate) * up) over [T][P], 4 values per
//     thread (grid ceil(T * P / 512)): that GeGLU written straight as the F16 input of the down
//     projection's cuBLAS product, the value gelu_mul_inplace and f32_to_f16 would give
//   gelu_mul_pair(gu, y, T), gelu_mul_f16_pair(gu, out, T): the same two from one cuBLAS product
//     of the gate and up copies side by side, gu [T][2P] (each token's gate row, then its up
//     row), into y [T][P] fp32 / out [T][P] f16; 4 values per thread (grid ceil(T * P / 512))
#include "gj_ptx.cuh"

static_assert(P % 32 == 0 && P > 0, "ple: P must be a positive multiple of 32");

#define GJ_PLE_THREADS 128

#ifdef N_LAYERS
static_assert(N_LAYERS > 0, "ple: N_LAYERS must be positive");

extern "C" __global__ void __launch_bounds__(GJ_PLE_THREADS)
    ple_finish(const float* ctx, const float* __restrict__ tok,
               const float* __restrict__ proj_norm_w, float* ple_out, int T, float inv_sqrt_d,
               float eps) {
    gj_grid_sync();
    constexpr int kPerLane = P / 32;
    const int slice = blockIdx.x * (GJ_PLE_THREADS / 32) + threadIdx.x / 32;  // t * L + l
    const int lane = threadIdx.x % 32;
    if (slice >= T * N_LAYERS) return;  // whole warps leave together
    const size_t base = (size_t)slice * P;
    float c[kPerLane];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        c[k] = ctx[base + k * 32 + lane] * inv_sqrt_d;
        ss = fmaf(c[k], c[k], ss);
    }
    ss = warp_sum<32>(ss);
    const float inv = rsqrt_refined(ss * (1.0f / P) + eps);
    const float mix = 0.70710677f;  // float(1 / sqrt(2))
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
        const int j = k * 32 + lane;
        ple_out[base + j] = (c[k] * inv * __ldg(proj_norm_w + j) + __ldg(tok + base + j)) * mix;
    }
}
#else

extern "C" __global__ void __launch_bounds__(GJ_PLE_THREADS)
    gelu_mul(const float* __restrict__ gate, const float* __restrict__ other, int other_stride,
             float* __restrict__ out, int T) {
    gj_grid_sync();
    const int i = blockIdx.x * GJ_PLE_THREADS + threadIdx.x;
    if (i >= T * P) return;
    const int t = i / P, j = i % P;
    out[i] = gelu_tanh(gate[i]) * other[(size_t)t * other_stride + j];
}

extern "C" __global__ void __launch_bounds__(GJ_PLE_THREADS)
    gelu_mul_q8(const float* __restrict__ gate, const float* __restrict__ other, int other_stride,
                uint32* __restrict__ yq, float2* __restrict__ yds, int T) {
    gj_grid_sync();
    const int i = blockIdx.x * GJ_PLE_THREADS + threadIdx.x;  // group of 4 values
    // Groups of 8 lanes are whole 32-blocks of one token (P % 32 == 0), so liveness is uniform
    // within each group and the group shuffles of quantize_q8_1_group8 stay within their block.
    const bool live = i < T * (P / 4);
    float4 g = make_float4(0.f, 0.f, 0.f, 0.f);
    if (live) {
        const int t = i / (P / 4), j = 4 * (i % (P / 4));
        const float4 a = __ldg((const float4*)gate + i);
        g = gelu_mul4(a, other + (size_t)t * other_stride + j);
    }
    float2 ds;
    const uint32 packed = quantize_q8_1_group8(g, &ds);
    if (!live) return;
    yq[i] = packed;
    if (i % 8 == 0) yds[i / 8] = ds;
}

extern "C" __global__ void __launch_bounds__(GJ_PLE_THREADS)
    gelu_mul_inplace(const float* __restrict__ gate, float* y, int T) {
    gj_grid_sync();
    const int i = blockIdx.x * GJ_PLE_THREADS + threadIdx.x;
    if (i >= T * P) return;
    y[i] = gelu_tanh(gate[i]) * y[i];
}

// Group i of 4 values of a [T][P] GeGLU, gelu_tanh(gate) * up, from gu [T][2P] (each token's
// gate half, then its up half).
GJ_DEVICE float4 gj_geglu_pair4(const float4* __restrict__ gu, int i) {
    const int t = i / (P / 4), c = i - t * (P / 4);
    const float4 g = __ldg(gu + (size_t)t * (P / 2) + c);
    const float4 u = __ldg(gu + (size_t)t * (P / 2) + P / 4 + c);
    return make_float4(gelu_tanh(g.x) * u.x, gelu_tanh(g.y) * u.y, gelu_tanh(g.z) * u.z,
                       gelu_tanh(g.w) * u.w);
}

extern "C" __global__ void __launch_bounds__(GJ_PLE_THREADS)
    gelu_mul_pair(const float4* __restrict__ gu, float4* __restrict__ y, int T) {
    gj_grid_sync();
    const int i = blockIdx.x * GJ_PLE_THREADS + threadIdx.x;  // group of 4 values
    if (i < T * (P / 4)) y[i] = gj_geglu_pair4(gu, i);
}

extern "C" __global__ void __launch_bounds__(GJ_PLE_THREADS)
    gelu_mul_f16_pair(const float4* __restrict__ gu, uint2* __restrict__ out, int T) {
    gj_grid_sync();
    const int i = blockIdx.x * GJ_PLE_THREADS + threadIdx.x;  // group of 4 values
    if (i >= T * (P / 4)) return;
    const float4 v = gj_geglu_pair4(gu, i);
    out[i] = make_uint2(pack_f16x2(v.x, v.y), pack_f16x2(v.z, v.w));
}

extern "C" __global__ void __launch_bounds__(GJ_PLE_THREADS)
    gelu_mul_f16(const float4* __restrict__ gate, const float4* __restrict__ up,
                 uint2* __restrict__ out, int T) {
    gj_grid_sync();
    const int i = blockIdx.x * GJ_PLE_THREADS + threadIdx.x;  // group of 4 values
    if (i >= T * (P / 4)) return;
    const float4 g = __ldg(gate + i), u = __ldg(up + i);
    out[i] = make_uint2(pack_f16x2(gelu_tanh(g.x) * u.x, gelu_tanh(g.y) * u.y),
                        pack_f16x2(gelu_tanh(g.z) * u.z, gelu_tanh(g.w) * u.w));
}
#endif
