// q32_blocks.cuh: ggml's 32-element block types besides Q8_0 / Q4_0, read in place as the GGUF
// stores them (the fallback types K-quant files use where a row is not whole 256-element
// super-blocks). Shared by their matvecs (matvec_q32.cuh), the embedding gather (embed.cu) and
// the F16 dequantization for prefill products (dequant_f16.cu).
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
