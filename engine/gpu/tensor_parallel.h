// Tensor parallelism (issue 15, docs/TENSOR_PARALLEL.md): one model over N GPUs, one process per
// GPU. Every rank's process runs the same command on the same inputs (SPMD): each loads its shard
// of the weights (engine/gpu/shard_plan.h), runs the same forward pass over its heads, FFN columns
// and vocabulary rows with the NCCL collectives captured in its decode graphs, and picks the same
// next token from the gathered candidates. Only rank 0 prints.
//
// One process per GPU rather than one thread per GPU: the engine's device, streams and module set
// stay process-wide singletons, NCCL runs its intra-node transports between processes as fast as
// between threads (CUDA IPC over NVLink), and a failed rank is an exit status, not a corrupted
// shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/gpu/kernel_plan.h"
#include "jit/nccl.h"

namespace gj::jit {
class Flags;
}

namespace gj::gemma4 {

// What a model load needs to know of the split: this process's rank, and the communicator its
// collectives run on (null when only planning, e.g. `kernels --tp N`).
struct TensorParallel {
    int rank = 0;
    int ranks = 1;
    jit::Nccl* nccl = nullptr;
    jit::Nccl::Comm comm = nullptr;
    bool active() const { return ranks > 1; }
};

// Whether a split's decode steps take the forms that compile against NCCL's device headers
// (FusedNormPlan, engine/gpu/kernel_plan.h), as a load decides it: GEMMAJIT_TP_FUSED_NORM and
// GEMMAJIT_TP_SYMMETRIC on, an NCCL whose device API the engine knows, that release's device
// headers (GEMMAJIT_NCCL_INCLUDE, or found beside the library) and the CUDA headers to compile
// against; `push` is GEMMAJIT_TP_PUSH, `prefill_push` GEMMAJIT_TP_PREFILL_PUSH. `nccl` is the
// library a load runs on; null when only planning (`kernels` / `precompile --tp`), where the
// library a load would find is loaded here for its version. nullopt, with `why` saying what is off
// or missing, when they do not.
std::optional<FusedNormPlan> fused_norm_plan(const jit::Flags& flags, const jit::Nccl* nccl,
                                             std::string* why);

// A buffer of NCCL symmetric memory registered as a window of the communicator
// (GEMMAJIT_TP_SYMMETRIC): collectives on it take NCCL's symmetric kernels. Making one is
// collective (every rank makes one of the same size at the same point); freeing it is local. Empty
// (ptr() 0) where the communicator has no symmetric support: the memory is given back and the
// caller keeps its ordinary buffers. Past its `bytes` it holds one byte more: the one the barrier
// before a symmetric all-reduce writes (jit::Nccl::symmetric_kernels_skip_grid_wait).
class SymmetricBuffer {
  public:
    SymmetricBuffer() = default;
    SymmetricBuffer(const TensorParallel& tp, uint64_t bytes);
    ~SymmetricBuffer();
    SymmetricBuffer(SymmetricBuffer&& o) noexcept { *this = std::move(o); }
    SymmetricBuffer& operator=(SymmetricBuffer&& o) noexcept;
    SymmetricBuffer(const SymmetricBuffer&) = delete;
    SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

    CUdeviceptr ptr() const { return ptr_; }
    bool holds(CUdeviceptr p) const { return ptr_ && p >= ptr_ && p < ptr_ + bytes_; }
    CUdeviceptr barrier_byte() const { return ptr_ + bytes_; }
    jit::Nccl::Window window() const { return win_; }  // its device-side handle (ncclWindow_t)

  private:
    void release();
    jit::Nccl* nccl_ = nullptr;
    jit::Nccl::Comm comm_ = nullptr;
    jit::Nccl::Window win_ = nullptr;
    CUdeviceptr ptr_ = 0;
    uint64_t bytes_ = 0;
};

// NCCL's device communicator (its device API; GEMMAJIT_TP_FUSED_NORM): the LSA barriers of the
// kernels that meet the other ranks themselves (the decode post-norms summing the ranks'
// products). Making one is collective, like a SymmetricBuffer; bytes() is the ncclDevComm a
// kernel takes by value.
class DeviceComm {
  public:
    DeviceComm() = default;
    DeviceComm(const TensorParallel& tp, int lsa_barriers);
    ~DeviceComm();
    DeviceComm(DeviceComm&& o) noexcept { *this = std::move(o); }
    DeviceComm& operator=(DeviceComm&& o) noexcept;
    DeviceComm(const DeviceComm&) = delete;
    DeviceComm& operator=(const DeviceComm&) = delete;

    bool made() const { return !bytes_.empty(); }
    void* bytes() { return bytes_.data(); }

  private:
    jit::Nccl* nccl_ = nullptr;
    jit::Nccl::Comm comm_ = nullptr;
    std::vector<uint8_t> bytes_;
};

// The processes of one tensor-parallel run. Create it before anything touches the GPU (the
// driver does not survive fork()): the calling process becomes rank 0 and forks ranks 1..N-1,
// which return from the constructor too, with their own rank(), stdout sent to /dev/null and a
// death signal tied to rank 0. connect() then opens each rank's GPU (ordinal = rank) and joins
// the communicator. Rank 0 watches the others: when one fails before the run ends, rank 0 reports
// which one and with what status and exits (the collectives it waits in would never return).
class RankGroup {
  public:
    // ranks in 1..kMaxTensorParallel (1: no processes, no NCCL). Throws std::invalid_argument for
    // a count outside it, std::runtime_error when a fork or pipe fails.
    explicit RankGroup(int ranks);
    ~RankGroup();  // rank 0: stops watching and reaps the workers (see finish())
    RankGroup(const RankGroup&) = delete;
    RankGroup& operator=(const RankGroup&) = delete;

    int rank() const { return rank_; }
    int ranks() const { return ranks_; }
    bool leader() const { return rank_ == 0; }

    // Once per process: selects GPU `rank`, loads NCCL and joins the communicator (rank 0 makes
    // the rendezvous id and writes it to each worker's pipe). Throws jit::DeviceUnavailable (no
    // NCCL, no such GPU) or jit::DeviceError.
    TensorParallel connect(const jit::Flags& flags);

    // After connect(), a command stream from rank 0 to the workers over the same pipes (the
    // server's session calls, GpuSession::set_mirror): rank 0 sends each record to every worker;
    // a worker receives them in order, false once rank 0 has closed the stream (finish(), or its
    // exit). Throws std::runtime_error when a pipe breaks (a worker gone).
    void send(std::span<const int32_t> record);
    bool receive(std::vector<int32_t>& record);

    // Rank 0, after its own work: closes the command stream, waits for every worker to exit and
    // throws std::runtime_error naming each one that failed. Workers: nothing.
    void finish();

  private:
    int rank_ = 0, ranks_ = 1;
    std::vector<int> id_pipes_;  // rank 0: write ends, one per worker; a worker: its read end
    struct Watch;
    Watch* watch_ = nullptr;
};

}  // namespace gj::gemma4
