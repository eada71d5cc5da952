// attn_kv.cuh: the KV cache element type, shared by attn_prep (writes rows), flash_decode,
// flash_prefill and flash_prefill_wgmma (read them), and the helpers the readers share.
//   KV_TYPE 0 = IEEE fp16 (default), 1 = bfloat16: 2 bytes per element, so a cache row of
//     HEAD_DIM elements is 2 * HEAD_DIM bytes and 8 elements fill one 16-byte load.
//   KV_TYPE 2 = q8_0: int8 payloads with one fp16 scale per 32 consecutive elements of a row,
//     value = scale * q. Quantized like ggml's Q8_0 reference: d = amax / 127, q = round(x / d)
//     computed as round_half_away(x * (1 / d)), scale stored as fp16(d). A block holding a NaN or
//     an infinity stores a NaN scale, so the whole block reads back as NaN (never silently 0).
//
// Cache layout of one plane (K or V) of `slots` positions; position p lives in slot p % slots (a
// ring on sliding layers, the whole context on global layers):
//   f16 / bf16: elements [slots][N_KV_HEADS][HEAD_DIM].
//   q8_0:       payload int8 [slots][N_KV_HEADS][HEAD_DIM], then at byte offset
//               slots * N_KV_HEADS * HEAD_DIM (a multiple of 16 since HEAD_DIM % 32 == 0) the
//               scales fp16 [slots][N_KV_HEADS][HEAD_DIM / 32]. So both pieces of a plane start
//               16-byte aligned, a payload row is HEAD_DIM bytes (16-byte chunks for cp.async) and
//               the kernels address everything from the plane base and `slots` alone.
#ifndef GJ_ATTN_KV_CUH
#define GJ_ATTN_KV_CUH

#include "gj_ptx.cuh"

#ifndef KV_TYPE
#define KV_TYPE 0
#endif
static_assert(KV_TYPE == 0 || KV_TYPE == 1 || KV_TYPE == 2,
              "attn: KV_TYPE must be 0 (f16), 1 (bf16) or 2 (q8_0)");
static_assert(KV_TYPE != 2 || HEAD_DIM % 32 == 0, "attn: a q8_0 cache needs HEAD_DIM % 32 == 0");

// -inf, the score of a masked key.
GJ_DEVICE float neg_inf() {
    return __int_as_float(0xff800000);
}

// (sin, cos) of RoPE pair j at position pos (NeoX pairs j, j + HEAD_DIM / 2). The frequency is
// the fp32 value of base^(-2j/HEAD_DIM), computed in double so that it equals the correctly
// rounded powf of the CPU reference; the angle is float(pos) * freq in fp32 as HF computes it,
// and sincosf is the accurate one. Callers make a table of these before their grid wait.
GJ_DEVICE float2 rope_sin_cos(int j, int pos, float rope_base) {
    const float e = (float)(2 * j) / (float)HEAD_DIM;
    const float inv_freq = 1.0f / (float)pow((double)rope_base, (double)e);
    float s, c;
    sincosf((float)pos * inv_freq, &s, &c);
    return make_float2(s, c);
}

// 16-byte cp.async that writes zeros instead when !live: tile rows past a key range must hold
// zeros, never stale bits (P = 0 times a NaN is still NaN).
GJ_DEVICE void cp_async16_or_zero(uint32 smem_dst, const void* gmem_src, bool live) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_dst), "l"(gmem_src),
                 "r"(live ? 16 : 0)
                 : "memory");
}

#define KV_Q8 (KV_TYPE == 2)
// Bytes of one cache row's elements (payload for q8_0) and of its scales (0 without scales).
#define KV_ROW_BYTES (KV_Q8 ? HEAD_DIM : 2 * HEAD_DIM)
#define KV_SCALE_ROW_BYTES (KV_Q8 ? HEAD_DIM / 16 : 0)

// Start of the scale piece of a q8_0 plane.
GJ_DEVICE const uint8* kv_scale_plane(const void* plane, int slots) {
    return (const uint8*)plane + (size_t)slots * N_KV_HEADS * KV_ROW_BYTES;
}

#if !KV_Q8
// Two floats -> one 32-bit word of two KV elements (lo in bits 0..15), round to nearest even.
GJ_DEVICE uint32 kv_pack2(float lo, float hi) {
#if KV_TYPE == 0
    return pack_f16x2(lo, hi);
#else
    return pack_u16x2(f32_to_bf16(lo), f32_to_bf16(hi));
#endif
}

// One 32-bit word of two KV elements -> two floats (exact).
GJ_DEVICE float2 kv_unpack2(uint32 w) {
#if KV_TYPE == 0
    return unpack_f16x2(w);
#else
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
#endif
}

// One KV element (raw 16 bits) -> float.
GJ_DEVICE float kv_to_f32(uint16 h) {
#if KV_TYPE == 0
    return f16_to_f32(h);
#else
    return bf16_to_f32(h);
#endif
}
#else
// Scales are copied into shared memory in pieces of KV_SCALE_GRAIN bytes (cp.async takes 4, 8 or
// 16); a 32-dim head has 2 bytes of scales per row, which plain loads copy instead (visible to the
// other threads after the barrier that precedes their use, like the asynchronous copies). Dead
// rows (!live) get zeros.
#define KV_SCALE_GRAIN (KV_SCALE_ROW_BYTES >= 16 ? 16 : KV_SCALE_ROW_BYTES)
GJ_DEVICE void kv_copy_scale_or_zero(uint8* smem_dst, const uint8* gmem_src, bool live) {
#if KV_SCALE_GRAIN >= 4
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem_addr(smem_dst)),
                 "l"(gmem_src), "n"(KV_SCALE_GRAIN), "r"(live ? KV_SCALE_GRAIN : 0)
                 : "memory");
#else
    *(uint16*)smem_dst = live ? *(const uint16*)gmem_src : (uint16)0;
#endif
}

// Signed byte b (0..3) of a 32-bit word of q8_0 payload, as a float.
GJ_DEVICE float q8_byte(uint32 w, int b) {
    return (float)((int32)(w << (24 - 8 * b)) >> 24);
}

// Four payload bytes of one block -> four floats (exact: 8-bit q times an fp16 scale).
GJ_DEVICE void q8_dequant4(uint32 w, float d, float* out) {
    out[0] = q8_byte(w, 0) * d;
    out[1] = q8_byte(w, 1) * d;
    out[2] = q8_byte(w, 2) * d;
    out[3] = q8_byte(w, 3) * d;
}
#endif

#endif  // GJ_ATTN_KV_CUH
