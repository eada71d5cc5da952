// What the kernel families' spec builders share: reading a spec constant back, the weight types
// the kernels read, the GQA group of a layer, and small integer helpers.
//
// NVRTC options: no family adds options of its own. jit/ compiles every spec with one canonical
// option list (jit/nvrtc_compiler.cpp); the only per-family target choice is
// KernelSpec::arch_specific (gemm_wgmma: sm_90a).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/gguf/ggml_types.h"
#include "engine/model/gemma4_config.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Value of a spec constant; throws std::out_of_range naming the spec and constant. Launch geometry
// is read back from the spec's constants with it (each family header states which).
int64_t spec_constant(const jit::KernelSpec& spec, std::string_view name);
// Whether the spec has constant `name`; sets it (adding it when missing).
bool spec_has_constant(const jit::KernelSpec& spec, std::string_view name);
void set_spec_constant(jit::KernelSpec& spec, std::string_view name, int64_t value);
// Whether the spec's source defines entry `name` (the optional entries some forms have).
bool spec_has_entry(const jit::KernelSpec& spec, std::string_view name);

// The K split of the prefill GEMMs' split tiles (mmq and gemm_wgmma); the post-norms after them
// read that many partial planes (rmsnorm's ".p<parts>").
inline constexpr int kMmqSplits = 3;

// Helpers of the spec builders (their own namespace, so they do not meet the engine's local
// helpers of the same names).
namespace spec_util {

inline int round_up(int v, int m) {
    return (v + m - 1) / m * m;
}

inline int next_pow2(int v) {
    int p = 1;
    while (p < v) p *= 2;
    return p;
}

inline int prev_pow2(int v) {
    int p = 1;
    while (p * 2 <= v) p *= 2;
    return p;
}

// The tag of a block-quantized weight type the int8 (dp4a) matvecs read in place against Q8_1
// activations: "q8_0", "q4_0", "q4_1", "q5_0", "q5_1" (32-element blocks) or "q4_k", "q5_k",
// "q6_k" (256-element K-quant super-blocks); else nullptr.
inline const char* quant_type_tag(ggml::Type t) {
    switch (t) {
        case ggml::Type::Q8_0:
            return "q8_0";
        case ggml::Type::Q4_0:
            return "q4_0";
        case ggml::Type::Q4_K:
            return "q4_k";
        case ggml::Type::Q5_K:
            return "q5_k";
        case ggml::Type::Q6_K:
            return "q6_k";
        case ggml::Type::Q4_1:
            return "q4_1";
        case ggml::Type::Q5_0:
            return "q5_0";
        case ggml::Type::Q5_1:
            return "q5_1";
        default:
            return nullptr;
    }
}

// The 32-element block types besides Q8_0 / Q4_0 (no tensor-core GEMM; their prefill products go
// through F16 copies): Q4_1, Q5_0, Q5_1, the fallbacks of K-quant files.
inline bool is_q32_fallback(ggml::Type t) {
    return t == ggml::Type::Q4_1 || t == ggml::Type::Q5_0 || t == ggml::Type::Q5_1;
}

// K-quant super-block types (256 elements per block).
inline bool is_kquant(ggml::Type t) {
    return t == ggml::Type::Q4_K || t == ggml::Type::Q5_K || t == ggml::Type::Q6_K;
}

// Elements per quant block of a type the matvecs read (32, or 256 for the K-quants); 4 (one
// 16-byte group of f32) stands for the float types.
inline int matvec_block_elems(ggml::Type t) {
    return is_kquant(t) ? 256 : quant_type_tag(t) ? 32 : 4;
}

// Whether prefill products of type t go through F16 copies (dequant_f16) and cuBLAS.
inline bool has_dequant_f16(ggml::Type t) {
    return is_kquant(t) || is_q32_fallback(t);
}

// The K-quants with a split layout (kernel_templates/kquant.cuh): Q4_K, Q5_K, Q6_K (all of
// them). Their split matrices are also read by the prefill dequantization, and a tied embedding
// table in that layout by the row gather.
inline bool is_kquant_split(ggml::Type t) {
    return is_kquant(t);
}

// Whether matrices of type t have the split layout (MatvecLayout::Split: aligned planes made
// once at load by the matvec spec's repack entry): every block type the matvecs read (Q8_0,
// Q4_0, the fallbacks Q4_1, Q5_0, Q5_1, the K-quants Q4_K, Q5_K, Q6_K).
inline bool has_split(ggml::Type t) {
    return quant_type_tag(t) != nullptr;
}

// Whether the prefill tensor-core GEMMs (mmq, gemm_wgmma) read weights of type t in place.
inline bool has_gemm(ggml::Type t) {
    return t == ggml::Type::Q8_0 || t == ggml::Type::Q4_0;
}

inline bool is_float_type(ggml::Type t) {
    return t == ggml::Type::F32 || t == ggml::Type::F16 || t == ggml::Type::BF16;
}

// Whether weights (and embedding tables) stored as t have kernels: a matvec and a row gather.
inline bool has_matvec(ggml::Type t) {
    return quant_type_tag(t) || is_float_type(t);
}

// The weight types of has_matvec, for error messages.
std::string supported_types();

// Query heads per KV head of a layer; throws ConfigError when they do not divide.
int gqa_group(const Config& cfg, int layer);

}  // namespace spec_util
}  // namespace gj::gemma4
