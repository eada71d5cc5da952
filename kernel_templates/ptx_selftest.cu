// ptx_selftest: one small kernel per group of gj_ptx.cuh helpers, so the GPU numerics test
// (tests/jit/gpu_test_ptx_helpers.cpp) can compare every helper against CPU math, and the compile test
// can assert that each helper really emits the instruction it is named after.
//
// Constants: none. Launch geometry is given per entry below. Not a model kernel: it is compiled
// only by the tests and `gemmajit jit` tooling. (quantize_q8_1_group8 is tested through the
// production kernel quantize_q8_1.cu; its division helper q8_inv_scale has its own entry.)
#include "gj_ptx.cuh"

// Scalar conversions, one element per thread (any grid covering n):
//   f16_out = f32_to_f16(f), f16_back = f16_to_f32(h), bf16_out = f32_to_bf16(f),
//   bf16_back = bf16_to_f32(h), s8_out = f32_to_s8_sat(f).
extern "C" __global__ void selftest_convert(const float* f, const uint16* h, int n, uint16* f16_out,
                                            float* f16_back, uint16* bf16_out, float* bf16_back,
                                            int32* s8_out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    f16_out[i] = f32_to_f16(f[i]);
    f16_back[i] = f16_to_f32(h[i]);
    bf16_out[i] = f32_to_bf16(f[i]);
    bf16_back[i] = bf16_to_f32(h[i]);
    s8_out[i] = f32_to_s8_sat(f[i]);
}

// Packing and half2 arithmetic, one element per thread:
//   f16x2_out = pack_f16x2(f[2i], f[2i+1]), unpacked = unpack_f16x2(words[i]),
//   fma_out = hfma2(a[i], b[i], c[i]), u16x2_out = pack_u16x2(lo16(a), lo16(b)),
//   s8x4_out = pack_s8x4(a, b, c, a + b).
extern "C" __global__ void selftest_pack(const float* f, const uint32* words, const uint32* a,
                                         const uint32* b, const uint32* c, int n, uint32* f16x2_out,
                                         float2* unpacked, uint32* fma_out, uint32* u16x2_out,
                                         uint32* s8x4_out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    f16x2_out[i] = pack_f16x2(f[2 * i], f[2 * i + 1]);
    unpacked[i] = unpack_f16x2(words[i]);
    fma_out[i] = hfma2(a[i], b[i], c[i]);
    u16x2_out[i] = pack_u16x2((uint16)a[i], (uint16)b[i]);
    s8x4_out[i] = pack_s8x4((int32)a[i], (int32)b[i], (int32)c[i], (int32)(a[i] + b[i]));
}

// dp4a_s8(a, b, c) per element.
extern "C" __global__ void selftest_dp4a(const int32* a, const int32* b, const int32* c, int n,
                                         int32* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = dp4a_s8(a[i], b[i], c[i]);
}

// One warp (launch <<<1, 32>>>): D = A * B + C through mma_s8_16x8x32. A is 16x32 int8
// row-major, Bt is B transposed (8x32 row-major, i.e. B column-major), C and D are 16x8 int32
// row-major. Fragments are gathered straight from global memory following the documented layout.
extern "C" __global__ void selftest_mma_s8(const int8* A, const int8* Bt, const int32* C,
                                           int32* D) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const uint32* A32 = (const uint32*)A;  // 8 words per row
    const uint32* B32 = (const uint32*)Bt;
    uint32 a[4] = {A32[g * 8 + t], A32[(g + 8) * 8 + t], A32[g * 8 + 4 + t],
                   A32[(g + 8) * 8 + 4 + t]};
    uint32 b[2] = {B32[g * 8 + t], B32[g * 8 + 4 + t]};
    int32 c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                  C[(g + 8) * 8 + 2 * t + 1]};
    int32 d[4];
    mma_s8_16x8x32(d, a, b, c);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// One warp: D = A * B + C through mma_f16_16x8x16 (selftest_mma_f16) or mma_bf16_16x8x16
// (selftest_mma_bf16). A 16x16 f16/bf16 row-major, Bt = B transposed (8x16 row-major), C and D
// 16x8 f32 row-major.
template <bool kBf16>
GJ_DEVICE void mma_16x8x16_selftest(const uint16* A, const uint16* Bt, const float* C, float* D) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const uint32* A32 = (const uint32*)A;  // 8 words (16 elements) per row
    const uint32* B32 = (const uint32*)Bt;
    uint32 a[4] = {A32[g * 8 + t], A32[(g + 8) * 8 + t], A32[g * 8 + 4 + t],
                   A32[(g + 8) * 8 + 4 + t]};
    uint32 b[2] = {B32[g * 8 + t], B32[g * 8 + 4 + t]};
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                  C[(g + 8) * 8 + 2 * t + 1]};
    float d[4];
    if (kBf16)
        mma_bf16_16x8x16(d, a, b, c);
    else
        mma_f16_16x8x16(d, a, b, c);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
extern "C" __global__ void selftest_mma_f16(const uint16* A, const uint16* Bt, const float* C,
                                            float* D) {
    mma_16x8x16_selftest<false>(A, Bt, C, D);
}
extern "C" __global__ void selftest_mma_bf16(const uint16* A, const uint16* Bt, const float* C,
                                             float* D) {
    mma_16x8x16_selftest<true>(A, Bt, C, D);
}

// One warp. M holds four 8x8 matrices of 16-bit elements (matrix i = M[64i .. 64i+63],
// row-major), staged in shared memory; lane l points at row l%8 of matrix l/8. Output: five
// variants (x1, x2, x4, x2.trans, x4.trans) x 32 lanes x 4 registers, unused registers zero.
extern "C" __global__ void selftest_ldmatrix(const uint16* M, uint32* out) {
    __shared__ __align__(16) uint16 tile[256];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) tile[i] = M[i];
    __syncwarp();
    const uint32 addr = smem_addr(&tile[(lane / 8) * 64 + (lane % 8) * 8]);
    uint32 r[5][4] = {};
    r[0][0] = ldmatrix_x1(addr);
    ldmatrix_x2(r[1], addr);
    ldmatrix_x4(r[2], addr);
    ldmatrix_x2_trans(r[3], addr);
    ldmatrix_x4_trans(r[4], addr);
    for (int v = 0; v < 5; ++v)
        for (int k = 0; k < 4; ++k) out[(v * 32 + lane) * 4 + k] = r[v][k];
}

// One block of 128 threads copies 256 16-byte chunks through shared memory: chunk t with
// cp.async.ca and chunk t + 128 with cp.async.cg, one commit, wait_group 0, barrier, then each
// thread writes back the chunks another thread fetched (so the barrier is what makes them visible).
extern "C" __global__ void selftest_cp_async(const uint4* src, uint4* dst) {
    __shared__ __align__(16) uint4 buf[256];
    const int t = threadIdx.x;
    cp_async_ca16(smem_addr(&buf[t]), &src[t]);
    cp_async_cg16(smem_addr(&buf[t + 128]), &src[t + 128]);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    dst[t] = buf[255 - t];
    dst[255 - t] = buf[t];
}

// Warp reductions, any number of full warps: per lane, the result of its warp (width 32) and of
// its aligned group of 8 lanes.
extern "C" __global__ void selftest_warp_reduce(const float* x, const int32* xi, float* sum32,
                                                float* max32, float* sum8, int32* isum32) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    sum32[i] = warp_sum<32>(x[i]);
    max32[i] = warp_max<32>(x[i]);
    sum8[i] = warp_sum<8>(x[i]);
    isum32[i] = warp_sum_i32<32>(xi[i]);
}

// Fast math, one element per thread.
extern "C" __global__ void selftest_fast_math(const float* x, int n, float* exp2_out,
                                              float* tanh_out, float* rcp_out, float* gelu_out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    exp2_out[i] = exp2_approx(x[i]);
    tanh_out[i] = tanh_approx(x[i]);
    rcp_out[i] = rcp_approx(x[i]);
    gelu_out[i] = gelu_tanh(x[i]);
}

// out[i] = rsqrt_refined(x[i]), one per thread.
extern "C" __global__ void selftest_rsqrt(const float* x, int n, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = rsqrt_refined(x[i]);
}

// out[i] = q8_inv_scale(amax[i]) (must equal 127.0f / amax[i] bit for bit), one per thread.
extern "C" __global__ void selftest_q8_scale(const float* amax, int n, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = q8_inv_scale(amax[i]);
}

// Loads over a byte buffer `bytes` (16-byte aligned, at least 4n + 24 bytes), thread i:
//   a2[i]     = load_u32_align2(bytes + 2i)            (2-byte aligned 32-bit read)
//   funnel[i] = funnel_bytes(word[i/4], word[i/4 + 1], i % 4) == the 32 bits at byte i
//   s32[i]    = ld_stream_u32(bytes + 4i), u16[i] = ld_nc_u16(bytes + 2i)
//   s128[i]   = ld_stream_u32x4(bytes + 16 * (i / 4)).component(i % 4)
extern "C" __global__ void selftest_loads(const uint8* bytes, int n, uint32* a2, uint32* funnel,
                                          uint32* s32, uint32* u16, uint32* s128) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const uint32* w = (const uint32*)bytes;
    a2[i] = load_u32_align2(bytes + 2 * i);
    funnel[i] = funnel_bytes(w[i / 4], w[i / 4 + 1], i % 4);
    s32[i] = ld_stream_u32(bytes + 4 * i);
    u16[i] = ld_nc_u16(bytes + 2 * i);
    const uint4 v = ld_stream_u32x4(bytes + 16 * (i / 4));
    const int c = i % 4;
    s128[i] = c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}
