#include "engine/model/quant_mix.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gj::gemma4 {

namespace {

using ggml::Type;

// llama_ftype values (llama.h) for general.file_type.
const QuantMix kMixes[] = {
    {"f32", Type::F32, false, 0},
    {"f16", Type::F16, false, 1},
    {"bf16", Type::BF16, false, 32},
    {"q8_0", Type::Q8_0, false, 7},
    {"q4_0", Type::Q4_0, false, 2},
    {"q4_1", Type::Q4_1, false, 3},
    {"q5_0", Type::Q5_0, false, 8},
    {"q5_1", Type::Q5_1, false, 9},
    // Pure K-quants: llama has no "all Q4_K/Q5_K" file type; MOSTLY_Q4_K_S / Q5_K_S (14 / 16)
    // are the closest names. MOSTLY_Q6_K (18) is pure already.
    {"q4_k", Type::Q4_K, false, 14},
    {"q5_k", Type::Q5_K, false, 16},
    {"q6_k", Type::Q6_K, false, 18},
    {"q4_k_m", Type::Q4_K, true, 15},
    {"q5_k_m", Type::Q5_K, true, 17},
};

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) {
    return s.find(part) != std::string_view::npos;
}

// ggml_n_dims: trailing dimensions of 1 do not count.
int n_dims(const std::vector<uint64_t>& dims) {
    int n = int(dims.size());
    while (n > 1 && dims[size_t(n) - 1] == 1) --n;
    return n;
}

// "blk.<l>." -> l; -1 for model-level tensors.
int layer_of(const std::string& name) {
    if (!name.starts_with("blk.")) return -1;
    const size_t dot = name.find('.', 4);
    if (dot == std::string::npos || dot == 4) return -1;
    int l = 0;
    for (size_t i = 4; i < dot; ++i) {
        if (name[i] < '0' || name[i] > '9' || l > 1000000) return -1;
        l = l * 10 + (name[i] - '0');
    }
    return l;
}

bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

bool is_block_quant(Type t) {
    return ggml::type_info(t).block_elems > 1;
}

// tensor_type_fallback: a 32-element type when a row is not whole 256-element blocks.
Type fallback(Type t, uint64_t ne0) {
    if (ne0 % ggml::type_info(t).block_elems == 0) return t;
    Type f = Type::F16;
    switch (t) {
        case Type::Q4_K:
            f = Type::Q5_0;
            break;
        case Type::Q5_K:
            f = Type::Q5_1;
            break;
        case Type::Q6_K:
            f = Type::Q8_0;
            break;
        case Type::Q2_K:
        case Type::Q3_K:
            f = Type::Q4_0;
            break;
        default:
            break;
    }
    return ne0 % ggml::type_info(f).block_elems == 0 ? f : Type::F16;
}

}  // namespace

std::optional<QuantMix> quant_mix_from_name(std::string_view name) {
    for (const auto& m : kMixes)
        if (m.name == name) return m;
    return std::nullopt;
}

std::vector<std::string> quant_mix_names() {
    std::vector<std::string> out;
    for (const auto& m : kMixes) out.push_back(m.name);
    return out;
}

std::string quant_mix_names_text() {
    std::string s;
    for (const auto& m : kMixes) s += (s.empty() ? "" : ", ") + m.name;
    return s;
}

bool quantizable(const MixTensor& t) {
    const std::string_view n = t.name;
    return n_dims(t.dims) >= 2 && ends_with(n, "weight") && !contains(n, "_norm.weight") &&
           !contains(n, "ffn_gate_inp.weight") && !contains(n, "per_layer_model_proj") &&
           !contains(n, "altup") && !contains(n, "laurel");
}

std::vector<Type> mix_types(const QuantMix& mix, const std::vector<MixTensor>& tensors,
                            int n_layers) {
    // attn_v ordinals in layer order (llama-quant walks tensors sorted by layer).
    bool tied = true;
    std::vector<int> v_layers;
    for (const auto& t : tensors) {
        if (t.name == "output.weight") tied = false;
        if (contains(t.name, "attn_v.weight") && quantizable(t))
            v_layers.push_back(layer_of(t.name));
    }
    std::sort(v_layers.begin(), v_layers.end());
    const int n_v = int(v_layers.size());

    std::vector<Type> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) {
        if (!quantizable(t)) {
            out.push_back(t.type);
            continue;
        }
        const uint64_t ne0 = t.dims.empty() ? 0 : t.dims[0];
        Type type = mix.base;
        if (mix.mixed) {
            const int layer = layer_of(t.name);
            const bool embd =
                t.name == "token_embd.weight" || t.name == "per_layer_token_embd.weight";
            if (t.name == "output.weight" || (tied && embd)) {
                type = ne0 % 256 != 0 ? Type::Q8_0 : Type::Q6_K;
            } else if (contains(t.name, "attn_v.weight")) {
                const int i = int(std::lower_bound(v_layers.begin(), v_layers.end(), layer) -
                                  v_layers.begin());
                if (use_more_bits(i, n_v)) type = Type::Q6_K;
            } else if (contains(t.name, "ffn_down")) {
                if (layer < 0 || layer >= n_layers)
                    throw std::invalid_argument(
                        fmt::format("quant mix {}: tensor {} is not in a layer 0..{}", mix.name,
                                    t.name, n_layers - 1));
                if (use_more_bits(layer, n_layers)) type = Type::Q6_K;
            }
        }
        out.push_back(is_block_quant(mix.base) ? fallback(type, ne0) : type);
    }
    return out;
}

}  // namespace gj::gemma4
