// matvec_q5_k: decode matvec for Q5_K weights against Q8_1 activations, with dp4a. Constants,
// launch and entry points: see matvec_common.cuh (K a multiple of 256, LAYOUT, THREADS, ROWS,
// NCOLS, UNROLL). Entries: matvec_q5_k, matvec_q5_k_add, matvec_q5_k_geglu, and with LAYOUT=1
// also repack_q5_k; with MULTI_V only matvec_q5_k_multi, whose third matrix is Q6_K.
//
// LAYOUT 0: the GGUF super-blocks in place (traits and unit layout: matvec_kquant_min.cuh; block
// layout: kquant.cuh).
//
// LAYOUT 1: the split Q5_K made once at load by repack_q5_k (180 bytes per 256 elements against
// the file's 176; planes in kquant.cuh): the split Q4_K (matvec_q4_k.cu) plus one aligned word of
// fifth bits per 32-element sub-block. A unit is one sub-block: a coalesced 16-byte load of
// nibbles in the Q4_0 order, a 4-byte load of its fifth bits, its unpacked scale and min bytes
// and the super-block's d|dmin word, so the loop does no 6-bit scale unpacking and no nibble or
// bit reordering beyond one shift and mask per nibble word. Per sub-block (scale sc, min m,
// activation block {dx, sx = dx * sum(qx)}), with q = nibble | fifth bit << 4 (0..31):
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

GJ_MATVEC_ENTRIES(matvec_q5_k, gj_kq_min<true>)
#else
static_assert(K % 256 == 0, "matvec_q5_k: K must be a multiple of 256 (whole super-blocks)");

struct gj_q5_k_split {
    static constexpr int kUnits = K / 32;
    // The matrix, its unit count and the row's first unit, from which each load computes its
    // plane offset: 4 registers per row instead of 8 for four plane pointers, which spilled in
    // the 8-column GeGLU (k 8192, sm_80) and took more instructions per unit.
    struct Row {
        const uint8* w;
        uint32 units, u0;
    };
    struct WFrag {
        uint4 q;     // the sub-block's 16 nibble bytes
        uint32 qh;   // its fifth bits
        uint32 dm;   // d | dmin (fp16 each)
        uint32 scm;  // sc | m << 8
    };
    using XFrag = gj_x32;
    static GJ_DEVICE Row row(const uint8* w, int n_rows, int r) {
        return Row{w, (uint32)n_rows * (K / 32), (uint32)r * (K / 32)};
    }
    static GJ_DEVICE void prefetch_l2(const Row& row) {
        const size_t units = row.units, i = row.u0;
        gj_prefetch_plane(row.w + 16 * i, K / 2);
        gj_prefetch_plane((const uint32*)(row.w + gj_q5_k_qh_plane(units)) + i, K / 8);
        gj_prefetch_plane((const uint32*)(row.w + gj_q5_k_dm_plane(units)) + i / 8, K / 64);
        gj_prefetch_plane((const uint16*)(row.w + gj_q5_k_scm_plane(units)) + i, K / 16);
    }
    static GJ_DEVICE WFrag load_w(const Row& row, int u) {
        const size_t units = row.units, i = row.u0 + (uint32)u;
        return WFrag{ld_stream_u32x4(row.w + 16 * i),
                     ld_stream_u32((const uint32*)(row.w + gj_q5_k_qh_plane(units)) + i),
                     __ldg((const uint32*)(row.w + gj_q5_k_dm_plane(units)) + i / 8),
                     (uint32)ld_nc_u16((const uint16*)(row.w + gj_q5_k_scm_plane(units)) + i)};
    }
    static GJ_DEVICE float scale(const WFrag&, int) { return 1.0f; }
    template <bool kS = false>
    static GJ_DEVICE XFrag load_x(const void* x, const float2* xds, int c, int u) {
        return gj_x32::load<kS>(x, xds, c, u);
    }
    static GJ_DEVICE float dot(const WFrag& f, const XFrag& x) {
        return gj_kq_split_unit_sum(f.dm, f.scm, x.ds, gj_split_unit_dot5(f.q, f.qh, x));
    }
};

// GGUF super-blocks [n_rows][K / 256] -> split planes (dst must not overlap src; src 16-byte
// aligned). One thread per sub-block: any grid covering n_rows * K / 32 threads (the launch of
// the 32-element repacks). Run once at load.
extern "C" __global__ void repack_q5_k(const void* src, void* dst, int n_rows) {
    gj_grid_sync();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t units = (size_t)n_rows * (K / 32);
    if (i >= units) return;
    const size_t b = i / 8;  // super-block
    const int s = (int)(i % 8);
    const uint8* blk = (const uint8*)src + b * GJ_Q5_K_BYTES;
    const uint4 head = *(const uint4*)blk;         // d, dmin, the 12 scale bytes
    const uint32* qh = (const uint32*)(blk + 16);  // byte l: bit s is element 32s + l's fifth bit
    gj_kq_split_repack_unit((const uint32*)(blk + 48 + 32 * (s / 2)), head, s,
                            (uint32*)((uint8*)dst + i * 16),
                            (uint16*)((uint8*)dst + gj_q5_k_scm_plane(units)) + i);
    // The fifth bits: element 4t + l (byte l of qh word t) at bit t of byte l, element
    // 16 + 4t + l (byte l of qh word 4 + t) at bit 4 + t.
    uint32 h = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t)
        h |= (((qh[t] >> s) & 0x01010101u) << t) | (((qh[4 + t] >> s) & 0x01010101u) << (4 + t));
    ((uint32*)((uint8*)dst + gj_q5_k_qh_plane(units)))[i] = h;
    if (s == 0) ((uint32*)((uint8*)dst + gj_q5_k_dm_plane(units)))[b] = head.x;
}

GJ_MATVEC_ENTRIES(matvec_q5_k, gj_q5_k_split)
#endif
