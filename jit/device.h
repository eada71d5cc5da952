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

// True when a driver and at least one device exist; otherwise `why` gets the reason. Never throws.
bool device_available(std::string* why = nullptr);

// The process-wide device (ordinal 0 or GEMMAJIT_DEVICE), primary context made current on the
// calling thread by every method that needs it.
class Device {
public:
    static Device& get();  // throws DeviceUnavailable
    std::string name() const;
    std::string arch() const;  // "sm_90"
    int sm_count() const;
    size_t total_memory() const;
    size_t free_memory() const;
    CUstream stream() const;   // the engine's compute stream (non-blocking)
    void make_current() const; // binds the primary context to the calling thread
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
    Kernel(CUfunction fn, std::string name) : fn_(fn), name_(std::move(name)) {}
    CUfunction handle() const { return fn_; }
    const std::string& name() const { return name_; }
    // Must be called before any graph capture that launches with more than 48 KiB dynamic smem.
    void set_max_dynamic_smem(int bytes);
    int attribute(CUfunction_attribute attr) const;
    void launch(LaunchDims grid, LaunchDims block, unsigned dyn_smem, CUstream stream,
                void** args) const;

private:
    CUfunction fn_ = nullptr;
    std::string name_;
};

// Modules loaded from compiled kernels; one module per spec. A cubin the driver rejects is
// reported (so the caller can evict the cache entry and rebuild).
class ModuleSet {
public:
    ModuleSet() = default;
    ~ModuleSet();
    ModuleSet(const ModuleSet&) = delete;
    ModuleSet& operator=(const ModuleSet&) = delete;
    void load(const CompiledKernel& k);  // throws DeviceError naming the spec
    // Entry lookup by "<spec name>/<entry>" or plain "<entry>" when unique.
    const Kernel& kernel(std::string_view spec_name, std::string_view entry) const;
    size_t size() const { return modules_.size(); }

private:
    std::vector<CUmodule> modules_;
    std::unordered_map<std::string, Kernel> kernels_;
};

}  // namespace gj::jit
