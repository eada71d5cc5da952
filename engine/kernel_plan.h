// The list of kernel specializations a model needs, derived from its Config and weight type.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/gemma4_config.h"
#include "engine/ggml_types.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Deduplicated by spec name, decode-path kernels first (priority 0). Every matrix, embedding table
// and PLE table is taken to be stored as `weight_type` (f32, f16, bf16, q8_0 or q4_0). Throws
// ConfigError for a weight type with no kernel.
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, ggml::Type weight_type);

// How a quantized matrix sits in GPU memory for the matvec kernels.
enum class MatvecLayout {
    Ggml,   // the GGUF's blocks as-is
    Split,  // payload plane + fp16 scale plane, made once by the spec's repack_<type> entry
};

// The storage of each weight role, for files that mix types (a Q4_0 file with F16 embeddings).
struct PlanTypes {
    ggml::Type matmul;                          // attention, FFN and PLE gate/proj matrices
    ggml::Type token_embd;                      // the embedding gather and the tied LM head
    ggml::Type ple_token_embd;                  // per_layer_token_embd (PLE models)
    ggml::Type ple_model_proj;                  // per_layer_model_proj (PLE models)
    MatvecLayout layout = MatvecLayout::Split;  // for the quantized matrices
    int max_cols = 8;  // > 1: also the matvecs for batches of max_cols columns (prefill)
};
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, const PlanTypes& types);

// ---- Single-spec builders (the plan is made of these; the engine and tests use them too). ----
// Launch geometry is read back from the spec's constants with spec_constant(); each template's
// header comment states it. In short:
//   rmsnorm:       block TPR * RPB, grid ceil(rows / RPB)
//   matvec_*:      block THREADS, grid ceil(n_rows / ROWS)
//   quantize_q8_1: block THREADS, grid ceil(8 * n_blocks / THREADS)
//   embed_rows:    block THREADS, grid (ceil(N / 4 / THREADS), T)
//   ple_finish:    block 128, grid ceil(T * L / 4)
//   gelu_mul:      block 128, grid ceil(T * P / 128); gelu_mul_q8: grid ceil(T * P / 512)
//   logits:        block THREADS; grid ARGMAX_BLOCKS (softcap_argmax), TOPK_BLOCKS
//                  (softcap_topk), ceil(n / THREADS) (softcap); workspace WORK_BYTES

// rmsnorm over rows of n floats: "rmsnorm.n<n>.w<0|1>[.add][.scale][.n2][.q8]".
//   quant:  also write Q8_1 activations (of the second norm's output when norm2); n % 32 == 0
//   add:    y = residual + norm(x) [* w]
//   scale:  y = (residual + norm(x) * w) * (*scale)   (layer_output_scale; needs add)
//   norm2:  also y2 = norm(y) * w2                     (the next pre-norm; needs add)
// Entry "rmsnorm" without scale and norm2, else "rmsnorm_ext" (see kernel_templates/rmsnorm.cu).
// Throws std::invalid_argument for an impossible combination.
jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant = false, bool add = false,
                             bool scale = false, bool norm2 = false);

// matvec of input width k. Q8_0 / Q4_0: "matvec_q8_0.k<k>[.b<ncols>][.split]" (int8 activations);
// F32 / F16 / BF16: the matvec_f_spec below (layout must be Ggml). Throws ConfigError for another
// weight type, std::invalid_argument for k % 32 != 0 or ncols outside 1..8.
jit::KernelSpec matvec_spec(ggml::Type weight_type, int k, int ncols = 1,
                            MatvecLayout layout = MatvecLayout::Ggml);

// matvec for float weights (f32, f16, bf16) against fp32 activations:
// "matvec_f.<type>.k<k>[.b<ncols>]". Throws like matvec_spec.
jit::KernelSpec matvec_f_spec(ggml::Type weight_type, int k, int ncols = 1);

// fp32 -> Q8_1 activation quantization (width-independent): "quantize_q8_1".
jit::KernelSpec quantize_spec();

// Row gather + scale from an n-wide table of `vocab` rows stored as f32/f16/bf16/q8_0/q4_0:
// "embed_rows.<type>.n<n>.v<vocab>". Throws ConfigError for another type, std::invalid_argument
// for n not a multiple of 4 (32 for the quantized types).
jit::KernelSpec embed_rows_spec(int n, ggml::Type table_type, int vocab);

// PLE precompute (ple_finish) for L layers of width P: "ple_finish.l<L>.p<P>".
jit::KernelSpec ple_finish_spec(int n_layers, int ple_dim);
// PLE injection gelu(gate) * ple[l] (gelu_mul, gelu_mul_q8): "gelu_mul.p<P>".
jit::KernelSpec gelu_mul_spec(int ple_dim);

// Softcap + argmax / top-k over a vocabulary: "logits.v<vocab>.k<topk>"; topk in 1..64.
jit::KernelSpec logits_spec(int vocab, int topk = 64);

// Value of a spec constant; throws std::out_of_range naming the spec and constant.
int64_t spec_constant(const jit::KernelSpec& spec, std::string_view name);

}  // namespace gj::gemma4
