// quantize_q8_1 family: the spec of kernel_templates/quantize_q8_1.cu, fp32 -> Q8_1 activations
// for the int8 matvecs and GEMMs where the producer is not a norm that quantizes itself.
//
// Spec name: "quantize_q8_1" (width-independent: one spec per model).
// Launch (from the spec constants): block THREADS, grid ceil(8 * n_blocks / THREADS).
#pragma once

#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// fp32 -> Q8_1 activation quantization (width-independent): "quantize_q8_1".
jit::KernelSpec quantize_spec();

}  // namespace gj::gemma4
