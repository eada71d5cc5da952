// gemma4::Config: everything the forward pass and the kernel plan need to know about a Gemma 4
// model, per layer. Built from GGUF metadata (validated against the tensor table) or from a named
// preset carrying the real shapes of the five released models, so planning needs no weights.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/ggml_types.h"

namespace gj::gguf {
class File;
}

namespace gj::gemma4 {

struct ConfigError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct LayerConfig {
    bool sliding = false;    // sliding-window attention (else global/causal)
    int head_dim = 0;        // 256 on sliding layers, 512 on global layers in released models
    int n_kv_heads = 0;      // per layer (array-valued head_count_kv)
    int ffn_dim = 0;         // dense GeGLU width (per layer: E2B double-wide on shared layers)
    bool has_kv = true;      // false for trailing KV-shared layers
    int kv_source = 0;       // layer whose cache this layer reads (itself when has_kv)
    bool has_v_proj = true;  // false on k_eq_v layers: V comes from the raw K projection
    float rope_base = 10000.0f;
    int rope_pairs = 0;  // rotated (j, j + head_dim/2) pairs: head_dim/2 sliding, 64 global
    // has_v_proj is meaningful only when has_kv; KV-shared layers own no projections at all and
    // report false.
};

struct Config {
    std::string name;  // preset name or the GGUF's general.name
    int n_layers = 0;
    int d_model = 0;
    int n_heads = 0;
    int vocab_size = 0;  // from token_embd's shape when loaded from a file
    int context_length = 0;
    int sliding_window = 0;
    int ple_dim = 0;  // per-layer-embedding width P (0 = no PLE)
    int n_kv_shared_layers = 0;
    int head_dim_global = 512;
    int head_dim_swa = 256;
    float rms_eps = 1e-6f;
    float final_softcap = 30.0f;
    float rope_base_global = 1e6f;
    float rope_base_swa = 1e4f;
    float rope_partial_factor = 0.25f;  // proportional RoPE on global layers
    // MoE (26B-A4B); zeros when dense.
    int n_experts = 0;
    int n_experts_used = 0;
    int expert_ffn_dim = 0;
    std::vector<LayerConfig> layers;

    bool is_moe() const { return n_experts > 0; }
    bool has_ple() const { return ple_dim > 0; }
    // llama.cpp multiplies the token embedding by the exact f32 sqrtf(d) (HF in fp32 agrees).
    float embed_scale() const;
    int q_dim(int layer) const { return n_heads * layers.at(layer).head_dim; }
    int kv_dim(int layer) const { return layers.at(layer).n_kv_heads * layers.at(layer).head_dim; }
    int first_shared_layer() const { return n_layers - n_kv_shared_layers; }

    // Throws ConfigError naming the key/tensor: missing keys, inconsistent tensor shapes,
    // architecture other than "gemma4", unsupported tensor types.
    static Config from_gguf(const gguf::File& file);
    // "e2b", "e4b", "12b", "26b-a4b", "31b" and the small "tiny*" presets used by tests.
    static Config preset(std::string_view name);
    static std::vector<std::string> preset_names();
    // The first n layers of this model as a model of their own (for smaller synthetic files):
    // the layer pattern, widths and donors stay those of the first n layers, the KV-shared tail
    // shrinks to the shared layers among them. Throws ConfigError when a shared layer would
    // lose its donor or n is out of range.
    Config first_layers(int n) const;
    void validate() const;        // internal consistency; throws ConfigError
    std::string summary() const;  // one-paragraph human description for logs
};

}  // namespace gj::gemma4
