// The kernel set of one loaded model: the specializations its forward pass launches, collected
// while the model decides how each tensor sits on the GPU, then compiled (disk cache, parallel
// NVRTC) and loaded in one go, with every entry's dynamic shared memory limit raised before any
// graph capture.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/jit.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

class GpuKernels {
  public:
    // Adds a spec (deduplicated by name) and returns the stored copy. Only before build().
    const jit::KernelSpec& add(jit::KernelSpec spec);
    bool has(std::string_view spec_name) const;

    // Compiles every spec for the local GPU and loads them, with the cache and compile settings
    // of `flags`; entries of a spec whose SMEM constant exceeds 48 KiB get that dynamic shared
    // memory limit. `progress` gets one line before and a running count during compilation (NVRTC
    // misses only; cache hits are quick).
    // `jit_log`: where the JIT's own lines (compile misses, cache warnings) go; empty: stderr.
    void build(const jit::Flags& flags, const std::function<void(const std::string&)>& progress,
               jit::LogSink jit_log = {});

    const jit::KernelSpec& spec(std::string_view spec_name) const;
    const jit::Kernel& get(std::string_view spec_name, std::string_view entry) const;

    std::vector<jit::KernelSpec> specs() const;
    size_t size() const { return specs_.size(); }
    double compile_seconds() const { return compile_seconds_; }
    size_t compiled_now() const { return compiled_now_; }  // NVRTC runs (cache misses)

  private:
    std::map<std::string, jit::KernelSpec, std::less<>> specs_;
    jit::ModuleSet modules_;
    bool built_ = false;
    double compile_seconds_ = 0;
    size_t compiled_now_ = 0;
};

}  // namespace gj::gemma4
