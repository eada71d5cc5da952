// matvec_q32.cuh: the matvec traits of Q4_1, Q5_0 and Q5_1 (layouts in q32_blocks.cuh), read in
// place in their GGUF blocks against Q8_1 activations with dp4a; matvec_q4_1.cu, matvec_q5_0.cu
// and matvec_q5_1.cu instantiate it.
//
// Two lanes per block, as Q4_0's GGUF layout: part p holds payload bytes 8p .. 8p+7, i.e. the low
// nibbles of elements 8p .. 8p+7 and the high nibbles of 16+8p .. 16+8p+7, plus their fifth bits.
// With the activation block {dx, sx = dx * sum(qx)}:
//   Q4_1 / Q5_1: sum (d q + m) dx qx = d dx sum(q qx) + m sx,
//   Q5_0:        sum d (q - 16) dx qx = d (dx sum(q qx) - 16 sx),
// and each of the two lanes takes half of the sx term.
#ifndef GJ_MATVEC_Q32_CUH
#define GJ_MATVEC_Q32_CUH

#include "matvec_common.cuh"
#include "q32_blocks.cuh"

static_assert(LAYOUT == 0, "matvec (Q4_1/Q5_0/Q5_1): only the GGUF layout (LAYOUT 0)");

template <int kType>
struct gj_q32 {
    using L = gj_q32_layout<kType>;
    static constexpr int kUnits = K / 16;
    struct Row {
        const uint8* p;
    };
    struct WFrag {
        uint32 q0, q1;  // payload bytes 8p .. 8p+7
        uint32 qh;      // the block's fifth bits, shifted so bit 0 is element 8p
        uint32 dm;      // d | m << 16 (m only for Q4_1 / Q5_1)
    };
    struct XFrag {
        int2 lo, hi;
        float2 ds;
    };
    static GJ_DEVICE Row row(const uint8* w, int, int r) {
        return Row{w + (size_t)r * (K / 32) * L::kBytes};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.p, K / 32 * L::kBytes);
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) {
        const int p = u % 2;
        const uint8* blk = row.p + (size_t)(u / 2) * L::kBytes;
        WFrag f;
        f.q0 = L::word(blk + L::kQs + 8 * p);
        f.q1 = L::word(blk + L::kQs + 8 * p + 4);
        f.qh = L::kFifth ? L::word(blk + L::kQh) >> (8 * p) : 0u;
        f.dm = L::kMin ? L::word(blk) : (uint32)load_u32_align2(blk) & 0xffffu;
        return f;
    }
    static GJ_DEVICE float scale(const WFrag&, int) { return 1.0f; }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        const int b = u / 2, p = u % 2;
        const int2* x2 = (const int2*)((const int8*)x + (size_t)c * K) + 4 * b + p;
        return XFrag{gj_ldx<kS>(x2), gj_ldx<kS>(x2 + 2),
                     gj_ldx<kS>(&xds[(size_t)c * (K / 32) + b])};
    }
    // Four payload nibbles of a word plus their fifth bits (4 bits of qh from `shift`).
    static GJ_DEVICE int32 bytes(uint32 nibbles, uint32 qh, int shift) {
        uint32 v = nibbles & 0x0f0f0f0fu;
        if (L::kFifth) v |= ((((qh >> shift) & 0xfu) * 0x00204081u) & 0x01010101u) << 4;
        return (int32)v;
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        int32 s = dp4a_s8(bytes(f.q0, f.qh, 0), x.lo.x, 0);
        s = dp4a_s8(bytes(f.q1, f.qh, 4), x.lo.y, s);
        s = dp4a_s8(bytes(f.q0 >> 4, f.qh, 16), x.hi.x, s);
        s = dp4a_s8(bytes(f.q1 >> 4, f.qh, 20), x.hi.y, s);
        const float2 dm = unpack_f16x2(f.dm);
        if (L::kMin) return dm.x * x.ds.x * (float)s + 0.5f * dm.y * x.ds.y;
        return dm.x * (x.ds.x * (float)s - 8.0f * x.ds.y);
    }
};

#endif  // GJ_MATVEC_Q32_CUH
