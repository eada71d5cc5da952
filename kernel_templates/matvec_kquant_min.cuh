// matvec_kquant_min.cuh: the matvec traits of the K-quants with a per-sub-block min, Q4_K and
// Q5_K (layouts in kquant.cuh), read in place in their GGUF blocks against Q8_1 activations with
// dp4a. matvec_q4_k.cu and matvec_q5_k.cu instantiate it for their GGUF layout (LAYOUT 0).
//
// A unit is 16 nibble bytes (one aligned 16-byte load): bytes 16h .. 16h+15 of chunk j's 32, so
// its low nibbles are elements 64j + 16h + 0..15 (sub-block 2j) and its high nibbles elements
// 64j + 32 + 16h + 0..15 (sub-block 2j+1); 8 units per super-block. Each lane also loads the
// block's 16-byte head (d, dmin, the 12 scale bytes), which the 8 lanes of a block share in L1.
// Per sub-block s (scale sc, min m, activation block {dx, sx = dx * sum(qx)}):
//   sum_l (d sc q_l - dmin m) dx qx_l = d sc dx sum(q qx) - dmin m sx,
// and a unit covering half of the sub-block takes half of the min term (the halves add up).
#ifndef GJ_MATVEC_KQUANT_MIN_CUH
#define GJ_MATVEC_KQUANT_MIN_CUH

#include "kquant.cuh"
#include "matvec_common.cuh"

static_assert(K % 256 == 0, "matvec (K-quant): K must be a multiple of 256 (whole super-blocks)");
static_assert(LAYOUT == 0, "matvec (K-quant): only the GGUF layout (LAYOUT 0)");

template <bool kHighBit>  // Q5_K: a fifth bit per element from qh
struct gj_kq_min {
    static constexpr int kBlockBytes = kHighBit ? GJ_Q5_K_BYTES : GJ_Q4_K_BYTES;
    static constexpr int kQsOffset = kHighBit ? 48 : 16;
    static constexpr int kUnits = K / 32;
    struct Row {
        const uint8* p;
    };
    struct WFrag {
        uint4 head;  // d | dmin, scale bytes 0..11
        uint4 q;     // 16 nibble bytes
        uint4 h;     // Q5_K: qh bytes 16h .. 16h+15
        int j;       // chunk (0..3)
    };
    struct XFrag {
        int4 lo, hi;          // activations under the low / high nibbles
        float2 ds_lo, ds_hi;  // their Q8_1 blocks' {d, d * sum(q)}
    };
    static GJ_DEVICE Row row(const uint8* w, int, int r) {
        return Row{w + (size_t)r * (K / 256) * kBlockBytes};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.p, K / 256 * kBlockBytes);
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) {
        const int i = u % 8, j = i / 2, h = i % 2;
        const uint8* blk = row.p + (size_t)(u / 8) * kBlockBytes;
        WFrag f;
        f.head = __ldg((const uint4*)blk);
        f.q = ld_stream_u32x4(blk + kQsOffset + 32 * j + 16 * h);
        if (kHighBit)
            f.h = __ldg((const uint4*)(blk + 16 + 16 * h));
        else
            f.h = make_uint4(0, 0, 0, 0);
        f.j = j;
        return f;
    }
    static GJ_DEVICE float scale(const WFrag&, int) { return 1.0f; }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        const int b = u / 8, i = u % 8, j = i / 2, h = i % 2;
        const int blk_lo = 8 * b + 2 * j;  // Q8_1 block of the low nibbles; +1 for the high
        const int4* x4 = (const int4*)((const int8*)x + (size_t)c * K) + 2 * blk_lo + h;
        const float2* ds = xds + (size_t)c * (K / 32) + blk_lo;
        return XFrag{gj_ldx<kS>(x4), gj_ldx<kS>(x4 + 2), gj_ldx<kS>(ds), gj_ldx<kS>(ds + 1)};
    }
    static GJ_DEVICE uint32 bits(uint32 q, uint32 h, int shift, int hbit) {
        uint32 v = (q >> shift) & 0x0f0f0f0fu;
        if (kHighBit) v |= ((h >> hbit) & 0x01010101u) << 4;
        return v;
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        const int hb = 2 * f.j;
        int32 s_lo = dp4a_s8((int32)bits(f.q.x, f.h.x, 0, hb), x.lo.x, 0);
        s_lo = dp4a_s8((int32)bits(f.q.y, f.h.y, 0, hb), x.lo.y, s_lo);
        s_lo = dp4a_s8((int32)bits(f.q.z, f.h.z, 0, hb), x.lo.z, s_lo);
        s_lo = dp4a_s8((int32)bits(f.q.w, f.h.w, 0, hb), x.lo.w, s_lo);
        int32 s_hi = dp4a_s8((int32)bits(f.q.x, f.h.x, 4, hb + 1), x.hi.x, 0);
        s_hi = dp4a_s8((int32)bits(f.q.y, f.h.y, 4, hb + 1), x.hi.y, s_hi);
        s_hi = dp4a_s8((int32)bits(f.q.z, f.h.z, 4, hb + 1), x.hi.z, s_hi);
        s_hi = dp4a_s8((int32)bits(f.q.w, f.h.w, 4, hb + 1), x.hi.w, s_hi);
        int sc0, m0, sc1, m1;
        gj_kq_scale_min(f.head.y, f.head.z, f.head.w, 2 * f.j, sc0, m0);
        gj_kq_scale_min(f.head.y, f.head.z, f.head.w, 2 * f.j + 1, sc1, m1);
        const float2 dm = unpack_f16x2(f.head.x);  // {d, dmin}
        const float dot =
            (float)sc0 * x.ds_lo.x * (float)s_lo + (float)sc1 * x.ds_hi.x * (float)s_hi;
        const float mins = (float)m0 * x.ds_lo.y + (float)m1 * x.ds_hi.y;
        return dm.x * dot - 0.5f * dm.y * mins;
    }
};

#endif  // GJ_MATVEC_KQUANT_MIN_CUH
