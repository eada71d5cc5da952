// kquant.cuh: reading ggml's K-quant super-blocks (256 elements) in place, as the GGUF stores
// them. Shared by the K-quant matvecs (matvec_q4_k.cu, matvec_q5_k.cu, matvec_q6_k.cu), the
// embedding gather (embed.cu) and the F16 dequantization for prefill GEMMs (dequant_f16.cu).
//
//   Q4_K (144 bytes): fp16 d, fp16 dmin, scales[12] (8 six-bit scales + 8 six-bit mins), qs[128].
//     Chunk j (elements 64j .. 64j+63): the low nibbles of qs[32j .. 32j+31] are elements
//     64j + 0..31 (sub-block 2j), the high nibbles elements 64j + 32..63 (sub-block 2j+1).
//     x = d * sc[s] * q - dmin * m[s].
//   Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]: Q4_K's nibbles plus a fifth bit, bit
//     2j of qh[l] for element 64j + l and bit 2j+1 for element 64j + 32 + l (l < 32).
//   Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d. In half n (elements 128n ..),
//     for l < 32 and g = 0..3, element 128n + 32g + l has the low (g < 2) or high (g >= 2)
//     nibble of ql[64n + 32 * (g & 1) + l] as its low 4 bits and bits 2g, 2g+1 of qh[32n + l]
//     as its high 2; x = d * scales[8n + 2g + l / 16] * (q - 32).
// Q4_K and Q5_K blocks are multiples of 16 bytes, so a row of whole blocks keeps the 16-byte
// alignment of its base; a Q6_K block is 2 mod 4 bytes, so every other block (and row) starts 2
// bytes past a word: gj_ld_u32x4_align2 reads those.
//
// Split layouts (Q4_K, Q5_K, Q6_K), made once at load by repack_q4_k / repack_q5_k / repack_q6_k
// (matvec_q4_k.cu, matvec_q5_k.cu, matvec_q6_k.cu) for aligned, coalesced matvec loads. A unit is
// 32 consecutive elements of a row (units are numbered row by row: unit r * K / 32 + u); the
// planes follow one another, each over the whole matrix (`units` = n_rows * K / 32 of them):
//   Q4_K (148 bytes per 256):  nibbles [units][16] | d|dmin [units / 8] u32 | sc|m [units] u16
//   Q5_K (180 bytes per 256, the file's 176 + 4):  nibbles [units][16] | fifth bits [units] u32 |
//                              d|dmin [units / 8] u32 | sc|m [units] u16
//   Q6_K (210 bytes, as the file): low nibbles [units][16] | high bits [units][8] |
//                              scales [units][2] int8 | d [units / 8] fp16
// The nibble bytes are in the Q4_0 order: byte b's low nibble is element b of the unit, its high
// nibble element 16 + b (so word t holds elements 4t.. and 16 + 4t..). Q4_K's and Q5_K's sc|m are
// the sub-block's 6-bit scale and min, one byte each (d|dmin: the super-block's two fp16, as in
// the file). Q5_K's fifth-bit word: byte i, bit j holds the fifth bit of element 4j + i, so for
// nibble word t the bits under its low nibbles are bit t of each byte and those under its high
// nibbles bit 4 + t (gj_q5_k_split_q). Q6_K's high bits: word w (w = 0, 1) of the
// unit's 8 bytes, byte i, holds the top 2 bits of elements 8w + i (bits 0-1), 16 + 8w + i (2-3),
// 8w + 4 + i (4-5) and 16 + 8w + 4 + i (6-7): for nibble word t the bits under its low nibbles
// sit at 4 (t % 2) and those under its high nibbles at 4 (t % 2) + 2. Its two scales are those of
// elements 0..15 and 16..31.
#ifndef GJ_KQUANT_CUH
#define GJ_KQUANT_CUH

#include "gj_ptx.cuh"

#define GJ_Q4_K_BYTES 144
#define GJ_Q5_K_BYTES 176
#define GJ_Q6_K_BYTES 210

// Scale and min of sub-block `is` (0..7) from the 12 packed bytes as three little-endian words
// (ggml's get_scale_min_k4): sub-blocks 0..3 keep 6 bits in bytes 0..3 (scales) and 4..7 (mins);
// sub-blocks 4..7 take their low 4 bits from the nibbles of bytes 8..11 and their high 2 bits
// from the top bits of bytes 0..3 / 4..7.
GJ_DEVICE void gj_kq_scale_min(uint32 w0, uint32 w1, uint32 w2, int is, int& sc, int& m) {
    const uint32 sh = 8u * (uint32)(is & 3);
    const uint32 b0 = (w0 >> sh) & 0xffu, b1 = (w1 >> sh) & 0xffu;
    if (is < 4) {
        sc = (int)(b0 & 63u);
        m = (int)(b1 & 63u);
    } else {
        const uint32 b2 = (w2 >> sh) & 0xffu;
        sc = (int)((b2 & 15u) | ((b0 >> 2) & 0x30u));
        m = (int)((b2 >> 4) | ((b1 >> 2) & 0x30u));
    }
}

// 16 bytes at an address that is only 2-byte aligned: the five aligned words under them, joined
// by funnel shifts (read-only path; neighbouring lanes' words share L1 lines).
GJ_DEVICE uint4 gj_ld_u32x4_align2(const uint8* p) {
    const uint32 mis = (uint32)(uint64)p & 2u;
    const uint32* w = (const uint32*)(p - mis);
    const uint32 w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3);
    const uint32 w4 = __ldg(w + (mis ? 4 : 3));
    const uint32 s = mis * 8;
    return make_uint4(__funnelshift_r(w0, w1, s), __funnelshift_r(w1, w2, s),
                      __funnelshift_r(w2, w3, s), __funnelshift_r(w3, w4, s));
}

// 8 bytes at a 2-byte aligned address, as two words.
GJ_DEVICE uint2 gj_ld_u32x2_align2(const uint8* p) {
    const uint32 mis = (uint32)(uint64)p & 2u;
    const uint32* w = (const uint32*)(p - mis);
    const uint32 w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + (mis ? 2 : 1));
    const uint32 s = mis * 8;
    return make_uint2(__funnelshift_r(w0, w1, s), __funnelshift_r(w1, w2, s));
}

// The four elements 4g .. 4g+3 (g = 0..63) of the super-block at `blk`, dequantized exactly as the
// CPU does it (engine/gguf/dequant.cpp: the same float products in the same order, no FMA
// contraction), so gathered embeddings equal the CPU's bit for bit. WTYPE is the ggml type id:
// 12 Q4_K, 13 Q5_K, 14 Q6_K.
template <int kType>
GJ_DEVICE float4 gj_kq_dequant4(const uint8* blk, int g) {
    const int e = 4 * g;  // first element
    uint32 q;             // the four values' quant bytes, before offsets
    float f[4];
    if (kType == 12 || kType == 13) {
        const int j = e / 64, c = e % 64, hi = c >= 32, l = c % 32;
        const uint32 w0 = load_u32_align2(blk + 4), w1 = load_u32_align2(blk + 8),
                     w2 = load_u32_align2(blk + 12);
        int sc, m;
        gj_kq_scale_min(w0, w1, w2, 2 * j + hi, sc, m);
        const float d = __fmul_rn(f16_to_f32(*(const uint16*)blk), (float)sc);
        const float mn = __fmul_rn(f16_to_f32(*(const uint16*)(blk + 2)), (float)m);
        const int qs_off = kType == 12 ? 16 : 48;
        q = (load_u32_align2(blk + qs_off + 32 * j + l) >> (hi ? 4 : 0)) & 0x0f0f0f0fu;
        if (kType == 13) {
            const uint32 h = load_u32_align2(blk + 16 + l);
            q |= ((h >> (2 * j + hi)) & 0x01010101u) << 4;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k)
            f[k] = __fsub_rn(__fmul_rn(d, (float)((q >> (8 * k)) & 0xffu)), mn);
    } else {
        const int n = e / 128, c = e % 128, gg = c / 32, l = c % 32;
        const uint32 lo = load_u32_align2(blk + 64 * n + l + 32 * (gg & 1));
        const uint32 h = load_u32_align2(blk + 128 + 32 * n + l);
        q = ((lo >> (gg & 2 ? 4 : 0)) & 0x0f0f0f0fu) | (((h >> (2 * gg)) & 0x03030303u) << 4);
        const int sc = (int)(int8)blk[192 + 8 * n + l / 16 + 2 * gg];
        const float ds = __fmul_rn(f16_to_f32(*(const uint16*)(blk + 208)), (float)sc);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            f[k] = __fmul_rn(ds, (float)((int)((q >> (8 * k)) & 0xffu) - 32));
    }
    return make_float4(f[0], f[1], f[2], f[3]);
}

// Offsets of the split planes after the nibbles, for a matrix of `units` 32-element units.
GJ_DEVICE size_t gj_q4_k_dm_plane(size_t units) {
    return units * 16;
}
GJ_DEVICE size_t gj_q4_k_scm_plane(size_t units) {
    return units * 16 + units / 2;
}
GJ_DEVICE size_t gj_q5_k_qh_plane(size_t units) {
    return units * 16;
}
GJ_DEVICE size_t gj_q5_k_dm_plane(size_t units) {
    return units * 20;
}
GJ_DEVICE size_t gj_q5_k_scm_plane(size_t units) {
    return units * 20 + units / 2;
}
GJ_DEVICE size_t gj_q6_k_qh_plane(size_t units) {
    return units * 16;
}
GJ_DEVICE size_t gj_q6_k_sc_plane(size_t units) {
    return units * 24;
}
GJ_DEVICE size_t gj_q6_k_d_plane(size_t units) {
    return units * 26;
}

// The four unsigned 6-bit values (0..63, one per byte) under the low (hi 0) or high (hi 1)
// nibbles of nibble word t of a split Q6_K unit, given that word and top-bit word t / 2.
GJ_DEVICE uint32 gj_q6_k_split_q(uint32 ql, uint32 h, int t, int hi) {
    return ((ql >> (4 * hi)) & 0x0f0f0f0fu) | (((h >> (4 * (t & 1) + 2 * hi)) & 0x03030303u) << 4);
}

// The four unsigned 5-bit values (0..31, one per byte) under the low (hi 0) or high (hi 1)
// nibbles of nibble word t of a split Q5_K unit, given that word and the unit's fifth-bit word.
GJ_DEVICE uint32 gj_q5_k_split_q(uint32 ql, uint32 h, int t, int hi) {
    return ((ql >> (4 * hi)) & 0x0f0f0f0fu) | (((h >> (t + 4 * hi)) & 0x01010101u) << 4);
}

// The split Q4_K / Q5_K repack of one unit (sub-block s of a super-block whose 6-bit scales are in
// the block head's words 1..3): its 16 nibble bytes in the Q4_0 order from the 32 qs bytes of its
// chunk (sub-block s's element e is nibble s % 2 of qs[e]: elements 4t.. under the low nibbles of
// word t, 16 + 4t.. under its high ones), and its scale and min unpacked to sc | m << 8.
GJ_DEVICE void gj_kq_split_repack_unit(const uint32* qs, uint4 head, int s, uint32* q,
                                       uint16* scm) {
    const int hi = s % 2;
#pragma unroll
    for (int t = 0; t < 4; ++t)
        q[t] = ((qs[t] >> (4 * hi)) & 0x0f0f0f0fu) | (((qs[4 + t] >> (4 * hi)) & 0x0f0f0f0fu) << 4);
    int sc, m;
    gj_kq_scale_min(head.y, head.z, head.w, s, sc, m);
    *scm = (uint16)(sc | (m << 8));
}

// A split Q4_K / Q5_K unit's contribution from its integer dot s = sum(q qx): d sc dx s -
// dmin m sx (dm: d | dmin fp16; scm: sc | m << 8; xds: the activation block's {dx, sx}).
GJ_DEVICE float gj_kq_split_unit_sum(uint32 dm_bits, uint32 scm, float2 xds, int32 s) {
    const float2 dm = unpack_f16x2(dm_bits);  // {d, dmin}
    const float sc = (float)(scm & 0xffu), m = (float)(scm >> 8);
    return dm.x * sc * xds.x * (float)s - dm.y * m * xds.y;
}

// Elements p .. p+3 (p a multiple of 4 below 32) of unit `unit` of a split matrix at w, with the
// CPU's products (as gj_kq_dequant4: equal bit for bit). kType: 12 Q4_K, 13 Q5_K, 14 Q6_K.
template <int kType>
GJ_DEVICE float4 gj_kq_split_dequant4(const uint8* w, size_t units, size_t unit, int p) {
    const int t = (p & 15) / 4, hi = p >= 16;
    const uint32 ql = __ldg((const uint32*)(w + unit * 16) + t);
    float f[4];
    if (kType == 12 || kType == 13) {
        const size_t dm_plane = kType == 12 ? gj_q4_k_dm_plane(units) : gj_q5_k_dm_plane(units);
        const size_t scm_plane = kType == 12 ? gj_q4_k_scm_plane(units) : gj_q5_k_scm_plane(units);
        const uint32 dm = __ldg((const uint32*)(w + dm_plane) + unit / 8);
        const uint32 scm = __ldg((const uint16*)(w + scm_plane) + unit);
        const float d = __fmul_rn(f16_to_f32((uint16)(dm & 0xffffu)), (float)(scm & 0xffu));
        const float mn = __fmul_rn(f16_to_f32((uint16)(dm >> 16)), (float)(scm >> 8));
        uint32 q = (ql >> (4 * hi)) & 0x0f0f0f0fu;
        if (kType == 13) {
            const uint32 h = __ldg((const uint32*)(w + gj_q5_k_qh_plane(units)) + unit);
            q = gj_q5_k_split_q(ql, h, t, hi);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k)
            f[k] = __fsub_rn(__fmul_rn(d, (float)((q >> (8 * k)) & 0xffu)), mn);
    } else {
        const uint32 h = __ldg((const uint32*)(w + gj_q6_k_qh_plane(units) + unit * 8) + t / 2);
        const uint32 q = gj_q6_k_split_q(ql, h, t, hi);
        const int sc = (int)(int8)__ldg(w + gj_q6_k_sc_plane(units) + unit * 2 + hi);
        const uint16 dbits = __ldg((const uint16*)(w + gj_q6_k_d_plane(units)) + unit / 8);
        const float ds = __fmul_rn(f16_to_f32(dbits), (float)sc);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            f[k] = __fmul_rn(ds, (float)((int)((q >> (8 * k)) & 0xffu) - 32));
    }
    return make_float4(f[0], f[1], f[2], f[3]);
}

#endif  // GJ_KQUANT_CUH
