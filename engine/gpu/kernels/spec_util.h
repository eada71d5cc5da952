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

// "q8_0" / "q4_0" for the block-quantized weight types the int8 kernels read, else nullptr.
inline const char* quant_type_tag(ggml::Type t) {
    switch (t) {
        case ggml::Type::Q8_0:
            return "q8_0";
        case ggml::Type::Q4_0:
            return "q4_0";
        default:
            return nullptr;
    }
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
