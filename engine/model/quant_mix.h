// Weight-type recipes: which ggml type each tensor of a Gemma 4 GGUF gets for a weight type
// name, as llama.cpp's quantizer (src/llama-quant.cpp: tensor_allows_quantization,
// llama_tensor_get_type_impl, tensor_type_fallback) decides it for the gemma4 tensor set.
// Used by `synth --wtype` (engine/model/synth.cpp) and `quantize` (engine/model/requantize.cpp).
//
// Names:
//   f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k   pure: every quantizable tensor gets
//       the type (llama-quantize --pure), with the 32-block fallback below
//   q4_k_m q5_k_m   llama.cpp's Q4_K_M / Q5_K_M mixes (no importance matrix):
//     * output.weight, and token_embd / per_layer_token_embd while the embeddings are tied (no
//       output.weight, always so for Gemma 4): Q6_K (Q8_0 when ne0 % 256 != 0)
//     * attn_v.weight on the "use_more_bits" attn_v tensors: Q6_K. The i-th of n attn_v tensors
//       (in layer order; KV-shared and k_eq_v layers have none) uses more bits when
//       i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2
//     * ffn_down.weight / ffn_down_exps.weight of use_more_bits layers (i = layer, n = layers):
//       Q6_K
//     * everything else quantizable: Q4_K / Q5_K
// Kept as stored (not quantizable): tensors of fewer than 2 dims, names not ending in "weight",
// "*_norm.weight", ffn_gate_inp.weight (the router), per_layer_model_proj.weight.
// Fallback when ne0 is not a multiple of the type's block (the 26B-A4B's 2112/704-wide
// ffn_down rows): Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; F16 if ne0 % 32 != 0 as well.
// Rules llama.cpp has for other architectures (8-expert models, Falcon, 70B) do not apply to
// Gemma 4 and are left out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/ggml_types.h"

namespace gj::gemma4 {

struct QuantMix {
    std::string name;    // "q4_k_m", "q8_0", ...
    ggml::Type base;     // the type of most quantized tensors (llama's default type of the ftype)
    bool mixed;          // true: the _M rules above; false: pure
    uint32_t file_type;  // general.file_type (llama_ftype) to write
};

// nullopt for an unknown name.
std::optional<QuantMix> quant_mix_from_name(std::string_view name);
// Every name quant_mix_from_name knows, in the order of the list above.
std::vector<std::string> quant_mix_names();
// "f32, f16, ..." for messages and --help.
std::string quant_mix_names_text();

// One tensor as the rule sees it.
struct MixTensor {
    std::string name;
    std::vector<uint64_t> dims;  // ggml order
    ggml::Type type;             // stored type before quantization
};

// Whether llama-quant would quantize this tensor (see "Kept as stored" above).
bool quantizable(const MixTensor& t);

// The type of every tensor (same order) under the mix; n_layers is the model's block count.
// Throws std::invalid_argument when a tensor's layer number is out of range.
std::vector<ggml::Type> mix_types(const QuantMix& mix, const std::vector<MixTensor>& tensors,
                                  int n_layers);

}  // namespace gj::gemma4
