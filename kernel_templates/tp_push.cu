// tp_push: a tensor-parallel prefill chunk's exchange of one row-parallel partial product (the
// attention output projection's or FFN down's), through NCCL's device API instead of an NCCL
// all-reduce launch. Each rank converts its fp32 partial product to bf16 and stores it, as one
// stream, into its own slot of every rank's symmetric window (peer memory over NVLink); then each
// block meets the same block of every other rank at an LSA barrier. Once the kernel has finished
// on a rank, every rank's product is in that rank's own window, and the post-norm after it sums
// the slots in rank order (rmsnorm X_BF16 = PEERS), reading local memory only.
//
// Why a kernel of its own: the ranks wait for each other in a kernel that only moves data, one
// block per SM (fewer measured slower, more no faster), while the next layer's F16 weight copies
// keep running; an exchange whose barrier sat in the norm's 512 blocks measured slower
// (docs/TENSOR_PARALLEL.md).
// It replaces three steps: the conversion to bf16, NCCL's bf16 all-reduce and the sum's rounding
// to bf16 (the norm sums the bf16 products in fp32).
//
// Constants: N (values per row: d_model, a multiple of 4), PEERS (ranks, 2..8), THREADS.
// Launch: block THREADS, a grid whose blocks all run at once (GpuModel::tp_push_blocks); barrier b
// is block b's, so the device communicator holds at least gridDim.x LSA barriers and every rank
// launches the same grid.
// Entries:
//   bf16_push_lsa(x, rows, to, comm): x [rows][N] fp32, this rank's partial product; to.y[p]:
//     the base of the slots in rank p's window ([rows][PEERS][N] bf16, this rank's at
//     (r * PEERS + self) * N for row r); comm the ncclDevComm, by value.
//   lsa_window_pointers(win, offset, out): out[p] = the address of byte `offset` of rank p's
//     window (the destinations above, found once at setup).
#include "gj_nccl_lsa.cuh"
#include "gj_ptx.cuh"

#ifndef THREADS
#define THREADS 256
#endif
#ifndef PEERS
#define PEERS 2
#endif

static_assert(N % 4 == 0, "tp_push: N must be a multiple of 4 (float4 rows)");
static_assert(PEERS >= 2 && PEERS <= 8, "tp_push: 2 to 8 ranks");

#define VEC (N / 4)  // float4 per row
#define UNROLL 4     // float4 loads in flight per thread

// The destinations, by value (indexed by constants only: parameter space, no stack copy).
struct gj_bf16_slots {
    uint2* y[8];
};

extern "C" __global__ void __launch_bounds__(THREADS)
    bf16_push_lsa(const float4* __restrict__ x, int rows, gj_bf16_slots to,
                  const __grid_constant__ ncclDevComm comm) {
    if (comm.lsaSize != PEERS) __trap();  // the engine's ranks: one host's GPUs
    const int self = comm.lsaRank;
    // The grid wait only: the kernel after it (the post-norm, 512 blocks for a 512-row chunk)
    // starts when this one ends, not early, so its waiting blocks hold no SMs the weight copies
    // could use while the exchange runs.
    gj_grid_wait();
    const int total = rows * VEC;
    const int stride = gridDim.x * THREADS * UNROLL;
    for (int base = blockIdx.x * THREADS * UNROLL + threadIdx.x; base < total; base += stride) {
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * THREADS;
            v[u] = i < total ? __ldg(x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * THREADS;
            if (i >= total) break;
            const int r = i / VEC, c = i - r * VEC;
            const uint2 b = make_uint2(pack_u16x2(f32_to_bf16(v[u].x), f32_to_bf16(v[u].y)),
                                       pack_u16x2(f32_to_bf16(v[u].z), f32_to_bf16(v[u].w)));
            const size_t at = ((size_t)r * PEERS + self) * VEC + c;
#pragma unroll
            for (int p = 0; p < PEERS; ++p) to.y[p][at] = b;
        }
    }
    // The block's stores (local and over NVLink) are published by its arrival (release, after
    // the CTA sync inside arrive); the kernel ends once every rank's same block has arrived, so
    // the kernel after it reads every rank's product. (Made after the grid wait: the session
    // reads this barrier's epoch, which the last kernel to use barrier b stored at its end.)
    ncclLsaBarrierSession<ncclCoopCta> barrier{ncclCoopCta(), comm, ncclTeamTagLsa{},
                                               (uint32_t)blockIdx.x};
    barrier.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

extern "C" __global__ void lsa_window_pointers(ncclWindow_t win, size_t offset, void** out) {
    gj_grid_sync();  // (as every model kernel, though nothing it reads is written by a kernel)
    gj_lsa_window_pointers(win, offset, out, PEERS);
}
