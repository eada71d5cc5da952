// Warpgroup tensor-core helpers (wgmma, sm_90a) shared by gemm_wgmma.cu and
// flash_prefill_wgmma.cu: the shared-memory descriptor of a K-major SWIZZLE_128B tile, the fence /
// commit / wait of the asynchronous products, the async-proxy fence for shared memory written by
// plain stores or cp.async, the register pin that keeps accumulator accesses out of the
// asynchronous window, and the mbarriers of a producer warpgroup's pipeline.
#ifndef GJ_WGMMA_CUH
#define GJ_WGMMA_CUH

#include "gj_ptx.cuh"

// Shared-memory matrix descriptor of a K-major SWIZZLE_128B tile at shared address `addr`
// (1024-byte aligned, or advanced by 32 bytes per k16 within a 128-byte row): start address >> 4,
// leading byte offset 1 (unused by swizzled K-major tiles), stride 1024 bytes between 8-row groups,
// swizzle mode 1 (128 B) in bits 62-63.
GJ_DEVICE uint64 wg_desc(uint32 addr) {
    return (uint64)((addr & 0x3ffff) >> 4) | ((uint64)1 << 16) | ((uint64)(1024 >> 4) << 32) |
           ((uint64)1 << 62);
}
GJ_DEVICE void wg_fence() {  // orders register writes (A operands, accumulators) before wgmmas
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
GJ_DEVICE void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
GJ_DEVICE void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (cp.async) visible to the async proxy
// that wgmma reads through; a barrier must follow before other warps' wgmmas.
GJ_DEVICE void wg_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Keeps the compiler from moving accumulator accesses across the asynchronous window.
template <int N>
GJ_DEVICE void wg_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// mbarrier helpers (shared::cta, 64-bit barriers at 8-byte aligned shared addresses): the full /
// empty handshakes between a producer warpgroup and its consumers.
GJ_DEVICE void wg_mbar_init(uint32 addr, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(addr), "r"(count) : "memory");
}
GJ_DEVICE void wg_mbar_arrive(uint32 addr) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(addr)
                 : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
GJ_DEVICE void wg_mbar_wait(uint32 addr, uint32 parity) {
    uint32 done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
}
// Initializes `n` barriers of `count` arrivals each at addr, addr + 8, ... (one thread calls it;
// a block barrier must follow before any thread uses them).
GJ_DEVICE void wg_mbar_init_all(uint32 addr, int n, int count) {
    for (int i = 0; i < n; ++i) wg_mbar_init(addr + 8 * i, count);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

#endif  // GJ_WGMMA_CUH
