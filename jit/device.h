// The GPU side of the JIT: Driver API (dlopen'ed libcuda.so.1, so the binary runs where no driver
// exists), primary context, device memory, module load and checked kernel launches.
#pragma once

#include <cuda.h>  // types and enums only; nothing from libcuda is linked

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "jit/jit.h"

namespace gj::jit {

// Thrown by every GPU entry point when no usable driver/GPU exists. what() is one clear sentence,
// e.g. "no CUDA driver: libcuda.so.1 not found (this command needs an NVIDIA GPU)".
struct DeviceUnavailable : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A failed Driver API call; the message names the call, the kernel (if any) and the CUresult.
struct DeviceError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// The driver refused a module (cuModuleLoadData or cuModuleGetFunction failed): the binary is bad
// for this device, so the caller evicts its cache entry and rebuilds it.
struct ModuleRejected : DeviceError {
    using DeviceError::DeviceError;
};

// True when a driver and at least one device exist; otherwise `why` gets the reason. Never throws.
bool device_available(std::string* why = nullptr);

// The process-wide device (ordinal 0 or GEMMAJIT_DEVICE), primary context made current on the
// calling thread by every method that needs it.
class Device {
  public:
    static Device& get();  // throws DeviceUnavailable
    // Makes get() open device `ordinal` instead of GEMMAJIT_DEVICE's (a tensor-parallel rank's
    // process its own GPU). Only before the first get(): std::logic_error after it.
    static void select(int ordinal);
    std::string name() const;
    std::string arch() const;  // "sm_90"
    int sm_count() const;
    int compute_capability() const;          // 90 for sm_90
    int max_shared_per_block_optin() const;  // largest dynamic smem a kernel may opt into
    int driver_version() const;              // 13000
    size_t total_memory() const;
    size_t free_memory() const;
    CUstream stream() const;  // the engine's compute stream (non-blocking, highest priority)
    // A new non-blocking stream (the caller destroys it): of the compute stream's priority, or
    // with `background` of the lowest: when blocks of both wait, the scheduler starts the
    // compute stream's first (running blocks are never preempted).
    CUstream create_stream(bool background = false) const;
    void make_current() const;  // binds the primary context to the calling thread
    void synchronize() const;

  private:
    Device();
    struct Impl;
    std::unique_ptr<Impl> impl_;
    friend struct DeviceAccess;
};

// RAII device allocation.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&&) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&&) noexcept;
    CUdeviceptr ptr() const { return ptr_; }
    size_t size() const { return size_; }
    void upload(const void* src, size_t bytes, size_t offset = 0);    // synchronous
    void download(void* dst, size_t bytes, size_t offset = 0) const;  // synchronous
    void zero();
    // Device bytes all DeviceBuffers of the process hold now (a leak check for long runs).
    static uint64_t live_bytes();

  private:
    CUdeviceptr ptr_ = 0;
    size_t size_ = 0;
};

struct LaunchDims {
    unsigned x = 1, y = 1, z = 1;
};

// A loaded entry point. launch() checks the return code and names the kernel in errors.
class Kernel {
  public:
    Kernel() = default;
    Kernel(CUfunction fn, std::string name, bool waits_on_grid = false)
        : fn_(fn), name_(std::move(name)), waits_on_grid_(waits_on_grid) {}
    CUfunction handle() const { return fn_; }
    // Whether the entry's code waits on its grid dependency (jit/grid_dependency.h), so that it
    // may be launched as a programmatic dependent.
    bool waits_on_grid() const { return waits_on_grid_; }
    const std::string& name() const { return name_; }
    // Must be called before any graph capture that launches with more than 48 KiB dynamic smem.
    // Throws DeviceError naming the kernel when the device cannot give that much.
    void set_max_dynamic_smem(int bytes);
    int max_dynamic_smem() const { return max_dyn_smem_; }
    int attribute(CUfunction_attribute attr) const;
    // dependent: launch as a programmatic dependent of the stream's previous kernel
    // (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) when the kernel waits on its grid
    // dependency; its blocks may then start while that kernel finishes. Ignored otherwise.
    void launch(LaunchDims grid, LaunchDims block, unsigned dyn_smem, CUstream stream, void** args,
                bool dependent = false) const;

  private:
    CUfunction fn_ = nullptr;
    std::string name_;
    int max_dyn_smem_ = 48 * 1024;  // the default every kernel gets without opting in
    bool waits_on_grid_ = false;
};

// Modules loaded from compiled kernels; one module per spec. A cubin the driver rejects is
// reported (so the caller can evict the cache entry and rebuild).
class ModuleSet {
  public:
    ModuleSet() = default;
    ~ModuleSet();
    ModuleSet(const ModuleSet&) = delete;
    ModuleSet& operator=(const ModuleSet&) = delete;
    void load(const CompiledKernel& k);  // throws ModuleRejected naming the spec
    // Entry lookup by spec name and entry; an empty spec name finds an entry that only one
    // loaded spec defines. Throws std::invalid_argument naming what is missing or ambiguous.
    const Kernel& kernel(std::string_view spec_name, std::string_view entry) const;
    // Function attributes are set here, once, before any graph capture.
    void set_max_dynamic_smem(std::string_view spec_name, std::string_view entry, int bytes);
    size_t size() const { return modules_.size(); }

  private:
    Kernel& find(std::string_view spec_name, std::string_view entry);
    std::vector<CUmodule> modules_;
    std::unordered_map<std::string, Kernel> kernels_;  // "<spec>/<entry>"
    std::unordered_map<std::string, std::string>
        by_entry_;  // entry -> "<spec>/<entry>" or "" if ambiguous
};

}  // namespace gj::jit
