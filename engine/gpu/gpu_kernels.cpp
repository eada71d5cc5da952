#include "engine/gpu/gpu_kernels.h"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

namespace gj::gemma4 {

const jit::KernelSpec& GpuKernels::add(jit::KernelSpec spec) {
    if (built_)
        throw std::logic_error(
            fmt::format("GpuKernels: spec {} added after the set was built", spec.name));
    auto it = specs_.find(spec.name);
    if (it == specs_.end()) it = specs_.emplace(spec.name, std::move(spec)).first;
    return it->second;
}

bool GpuKernels::has(std::string_view spec_name) const {
    return specs_.find(spec_name) != specs_.end();
}

void GpuKernels::build(const jit::Flags& flags,
                       const std::function<void(const std::string&)>& progress,
                       jit::LogSink jit_log) {
    if (built_) return;
    const auto t0 = std::chrono::steady_clock::now();
    // Cache, arch and log from the model's settings; the log shows misses.
    jit::Jit jit(flags, std::move(jit_log));
    std::vector<jit::KernelSpec> list = specs();
    std::vector<jit::CompiledKernel> compiled = jit.compile_plan(list, jit::Device::get().arch());
    for (const auto& k : compiled) compiled_now_ += k.cache_hit ? 0 : 1;
    jit.load(modules_, compiled);  // opts entries in to their SMEM constant
    built_ = true;
    compile_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (progress)
        progress(fmt::format("{} kernels ready ({} compiled now) in {:.1f} s", list.size(),
                             compiled_now_, compile_seconds_));
}

const jit::KernelSpec& GpuKernels::spec(std::string_view spec_name) const {
    auto it = specs_.find(spec_name);
    if (it == specs_.end())
        throw std::invalid_argument(
            fmt::format("kernel spec {} is not in this model's kernel set", spec_name));
    return it->second;
}

const jit::Kernel& GpuKernels::get(std::string_view spec_name, std::string_view entry) const {
    if (!built_)
        throw std::logic_error(
            fmt::format("GpuKernels: {}/{} requested before build()", spec_name, entry));
    return modules_.kernel(spec_name, entry);
}

std::vector<jit::KernelSpec> GpuKernels::specs() const {
    std::vector<jit::KernelSpec> out;
    out.reserve(specs_.size());
    for (const auto& [name, s] : specs_) out.push_back(s);
    return out;
}

}  // namespace gj::gemma4
