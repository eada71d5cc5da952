// A small harness for the GPU kernel tests: compile specs with the JIT (no disk cache), load them,
// move vectors to and from the device, launch and wait.
#pragma once

#include <string_view>
#include <vector>

#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/jit.h"

namespace gj::test::kref {

class GpuKernels {
  public:
    // Compiles (in parallel) and loads every spec for the local GPU (entries opted in to their
    // SMEM constant, like the engine's). Throws on any failure.
    explicit GpuKernels(const std::vector<jit::KernelSpec>& specs);
    const jit::Kernel& get(std::string_view spec_name, std::string_view entry) const {
        return modules_.kernel(spec_name, entry);
    }
    const std::vector<jit::CompiledKernel>& compiled() const { return compiled_; }

  private:
    jit::Jit jit_;
    jit::ModuleSet modules_;
    std::vector<jit::CompiledKernel> compiled_;
};

// The module of one spec, compiled on first use and kept for the process (ctest runs every test
// in its own process, so each compiles only the specs it launches).
const GpuKernels& kernels_for(const jit::KernelSpec& spec);

template <class T>
jit::DeviceBuffer to_device(const std::vector<T>& v) {
    jit::DeviceBuffer b(v.size() * sizeof(T) + 16);  // never zero-sized
    b.upload(v.data(), v.size() * sizeof(T));
    return b;
}

template <class T>
std::vector<T> from_device(const jit::DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    b.download(v.data(), n * sizeof(T));
    return v;
}

// Launches on the device stream with the given arguments (each passed by address, as the Driver
// API wants) and waits for completion. It first waits for everything already issued: uploads
// (cuMemcpyHtoD from pageable memory may return before its DMA lands) and memsets run on the
// legacy stream, which does not order itself with the non-blocking compute stream.
template <class... Args>
void launch(const jit::Kernel& k, jit::LaunchDims grid, jit::LaunchDims block, Args... args) {
    void* argv[] = {static_cast<void*>(&args)...};
    auto& dev = jit::Device::get();
    dev.synchronize();
    k.launch(grid, block, 0, dev.stream(), argv);
    dev.synchronize();
}
// launch() with `smem` bytes of dynamic shared memory, without waiting.
template <class... Args>
void launch_smem_async(const jit::Kernel& k, jit::LaunchDims grid, jit::LaunchDims block,
                       unsigned smem, Args... args) {
    void* argv[] = {static_cast<void*>(&args)...};
    k.launch(grid, block, smem, jit::Device::get().stream(), argv);
}
// Launches without waiting (benchmarks); call Device::synchronize() after uploads first.
template <class... Args>
void launch_async(const jit::Kernel& k, jit::LaunchDims grid, jit::LaunchDims block, Args... args) {
    void* argv[] = {static_cast<void*>(&args)...};
    k.launch(grid, block, 0, jit::Device::get().stream(), argv);
}

inline unsigned ceil_div(size_t a, size_t b) {
    return static_cast<unsigned>((a + b - 1) / b);
}

}  // namespace gj::test::kref
