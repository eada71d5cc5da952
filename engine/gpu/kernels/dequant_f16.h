// dequant_f16 family: the spec of kernel_templates/dequant_f16.cu, quantized rows -> fp16 rows in
// a session scratch buffer, so that a prefill chunk multiplies a quantized matrix with cuBLAS on
// tensor cores (the decode matvecs read the quantized blocks in place).
//
// Spec name: "dequant_f16.<type>.k<k>[.split]" (.split: a split-layout K-quant matrix, see
// kernel_templates/kquant.cuh, or a split Q8_0 / Q4_0 one under GEMMAJIT_MMQ_VARIANT=blas).
// Launch (from the spec constants): block THREADS, grid ceil(n_rows * K / ELEMS / THREADS).
#pragma once

#include "engine/gguf/ggml_types.h"
#include "engine/gpu/kernels/matvec.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Dequantization of rows k wide stored as Q4_K / Q5_K / Q6_K (or Q4_1 / Q5_0 / Q5_1, or Q8_0 /
// Q4_0 in the split layout): "dequant_f16.<type>.k<k>[.split]", reading the matrix in `layout`
// (Split: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0). Throws ConfigError for another type,
// std::invalid_argument for k not a positive multiple of the type's block (256, or 32), a split
// layout the type does not have, or Q8_0 / Q4_0 in the GGUF layout.
jit::KernelSpec dequant_f16_spec(ggml::Type weight_type, int k,
                                 MatvecLayout layout = MatvecLayout::Ggml);

}  // namespace gj::gemma4
