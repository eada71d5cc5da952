// l2_prefetch: asks L2 for up to four byte ranges of weights and returns without waiting for
// them. A decode step launches it on a side branch of its graph right after a matvec, for the
// weights the step reads next (GEMMAJIT_PREFETCH_AHEAD_MB ahead of the matvecs). Between the
// matvecs run chains of small kernels (norms, attention, the tensor-parallel all-reduces) that
// leave HBM idle; the prefetch fills those gaps, so the next matvecs find their leading rows in
// L2 instead of waiting for HBM.
//
// Constants: THREADS (block size, a multiple of 32), CHUNK (bytes one thread asks for, a multiple
// of 128).
// Launch: block THREADS, grid ceil((n0 + n1 + n2 + n3) / (THREADS * CHUNK)); plain, not as a
// programmatic dependent (it waits on nothing and nothing waits on its requests).
// Entry: l2_prefetch(p0, n0, p1, n1, p2, n2, p3, n3): ranges of n_i bytes at p_i (16-byte
// aligned; n_i may be 0). Only hints: the results of every kernel are the same without it.
#include "gj_ptx.cuh"

#ifndef THREADS
#define THREADS 128
#endif
#ifndef CHUNK
#define CHUNK 8192
#endif
static_assert(THREADS % 32 == 0 && THREADS <= 1024,
              "l2_prefetch: THREADS must be a multiple of 32 up to 1024");
static_assert(CHUNK % 128 == 0 && CHUNK > 0, "l2_prefetch: CHUNK must be a multiple of 128");

// Asks for [p, p + n) (n <= CHUNK): one bulk request on sm_90, one per 128-byte line before.
GJ_DEVICE void prefetch_chunk(const uint8* p, uint64 n) {
#if __CUDA_ARCH__ >= 900
    prefetch_l2_range(p, (uint32)n);
#else
    for (uint64 o = 0; o < n; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

// Asks for this thread's chunk when it lies in the range [p, p + n); else moves `at` past it.
GJ_DEVICE bool prefetch_in(const uint8* p, uint64 n, uint64& at) {
    if (at >= n) {
        at -= n;
        return false;
    }
    prefetch_chunk(p + at, n - at < CHUNK ? n - at : CHUNK);
    return true;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    l2_prefetch(const uint8* p0, uint64 n0, const uint8* p1, uint64 n1, const uint8* p2, uint64 n2,
                const uint8* p3, uint64 n3) {
    // This thread's chunk of the four ranges laid end to end.
    uint64 at = ((uint64)blockIdx.x * THREADS + threadIdx.x) * CHUNK;
    prefetch_in(p0, n0, at) || prefetch_in(p1, n1, at) || prefetch_in(p2, n2, at) ||
        prefetch_in(p3, n3, at);
}
