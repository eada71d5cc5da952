// matvec_q6_k.cuh: the Q6_K weight traits of the decode matvecs (matvec_common.cuh's F), in the
// GGUF blocks (LAYOUT 0) and the split planes (LAYOUT 1); layouts as matvec_q6_k.cu describes
// them. A header of its own so that the Q4_K / Q5_K multi entry of the _M mixes' layers whose V is
// Q6_K (MULTI_V) reads its third matrix with them.
#ifndef GJ_MATVEC_Q6_K_CUH
#define GJ_MATVEC_Q6_K_CUH

#include "kquant.cuh"
#include "matvec_common.cuh"

static_assert(K % 256 == 0, "matvec_q6_k: K must be a multiple of 256 (whole super-blocks)");

#if LAYOUT == 0

struct gj_q6_k {
    static constexpr int kUnits = K / 64;
    struct Row {
        const uint8* p;
    };
    struct WFrag {
        uint4 ql_a, ql_b, qh;  // ql[64n + 16t ..], ql[64n + 32 + 16t ..], qh[32n + 16t ..]
        uint2 sc;              // scales 8n .. 8n+7
        uint16 dbits;
        int t;
    };
    struct XFrag {
        int4 q[4];   // group g's 16 activations
        float d[4];  // their Q8_1 block scales
    };
    static GJ_DEVICE Row row(const uint8* w, int, int r) {
        return Row{w + (size_t)r * (K / 256) * GJ_Q6_K_BYTES};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.p, K / 256 * GJ_Q6_K_BYTES);
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) {
        const int i = u % 4, n = i / 2, t = i % 2;
        const uint8* blk = row.p + (size_t)(u / 4) * GJ_Q6_K_BYTES;
        WFrag f;
        f.ql_a = gj_ld_u32x4_align2(blk + 64 * n + 16 * t);
        f.ql_b = gj_ld_u32x4_align2(blk + 64 * n + 32 + 16 * t);
        f.qh = gj_ld_u32x4_align2(blk + 128 + 32 * n + 16 * t);
        f.sc = gj_ld_u32x2_align2(blk + 192 + 8 * n);
        f.dbits = __ldg((const uint16*)(blk + 208));
        f.t = t;
        return f;
    }
    static GJ_DEVICE float scale(const WFrag& f, int) { return f16_to_f32(f.dbits); }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        const int b = u / 4, i = u % 4, n = i / 2, t = i % 2;
        const int blk0 = 8 * b + 4 * n;  // Q8_1 block of group 0
        const int4* x4 = (const int4*)((const int8*)x + (size_t)c * K) + 2 * blk0 + t;
        const float2* ds = xds + (size_t)c * (K / 32) + blk0;
        XFrag r;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            r.q[g] = gj_ldx<kS>(x4 + 2 * g);
            r.d[g] = gj_ldx<kS>(&ds[g].x);
        }
        return r;
    }
    // Group g's four words of signed 6-bit values (q - 32).
    static GJ_DEVICE int32 word(uint32 ql, uint32 qh, int g) {
        const uint32 v =
            ((ql >> (g >= 2 ? 4 : 0)) & 0x0f0f0f0fu) | (((qh >> (2 * g)) & 0x03030303u) << 4);
        return (int32)__vsub4(v, 0x20202020u);
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        float acc = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const uint4 ql = (g & 1) ? f.ql_b : f.ql_a;
            int32 s = dp4a_s8(word(ql.x, f.qh.x, g), x.q[g].x, 0);
            s = dp4a_s8(word(ql.y, f.qh.y, g), x.q[g].y, s);
            s = dp4a_s8(word(ql.z, f.qh.z, g), x.q[g].z, s);
            s = dp4a_s8(word(ql.w, f.qh.w, g), x.q[g].w, s);
            // Scale 8n + t + 2g: byte t + 2g of the 8 (g < 2: first word, else second).
            const uint32 sw = g < 2 ? f.sc.x : f.sc.y;
            const int sc = (int)(int8)((sw >> (8 * (f.t + 2 * (g & 1)))) & 0xffu);
            acc = fmaf((float)sc * x.d[g], (float)s, acc);
        }
        return acc;
    }
};

#else
struct gj_q6_k {
    static constexpr int kUnits = K / 32;
    struct Row {
        const uint8* ql;   // [K / 32][16] low nibbles
        const uint2* qh;   // [K / 32] top bits
        const uint16* sc;  // [K / 32] two int8 scales
        const uint16* d;   // [K / 256] fp16
    };
    struct WFrag {
        uint4 ql;
        uint2 qh;
        uint32 sc;
        uint16 dbits;
    };
    using XFrag = gj_x32;
    static GJ_DEVICE Row row(const uint8* w, int n_rows, int r) {
        const size_t units = (size_t)n_rows * (K / 32), u0 = (size_t)r * (K / 32);
        return Row{w + u0 * 16, (const uint2*)(w + gj_q6_k_qh_plane(units)) + u0,
                   (const uint16*)(w + gj_q6_k_sc_plane(units)) + u0,
                   (const uint16*)(w + gj_q6_k_d_plane(units)) + (size_t)r * (K / 256)};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.ql, K / 2);
        gj_prefetch_plane(row.qh, K / 4);
        gj_prefetch_plane(row.sc, K / 16);
        gj_prefetch_plane(row.d, K / 128);
    }
    static GJ_DEVICE WFrag load_w(const Row& row, int u) {
        return WFrag{ld_stream_u32x4(row.ql + 16 * u), ld_stream_u32x2(row.qh + u),
                     (uint32)ld_nc_u16(row.sc + u), ld_nc_u16(row.d + u / 8)};
    }
    static GJ_DEVICE float scale(const WFrag& f, int) { return f16_to_f32(f.dbits); }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        return gj_x32::load<kS>(x, xds, c, u);
    }
    // Nibble word t's signed 6-bit values (q - 32): its low nibbles (hi 0) or high nibbles (1).
    static GJ_DEVICE int32 word(uint32 ql, uint32 h, int t, int hi) {
        return (int32)__vsub4(gj_q6_k_split_q(ql, h, t, hi), 0x20202020u);
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        const uint32 ql[4] = {f.ql.x, f.ql.y, f.ql.z, f.ql.w};
        const int32 lo[4] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w};
        const int32 hi[4] = {x.hi.x, x.hi.y, x.hi.z, x.hi.w};
        int32 s_lo = 0, s_hi = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const uint32 h = t < 2 ? f.qh.x : f.qh.y;
            s_lo = dp4a_s8(word(ql[t], h, t, 0), lo[t], s_lo);
            s_hi = dp4a_s8(word(ql[t], h, t, 1), hi[t], s_hi);
        }
        const float sc_lo = (float)(int8)(f.sc & 0xffu), sc_hi = (float)(int8)(f.sc >> 8);
        return x.ds.x * (sc_lo * (float)s_lo + sc_hi * (float)s_hi);
    }
};
#endif

#endif  // GJ_MATVEC_Q6_K_CUH
