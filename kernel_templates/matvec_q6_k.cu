// matvec_q6_k: decode matvec for Q6_K weights against Q8_1 activations, with dp4a. Constants,
// launch and entry points: see matvec_common.cuh (K a multiple of 256, LAYOUT, THREADS, ROWS,
// NCOLS, UNROLL). Entries: matvec_q6_k, matvec_q6_k_add, matvec_q6_k_geglu, and with LAYOUT=1
// also repack_q6_k.
//
// LAYOUT 0, the GGUF super-blocks (layout: kquant.cuh). A unit is (half n, sixteen t) of a
// super-block, 4 units per block: l = 16t .. 16t+15 of half n, i.e. the 64 elements 128n + 32g +
// 16t + 0..15 (g = 0..3), which take ql[64n + 16t ..] and ql[64n + 32 + 16t ..] (16 bytes each),
// qh[32n + 16t ..] (16 bytes), scales 8n + t + 2g and d. Blocks are 210 bytes, so the loads join
// aligned words (gj_ld_u32x4_align2). The 6-bit values minus 32 fit int8 (__vsub4), so each group g
// is one plain dp4a sum against its activation block 4n + g (no min term); the group's scale
// multiplies it.
//
// LAYOUT 1, the split Q6_K made once at load by repack_q6_k (as many bytes as the file; planes in
// kquant.cuh): a unit is 32 elements, one 16-byte load of low nibbles in the Q4_0 order, one
// 8-byte load of their top bits, a 2-byte load of its two scales and the super-block's fp16 d,
// all aligned and coalesced across the warp (the GGUF blocks take 19 loads per 64 elements,
// joined by funnel shifts).
#include "kquant.cuh"
#include "matvec_common.cuh"
#include "matvec_q6_k.cuh"

#if LAYOUT == 1
// GGUF super-blocks [n_rows][K / 256] -> split planes (dst must not overlap src; src 2-byte
// aligned, as 210-byte blocks are). One thread per 32-element unit: any grid covering
// n_rows * K / 32 threads. Run once at load.
extern "C" __global__ void repack_q6_k(const void* src, void* dst, int n_rows) {
    gj_grid_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t units = (size_t)n_rows * (K / 32);
    if (i >= units) return;
    const size_t b = i / 8;                            // super-block
    const int s = (int)(i % 8), n = s / 4, g = s % 4;  // the unit is elements 128n + 32g + 0..31
    const uint8* blk = (const uint8*)src + b * GJ_Q6_K_BYTES;
    const uint8* ql = blk + 64 * n + 32 * (g & 1);  // low 4 bits: nibble g / 2 of ql[l]
    const uint8* qh = blk + 128 + 32 * n;           // top 2 bits: bits 2g, 2g+1 of qh[l]
    auto low = [&](int l) { return (uint32)(ql[l] >> (4 * (g / 2))) & 15u; };
    auto top = [&](int l) { return (uint32)(qh[l] >> (2 * g)) & 3u; };
    uint8* out = (uint8*)dst;
    for (int byte = 0; byte < 16; ++byte)
        out[i * 16 + byte] = (uint8)(low(byte) | (low(16 + byte) << 4));
    for (int w = 0; w < 2; ++w)
        for (int k = 0; k < 4; ++k)
            out[gj_q6_k_qh_plane(units) + i * 8 + 4 * w + k] =
                (uint8)(top(8 * w + k) | (top(16 + 8 * w + k) << 2) | (top(8 * w + 4 + k) << 4) |
                        (top(16 + 8 * w + 4 + k) << 6));
    out[gj_q6_k_sc_plane(units) + i * 2] = blk[192 + 8 * n + 2 * g];
    out[gj_q6_k_sc_plane(units) + i * 2 + 1] = blk[192 + 8 * n + 2 * g + 1];
    if (s == 0) ((uint16*)(out + gj_q6_k_d_plane(units)))[b] = *(const uint16*)(blk + 208);
}
#endif

GJ_MATVEC_ENTRIES(matvec_q6_k, gj_q6_k)
