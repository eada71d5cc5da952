#include "tests/support/kernel_ref_gpu.h"

namespace gj::test::kref {

GpuKernels::GpuKernels(const std::vector<jit::KernelSpec>& specs)
    : jit_(jit::Flags::parse({{"GEMMAJIT_CACHE", "0"}}), [](const std::string&) {}) {
    compiled_ = jit_.compile_plan(specs, jit::Device::get().arch());
    jit_.load(modules_, compiled_);
}

}  // namespace gj::test::kref
