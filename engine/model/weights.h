// Typed access to a Gemma 4 model's tensors inside a gguf::File: every tensor the config implies
// is bound once (shapes already checked by Config::from_gguf), vectors (norm gains, scales) are
// converted to f32 at load, matrices stay in the file's encoding and are dequantized row by row
// on demand, or, when the caller allows it, once at load into an f32 copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/model/gemma4_config.h"

namespace gj::gguf {
class File;
struct TensorInfo;
}  // namespace gj::gguf

namespace gj::gemma4 {

// `rows` rows of `cols` elements (ggml: cols = ne0), possibly one expert's slice of a 3-D tensor.
class Matrix {
  public:
    Matrix() = default;
    Matrix(std::string name, ggml::Type type, uint64_t cols, uint64_t rows, const uint8_t* data);

    bool present() const { return data_ != nullptr; }
    const std::string& name() const { return name_; }
    ggml::Type type() const { return type_; }
    uint64_t cols() const { return cols_; }
    uint64_t rows() const { return rows_; }

    // Row r as f32: a pointer into the f32 copy when there is one, else `scratch` (cols floats)
    // filled by dequantizing the row.
    const float* row(uint64_t r, float* scratch) const;
    // Rows [first, first + count) as their own matrix (one expert of a stacked tensor; one half
    // of a fused gate|up expert).
    Matrix slice_rows(uint64_t first, uint64_t count) const;
    // Replaces on-demand dequantization by a one-time f32 copy of the whole matrix.
    void make_f32_copy();
    bool has_f32_copy() const { return f32_ != nullptr; }
    uint64_t f32_bytes() const { return cols_ * rows_ * sizeof(float); }

  private:
    std::string name_;
    ggml::Type type_ = ggml::Type::F32;
    uint64_t cols_ = 0, rows_ = 0, row_bytes_ = 0;
    const uint8_t* data_ = nullptr;
    std::shared_ptr<const std::vector<float>> f32_;  // shared by slices
    const float* f32_rows_ = nullptr;                // start of this slice inside f32_
};

struct LayerWeights {
    std::vector<float> attn_norm, q_norm, k_norm, post_attention_norm;
    Matrix attn_q, attn_k, attn_v, attn_output;  // attn_k/attn_v absent on KV-shared layers,
                                                 // attn_v absent on k_eq_v layers
    std::vector<float> ffn_norm, post_ffw_norm;
    Matrix ffn_gate, ffn_up, ffn_down;
    float output_scale = 1.0f;  // layer_output_scale
    // PLE
    Matrix inp_gate, proj;
    std::vector<float> post_norm;
    // MoE: per expert e, gate_exps[e] and up_exps[e] are {d -> F}, down_exps[e] is {F -> d}.
    Matrix router;  // ffn_gate_inp {d -> E}
    std::vector<float> router_scale, expert_scale, pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2;
    std::vector<Matrix> gate_exps, up_exps, down_exps;
};

struct WeightOptions {
    // Make f32 copies of all matrices when together they need at most this many bytes (tiny
    // models: instant matvecs); otherwise every matrix dequantizes rows on demand (E4B-size
    // models would need tens of GB as f32). 0 disables copies.
    uint64_t f32_copy_limit_bytes = uint64_t(512) << 20;
};

class Weights {
  public:
    // Binds every tensor of `cfg` (from Config::from_gguf(file)); throws ConfigError naming a
    // tensor that is missing or mis-shaped. `file` must outlive the Weights.
    Weights(const gguf::File& file, const Config& cfg, const WeightOptions& opts = {});

    Matrix token_embd;  // {d -> V}: embedding rows and the tied LM head
    Matrix output;      // output.weight when the file has one, else token_embd
    std::vector<float> output_norm;
    Matrix per_layer_token_embd, per_layer_model_proj;  // PLE
    std::vector<float> per_layer_proj_norm;
    std::vector<LayerWeights> layers;

    bool uses_f32_copies() const { return f32_copies_; }

  private:
    bool f32_copies_ = false;
};

}  // namespace gj::gemma4
