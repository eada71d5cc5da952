// q32_blocks.cuh: ggml's 32-element block types besides Q8_0 / Q4_0 (the fallback types K-quant
// files use where a row is not whole 256-element super-blocks), as the GGUF stores them and in
// their split layout (below). Shared by their matvecs (matvec_q32.cuh), the embedding gather
// (embed.cu, GGUF blocks only) and the F16 dequantization for prefill products (dequant_f16.cu).
//
//   Q4_1 (type 3, 20 bytes): fp16 d, fp16 m, qs[16];          x = d * q + m, q = 4 bits
//   Q5_0 (type 6, 22 bytes): fp16 d, qh[4], qs[16];           x = d * (q - 16), q = 5 bits
//   Q5_1 (type 7, 24 bytes): fp16 d, fp16 m, qh[4], qs[16];   x = d * q + m, q = 5 bits
// The low nibbles of qs[0..15] are elements 0..15, the high nibbles elements 16..31 (as Q4_0);
// bit e of the little-endian word qh is the fifth bit of element e. Q4_1 and Q5_1 blocks keep a
// row's 4-byte alignment; Q5_0's 22-byte blocks only 2-byte alignment.
#ifndef GJ_Q32_BLOCKS_CUH
#define GJ_Q32_BLOCKS_CUH

#include "gj_ptx.cuh"
#include "kquant.cuh"

template <int kType>
struct gj_q32_layout {
    static_assert(kType == 3 || kType == 6 || kType == 7, "q32 block type: 3, 6 or 7");
    static constexpr int kBytes = kType == 3 ? 20 : kType == 6 ? 22 : 24;
    static constexpr bool kMin = kType != 6;    // x = d * q + m (else d * (q - 16))
    static constexpr bool kFifth = kType != 3;  // a fifth bit per element in qh
    static constexpr int kQh = kType == 6 ? 2 : 4;
    static constexpr int kQs = kType == 3 ? 4 : kType == 6 ? 6 : 8;
    // A 32-bit word at a byte offset of a block: aligned loads where the block size keeps words
    // aligned, two 16-bit loads for Q5_0.
    static GJ_DEVICE uint32 word(const uint8* p) {
        if (kBytes % 4 == 0) return __ldg((const uint32*)p);
        return load_u32_align2(p);
    }
};

// The split layout of these types (matvec LAYOUT 1, made once at load by the matvecs' repack_<type>
// entries), over a matrix's `units` blocks (n_rows * K / 32; rows contiguous in every plane):
//   [0, 16 units)          each block's 16 payload bytes as the file stores them (Q4_0's order)
//   [16 units, 20 units)   Q5_0 / Q5_1: each block's fifth-bit word, rearranged as split Q5_K's
//                          (kquant.cuh): bit t of byte i is element 4t + i's fifth bit, bit 4 + t
//                          element 16 + 4t + i's, so the four bits under one nibble word are one
//                          shift and mask away
//   then                   each block's fp16 d (Q5_0) or d | m << 16 (Q4_1 / Q5_1)
// The same bytes as the GGUF blocks; each plane starts on its element's alignment when the
// matrix does (16 bytes), and a stack of experts repacked one by one keeps every expert's base
// 16-byte aligned when its block count is a multiple of 8.
template <int kType>
struct gj_q32_split_planes {
    using L = gj_q32_layout<kType>;
    static GJ_DEVICE size_t qh(size_t units) { return 16 * units; }
    static GJ_DEVICE size_t dm(size_t units) { return (L::kFifth ? 20 : 16) * units; }
};

// A GGUF fifth-bit word (bit e: element e) in the split order above.
GJ_DEVICE uint32 gj_q32_split_fifth(uint32 qh) {
    uint32 h = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        // Nibble t of qh (elements 4t .. 4t+3) spread to bit 0 of bytes 0..3, then moved to bit t.
        h |= ((((qh >> (4 * t)) & 0xfu) * 0x00204081u) & 0x01010101u) << t;
        h |= ((((qh >> (16 + 4 * t)) & 0xfu) * 0x00204081u) & 0x01010101u) << (4 + t);
    }
    return h;
}

// Block `unit` of a GGUF matrix at `src` to the split planes at `dst` (of `units` blocks).
template <int kType>
GJ_DEVICE void gj_q32_split_repack(const uint8* src, uint8* dst, size_t units, size_t unit) {
    using L = gj_q32_layout<kType>;
    using P = gj_q32_split_planes<kType>;
    const uint8* blk = src + unit * L::kBytes;
    uint32* q = (uint32*)(dst + 16 * unit);
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = L::word(blk + L::kQs + 4 * k);
    if (L::kFifth)
        ((uint32*)(dst + P::qh(units)))[unit] = gj_q32_split_fifth(L::word(blk + L::kQh));
    if (L::kMin)
        ((uint32*)(dst + P::dm(units)))[unit] = L::word(blk);
    else
        ((uint16*)(dst + P::dm(units)))[unit] = *(const uint16*)blk;
}

// The four elements e .. e+3 (e a multiple of 4) of block `unit` of a split matrix at `w` of
// `units` blocks, dequantized exactly as gj_q32_dequant4 (and the CPU) does it.
template <int kType>
GJ_DEVICE float4 gj_q32_split_dequant4(const uint8* w, size_t units, size_t unit, int e) {
    using L = gj_q32_layout<kType>;
    using P = gj_q32_split_planes<kType>;
    const uint32 ql = __ldg((const uint32*)(w + 16 * unit + (e & 15)));
    const uint32 h = L::kFifth ? __ldg((const uint32*)(w + P::qh(units)) + unit) : 0u;
    const uint32 q = gj_q5_k_split_q(ql, h, (e & 15) / 4, e >= 16);  // h is 0 for Q4_1
    float d, m = 0.0f;
    if (L::kMin) {
        const uint32 dm = __ldg((const uint32*)(w + P::dm(units)) + unit);
        d = f16_to_f32((uint16)(dm & 0xffffu));
        m = f16_to_f32((uint16)(dm >> 16));
    } else {
        d = f16_to_f32(__ldg((const uint16*)(w + P::dm(units)) + unit));
    }
    float f[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int v = (int)((q >> (8 * k)) & 0xffu);
        f[k] = L::kMin ? __fadd_rn(__fmul_rn((float)v, d), m) : __fmul_rn((float)(v - 16), d);
    }
    return make_float4(f[0], f[1], f[2], f[3]);
}

// The four elements 4g .. 4g+3 (g = 0..7) of the block at `blk`, dequantized exactly as the CPU
// does it (engine/gguf/dequant.cpp: the same float products and sums, unfused).
template <int kType>
GJ_DEVICE float4 gj_q32_dequant4(const uint8* blk, int g) {
    using L = gj_q32_layout<kType>;
    const int e = 4 * g;
    uint32 q = (L::word(blk + L::kQs + (e & 15)) >> (e >= 16 ? 4 : 0)) & 0x0f0f0f0fu;
    if (L::kFifth) {
        const uint32 bits = (L::word(blk + L::kQh) >> e) & 0xfu;
        q |= ((bits * 0x00204081u) & 0x01010101u) << 4;  // bit i -> bit 4 of byte i
    }
    const float d = f16_to_f32(*(const uint16*)blk);
    float f[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int v = (int)((q >> (8 * k)) & 0xffu);
        if (L::kMin)
            f[k] = __fadd_rn(__fmul_rn((float)v, d), f16_to_f32(*(const uint16*)(blk + 2)));
        else
            f[k] = __fmul_rn((float)(v - 16), d);
    }
    return make_float4(f[0], f[1], f[2], f[3]);
}

#endif  // GJ_Q32_BLOCKS_CUH
