// gj_ptx.cuh: the small inline-PTX helper layer every kernel template includes.
//
// Templates are compiled by NVRTC with no system headers at all (no <cuda_fp16.h>, no <cstdint>),
// so this file supplies what they would otherwise give: fixed-width integer names, fp16/bf16
// conversions, half2 arithmetic, int8/f16 tensor-core fragments, ldmatrix, cp.async, warp
// reductions, fast transcendental approximations and loads for the 2-byte-aligned fields of ggml
// quant blocks. Each helper is one or a few instructions; the GPU numerics test
// (tests/jit/gpu_test_ptx_helpers.cpp via kernel_templates/ptx_selftest.cu) checks every one of
// them.
//
// Targets: sm_80 and newer (cp.async, cvt.rn.bf16.f32 and cvt.rn.f16x2.f32 need sm_80).
//
// The jit replaces the line `#include "gj_ptx.cuh"` by this text, after the prologue that
// #defines the spec's constants (N, K, THREADS, ...). Those macros are UPPER_CASE, so every name
// here is lower case, k-prefixed or GJ_-prefixed: a template parameter called N would be rewritten
// by the prologue.
#ifndef GJ_PTX_CUH
#define GJ_PTX_CUH

// Not static: unreferenced inline functions then draw no "declared but never referenced" warning.
#define GJ_DEVICE __device__ __forceinline__

// ------------------------------------------------------------------------------------------------
// Integer types (there is no <cstdint> under NVRTC without headers).
typedef signed char int8;
typedef unsigned char uint8;
typedef short int16;
typedef unsigned short uint16;
typedef int int32;
typedef unsigned int uint32;
typedef long long int64;
typedef unsigned long long uint64;

// Half and bfloat16 values are carried as their raw 16-bit patterns.
typedef unsigned short f16_bits;
typedef unsigned short bf16_bits;

#define GJ_FULL_MASK 0xffffffffu

// ------------------------------------------------------------------------------------------------
// Scalar conversions.

// IEEE half -> float. Exact (every half is a float).
GJ_DEVICE float f16_to_f32(f16_bits h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// float -> IEEE half, round to nearest even; overflow gives +-inf, NaN stays NaN.
GJ_DEVICE f16_bits f32_to_f16(float f) {
    f16_bits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// bfloat16 -> float. Exact: a bf16 is the upper half of a float.
GJ_DEVICE float bf16_to_f32(bf16_bits h) {
    return __uint_as_float((uint32)h << 16);
}

// float -> bfloat16, round to nearest even (NaN stays NaN).
GJ_DEVICE bf16_bits f32_to_bf16(float f) {
    bf16_bits h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// float -> int8 value, round to nearest even, saturated to [-128, 127] (NaN gives 0). Returned as
// int32 so callers can pack it.
GJ_DEVICE int32 f32_to_s8_sat(float f) {
    int32 r;
    asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(f));
    return (int32)(int8)r;
}

// ------------------------------------------------------------------------------------------------
// Packing. Element 0 always goes to the least significant bits, matching memory order.

// Two 16-bit patterns -> one 32-bit word (lo in bits 0..15).
GJ_DEVICE uint32 pack_u16x2(uint16 lo, uint16 hi) {
    return (uint32)lo | ((uint32)hi << 16);
}

// Four int8 values (given as ints, only the low byte is used) -> one 32-bit word, a in bits 0..7.
GJ_DEVICE uint32 pack_s8x4(int32 a, int32 b, int32 c, int32 d) {
    uint32 lo = __byte_perm((uint32)a, (uint32)b, 0x0040);  // bytes: a0, b0 in the low half
    uint32 hi = __byte_perm((uint32)c, (uint32)d, 0x0040);
    return __byte_perm(lo, hi, 0x5410);
}

// Two floats -> half2 word, round to nearest even; lo in bits 0..15. (cvt.rn.f16x2.f32 puts its
// first source in the upper half, hence the swapped operands.)
GJ_DEVICE uint32 pack_f16x2(float lo, float hi) {
    uint32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// half2 word -> two floats (lo = bits 0..15).
GJ_DEVICE float2 unpack_f16x2(uint32 v) {
    float2 r;
    asm("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, "
        "h;\n\t}"
        : "=f"(r.x), "=f"(r.y)
        : "r"(v));
    return r;
}

// ------------------------------------------------------------------------------------------------
// Packed half arithmetic.

// a * b + c on both halves of half2 words, one rounding, round to nearest even.
GJ_DEVICE uint32 hfma2(uint32 a, uint32 b, uint32 c) {
    uint32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// ------------------------------------------------------------------------------------------------
// Integer dot products.

// c + sum_{i<4} a.byte[i] * b.byte[i] with all bytes signed (the dp4a matvec inner step).
GJ_DEVICE int32 dp4a_s8(int32 a, int32 b, int32 c) {
    int32 d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// 8 nibble bytes of a 32-element block whose low nibbles are elements 0..15 and high nibbles
// elements 16..31 (Q4_0, and the split Q4_K): q0, q1 = bytes 8p..8p+7 (or 4p'..4p'+7 of a 16-byte
// unit), times the activations under their low (lo0, lo1) and high (hi0, hi1) nibbles.
GJ_DEVICE int32 gj_q4_dot8(uint32 q0, uint32 q1, int32 lo0, int32 lo1, int32 hi0, int32 hi1,
                           int32 acc) {
    const uint32 m = 0x0f0f0f0fu;
    acc = dp4a_s8((int32)(q0 & m), lo0, acc);
    acc = dp4a_s8((int32)(q1 & m), lo1, acc);
    acc = dp4a_s8((int32)((q0 >> 4) & m), hi0, acc);
    return dp4a_s8((int32)((q1 >> 4) & m), hi1, acc);
}

// ------------------------------------------------------------------------------------------------
// Tensor-core MMA (warp-wide, all 32 lanes must participate). Fragment layouts, with
// g = lane / 4 and t = lane % 4:
//
// mma_s8_16x8x32: D(16x8, s32) = A(16x32, s8, row-major) * B(32x8, s8, column-major) + C.
//   a[0]: A[g][4t..4t+3]      a[1]: A[g+8][4t..4t+3]
//   a[2]: A[g][16+4t..+3]     a[3]: A[g+8][16+4t..+3]      (byte i of a word = column +i)
//   b[0]: B[4t..4t+3][g]      b[1]: B[16+4t..+3][g]        (byte i of a word = row +i)
//   c/d[0..1]: C[g][2t, 2t+1] c/d[2..3]: C[g+8][2t, 2t+1]
GJ_DEVICE void mma_s8_16x8x32(int32 d[4], const uint32 a[4], const uint32 b[2], const int32 c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]),
          "r"(c[2]), "r"(c[3]));
}

// mma_f16_16x8x16: D(16x8, f32) = A(16x16, f16, row-major) * B(16x8, f16, column-major) + C.
//   a[0]: A[g][2t, 2t+1]      a[1]: A[g+8][2t, 2t+1]
//   a[2]: A[g][2t+8, 2t+9]    a[3]: A[g+8][2t+8, 2t+9]     (low half = lower column)
//   b[0]: B[2t, 2t+1][g]      b[1]: B[2t+8, 2t+9][g]       (low half = lower row)
//   c/d[0..1]: C[g][2t, 2t+1] c/d[2..3]: C[g+8][2t, 2t+1]
GJ_DEVICE void mma_f16_16x8x16(float d[4], const uint32 a[4], const uint32 b[2], const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
}

// mma_bf16_16x8x16: the same shape and fragment layout with bfloat16 A and B.
GJ_DEVICE void mma_bf16_16x8x16(float d[4], const uint32 a[4], const uint32 b[2],
                                const float c[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
}

// ------------------------------------------------------------------------------------------------
// Shared memory: addresses, ldmatrix, cp.async.

// Generic pointer to shared memory -> 32-bit shared-window address (what ldmatrix/cp.async take).
GJ_DEVICE uint32 smem_addr(const void* p) {
    uint32 a;
    asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}"
        : "=r"(a)
        : "l"(p));
    return a;
}

// ldmatrix loads 8x8 matrices of 16-bit elements from shared memory, one 16-byte row per address.
// Lane 8*i + r supplies the address of row r of matrix i (lanes beyond the count are ignored).
// Lane l receives, for matrix i, in register i: row l/4, columns 2*(l%4) and 2*(l%4)+1 (low half
// = lower column) -- exactly an mma A/B fragment quarter. The .trans forms deliver the transposed
// matrix: row 2*(l%4) and 2*(l%4)+1 of column l/4.
GJ_DEVICE uint32 ldmatrix_x1(uint32 addr) {
    uint32 r;
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(addr));
    return r;
}
GJ_DEVICE void ldmatrix_x2(uint32 r[2], uint32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}
GJ_DEVICE void ldmatrix_x4(uint32 r[4], uint32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
GJ_DEVICE void ldmatrix_x2_trans(uint32 r[2], uint32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}
GJ_DEVICE void ldmatrix_x4_trans(uint32 r[4], uint32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Asynchronous 16-byte global -> shared copies (both addresses 16-byte aligned). .ca caches the
// line in L1 (data read again soon), .cg bypasses L1 (streamed data, e.g. weights).
GJ_DEVICE void cp_async_ca16(uint32 smem_dst, const void* gmem_src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(smem_dst), "l"(gmem_src)
                 : "memory");
}
GJ_DEVICE void cp_async_cg16(uint32 smem_dst, const void* gmem_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_dst), "l"(gmem_src)
                 : "memory");
}
// Closes the group of copies issued since the last commit.
GJ_DEVICE void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most kPending committed groups are still in flight (0: all done). The copies are
// then visible to the issuing thread; use __syncthreads() before other threads read them.
template <int kPending>
GJ_DEVICE void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// ------------------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+). The engine launches a kernel as a programmatic
// dependent of the kernel before it on the stream when the kernel's code waits on that grid
// (jit/device.cpp finds gj_grid_wait's instruction in each entry's PTX): the kernel's blocks may
// then start while the previous kernel still runs, so the launch latency and whatever a block
// does before gj_grid_wait (loading weights, which no kernel writes) overlap its tail.
//
// The rule every entry point follows: nothing before gj_grid_wait() reads memory the kernel right
// before it writes, or writes memory any earlier kernel reads. gj_grid_sync() is the usual first
// statement: wait, then let the next kernel launch. Triggering only after the wait keeps at most
// two grids in flight (a kernel that triggered before waiting would let the whole rest of the
// step launch and fill the SMs with waiting blocks). It also means that a kernel runs only once
// every block of the kernel before has passed its wait, so every kernel before that one has
// finished and its stores are visible: reading them before the wait is safe (the step state the
// host copied, the residual stream a norm adds to, the PLE inputs).
//
// Where the kernel was launched normally (or on sm_80) both are no-ops.
GJ_DEVICE void gj_grid_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
GJ_DEVICE void gj_grid_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
GJ_DEVICE void gj_grid_sync() {
    gj_grid_wait();
    gj_grid_launch_dependents();
}

// ------------------------------------------------------------------------------------------------
// x² + y² + z² + w² of a float4 in one fixed order. Written as plain arithmetic, the compiler may
// contract it into FMAs starting from either product, and it has chosen differently for the same
// line in two specializations (rmsnorm width 2560 with and without PARTS, one float4 per thread):
// kernels that must give each other's sums bit for bit (a norm and the matvec prologue repeating
// it, PARTS and its reduced form) need the order pinned.
GJ_DEVICE float f4_sum_sq(float4 v) {
    return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, __fmul_rn(v.x, v.x))));
}

// ------------------------------------------------------------------------------------------------
// Warp reductions over groups of kWidth consecutive lanes (kWidth a power of two <= 32). Every lane
// of the group ends with the group's result. All lanes of the warp must call them.
template <int kWidth = 32>
GJ_DEVICE float warp_sum(float v) {
#pragma unroll
    for (int o = kWidth / 2; o > 0; o >>= 1) v += __shfl_xor_sync(GJ_FULL_MASK, v, o);
    return v;
}
template <int kWidth = 32>
GJ_DEVICE float warp_max(float v) {
#pragma unroll
    for (int o = kWidth / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(GJ_FULL_MASK, v, o));
    return v;
}
template <int kWidth = 32>
GJ_DEVICE int32 warp_sum_i32(int32 v) {
#pragma unroll
    for (int o = kWidth / 2; o > 0; o >>= 1) v += __shfl_xor_sync(GJ_FULL_MASK, v, o);
    return v;
}

// ------------------------------------------------------------------------------------------------
// Fast transcendental approximations (MUFU). Use where their error is far below the precision of
// the data they feed (softmax weights, GELU of int8-quantized activations).

// 2^x, max relative error about 2^-22; flushes subnormal results to zero.
GJ_DEVICE float exp2_approx(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
// tanh(x), max absolute error about 2^-10.7 (sm_75+).
GJ_DEVICE float tanh_approx(float x) {
    float r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
// 1/x, max relative error about 2^-23.
GJ_DEVICE float rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
// 1 / sqrt(x) for normal x > 0 (the RMSNorm scale): rsqrt.approx (about 2 ulp) refined by one
// Newton step to about 1 ulp, without the out-of-line slow paths of the IEEE sqrt.rn / rcp.rn
// (subroutine calls whose register saves show up as spills in the norm kernels). x = +inf gives 0.
GJ_DEVICE float rsqrt_refined(float x) {
    const float r = rsqrtf(x);
    const float h = 0.5f * x * r;
    const float e = fmaf(-h, r, 0.5f);  // 0.5 - x r^2 / 2: the relative error of r, halved
    return x < __int_as_float(0x7f800000) ? fmaf(e, r, r) : r;
}
// GELU with the tanh approximation (gelu_pytorch_tanh), evaluated with the accurate tanhf.
GJ_DEVICE float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
// gelu_tanh(a) * o over 4 values: the PLE gate times the token's PLE input (o 4-byte aligned).
GJ_DEVICE float4 gelu_mul4(float4 a, float4 o) {
    return make_float4(gelu_tanh(a.x) * o.x, gelu_tanh(a.y) * o.y, gelu_tanh(a.z) * o.z,
                       gelu_tanh(a.w) * o.w);
}
GJ_DEVICE float4 gelu_mul4(float4 a, const float* o) {
    return gelu_mul4(a, make_float4(o[0], o[1], o[2], o[3]));
}

// ------------------------------------------------------------------------------------------------
// Global loads.

// Asks L2 for the whole 16-byte pieces within the `bytes` bytes at p (nothing past either end),
// without waiting and without a register: one bulk prefetch by the calling thread (sm_90; a
// no-op before).
GJ_DEVICE void prefetch_l2_range(const void* p, uint32 bytes) {
#if __CUDA_ARCH__ >= 900
    const uint64 a = ((uint64)p + 15) & ~(uint64)15;
    const uint64 e = ((uint64)p + bytes) & ~(uint64)15;
    if (e > a)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((uint32)(e - a))
                     : "memory");
#endif
}

// Asks for p's cache line in L1 (no register, no wait): data a later loop reads again.
GJ_DEVICE void prefetch_l1(const void* p) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// Streaming read-only 16-byte load (weights): no L1 allocation, read-only path. p 16-byte aligned.
GJ_DEVICE uint4 ld_stream_u32x4(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
// Streaming read-only 8-byte load. p 8-byte aligned.
GJ_DEVICE uint2 ld_stream_u32x2(const void* p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                 : "=r"(r.x), "=r"(r.y)
                 : "l"(p));
    return r;
}
// Streaming read-only 4-byte load. p 4-byte aligned.
GJ_DEVICE uint32 ld_stream_u32(const void* p) {
    uint32 r;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}
// Read-only 16-bit load (a block's fp16 scale).
GJ_DEVICE uint16 ld_nc_u16(const void* p) {
    uint16 r;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}

// 32-bit little-endian value at an address that is only 2-byte aligned (Q8_0 blocks are 34 bytes,
// so every other block's int8 payload starts at 2 mod 4): two 16-bit loads.
GJ_DEVICE uint32 load_u32_align2(const void* p) {
    const uint16* h = (const uint16*)p;
    return (uint32)h[0] | ((uint32)h[1] << 16);
}

// The 32 bits starting `shift_bytes` (0..3) into the 8-byte little-endian pair (lo, hi): joins two
// aligned words into the unaligned one between them.
GJ_DEVICE uint32 funnel_bytes(uint32 lo, uint32 hi, uint32 shift_bytes) {
    return __funnelshift_r(lo, hi, shift_bytes * 8);
}

// ------------------------------------------------------------------------------------------------
// Activation quantization ("Q8_1 activations"): 32 consecutive floats become 32 int8 values q with
// scale d = max|x| / 127 (q = round(x / d)), plus s = d * sum(q), which the Q4_0 dot product
// needs for its -8 offset. Layout: int8 q[K] (row-contiguous, so 16-byte vector loads work) and
// float2 {d, s}[K / 32].
//
// 127 / amax rounded to nearest even, bit-identical to the IEEE division 127.0f / amax for every
// amax > 0 (subnormal and inf included), without the division's out-of-line slow path: that path
// is a subroutine call, and the registers saved around it show up as spills in the kernels that
// quantize. The divisor is scaled by a power of two into [2^-85, 2^64]; rcp.approx plus one
// Newton step gives a quotient within about 1.5 ulp, which two rounds of exact tests against the
// midpoints to its neighbours correct (a float times the midpoint of two adjacent floats, 24 x 25
// bits, is exact in double); the result is scaled back: exact while the quotient is normal, and
// an overflow rounds to inf at the same threshold as the unscaled division. (A CPU simulation
// with a reciprocal off by up to 4 ulp and the GPU test over 2^27 divisors agree with IEEE.)
GJ_DEVICE float q8_inv_scale(float amax) {
    if (amax == __int_as_float(0x7f800000)) return 0.0f;
    const float s = amax < 0x1p-60f ? 0x1p64f : (amax > 0x1p60f ? 0x1p-64f : 1.0f);
    const float b = amax * s;
    const double db = b;
    float r = rcp_approx(b);
    r = fmaf(fmaf(-b, r, 1.0f), r, r);
    float c = 127.0f * r;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const uint32 bits = __float_as_uint(c);
        const float up = __uint_as_float(bits + 1), dn = __uint_as_float(bits - 1);
        const double at_up = db * (0.5 * ((double)c + (double)up));  // b * midpoint, exact
        const double at_dn = db * (0.5 * ((double)c + (double)dn));
        const bool odd = bits & 1u;  // ties go to the even neighbour
        if (at_up < 127.0 || (at_up == 127.0 && odd))
            c = up;
        else if (at_dn > 127.0 || (at_dn == 127.0 && odd))
            c = dn;
    }
    return c * s;
}

// Called by 8 consecutive lanes (an aligned group of 8 in the warp) that each hold 4 consecutive
// values of one 32-block, lane (lane % 8) holding values 4*(lane % 8) .. +3. Returns this lane's 4
// packed int8; `ds` gets {d, s} on every lane of the group.
GJ_DEVICE uint32 quantize_q8_1_group8(float4 v, float2* ds) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    amax = warp_max<8>(amax);
    const float d = amax * (1.0f / 127.0f);
    const float inv = amax > 0.0f ? q8_inv_scale(amax) : 0.0f;  // the CPU's 127.0f / amax
    const int32 q0 = f32_to_s8_sat(v.x * inv), q1 = f32_to_s8_sat(v.y * inv);
    const int32 q2 = f32_to_s8_sat(v.z * inv), q3 = f32_to_s8_sat(v.w * inv);
    const int32 sum = warp_sum_i32<8>(q0 + q1 + q2 + q3);
    *ds = make_float2(d, d * (float)sum);
    return pack_s8x4(q0, q1, q2, q3);
}

#endif  // GJ_PTX_CUH
