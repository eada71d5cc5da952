// Matvec test helpers on the GPU: a spec in another launch shape, and a matrix's weights uploaded
// (and repacked to the split layout) the way a load does it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/gpu/kernels/matvec.h"
#include "tests/support/kernel_ref_gpu.h"

namespace gj::test::kref {

// matvec_spec(t, k, ncols, layout) with its launch constants overridden (name extended so it
// stays unique), for every entry: the GeGLU's own shape (GEGLU_*) goes.
jit::KernelSpec matvec_variant(ggml::Type t, int k, int ncols, gemma4::MatvecLayout layout,
                               int threads, int rows, int unroll);

// Uploads ggml blocks of an n x k matrix, and for the split layout repacks them on the GPU with
// `spec`'s repack entry (checking the repack against the CPU's); returns the matrix as the
// matvecs read it.
jit::DeviceBuffer weights_on_device(const GpuKernels& g, const jit::KernelSpec& spec, ggml::Type t,
                                    const std::vector<uint8_t>& blocks, int n, int k,
                                    gemma4::MatvecLayout layout);

}  // namespace gj::test::kref
