// rmsnorm family: the spec of kernel_templates/rmsnorm.cu (norms over rows of n floats, with the
// residual add, layer output scale, chained second norm and Q8_1 output fused in).
//
// Spec name: "rmsnorm.n<n>.w<0|1>[.add][.scale][.n2][.q8|.h16][.p<parts>][.moe][.xb16[x<P>]]".
// Launch (from the spec constants): block TPR * RPB, grid ceil(rows / RPB).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// rmsnorm over rows of n floats: "rmsnorm.n<n>.w<0|1>[.add][.scale][.n2][.q8|.h16][.p<parts>]".
//   quant:  also write Q8_1 activations (of the second norm's output when norm2); n % 32 == 0
//   half:   (with quant) write that output as f16 instead of Q8_1, into the yq argument (the
//           input of F16 cuBLAS products): ".h16"
//   add:    y = residual + norm(x) [* w]
//   scale:  y = (residual + norm(x) * w) * (*scale)   (layer_output_scale; needs add)
//   norm2:  also y2 = norm(y) * w2                     (the next pre-norm; needs add)
//   parts:  x is the sum of that many [rows][n] planes (split-K partials of the int8 GEMM;
//           needs add)
//   moe_norms: also y3 = norm(y) * w3 and y4 = norm(y) * w4 with its Q8_1 form (a MoE layer's
//           router input and experts' pre-norm; needs norm2 and quant, not scale): ".moe"
//   bf16_in: 1: x is [rows][n] bf16 (a tensor-parallel prefill chunk's product, all-reduced in
//           bf16, read without a conversion back; needs add, parts 1): ".xb16"; P in 2..8: x is
//           [rows][P][n] bf16, the P ranks' products (kernel_templates/tp_push.cu), summed here
//           in rank order: ".xb16x<P>"
// Entry "rmsnorm" without scale and norm2, "rmsnorm_moe" with moe_norms, else "rmsnorm_ext" (see
// kernel_templates/rmsnorm.cu). Throws std::invalid_argument for an impossible combination.
// The threads that sum one row of n floats (TPR): the order of its sum of squares, which the
// matvecs that make their input from a norm (matvec_common.cuh, NORM_TPR) repeat.
int rmsnorm_threads_per_row(int n);

jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant = false, bool add = false,
                             bool scale = false, bool norm2 = false, int parts = 1,
                             bool moe_norms = false, bool half = false, int bf16_in = 0);

// The post-norms reading a tensor-parallel prefill chunk's bf16 all-reduced product (planes 1),
// or the ranks' bf16 products pushed into this rank's window (planes = ranks), n wide: each the
// bf16-input form (rmsnorm_spec's bf16_in) of a post-norm the forward pass launches after an
// all-reduce.
struct RmsnormBf16InputSpecs {
    // post_attention_norm + ffn_norm; [0] writes Q8_1, [1] f16 (the F16 cuBLAS products' input).
    jit::KernelSpec post_prenorm[2];
    // post_ffw_norm * layer_output_scale + the next pre-norm; [0] Q8_1, [1] f16.
    jit::KernelSpec post_scale_prenorm[2];
    // A PLE model's post_ffw_norm, quantizing the updated stream (the PLE gate's input).
    std::optional<jit::KernelSpec> post_quant;
    std::vector<jit::KernelSpec> all() const;
};
RmsnormBf16InputSpecs rmsnorm_bf16_input_specs(int n, bool ple, int planes = 1);

// The form of a decode post-norm (`fp32_form`: add, norm2 or scale, one fp32 plane; entry
// "rmsnorm_ext") that sums the `peers` tensor-parallel ranks' products itself, through NCCL's
// device API (an LSA barrier, then the peers' symmetric windows): ".lsa<peers>", entry
// "rmsnorm_ext_lsa", compiled against the NCCL headers in `nccl_include` (jit/nccl_device.h).
// Throws std::invalid_argument for another form or fewer than 2 peers.
jit::KernelSpec rmsnorm_lsa_spec(const jit::KernelSpec& fp32_form, int peers,
                                 const std::string& nccl_include);

// The push form of an rmsnorm_lsa_spec form: the ranks' products were stored into this rank's
// window by their matvecs (matvec_push_spec), one slot per rank, so the sum after the barrier
// reads local memory. ".push", constant LSA_PUSH; entries "rmsnorm_ext_lsa_push" and
// "lsa_window_pointers" (the slots' addresses on every rank, found once per session). Throws
// std::invalid_argument for another form.
jit::KernelSpec rmsnorm_lsa_push_spec(const jit::KernelSpec& lsa_form);

// The two decode post-norms of a split, n wide, in the form that sums the `peers` ranks' products
// (rmsnorm_lsa_spec, against the NCCL headers in `nccl_include`), and with `push` their push
// forms (rmsnorm_lsa_push_spec): what a load and a planned split (`kernels --tp`) both add.
struct RmsnormLsaSpecs {
    jit::KernelSpec post_prenorm;        // post_attention_norm + ffn_norm, Q8_1
    jit::KernelSpec post_scale_prenorm;  // post_ffw_norm * layer_output_scale + next pre-norm
    std::optional<jit::KernelSpec> push_post_prenorm, push_post_scale_prenorm;
    std::vector<jit::KernelSpec> all() const;
};
RmsnormLsaSpecs rmsnorm_lsa_specs(int n, int peers, const std::string& nccl_include, bool push);

}  // namespace gj::gemma4
