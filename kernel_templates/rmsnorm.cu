// rmsnorm: y = x / sqrt(mean(x^2) + eps) [* w] [+ residual] [* (*scale)] over rows of N floats,
// optionally followed by a second norm of that result and/or Q8_1 quantization (int8 + per-32
// {scale, scale * sum}) for the dp4a matvecs, so the norms around a residual update cost one
// launch and no fp32 round trip.
//
// Uses: the model's pre-norms (attn_norm, ffn_norm, output_norm: WEIGHT=1 QUANT=1), post-norms
// with the residual add (post_attention_norm, post_ffw_norm, PLE post_norm: WEIGHT=1 ADD=1), the
// layer output scale (ADD=1 SCALE=1: x = (x + post_norm(u)) * layer_output_scale), a post-norm
// chained with the next pre-norm (ADD=1 NORM2=1 [QUANT=1]: x += post_norm(u), then
// y2 = norm(x) * w2, e.g. post_attention_norm + ffn_norm), the PLE gate input (ADD=1 QUANT=1:
// the updated residual itself, quantized), per-head Q/K norms (N = head_dim, rows = heads,
// weight shared by all heads) and the weightless V-norm (WEIGHT=0).
//
// Constants (prologue #defines):
//   N       row width in floats; a multiple of 4 (of 32 when QUANT=1)
//   TPR     threads per row: 8, 16 or 32, or a multiple of 32 up to 1024
//   RPB     rows per block (>1 only when TPR <= 32, so a row never spans warps partially)
//   WEIGHT  1: multiply by w[N] (fp32, no +1 offset: Gemma 4 stores norm weights as-is)
//   QUANT   1: also write yq/yds: the quantized y2 when NORM2=1, else y (needs N % 32 == 0 and
//           TPR % 8 == 0); 2: write that output as f16 into yq instead ([rows][N] halves, yds
//           unused), the input of the F16 cuBLAS products of a prefill chunk
//   ADD     1: y = residual + normed (residual may alias y)
//   SCALE   1: y = (residual + normed) * (*scale), the scale read from device memory (needs ADD)
//   NORM2   1: y2 = y / sqrt(mean(y^2) + eps) * w2 (needs ADD)
//   PARTS   x is the sum of PARTS planes [rows][N] (plane z at x + z * rows * N), added in order
//           z = 0, 1, ... like mmq_reduce: the split-K partial products of the int8 GEMM reduced
//           here instead of in a pass of their own (needs ADD)
//   MOE_NORMS  1: besides y2, two more norms of the updated residual y with their own weights:
//           y3 = norm(y) * w3 (a MoE layer's router input) and y4 = norm(y) * w4 with its Q8_1
//           form yq4 / yds4 (the experts' pre-norm; y4, or yq4 and yds4, may be null: float
//           experts read y4, int8 ones the Q8_1 form), so a MoE layer's four norms of the post-
//           attention residual take one launch (needs NORM2 and QUANT)
//   X_BF16  1: x holds [rows][N] bf16 values instead of floats (read exactly as floats): a
//           tensor-parallel prefill chunk's all-reduced product, summed by NCCL in bf16, read
//           here without a conversion pass back to fp32 (PARTS 1). P > 1: x holds P bf16 rows
//           per row ([rows][P][N]), the P ranks' partial products that tp_push.cu stored into
//           this rank's window, summed here in fp32 in rank order 0, 1, ... (the same sum, bit
//           for bit, on every rank)
//   LSA_PEERS  P > 0: x is the sum of the P tensor-parallel ranks' partial products, each in its
//           rank's NCCL symmetric window at the same offset, summed here in rank order 0..P-1
//           (the same order on every rank, so every rank's residual stream stays bitwise alike).
//           After its grid wait each block meets the block of the same index on every other rank
//           at an NCCL LSA barrier (acquire-release: a rank's product, written by the kernel
//           before, is published by its arrival), then reads the P rows through the window's
//           peer pointers: a decode step's all-reduce in the norm, with no NCCL launch of its own.
//           Compiled against the NCCL headers of the library loaded (jit/nccl_device.h); NORM2
//           or SCALE, one plane, fp32 (the decode post-norms).
//   LSA_PUSH  1 (with LSA_PEERS): the ranks' products were pushed here by their matvecs
//           (matvec_common.cuh PUSH): rank p's in this rank's own window at x + p * slot floats,
//           so after the barrier the sum reads local memory only (no NVLink read on the path).
// Launch: block TPR * RPB threads, grid ceil(rows / RPB).
// Entries (rows contiguous, stride N):
//   SCALE = NORM2 = 0: rmsnorm(x, w, residual, y, yq, yds, rows, eps)
//   otherwise:         rmsnorm_ext(x, w, residual, y, scale, w2, y2, yq, yds, rows, eps)
//   LSA_PEERS > 0:     rmsnorm_ext_lsa(x_offset, win, comm, w, residual, y, scale, w2, y2, yq,
//                                      yds, rows, eps): x at byte x_offset of window `win` on
//                                      every rank; comm the ncclDevComm, by value
//   LSA_PUSH = 1:      rmsnorm_ext_lsa_push(x, slot, comm, w, residual, y, scale, w2, y2, yq,
//                                           yds, rows, eps): rank p's product at x + p * slot
//                                           (floats), all in this rank's window;
//                      lsa_window_pointers(win, offset, out): out[p] = the address of byte
//                                           `offset` of rank p's window, p < P (the push
//                                           matvecs' destinations, found once at setup)
//   MOE_NORMS = 1:     rmsnorm_moe(x, w, residual, y, w2, y2, yq, yds, w3, y3, w4, y4, yq4,
//                                  yds4, rows, eps)
// y (and y2) may be null when only the quantized output is wanted; y may alias x or residual
// (every element is read and written by the same thread; hence no __restrict__ on them).
#include "gj_ptx.cuh"

#ifndef LSA_PEERS
#define LSA_PEERS 0
#endif
#if LSA_PEERS
#include "gj_nccl_lsa.cuh"
#ifndef LSA_PUSH
#define LSA_PUSH 0
#endif
#if LSA_PUSH
#define GJ_LSA_PARAMS , const ncclDevComm &lsa_comm, size_t lsa_slot
#else
#define GJ_LSA_PARAMS , const ncclDevComm &lsa_comm, ncclWindow_t lsa_win, size_t lsa_offset
#endif
#else
#define LSA_PUSH 0
#define GJ_LSA_PARAMS
#endif

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
#ifndef SCALE
#define SCALE 0
#endif
#ifndef NORM2
#define NORM2 0
#endif
#ifndef PARTS
#define PARTS 1
#endif
#ifndef MOE_NORMS
#define MOE_NORMS 0
#endif
#ifndef X_BF16
#define X_BF16 0
#endif

static_assert(N % 4 == 0, "rmsnorm: N must be a multiple of 4 (float4 rows)");
static_assert((TPR <= 32 && (32 % TPR) == 0) || (TPR % 32 == 0 && TPR <= 1024),
              "rmsnorm: TPR must divide 32 or be a multiple of 32 up to 1024");
static_assert(RPB == 1 || TPR <= 32, "rmsnorm: several rows per block need TPR <= 32");
static_assert(TPR * RPB <= 1024, "rmsnorm: block too large");
static_assert(PARTS >= 1 && PARTS <= 8 && (PARTS == 1 || ADD),
              "rmsnorm: PARTS must be 1..8, and more than 1 only for a residual update (ADD)");
static_assert(X_BF16 >= 0 && X_BF16 <= 8 && (!X_BF16 || PARTS == 1),
              "rmsnorm: a bf16 input is one plane, or the sum of 2..8 ranks' products");
static_assert(
    !LSA_PEERS || (PARTS == 1 && !X_BF16 && !MOE_NORMS && (NORM2 || SCALE)),
    "rmsnorm: the ranks' sum is one fp32 plane per rank, read by a post-norm (rmsnorm_ext)");
static_assert(!LSA_PUSH || LSA_PEERS, "rmsnorm: LSA_PUSH is a form of the ranks' sum (LSA_PEERS)");
static_assert(QUANT >= 0 && QUANT <= 2, "rmsnorm: QUANT must be 0, 1 (Q8_1) or 2 (f16)");
static_assert(QUANT != 1 || (N % 32 == 0 && TPR % 8 == 0),
              "rmsnorm: QUANT needs N % 32 == 0 and TPR % 8 == 0 (8 lanes per 32-block)");
static_assert(!MOE_NORMS || (NORM2 && QUANT == 1 && !SCALE),
              "rmsnorm: MOE_NORMS extends the chained, quantized second norm (NORM2, QUANT)");
static_assert(ADD || !(SCALE || NORM2),
              "rmsnorm: SCALE and NORM2 apply to a residual update (ADD)");

#define VEC (N / 4)                  // float4 per row
#define VPT ((VEC + TPR - 1) / TPR)  // float4 per thread
#define WARPS_PER_ROW (TPR > 32 ? TPR / 32 : 1)

// Sum of v over the TPR threads of a row; every thread of the row gets it. `partial` is shared
// scratch of WARPS_PER_ROW floats (unused when a row fits in a warp), one per reduction.
GJ_DEVICE float gj_row_sum(float v, float* partial) {
    constexpr int kReduceWidth = TPR < 32 ? TPR : 32;
    v = warp_sum<kReduceWidth>(v);
#if TPR > 32
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0.0f;
#pragma unroll
    for (int k = 0; k < WARPS_PER_ROW; ++k) v += partial[k];
#endif
    return v;
}

// Quantizes float4 i of row r to Q8_1 and stores it when `store`. Groups of 8 lanes hold whole
// 32-blocks (TPR % 8 == 0, VEC % 8 == 0), so a group is entirely inside or outside the row and
// the group shuffles stay uniform; every lane must call it.
GJ_DEVICE void gj_quantize_store(float4 o, bool store, int r, int i, uint32* __restrict__ yq,
                                 float2* __restrict__ yds) {
#if QUANT == 2
    // f16 (round to nearest even, as f32_to_f16): 4 halves per float4.
    if (store)
        ((uint2*)yq)[(size_t)r * VEC + i] = make_uint2(pack_f16x2(o.x, o.y), pack_f16x2(o.z, o.w));
    (void)yds;
    return;
#endif
    float2 ds;
    const uint32 packed = quantize_q8_1_group8(o, &ds);
    if (store) {
        yq[(size_t)r * VEC + i] = packed;
        if (i % 8 == 0) yds[(size_t)r * (N / 32) + i / 8] = ds;
    }
}

GJ_DEVICE void gj_rmsnorm(const float* x, const float* __restrict__ w, const float* residual,
                          float* y, const float* __restrict__ out_scale,
                          const float* __restrict__ w2, float* y2, uint32* __restrict__ yq,
                          float2* __restrict__ yds, int rows, float eps GJ_LSA_PARAMS,
                          const float* __restrict__ w3 = nullptr, float* __restrict__ y3 = nullptr,
                          const float* __restrict__ w4 = nullptr, float* __restrict__ y4 = nullptr,
                          uint32* __restrict__ yq4 = nullptr, float2* __restrict__ yds4 = nullptr) {
    __shared__ float partial[2][WARPS_PER_ROW];
    const int tr = threadIdx.x % TPR;  // thread within its row
    const int row = blockIdx.x * RPB + threadIdx.x / TPR;
    // Rows past the end still run the shuffles below (they must stay converged), reading row 0.
    const bool live = row < rows;
    const int r = live ? row : 0;
    const float4* xr = (const float4*)(x + (size_t)r * N);
#if X_BF16
    const uint2* xr_bf16 = (const uint2*)((const bf16_bits*)x + (size_t)r * N * X_BF16);
#endif

    // Everything this thread reads is requested before the first reduction, so the launch pays
    // one memory latency instead of one per input. Before the grid dependency wait (launched as
    // a programmatic dependent, while the kernel before still runs): the norm weights (and the
    // layer scale), which no kernel writes, and the residual stream, which the engine never
    // writes in the kernel right before a norm (the kernel before that has finished once this
    // one runs); x (the product just made) right after it.
    float4 g1[VPT], g2[VPT], res[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = k * TPR + tr;
        const bool in_row = VEC % TPR == 0 || i < VEC;
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        g1[k] = WEIGHT && in_row ? __ldg((const float4*)w + i) : zero;
        g2[k] = NORM2 && in_row ? __ldg((const float4*)w2 + i) : zero;
        res[k] = ADD && in_row && live ? ((const float4*)(residual + (size_t)r * N))[i] : zero;
    }
#if SCALE
    const float s_out = __ldg(out_scale);
#endif
#if LSA_PEERS
    // Before the wait, as the loads above: every rank's row in the window (the window's fields
    // never change) and this block's barrier epoch (last stored by the kernel that used this
    // barrier last: a decode post-norm two or more kernels back, or a prefill chunk's push
    // (tp_push.cu) further back still, which never directly precedes a decode post-norm; either
    // has finished once this one runs). No prefetch of x: the SASS order check
    // (gpu_test_sass_order) does not cover this form.
    if (lsa_comm.lsaSize != LSA_PEERS) __trap();  // the engine's ranks: one host's GPUs
    const int self = lsa_comm.lsaRank;
    const float4* xp[LSA_PEERS];  // (indexed by constants only: registers, not a stack array)
#if LSA_PUSH
    // The ranks' products, pushed into this rank's own window by their matvecs: rank p's at
    // x + p * slot. The barrier below then says they have all arrived; the sum reads local memory.
#pragma unroll
    for (int p = 0; p < LSA_PEERS; ++p) xp[p] = (const float4*)(x + p * lsa_slot + (size_t)r * N);
    const float4* xs = (const float4*)(x + self * lsa_slot + (size_t)r * N);
#else
#pragma unroll
    for (int p = 0; p < LSA_PEERS; ++p)
        xp[p] = (const float4*)((const char*)ncclGetLsaPointer(lsa_win, lsa_offset, p) +
                                (size_t)r * N * 4);
    const float4* xs = (const float4*)((const char*)ncclGetLsaPointer(lsa_win, lsa_offset, self) +
                                       (size_t)r * N * 4);
#endif
    float4 own[VPT];
    {
        ncclLsaBarrierSession<ncclCoopCta> barrier{ncclCoopCta(), lsa_comm, ncclTeamTagLsa{},
                                                   (uint32_t)blockIdx.x};
        gj_grid_sync();
        // This rank's product (made by the kernel before) is published by the arrival and read
        // while the arrival travels; the other ranks' only once all have arrived (acquire).
        barrier.arrive(ncclCoopCta(), cuda::memory_order_release);
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = k * TPR + tr;
            own[k] = VEC % TPR == 0 || i < VEC ? xs[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        barrier.wait(ncclCoopCta(), cuda::memory_order_acquire);
    }
    // Rank 0's product, plus rank 1's, ...: for two ranks a + b, NCCL's sum bit for bit.
    float4 v[VPT];
#pragma unroll
    for (int p = 0; p < LSA_PEERS; ++p) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
            const int i = k * TPR + tr;
            const float4 a = p == self                   ? own[k]
                             : VEC % TPR == 0 || i < VEC ? xp[p][i]
                                                         : make_float4(0.f, 0.f, 0.f, 0.f);
            if (p == 0)
                v[k] = a;
            else
                v[k].x += a.x, v[k].y += a.y, v[k].z += a.z, v[k].w += a.w;
        }
    }
#else
    // A bulk L2 prefetch (of x, where the kernel before stores: harmless) between those loads and
    // the wait keeps ptxas from scheduling the wait ahead of them, as it otherwise may (it did for
    // width 2560; docs/PERFORMANCE.md, 2026-11-28).
    if (tr == 0)
#if X_BF16
        prefetch_l2_range(xr_bf16, N * 2 * X_BF16);
#else
        prefetch_l2_range(xr, N * 4);
#endif
    gj_grid_sync();
    float4 v[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = k * TPR + tr;
        const bool in_row = VEC % TPR == 0 || i < VEC;
#if X_BF16
#pragma unroll
        for (int p = 0; p < X_BF16; ++p) {
            const uint2 b = in_row ? xr_bf16[p * VEC + i] : make_uint2(0u, 0u);
            const float4 a =
                make_float4(bf16_to_f32((bf16_bits)b.x), bf16_to_f32((bf16_bits)(b.x >> 16)),
                            bf16_to_f32((bf16_bits)b.y), bf16_to_f32((bf16_bits)(b.y >> 16)));
            if (p == 0)
                v[k] = a;
            else
                v[k].x += a.x, v[k].y += a.y, v[k].z += a.z, v[k].w += a.w;
        }
#else
        v[k] = in_row ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
    }
#endif  // LSA_PEERS
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = k * TPR + tr;
#pragma unroll
        for (int z = 1; z < PARTS; ++z)
            if (VEC % TPR == 0 || i < VEC) {
                const float4 p = xr[(size_t)z * rows * VEC + i];
                v[k].x += p.x;
                v[k].y += p.y;
                v[k].z += p.z;
                v[k].w += p.w;
            }
        ss += f4_sum_sq(v[k]);
    }
    ss = gj_row_sum(ss, partial[0]);
    // About 1 ulp (rsqrt_refined), like the CPU's double computation rounded to float.
    const float scale = rsqrt_refined(ss * (1.0f / N) + eps);

    // o: this thread's part of y (zero outside the row, so NORM2's sum needs no mask). Without
    // NORM2 the quantization of y happens in the same pass (fewer values live at once).
    float ss2 = 0.0f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = k * TPR + tr;
        const bool in_row = VEC % TPR == 0 || i < VEC;
        float4& o = v[k];
        o = make_float4(o.x * scale, o.y * scale, o.z * scale, o.w * scale);
#if WEIGHT
        // Rounded before the residual add (no FMA contraction): the products the CPU makes.
        o = make_float4(__fmul_rn(o.x, g1[k].x), __fmul_rn(o.y, g1[k].y), __fmul_rn(o.z, g1[k].z),
                        __fmul_rn(o.w, g1[k].w));
#endif
#if ADD
        o.x += res[k].x, o.y += res[k].y, o.z += res[k].z, o.w += res[k].w;
#endif
#if SCALE
        o.x *= s_out, o.y *= s_out, o.z *= s_out, o.w *= s_out;
#endif
        if (in_row && live && y != nullptr) ((float4*)(y + (size_t)r * N))[i] = o;
#if NORM2
        ss2 += f4_sum_sq(o);
#elif QUANT
        gj_quantize_store(o, in_row && live, r, i, yq, yds);
#endif
    }
#if NORM2
    ss2 = gj_row_sum(ss2, partial[1]);
    const float scale2 = rsqrt_refined(ss2 * (1.0f / N) + eps);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
        const int i = k * TPR + tr;
        const bool in_row = VEC % TPR == 0 || i < VEC;
        const float4 n =
            make_float4(v[k].x * scale2, v[k].y * scale2, v[k].z * scale2, v[k].w * scale2);
        float4 o = n;
        o.x *= g2[k].x, o.y *= g2[k].y, o.z *= g2[k].z, o.w *= g2[k].w;
        if (in_row && live && y2 != nullptr) ((float4*)(y2 + (size_t)r * N))[i] = o;
#if QUANT
        gj_quantize_store(o, in_row && live, r, i, yq, yds);
#endif
#if MOE_NORMS
        if (in_row && live) {
            const float4 g3 = __ldg((const float4*)w3 + i);
            ((float4*)(y3 + (size_t)r * N))[i] =
                make_float4(n.x * g3.x, n.y * g3.y, n.z * g3.z, n.w * g3.w);
        }
        float4 o4 = n;
        if (in_row) {
            const float4 g4 = __ldg((const float4*)w4 + i);
            o4.x *= g4.x, o4.y *= g4.y, o4.z *= g4.z, o4.w *= g4.w;
        }
        if (in_row && live && y4 != nullptr) ((float4*)(y4 + (size_t)r * N))[i] = o4;
        gj_quantize_store(o4, in_row && live && yq4 != nullptr, r, i, yq4, yds4);
#endif
    }
#else
    (void)ss2;
    (void)w2;
    (void)y2;
#endif
#if !MOE_NORMS
    (void)w3, (void)y3, (void)w4, (void)y4, (void)yq4, (void)yds4;
#endif
#if !QUANT
    (void)yq;
    (void)yds;
#endif
}

// No __launch_bounds__: with it, ptxas (CUDA 13, sm_90) settles on 40 registers and spills 8
// bytes for some widths (2816, 5376 with SCALE); without it the same code takes 38 and spills
// nothing (the implied cap of 64 registers is far above what the kernel needs).
#if MOE_NORMS
extern "C" __global__ void rmsnorm_moe(const float* x, const float* __restrict__ w,
                                       const float* residual, float* y,
                                       const float* __restrict__ w2, float* y2,
                                       uint32* __restrict__ yq, float2* __restrict__ yds,
                                       const float* __restrict__ w3, float* __restrict__ y3,
                                       const float* __restrict__ w4, float* __restrict__ y4,
                                       uint32* __restrict__ yq4, float2* __restrict__ yds4,
                                       int rows, float eps) {
    gj_rmsnorm(x, w, residual, y, nullptr, w2, y2, yq, yds, rows, eps, w3, y3, w4, y4, yq4, yds4);
}
#elif LSA_PUSH
extern "C" __global__ void rmsnorm_ext_lsa_push(const float* x, size_t slot,
                                                const __grid_constant__ ncclDevComm comm,
                                                const float* __restrict__ w, const float* residual,
                                                float* y, const float* __restrict__ scale,
                                                const float* __restrict__ w2, float* y2,
                                                uint32* __restrict__ yq, float2* __restrict__ yds,
                                                int rows, float eps) {
    gj_rmsnorm(x, w, residual, y, scale, w2, y2, yq, yds, rows, eps, comm, slot);
}
extern "C" __global__ void lsa_window_pointers(ncclWindow_t win, size_t offset, void** out) {
    gj_grid_sync();  // (as every model kernel, though nothing it reads is written by a kernel)
    gj_lsa_window_pointers(win, offset, out, LSA_PEERS);
}
#elif LSA_PEERS
extern "C" __global__ void rmsnorm_ext_lsa(size_t x_offset, ncclWindow_t win,
                                           const __grid_constant__ ncclDevComm comm,
                                           const float* __restrict__ w, const float* residual,
                                           float* y, const float* __restrict__ scale,
                                           const float* __restrict__ w2, float* y2,
                                           uint32* __restrict__ yq, float2* __restrict__ yds,
                                           int rows, float eps) {
    gj_rmsnorm(nullptr, w, residual, y, scale, w2, y2, yq, yds, rows, eps, comm, win, x_offset);
}
#elif SCALE || NORM2
extern "C" __global__ void rmsnorm_ext(const float* x, const float* __restrict__ w,
                                       const float* residual, float* y,
                                       const float* __restrict__ scale,
                                       const float* __restrict__ w2, float* y2,
                                       uint32* __restrict__ yq, float2* __restrict__ yds, int rows,
                                       float eps) {
    gj_rmsnorm(x, w, residual, y, scale, w2, y2, yq, yds, rows, eps);
}
#else
extern "C" __global__ void rmsnorm(const float* x, const float* __restrict__ w,
                                   const float* residual, float* y, uint32* __restrict__ yq,
                                   float2* __restrict__ yds, int rows, float eps) {
    gj_rmsnorm(x, w, residual, y, nullptr, nullptr, nullptr, yq, yds, rows, eps);
}
#endif
