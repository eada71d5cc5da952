// matvec_q6_k: decode matvec for Q6_K weights in their GGUF super-blocks (layout: kquant.cuh)
// against Q8_1 activations, with dp4a. Constants, launch and entry points: see
// matvec_common.cuh (K a multiple of 256, LAYOUT 0, THREADS, ROWS, NCOLS, UNROLL). Entries:
// matvec_q6_k, matvec_q6_k_add, matvec_q6_k_geglu.
//
// A unit is (half n, sixteen t) of a super-block, 4 units per block: l = 16t .. 16t+15 of half n,
// i.e. the 64 elements 128n + 32g + 16t + 0..15 (g = 0..3), which take ql[64n + 16t ..] and
// ql[64n + 32 + 16t ..] (16 bytes each), qh[32n + 16t ..] (16 bytes), scales 8n + t + 2g and d.
// Blocks are 210 bytes, so the loads join aligned words (gj_ld_u32x4_align2). The 6-bit values
// minus 32 fit int8 (__vsub4), so each group g is one plain dp4a sum against its activation block
// 4n + g (no min term); the group's scale multiplies it.
#include "kquant.cuh"
#include "matvec_common.cuh"

static_assert(K % 256 == 0, "matvec_q6_k: K must be a multiple of 256 (whole super-blocks)");
static_assert(LAYOUT == 0, "matvec_q6_k: only the GGUF layout (LAYOUT 0)");

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
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        const int b = u / 4, i = u % 4, n = i / 2, t = i % 2;
        const int blk0 = 8 * b + 4 * n;  // Q8_1 block of group 0
        const int4* x4 = (const int4*)((const int8*)x + (size_t)c * K) + 2 * blk0 + t;
        const float2* ds = xds + (size_t)c * (K / 32) + blk0;
        XFrag r;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            r.q[g] = __ldg(x4 + 2 * g);
            r.d[g] = __ldg(&ds[g].x);
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

GJ_MATVEC_ENTRIES(matvec_q6_k, gj_q6_k)
