// chain_probe.cu: what a dependency between two steps of a decode-like chain costs, two ways
// (tests/gpu/gpu_test_chain_probe.cpp; issue 13, step 2, the persistent decode kernel):
//   probe_step        one launch per step, each a programmatic dependent of the one before, as
//                     the decode graph runs today: the kernel boundary is the dependency;
//   probe_persistent  one launch for every step, the blocks meeting at a device-wide barrier (an
//                     arrival counter in global memory) between steps.
// A step is a small matvec y = W x (W f16 [N][N], x and y fp32), so the next step's input is this
// one's output and every block depends on every block of the step before, as in a decode layer.
// Both forms prefetch their rows of the step's W into L2 before they wait, as the matvecs do, and
// sum in the same order, so they agree bit for bit.
// Constants: THREADS (a multiple of 32). N is a launch argument (a multiple of 256).
#include "gj_ptx.cuh"

#define PROBE_WARPS (THREADS / 32)

// The rows of W block `b` of `blocks` takes: row b*WARPS + warp, then every blocks*WARPS rows.
GJ_DEVICE void probe_prefetch(const uint4* W, int n, unsigned b, unsigned blocks) {
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32) return;
    for (int r = b * PROBE_WARPS + warp; r < n; r += blocks * PROBE_WARPS)
        prefetch_l2_range(W + (size_t)r * (n / 8), (uint32)n * 2);
}

// x is read through L2 only (ld.global.cg): in the persistent form another SM wrote it during this
// launch, and this SM's L1 may still hold the buffer's contents of two steps before.
GJ_DEVICE void probe_rows(const uint4* W, const float* x, float* y, int n, unsigned b,
                          unsigned blocks) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pieces = n / 8;
    for (int r = b * PROBE_WARPS + warp; r < n; r += blocks * PROBE_WARPS) {
        const uint4* row = W + (size_t)r * pieces;
        float s = 0.0f;
        for (int p = lane; p < pieces; p += 32) {
            const uint4 w = ld_stream_u32x4(row + p);
            const float4 xa = __ldcg(reinterpret_cast<const float4*>(x + p * 8));
            const float4 xb = __ldcg(reinterpret_cast<const float4*>(x + p * 8 + 4));
            const float2 a = unpack_f16x2(w.x), c = unpack_f16x2(w.y), d = unpack_f16x2(w.z),
                         e = unpack_f16x2(w.w);
            s += a.x * xa.x + a.y * xa.y + c.x * xa.z + c.y * xa.w + d.x * xb.x + d.y * xb.y +
                 e.x * xb.z + e.y * xb.w;
        }
        s = warp_sum(s);
        if (lane == 0) y[r] = s;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    probe_step(const uint4* __restrict__ W, const float* x, float* y, int n) {
    probe_prefetch(W, n, blockIdx.x, gridDim.x);
    gj_grid_sync();
    probe_rows(W, x, y, n, blockIdx.x, gridDim.x);
}

// Steps s = 0 .. steps-1 over the matrices W + (s % mats) * N * N, x = buf[s % 2], y = buf[(s +
// 1) % 2]. `arrived` is zero at launch; a block adds one after each step and, before step s, waits
// until every block has arrived s times. Every block of the grid must be resident at once (the
// caller launches at most one block per SM), or the wait never ends. barrier 0 skips the waits: a
// wrong result, timed only, to tell the barrier's cost from the steps'.
extern "C" __global__ void __launch_bounds__(THREADS)
    probe_persistent(const uint4* __restrict__ W, int mats, float* buf, int n, int steps,
                     unsigned* arrived, int barrier) {
    gj_grid_sync();  // (a no-op unless launched as a dependent, as every entry allows)
    const size_t mat = (size_t)n * (n / 8);
    for (int s = 0; s < steps; ++s) {
        const uint4* Ws = W + (size_t)(s % mats) * mat;
        probe_prefetch(Ws, n, blockIdx.x, gridDim.x);
        if (s > 0 && barrier) {
            if (threadIdx.x == 0) {
                const unsigned target = (unsigned)s * gridDim.x;
                unsigned seen;
                do {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                                 : "=r"(seen)
                                 : "l"(arrived)
                                 : "memory");
                } while (seen < target);
            }
            __syncthreads();
        }
        probe_rows(Ws, buf + (s % 2) * n, buf + ((s + 1) % 2) * n, n, blockIdx.x, gridDim.x);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrived) : "memory");
        }
    }
}
