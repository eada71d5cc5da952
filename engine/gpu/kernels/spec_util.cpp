#include "engine/gpu/kernels/spec_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gj::gemma4 {

int64_t spec_constant(const jit::KernelSpec& spec, std::string_view name) {
    for (const auto& [n, v] : spec.constants)
        if (n == name) return v;
    throw std::out_of_range(fmt::format("kernel spec {} has no constant {}", spec.name, name));
}

bool spec_has_constant(const jit::KernelSpec& spec, std::string_view name) {
    return std::any_of(spec.constants.begin(), spec.constants.end(),
                       [&](const auto& c) { return c.first == name; });
}

void set_spec_constant(jit::KernelSpec& spec, std::string_view name, int64_t value) {
    for (auto& [n, v] : spec.constants)
        if (n == name) {
            v = value;
            return;
        }
    spec.constants.push_back({std::string(name), value});
}

bool spec_has_entry(const jit::KernelSpec& spec, std::string_view name) {
    return std::find(spec.entries.begin(), spec.entries.end(), name) != spec.entries.end();
}

namespace spec_util {

std::string supported_types() {
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k";
}

int gqa_group(const Config& cfg, int layer) {
    const LayerConfig& l = cfg.layers.at(layer);
    if (l.n_kv_heads <= 0 || cfg.n_heads % l.n_kv_heads != 0)
        throw ConfigError(fmt::format("model {}: layer {} has {} heads over {} KV heads", cfg.name,
                                      layer, cfg.n_heads, l.n_kv_heads));
    return cfg.n_heads / l.n_kv_heads;
}

}  // namespace spec_util
}  // namespace gj::gemma4
