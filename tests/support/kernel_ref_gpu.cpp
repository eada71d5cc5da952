#include "tests/support/kernel_ref_gpu.h"

#include <map>
#include <memory>
#include <string>

namespace gj::test::kref {

GpuKernels::GpuKernels(const std::vector<jit::KernelSpec>& specs)
    : jit_(jit::Flags::parse({{"GEMMAJIT_CACHE", "0"}}), [](const std::string&) {}) {
    compiled_ = jit_.compile_plan(specs, jit::Device::get().arch());
    jit_.load(modules_, compiled_);
}

const GpuKernels& kernels_for(const jit::KernelSpec& spec) {
    static std::map<std::string, std::unique_ptr<GpuKernels>> loaded;
    auto& slot = loaded[spec.name];
    if (!slot) slot = std::make_unique<GpuKernels>(std::vector<jit::KernelSpec>{spec});
    return *slot;
}

}  // namespace gj::test::kref
