#include "tests/support/matvec_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tests/support/kernel_ref.h"

namespace gj::test::kref {

jit::KernelSpec matvec_variant(ggml::Type t, int k, int ncols, gemma4::MatvecLayout layout,
                               int threads, int rows, int unroll) {
    jit::KernelSpec s = gemma4::matvec_spec(t, k, ncols, layout);
    std::erase_if(s.constants, [](const auto& c) { return c.first.starts_with("GEGLU_"); });
    for (auto& [name, value] : s.constants) {
        if (name == "THREADS") value = threads;
        if (name == "ROWS") value = rows;
        if (name == "UNROLL") value = unroll;
    }
    s.name += ".t" + std::to_string(threads) + ".r" + std::to_string(rows) + ".u" +
              std::to_string(unroll);
    return s;
}

jit::DeviceBuffer weights_on_device(const GpuKernels& g, const jit::KernelSpec& spec, ggml::Type t,
                                    const std::vector<uint8_t>& blocks, int n, int k,
                                    gemma4::MatvecLayout layout) {
    jit::DeviceBuffer src = to_device(blocks);
    if (layout == gemma4::MatvecLayout::Ggml) return src;
    const size_t bytes = gemma4::matrix_bytes(t, layout, n, k);
    jit::DeviceBuffer dst(bytes + 16);
    const size_t n_blocks = size_t(n) * (k / 32);  // one repack thread per 32 elements
    launch(g.get(spec.name, gemma4::repack_entry(t)), {ceil_div(n_blocks, 256)}, {256}, src.ptr(),
           dst.ptr(), n);
    EXPECT_EQ(from_device<uint8_t>(dst, bytes), split_layout(t, blocks, n, k))
        << spec.name << ": GPU repack differs from the CPU split layout";
    return dst;
}

}  // namespace gj::test::kref
