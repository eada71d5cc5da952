// matvec_f: decode matvec y = W . x for float weights (f32, f16 or bf16 as stored in the GGUF)
// against fp32 activations, fp32 accumulation. Carries whole F32/F16/BF16 models and any tensor a
// quantized file keeps in a float type (PLE projections, dequantized embeddings).
//
// Constants (prologue #defines), shared machinery and launch: see matvec_common.cuh (K, THREADS,
// ROWS, NCOLS, UNROLL; LAYOUT is unused: rows are plain arrays of K elements), plus
//   WTYPE    ggml type id of the weights: 0 f32, 1 f16, 30 bf16
// Each thread's unit is 16 bytes of a row (4 f32 or 8 f16/bf16 weights), one streaming vector
// load; rows start 16-byte aligned because K * element size is a multiple of 16 (K % 32 == 0)
// and the matrix base must be 16-byte aligned.
//
// Entry points (one signature for all):
//   <name>(w, w_up, x, residual, y, n_rows)
//     w, w_up   weights [n_rows][K]; w_up only for _geglu
//     x         fp32 activations [NCOLS][K] (16-byte aligned)
//     residual  only for _add (may alias y)
//     y         fp32 [NCOLS][n_rows]
//   matvec_f        y = W x
//   matvec_f_add    y = residual + W x
//   matvec_f_geglu  y = gelu_tanh(W x) * (W_up x)
//   matvec_f_gelu_mul(w, x, other, other_stride, y, n_rows)
//                   y = gelu_tanh(W x) * other, column c reading other + c * other_stride (a PLE
//                   gate and its GeLU product with the token's PLE input in one launch)
// With PUSH = P (matvec_common.cuh) only
//   matvec_f_push(w, x, to, n_rows)  y = W x stored into the P ranks' window slots to.y[p]
#include "matvec_common.cuh"

#ifndef WTYPE
#define WTYPE 30
#endif
static_assert(WTYPE == 0 || WTYPE == 1 || WTYPE == 30,
              "matvec_f: WTYPE must be 0 (f32), 1 (f16) or 30 (bf16)");

struct gj_wf {
    static constexpr int kPerUnit = WTYPE == 0 ? 4 : 8;  // weights per 16-byte unit
    static constexpr int kUnits = K / kPerUnit;
    struct Row {
        const uint8* p;
    };
    typedef uint4 WFrag;
    struct XFrag {
        float4 v[kPerUnit / 4];
    };
    static GJ_DEVICE Row row(const uint8* w, int, int r) {
        return Row{w + (size_t)r * (K * (WTYPE == 0 ? 4 : 2))};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.p, K * (WTYPE == 0 ? 4 : 2));
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) { return ld_stream_u32x4(row.p + 16 * u); }
    static GJ_DEVICE float scale(const WFrag&, int) { return 1.0f; }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2*, int c, int u) {
        const float4* p = (const float4*)((const float*)x + c * K) + u * (kPerUnit / 4);
        XFrag f;
#pragma unroll
        for (int i = 0; i < kPerUnit / 4; ++i) f.v[i] = gj_ldx<kS>(p + i);
        return f;
    }
    // The 2 weights of one 32-bit word, in memory order.
    static GJ_DEVICE float2 pair(uint32 v) {
#if WTYPE == 1
        return unpack_f16x2(v);
#else
        return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
#endif
    }
    static GJ_DEVICE float dot(const WFrag& w, const XFrag& x) {
#if WTYPE == 0
        const float4 a = x.v[0];
        float s = __uint_as_float(w.x) * a.x;
        s = fmaf(__uint_as_float(w.y), a.y, s);
        s = fmaf(__uint_as_float(w.z), a.z, s);
        return fmaf(__uint_as_float(w.w), a.w, s);
#else
        const float2 w0 = pair(w.x), w1 = pair(w.y), w2 = pair(w.z), w3 = pair(w.w);
        const float4 a = x.v[0], b = x.v[1];
        float s = w0.x * a.x;
        s = fmaf(w0.y, a.y, s);
        s = fmaf(w1.x, a.z, s);
        s = fmaf(w1.y, a.w, s);
        s = fmaf(w2.x, b.x, s);
        s = fmaf(w2.y, b.y, s);
        s = fmaf(w3.x, b.z, s);
        return fmaf(w3.y, b.w, s);
#endif
    }
};

#define GJ_MATVEC_F_ENTRY(NAME, EPI)                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        NAME(const void* w, const void* w_up, const float* x, const float* residual, float* y, \
             int n_rows) {                                                                     \
        gj_matvec<gj_wf, EPI>((const uint8*)w, (const uint8*)w_up, x, nullptr, residual, y,    \
                              n_rows);                                                         \
    }
#if PUSH
extern "C" __global__ void __launch_bounds__(THREADS)
    matvec_f_push(const void* w, const float* x, gj_push_to to, int n_rows) {
    gj_matvec<gj_wf, gj_epi_push>((const uint8*)w, nullptr, x, nullptr, nullptr, nullptr, n_rows,
                                  gj_cols_dense(), -1, 0, gj_no_prologue(), to);
}
#elif MOE
GJ_MATVEC_MOE_ENTRY(matvec_f_moe, gj_wf, gj_epi_store, float)
GJ_MATVEC_MOE_ENTRY(matvec_f_moe_geglu, gj_wf, gj_epi_geglu, float)
#else
GJ_MATVEC_F_ENTRY(matvec_f, gj_epi_store)
GJ_MATVEC_F_ENTRY(matvec_f_add, gj_epi_add)
GJ_MATVEC_F_ENTRY(matvec_f_geglu, gj_epi_geglu)
extern "C" __global__ void __launch_bounds__(THREADS)
    matvec_f_gelu_mul(const void* w, const float* x, const float* other, int other_stride, float* y,
                      int n_rows) {
    gj_matvec<gj_wf, gj_epi_gelu_mul>((const uint8*)w, nullptr, x, nullptr, other, y, n_rows,
                                      gj_cols_dense(), -1, other_stride);
}
#if PLE_IN == 1
// matvec_f_gelu_mul_norm_in(w, u, w1, x_in, x_out, other, y, n_rows, eps): x1 = x_in +
// rmsnorm(u) * w1 (a decode step's post-FFW residual update), y = gelu_tanh(W x1) * other (the
// PLE gate and its GeLU product); x1 made by every block in shared memory, stored by block 0 to
// x_out, which must not alias x_in (matvec_common.cuh, gj_pro_norm_add).
extern "C" __global__ void __launch_bounds__(THREADS)
    matvec_f_gelu_mul_norm_in(const void* w, const float* u, const float* __restrict__ w1,
                              const float* x_in, float* x_out, const float* other, float* y,
                              int n_rows, float eps) {
    __shared__ __align__(16) float xs[K];
    gj_matvec<gj_wf, gj_epi_gelu_mul, gj_cols_dense, THREADS, ROWS, UNROLL,
              gj_pro_norm_add<false> >(
        (const uint8*)w, nullptr, xs, nullptr, other, y, n_rows, gj_cols_dense(), -1, 0,
        gj_pro_norm_add<false>{u, w1, x_in, x_out, xs, nullptr, eps});
}
#endif
#endif
