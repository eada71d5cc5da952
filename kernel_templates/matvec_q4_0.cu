// matvec_q4_0: decode matvec for Q4_0 weights (ggml block: fp16 scale d, then 16 bytes whose low
// nibbles are elements 0..15 and high nibbles elements 16..31; weight = d * (nibble - 8)) against
// Q8_1 activations, with dp4a.
// Constants, layouts, launch and entry points: see matvec_common.cuh (K, LAYOUT, THREADS, ROWS,
// NCOLS, UNROLL). Entries: matvec_q4_0, matvec_q4_0_add, matvec_q4_0_geglu, and with LAYOUT=1
// also repack_q4_0.
//
// The -8 offset uses the activation block's precomputed s = d * sum(q):
//   sum((n - 8) * qx) * dx = dx * sum(n * qx) - 8 * s,
// and a lane covering a fraction f of a block subtracts f * 8 * s (the fractions add up to 1).
#include "matvec_common.cuh"

#if LAYOUT == 0
// GGUF blocks: two lanes per block, 16 weights (8 payload bytes) per lane.
struct gj_q4_0 {
    static constexpr int kBlockBytes = 18;
    static constexpr int kUnits = K / 16;
    struct Row {
        const uint8* p;
    };
    struct WFrag {
        uint32 q0, q1, dbits;
    };
    struct XFrag {
        int2 lo;    // activations under the low nibbles (elements 8p .. 8p+7)
        int2 hi;    // under the high nibbles (elements 16+8p .. 16+8p+7)
        float2 ds;  // block {d, d * sum(q)}
    };
    static GJ_DEVICE Row row(const uint8* w, int, int r) {
        return Row{w + (size_t)r * (K / 32) * kBlockBytes};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.p, K / 32 * kBlockBytes);
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) {
        WFrag f;
        gj_load_ggml_unit(row.p + (u / 2) * kBlockBytes, u % 2, f.q0, f.q1, f.dbits);
        return f;
    }
    static GJ_DEVICE float scale(const WFrag& f, int lane) {
        return f16_to_f32((uint16)__shfl_sync(GJ_FULL_MASK, f.dbits, lane & ~1));
    }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        const int b = u / 2, p = u % 2;
        const int2* x2 = (const int2*)((const int8*)x + c * K) + 4 * b + p;
        return XFrag{gj_ldx<kS>(x2), gj_ldx<kS>(x2 + 2), gj_ldx<kS>(&xds[c * (K / 32) + b])};
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        const int32 s = gj_q4_dot8(f.q0, f.q1, x.lo.x, x.lo.y, x.hi.x, x.hi.y, 0);
        return x.ds.x * (float)s - 4.0f * x.ds.y;  // half of 8 * s per lane
    }
};
#else
// Split planes: one lane per block, its 16 nibble bytes in one 16-byte load.
struct gj_q4_0 {
    static constexpr int kUnits = K / 32;
    struct Row {
        const uint8* q;   // K / 2 nibble bytes
        const uint16* d;  // K / 32 fp16 scales
    };
    struct WFrag {
        uint4 q;
        uint16 dbits;
    };
    using XFrag = gj_x32;
    static GJ_DEVICE Row row(const uint8* w, int n_rows, int r) {
        return Row{w + (size_t)r * (K / 2),
                   (const uint16*)(w + (size_t)n_rows * (K / 2)) + (size_t)r * (K / 32)};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.q, K / 2);
        gj_prefetch_plane(row.d, K / 16);
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) {
        return WFrag{ld_stream_u32x4(row.q + 16 * u), ld_nc_u16(row.d + u)};
    }
    static GJ_DEVICE float scale(const WFrag& f, int) { return f16_to_f32(f.dbits); }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        return gj_x32::load<kS>(x, xds, c, u);
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        int32 s = gj_q4_dot8(f.q.x, f.q.y, x.lo.x, x.lo.y, x.hi.x, x.hi.y, 0);
        s = gj_q4_dot8(f.q.z, f.q.w, x.lo.z, x.lo.w, x.hi.z, x.hi.w, s);
        return x.ds.x * (float)s - 8.0f * x.ds.y;
    }
};

// ggml blocks [n_rows][K / 32] -> split planes (dst must not overlap src). One thread per block;
// any grid covering n_rows * K / 32 threads. Run once at load.
extern "C" __global__ void repack_q4_0(const void* src, void* dst, int n_rows) {
    gj_grid_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t n_blocks = (size_t)n_rows * (K / 32);
    if (i >= n_blocks) return;
    const uint16* s = (const uint16*)((const uint8*)src + i * 18);  // 2-byte aligned
    uint32* q = (uint32*)((uint8*)dst + i * 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = (uint32)s[1 + 2 * k] | ((uint32)s[2 + 2 * k] << 16);
    ((uint16*)((uint8*)dst + n_blocks * 16))[i] = s[0];
}
#endif

GJ_MATVEC_ENTRIES(matvec_q4_0, gj_q4_0)
