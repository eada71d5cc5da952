// attn_kv.cuh: the KV cache element type, shared by attn_prep (writes rows) and flash_decode
// (reads them). KV_TYPE 0 = IEEE fp16 (default), 1 = bfloat16; both 2 bytes per element, so a
// cache row of HEAD_DIM elements is 2 * HEAD_DIM bytes and 8 elements fill one 16-byte load.
//
// Cache layout (both planes): [slots][N_KV_HEADS][HEAD_DIM] elements; position p lives in slot
// p % slots (a ring on sliding layers, the whole context on global layers).
#ifndef GJ_ATTN_KV_CUH
#define GJ_ATTN_KV_CUH

#include "gj_ptx.cuh"

#ifndef KV_TYPE
#define KV_TYPE 0
#endif
static_assert(KV_TYPE == 0 || KV_TYPE == 1, "attn: KV_TYPE must be 0 (f16) or 1 (bf16)");

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

#endif  // GJ_ATTN_KV_CUH
