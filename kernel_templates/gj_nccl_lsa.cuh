// NCCL's device API as the engine's kernels use it: the headers of an LSA barrier (a CTA meeting
// the same CTA of every other rank of one host) and of a symmetric window's peer pointers. A
// module including this is compiled against the headers of the NCCL library the process loaded
// (jit/nccl_device.h), never a copy of our own.
#pragma once

#include "gj_ptx.cuh"

// The patched utility.h first (jit/nccl_device.h), so that its include guard skips NCCL's own.
#include <gj_nccl_utility.h>

#include <nccl_device/impl/core__funcs.h>
#include <nccl_device/impl/ptr__funcs.h>

// The same LSA barrier API in both: renamed from mem_barrier to lsa_barrier in 2.28.7.
#if NCCL_VERSION_CODE >= 22807
#include <nccl_device/impl/lsa_barrier__funcs.h>
#else
#include <nccl_device/impl/mem_barrier__funcs.h>
#endif

// out[p] = the address of byte `offset` of rank p's window, p < peers: NCCL's own pointer
// arithmetic (of the headers of the library loaded), asked once at setup by the kernels that
// store into the peers' windows.
GJ_DEVICE void gj_lsa_window_pointers(ncclWindow_t win, size_t offset, void** out, int peers) {
    if (threadIdx.x < peers && blockIdx.x == 0)
        out[threadIdx.x] = ncclGetLsaPointer(win, offset, threadIdx.x);
}
