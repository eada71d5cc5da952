// NCCL, the collectives of tensor parallelism (one model over several GPUs of one process: an
// all-reduce of the d-wide residual update after each row-parallel product, docs/
// TENSOR_PARALLEL.md). The library is dlopen'ed on first use, like the driver and cuBLAS, so no
// binary links it and a machine without it runs everything else: from GEMMAJIT_NCCL_LIB when set,
// else libnccl.so.2 on the library path, in the CUDA install, or in a Python nvidia-nccl wheel's
// folder (where the GPU machines keep it). Only the ABI subset the engine calls is declared here
// (NCCL keeps it stable across 2.x): no nccl.h is needed to build.
//
// Loading also sets NCCL_NVLS_ENABLE=0 unless the environment sets it: NVLink multicast (NVLS)
// stays off on the GPU machines (it needs fabric support they do not enable). And NCCL_SYM_CTAS=16:
// NCCL's symmetric all-reduces on 16 blocks instead of the few its cost model picks (faster for
// every prefill and the 31B's TP=2 decode measured, within 1% elsewhere; docs/PERFORMANCE.md).
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gj::jit {

class Flags;

// The element types of a collective (ncclDataType_t values).
enum class NcclType : int { I32 = 2, F16 = 6, F32 = 7, BF16 = 9 };
// The reductions of an all-reduce (ncclRedOp_t values).
enum class NcclOp : int { Sum = 0, Min = 3 };

class Nccl {
  public:
    // An opaque communicator (ncclComm_t).
    using Comm = struct NcclCommOpaque*;

    // The process-wide library, loaded on first use (later calls get it; one naming another file
    // in GEMMAJIT_NCCL_LIB throws). Throws DeviceUnavailable naming every place looked in when
    // none of them holds a loadable NCCL 2.x with the functions used.
    static Nccl& get(const Flags& flags);
    // The files get() tries, in order: GEMMAJIT_NCCL_LIB alone when set; else the bare soname
    // (the loader's search path) followed by the CUDA install's and the Python wheels' copies
    // that exist on this machine.
    static std::vector<std::string> candidates(const Flags& flags);

    const std::string& path() const { return path_; }  // where it was loaded from
    const std::string& file() const { return file_; }  // the file the loader found for path()
    int version() const { return version_; }           // e.g. 22809 for 2.28.9

    // One communicator per device ordinal in `devices` (ncclCommInitAll: one process drives
    // them all), rank i on devices[i]. Throws DeviceError naming the NCCL error.
    std::vector<Comm> init_all(const std::vector<int>& devices);

    // The rendezvous of a communicator whose ranks are separate processes (ncclUniqueId: 128
    // opaque bytes). Rank 0 makes it and hands it to the others, which pass it to init_rank.
    static constexpr size_t kUniqueIdBytes = 128;
    using UniqueId = std::array<char, kUniqueIdBytes>;
    UniqueId unique_id();
    // This process's communicator as `rank` of `ranks` on the current context's device
    // (ncclCommInitRank; blocks until every rank has joined).
    Comm init_rank(int ranks, const UniqueId& id, int rank);
    void destroy(Comm comm);  // never throws

    // In-place sum over the ranks of `count` elements at bufs[r] on streams[r] (each buffer and
    // stream on rank r's device), enqueued as one group; capturable into a CUDA graph per rank.
    // Not thread-safe for one set of communicators (NCCL's rule: one caller at a time).
    void all_reduce_sum(std::span<const Comm> comms, std::span<const CUdeviceptr> bufs,
                        size_t count, NcclType type, std::span<const CUstream> streams);
    // In place over the ranks of a communicator whose other ranks are other processes.
    void all_reduce(Comm comm, CUdeviceptr buf, size_t count, NcclType type, NcclOp op,
                    CUstream stream);
    // recv[r * count .. (r + 1) * count) = rank r's `count` elements at send, on every rank.
    void all_gather(Comm comm, CUdeviceptr send, CUdeviceptr recv, size_t count, NcclType type,
                    CUstream stream);

    // Symmetric memory (NCCL 2.27+): a buffer every rank allocates alike and registers as a
    // window, so that collectives on it take NCCL's symmetric kernels, which read and write the
    // peers' windows directly (for small messages, NCCL's fastest all-reduce).
    using Window = struct NcclWindowOpaque*;
    // Whether this library has the four calls below.
    bool has_windows() const;
    // ncclMemAlloc / ncclMemFree: memory a window may hold (the current context's device).
    CUdeviceptr mem_alloc(size_t bytes);
    void mem_free(CUdeviceptr ptr);  // never throws
    // ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC; collective (every rank of `comm` calls
    // it with a buffer of the same size, in the same order). Null where the communicator has no
    // symmetric support (its collectives then run as unregistered ones).
    Window register_window(Comm comm, CUdeviceptr buf, size_t bytes);
    void deregister_window(Comm comm, Window win);  // local to the rank; never throws
    // NCCL 2.28.0 up to 2.30.5 launch their symmetric kernels as programmatic dependents of the
    // kernel before them on sm_90+ but never wait on that grid (NCCL's commit 2948185d,
    // "Reintroduce cudaGridDependencySynchronize in built-in symmetric kernels", first in 2.30.6):
    // after a kernel that lets its dependents launch early, they read their input before it is
    // written. With these versions something that is no kernel must come between the two.
    bool symmetric_kernels_skip_grid_wait() const { return version_ >= 22800 && version_ < 23006; }

    // NCCL's device API (2.28+, nccl_device.h): a device communicator whose LSA barriers and
    // window pointers kernels compiled against this library's own headers use (jit/
    // nccl_device.h), e.g. the decode post-norm that sums the ranks' products itself. Its
    // structs are the ABI of one release, so only the releases whose requirements layout the
    // engine was checked against count: 2.28.3, 2.28.7 and 2.28.9.
    bool has_device_api() const;
    // ncclDevCommCreate with `lsa_barriers` LSA barriers; collective, like register_window. The
    // ncclDevComm NCCL wrote (this release's layout), zero-padded to kDevCommBytes: a kernel
    // takes it by value, the launch copying as many bytes as the kernel's parameter holds.
    static constexpr size_t kDevCommBytes = 4096;
    std::vector<uint8_t> dev_comm_create(Comm comm, int lsa_barriers);
    void dev_comm_destroy(Comm comm, const std::vector<uint8_t>& dev_comm);  // never throws

  private:
    Nccl() = default;
    struct Api;
    const Api* api_ = nullptr;
    std::string path_, file_;
    int version_ = 0;
};

}  // namespace gj::jit
