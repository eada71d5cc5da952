// gj_cluster.cuh: thread-block cluster helpers (sm_90) shared by the cluster probes
// (ffn_probe.cu, ple_cluster_probe.cu, attn_fused_probe.cu). Defined only where clusters exist;
// the probes' sm_80 builds do not use them.
#ifndef GJ_CLUSTER_CUH
#define GJ_CLUSTER_CUH

#include "gj_ptx.cuh"

#if __CUDA_ARCH__ >= 900
// This block's rank in its cluster.
GJ_DEVICE unsigned gj_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of the cluster meets here; shared (and global) stores before it are visible to
// every block of the cluster after it.
GJ_DEVICE void gj_cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;" ::
            : "memory");
}

// `p` (this block's shared memory) in block `rank` of the cluster, as a generic address: plain
// loads through it are ordinary memory operations to the compiler (ordered by the barriers'
// memory clobbers, free to be issued together), unlike volatile ld.shared::cluster statements.
template <class T>
GJ_DEVICE const T* gj_cluster_map(const T* p, unsigned rank) {
    uint64 remote;
    asm("mapa.u64 %0, %1, %2;" : "=l"(remote) : "l"((uint64)p), "r"(rank));
    return (const T*)remote;
}
#endif

#endif  // GJ_CLUSTER_CUH
