// matvec_q8_0: decode matvec for Q8_0 weights (ggml block: fp16 scale d, then 32 int8 q; weight
// = d * q) against Q8_1 activations, with dp4a.
// Constants, layouts, launch and entry points: see matvec_common.cuh (K, LAYOUT, THREADS, ROWS,
// NCOLS, UNROLL). Entries: matvec_q8_0, matvec_q8_0_add, matvec_q8_0_geglu, and with LAYOUT=1
// also repack_q8_0.
#include "matvec_common.cuh"

#if LAYOUT == 0
// GGUF blocks: four lanes per block, 8 weights per lane. Block sum = dw * dx * sum(qw * qx).
struct gj_q8_0 {
    static constexpr int kBlockBytes = 34;
    static constexpr int kUnits = K / 8;
    struct Row {
        const uint8* p;
    };
    struct WFrag {
        uint32 q0, q1, dbits;
    };
    struct XFrag {
        int2 q;   // the 8 activation values under this unit
        float d;  // their block scale
    };
    static GJ_DEVICE Row row(const uint8* w, int, int r) {
        return Row{w + (size_t)r * (K / 32) * kBlockBytes};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.p, K / 32 * kBlockBytes);
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) {
        WFrag f;
        gj_load_ggml_unit(row.p + (u / 4) * kBlockBytes, u % 4, f.q0, f.q1, f.dbits);
        return f;
    }
    static GJ_DEVICE float scale(const WFrag& f, int lane) {
        return f16_to_f32((uint16)__shfl_sync(GJ_FULL_MASK, f.dbits, lane & ~3));
    }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        const int8* xq = (const int8*)x + c * K;
        return XFrag{gj_ldx<kS>((const int2*)xq + u), gj_ldx<kS>(&xds[c * (K / 32) + u / 4].x)};
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        return x.d * (float)dp4a_s8((int32)f.q1, x.q.y, dp4a_s8((int32)f.q0, x.q.x, 0));
    }
};
#else
// Split planes: two lanes per block, 16 weights (one 16-byte load) per lane.
struct gj_q8_0 {
    static constexpr int kUnits = K / 16;
    struct Row {
        const uint8* q;   // K int8
        const uint16* d;  // K / 32 fp16 scales
    };
    struct WFrag {
        uint4 q;
        uint16 dbits;
    };
    struct XFrag {
        int4 q;
        float d;
    };
    static GJ_DEVICE Row row(const uint8* w, int n_rows, int r) {
        return Row{w + (size_t)r * K,
                   (const uint16*)(w + (size_t)n_rows * K) + (size_t)r * (K / 32)};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.q, K);
        gj_prefetch_plane(row.d, K / 16);
    }
    static GJ_DEVICE WFrag load_w(Row row, int u) {
        return WFrag{ld_stream_u32x4(row.q + 16 * u), ld_nc_u16(row.d + u / 2)};
    }
    static GJ_DEVICE float scale(const WFrag& f, int) { return f16_to_f32(f.dbits); }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        const int8* xq = (const int8*)x + c * K;
        return XFrag{gj_ldx<kS>((const int4*)xq + u), gj_ldx<kS>(&xds[c * (K / 32) + u / 2].x)};
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        int32 s = dp4a_s8((int32)f.q.x, x.q.x, 0);
        s = dp4a_s8((int32)f.q.y, x.q.y, s);
        s = dp4a_s8((int32)f.q.z, x.q.z, s);
        s = dp4a_s8((int32)f.q.w, x.q.w, s);
        return x.d * (float)s;
    }
};

// ggml blocks [n_rows][K / 32] -> split planes (dst must not overlap src). One thread per block;
// any grid covering n_rows * K / 32 threads. Run once at load.
extern "C" __global__ void repack_q8_0(const void* src, void* dst, int n_rows) {
    gj_grid_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t n_blocks = (size_t)n_rows * (K / 32);
    if (i >= n_blocks) return;
    const uint16* s = (const uint16*)((const uint8*)src + i * 34);  // 2-byte aligned
    uint32* q = (uint32*)((uint8*)dst + i * 32);
#pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = (uint32)s[1 + 2 * k] | ((uint32)s[2 + 2 * k] << 16);
    ((uint16*)((uint8*)dst + n_blocks * 32))[i] = s[0];
}
#endif

GJ_MATVEC_ENTRIES(matvec_q8_0, gj_q8_0)
