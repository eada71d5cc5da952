// matvec_q4_k: decode matvec for Q4_K weights against Q8_1 activations, with dp4a. Constants,
// launch and entry points: see matvec_common.cuh (K a multiple of 256, LAYOUT, THREADS, ROWS,
// NCOLS, UNROLL). Entries: matvec_q4_k, matvec_q4_k_add, matvec_q4_k_geglu, and with LAYOUT=1
// also repack_q4_k; with MULTI_V only matvec_q4_k_multi, whose third matrix is Q6_K.
//
// LAYOUT 0: the GGUF super-blocks in place (traits and unit layout: matvec_kquant_min.cuh; block
// layout: kquant.cuh).
//
// LAYOUT 1: the split Q4_K made once at load by repack_q4_k (148 bytes per 256 elements against
// the file's 144; planes in kquant.cuh): a unit is one 32-element sub-block, one coalesced 16-byte
// load of nibbles in the Q4_0 order plus its unpacked scale and min bytes and the super-block's
// d|dmin word, so the loop does no 6-bit scale unpacking and no nibble reordering (the GGUF
// layout spends about as many instructions on those as on the dot products: its matvecs are
// issue-bound, not bandwidth-bound). Per sub-block (scale sc, min m, activation block
// {dx, sx = dx * sum(qx)}):
//   sum_l (d sc q_l - dmin m) dx qx_l = d sc dx sum(q qx) - dmin m sx.
//
// (The renderer inlines each header once, where it first appears: the shared ones come before
// the layout branches.)
#include "kquant.cuh"
#include "matvec_common.cuh"
#if MULTI_V
#include "matvec_q6_k.cuh"  // the third matrix of the multi entry
#endif

#if LAYOUT == 0
#include "matvec_kquant_min.cuh"

GJ_MATVEC_ENTRIES(matvec_q4_k, gj_kq_min<false>)
#else
static_assert(K % 256 == 0, "matvec_q4_k: K must be a multiple of 256 (whole super-blocks)");

// Row r's three planes in a split matrix of n_rows rows.
struct gj_q4_k_row {
    const uint8* q;
    const uint32* dm;
    const uint16* scm;
};
GJ_DEVICE gj_q4_k_row gj_q4_k_planes(const uint8* w, int n_rows, size_t r) {
    const size_t units = (size_t)n_rows * (K / 32);
    return gj_q4_k_row{w + r * (K / 2),
                       (const uint32*)(w + gj_q4_k_dm_plane(units)) + r * (K / 256),
                       (const uint16*)(w + gj_q4_k_scm_plane(units)) + r * (K / 32)};
}

struct gj_q4_k_split {
    static constexpr int kUnits = K / 32;
    using Row = gj_q4_k_row;
    struct WFrag {
        uint4 q;     // the sub-block's 16 nibble bytes
        uint32 dm;   // d | dmin (fp16 each)
        uint32 scm;  // sc | m << 8
    };
    using XFrag = gj_x32;
    static GJ_DEVICE Row row(const uint8* w, int n_rows, int r) {
        return gj_q4_k_planes(w, n_rows, (size_t)r);
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        gj_prefetch_plane(row.q, K / 2);
        gj_prefetch_plane(row.dm, K / 64);
        gj_prefetch_plane(row.scm, K / 16);
    }
    static GJ_DEVICE WFrag load_w(const Row& row, int u) {
        return WFrag{ld_stream_u32x4(row.q + 16 * u), __ldg(row.dm + u / 8),
                     (uint32)ld_nc_u16(row.scm + u)};
    }
    static GJ_DEVICE float scale(const WFrag&, int) { return 1.0f; }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        return gj_x32::load<kS>(x, xds, c, u);
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        int32 s = gj_q4_dot8(f.q.x, f.q.y, x.lo.x, x.lo.y, x.hi.x, x.hi.y, 0);
        s = gj_q4_dot8(f.q.z, f.q.w, x.lo.z, x.lo.w, x.hi.z, x.hi.w, s);
        return gj_kq_split_unit_sum(f.dm, f.scm, x.ds, s);
    }
};

// GGUF super-blocks [n_rows][K / 256] -> split planes (dst must not overlap src; src 16-byte
// aligned). One thread per sub-block: any grid covering n_rows * K / 32 threads (the launch of
// the 32-element repacks). Run once at load.
extern "C" __global__ void repack_q4_k(const void* src, void* dst, int n_rows) {
    gj_grid_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t units = (size_t)n_rows * (K / 32);
    if (i >= units) return;
    const size_t b = i / 8;  // super-block
    const int s = (int)(i % 8);
    const uint8* blk = (const uint8*)src + b * GJ_Q4_K_BYTES;
    const uint4 head = *(const uint4*)blk;  // d, dmin, the 12 scale bytes
    gj_kq_split_repack_unit((const uint32*)(blk + 16 + 32 * (s / 2)), head, s,
                            (uint32*)((uint8*)dst + i * 16),
                            (uint16*)((uint8*)dst + gj_q4_k_scm_plane(units)) + i);
    if (s == 0) ((uint32*)((uint8*)dst + gj_q4_k_dm_plane(units)))[b] = head.x;
}

GJ_MATVEC_ENTRIES(matvec_q4_k, gj_q4_k_split)
#endif
