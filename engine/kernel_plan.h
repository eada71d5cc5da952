// The list of kernel specializations a model needs, derived from its Config and weight type.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/gemma4_config.h"
#include "engine/ggml_types.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Deduplicated by spec name, decode-path kernels first (priority 0). Throws ConfigError for a
// weight type with no kernel.
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, ggml::Type weight_type);

// ---- Single-spec builders (the plan is made of these; the engine and tests use them too). ----
// Launch geometry is read back from the spec's constants with spec_constant(); each template's
// header comment states it. In short:
//   rmsnorm:       block TPR * RPB, grid ceil(rows / RPB)
//   matvec_*:      block THREADS, grid ceil(n_rows / ROWS)
//   quantize_q8_1: block THREADS, grid ceil(8 * n_blocks / THREADS)

// How a quantized matrix sits in GPU memory for the matvec kernels.
enum class MatvecLayout {
    Ggml,   // the GGUF's blocks as-is
    Split,  // payload plane + fp16 scale plane, made once by the spec's repack_<type> entry
};

// rmsnorm over rows of n floats: "rmsnorm.n<n>.w<0|1>[.q8][.add]". quant and add exclude each
// other; quant needs n % 32 == 0. Throws std::invalid_argument for an impossible combination.
jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant = false, bool add = false);

// matvec for a Q8_0 or Q4_0 matrix of input width k: "matvec_q8_0.k<k>[.b<ncols>][.split]".
// Throws ConfigError for another weight type, std::invalid_argument for k % 64 != 0.
jit::KernelSpec matvec_spec(ggml::Type weight_type, int k, int ncols = 1,
                            MatvecLayout layout = MatvecLayout::Ggml);

// fp32 -> Q8_1 activation quantization (width-independent): "quantize_q8_1".
jit::KernelSpec quantize_spec();

// Value of a spec constant; throws std::out_of_range naming the spec and constant.
int64_t spec_constant(const jit::KernelSpec& spec, std::string_view name);

}  // namespace gj::gemma4
