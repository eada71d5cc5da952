// ple family: the specs of kernel_templates/ple.cu, the per-layer-embedding (PLE) elementwise
// steps of E2B/E4B (also the in-place GeGLU of the float-weight FFN's cuBLAS products).
//
// Spec names: "ple_finish.l<L>.p<P>" (entry ple_finish) and "gelu_mul.p<P>" (entries gelu_mul,
// gelu_mul_q8, gelu_mul_inplace, gelu_mul_f16, and the _pair forms reading one gate|up product).
// Launch: ple_finish: block 128, grid ceil(T * L / 4); gelu_mul, gelu_mul_inplace: block 128,
// grid ceil(T * P / 128); gelu_mul_q8, gelu_mul_f16 and the _pair forms: grid ceil(T * P / 512).
#pragma once

#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// PLE precompute (ple_finish) for L layers of width P: "ple_finish.l<L>.p<P>".
jit::KernelSpec ple_finish_spec(int n_layers, int ple_dim);
// PLE injection gelu(gate) * ple[l] (gelu_mul, gelu_mul_q8), and the GeGLU of the FFN's cuBLAS
// products (gelu_mul_inplace, gelu_mul_f16, the _pair forms; P = FFN width): "gelu_mul.p<P>".
jit::KernelSpec gelu_mul_spec(int ple_dim);

}  // namespace gj::gemma4
