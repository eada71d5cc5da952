// matvec_q32.cuh: the matvec traits of Q4_1, Q5_0 and Q5_1 (layouts in q32_blocks.cuh) against
// Q8_1 activations with dp4a, in their GGUF blocks (LAYOUT 0) or their split planes (LAYOUT 1,
// with the repack entry that makes them); matvec_q4_1.cu, matvec_q5_0.cu and matvec_q5_1.cu
// instantiate it.
//
// GGUF blocks: two lanes per block, as Q4_0's GGUF layout: part p holds payload bytes 8p .. 8p+7,
// i.e. the low nibbles of elements 8p .. 8p+7 and the high nibbles of 16+8p .. 16+8p+7, plus their
// fifth bits; each of the two lanes takes half of the sx term below. Split planes: one lane per
// block, its 16 payload bytes in one 16-byte load (as split Q4_0), its fifth-bit word and scale
// from their own planes.
// With the activation block {dx, sx = dx * sum(qx)}:
//   Q4_1 / Q5_1: sum (d q + m) dx qx = d dx sum(q qx) + m sx,
//   Q5_0:        sum d (q - 16) dx qx = d (dx sum(q qx) - 16 sx).
#ifndef GJ_MATVEC_Q32_CUH
#define GJ_MATVEC_Q32_CUH

#include "matvec_common.cuh"
#include "q32_blocks.cuh"

#if LAYOUT == 0
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

#define GJ_Q32_REPACK_ENTRY(NAME, TYPE)
#else
template <int kType>
struct gj_q32 {
    using L = gj_q32_layout<kType>;
    using P = gj_q32_split_planes<kType>;
    static constexpr int kUnits = K / 32;
    // The matrix, its block count and the row's first block, from which each load computes its
    // plane offset (as split Q5_K: fewer registers per row than a pointer per plane).
    struct Row {
        const uint8* w;
        uint32 units, u0;
    };
    struct WFrag {
        uint4 q;    // the block's 16 payload bytes
        uint32 qh;  // its split fifth-bit word (Q5_0 / Q5_1)
        uint32 dm;  // d, or d | m << 16
    };
    using XFrag = gj_x32;
    static GJ_DEVICE Row row(const uint8* w, int n_rows, int r) {
        return Row{w, (uint32)n_rows * (K / 32), (uint32)r * (K / 32)};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        const size_t units = row.units, i = row.u0;
        gj_prefetch_plane(row.w + 16 * i, K / 2);
        if (L::kFifth) gj_prefetch_plane((const uint32*)(row.w + P::qh(units)) + i, K / 8);
        gj_prefetch_plane(row.w + P::dm(units) + (L::kMin ? 4 : 2) * i, K / (L::kMin ? 8 : 16));
    }
    static GJ_DEVICE WFrag load_w(const Row& row, int u) {
        const size_t units = row.units, i = row.u0 + (uint32)u;
        WFrag f;
        f.q = ld_stream_u32x4(row.w + 16 * i);
        f.qh = L::kFifth ? ld_stream_u32((const uint32*)(row.w + P::qh(units)) + i) : 0u;
        f.dm = L::kMin ? __ldg((const uint32*)(row.w + P::dm(units)) + i)
                       : (uint32)ld_nc_u16((const uint16*)(row.w + P::dm(units)) + i);
        return f;
    }
    static GJ_DEVICE float scale(const WFrag&, int) { return 1.0f; }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        return gj_x32::load<kS>(x, xds, c, u);
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        const int32 s = gj_split_unit_dot5(f.q, f.qh, x);  // qh is 0 for Q4_1
        const float2 dm = unpack_f16x2(f.dm);
        if (L::kMin) return dm.x * x.ds.x * (float)s + dm.y * x.ds.y;
        return dm.x * (x.ds.x * (float)s - 16.0f * x.ds.y);
    }
};

// GGUF blocks [n_rows][K / 32] -> split planes (dst must not overlap src; src 2-byte aligned). One
// thread per block; any grid covering n_rows * K / 32 threads. Run once at load.
#define GJ_Q32_REPACK_ENTRY(NAME, TYPE)                                                     \
    extern "C" __global__ void NAME(const void* src, void* dst, int n_rows) {               \
        gj_grid_sync();                                                                     \
        const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                     \
        const size_t units = (size_t)n_rows * (K / 32);                                     \
        if (i < units) gj_q32_split_repack<TYPE>((const uint8*)src, (uint8*)dst, units, i); \
    }
#endif

#endif  // GJ_MATVEC_Q32_CUH
