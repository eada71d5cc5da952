// convert_f32 family: the spec of kernel_templates/convert_f32.cu, fp32 activations -> fp16 /
// bf16 for the cuBLAS products of F16 / BF16 weights and the bf16 inputs of the wgmma GEMM.
//
// Spec name: "convert_f32" (width-independent: one spec per model); entries f32_to_f16,
// f32_to_bf16.
// Launch (from the spec constants): block THREADS, grid ceil(n / 4 / THREADS).
#pragma once

#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// fp32 -> fp16 / bf16 activations for the cuBLAS products of F16 / BF16 weights (entries
// f32_to_f16, f32_to_bf16): "convert_f32".
jit::KernelSpec convert_f32_spec();

}  // namespace gj::gemma4
