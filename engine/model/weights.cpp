#include "engine/model/weights.h"

#include <fmt/format.h>

#include <cstring>

#include "engine/gguf/dequant.h"
#include "engine/gguf/reader.h"
#include "engine/model/gemma4_tensors.h"

namespace gj::gemma4 {

namespace {

std::vector<float> to_f32_vector(const gguf::TensorInfo& t) {
    std::vector<float> v(t.n_elements);
    ggml::dequantize_row(t.type, t.data, v.data(), int64_t(t.n_elements));
    return v;
}

class Binder {
  public:
    explicit Binder(const gguf::File& f) : f_(f) {}

    const gguf::TensorInfo* find(const std::string& name) const { return f_.find_tensor(name); }

    const gguf::TensorInfo& need(const std::string& name) const {
        const gguf::TensorInfo* t = f_.find_tensor(name);
        if (!t) throw ConfigError(fmt::format("{}: missing tensor {}", f_.path().string(), name));
        return *t;
    }

    std::vector<float> vec(const std::string& name) const { return to_f32_vector(need(name)); }

    Matrix mat(const std::string& name) const {
        const gguf::TensorInfo& t = need(name);
        return Matrix(name, t.type, t.dims[0], t.rows(), t.data);
    }

    // Splits a stacked {in, out, E} expert tensor into E matrices of `out` rows.
    std::vector<Matrix> experts(const std::string& name, uint64_t n_experts) const {
        const gguf::TensorInfo& t = need(name);
        Matrix all(name, t.type, t.dims[0], t.rows(), t.data);
        const uint64_t per = t.dims[1];
        std::vector<Matrix> out;
        for (uint64_t e = 0; e < n_experts; ++e) out.push_back(all.slice_rows(e * per, per));
        return out;
    }

  private:
    const gguf::File& f_;
};

}  // namespace

Matrix::Matrix(std::string name, ggml::Type type, uint64_t cols, uint64_t rows, const uint8_t* data)
    : name_(std::move(name)), type_(type), cols_(cols), rows_(rows), data_(data) {
    auto rb = ggml::row_bytes(type, cols);
    if (!rb)
        throw ConfigError(fmt::format("tensor {}: rows of {} elements do not fit {} blocks", name_,
                                      cols, ggml::type_name(type)));
    row_bytes_ = *rb;
}

const float* Matrix::row(uint64_t r, float* scratch) const {
    if (f32_rows_) return f32_rows_ + r * cols_;
    ggml::dequantize_row(type_, data_ + r * row_bytes_, scratch, int64_t(cols_));
    return scratch;
}

Matrix Matrix::slice_rows(uint64_t first, uint64_t count) const {
    if (first + count > rows_)
        throw ConfigError(
            fmt::format("tensor {}: rows [{}, {}) out of {}", name_, first, first + count, rows_));
    Matrix m = *this;
    m.rows_ = count;
    m.data_ = data_ + first * row_bytes_;
    if (f32_rows_) m.f32_rows_ = f32_rows_ + first * cols_;
    return m;
}

void Matrix::make_f32_copy() {
    if (f32_rows_ || !data_) return;
    auto copy = std::make_shared<std::vector<float>>(cols_ * rows_);
    for (uint64_t r = 0; r < rows_; ++r)
        ggml::dequantize_row(type_, data_ + r * row_bytes_, copy->data() + r * cols_,
                             int64_t(cols_));
    f32_rows_ = copy->data();
    f32_ = std::move(copy);
}

Weights::Weights(const gguf::File& file, const Config& cfg, const WeightOptions& opts) {
    Binder b(file);
    token_embd = b.mat("token_embd.weight");
    output = b.find("output.weight") ? b.mat("output.weight") : token_embd;
    output_norm = b.vec("output_norm.weight");
    if (cfg.has_ple()) {
        per_layer_token_embd = b.mat("per_layer_token_embd.weight");
        per_layer_model_proj = b.mat("per_layer_model_proj.weight");
        per_layer_proj_norm = b.vec("per_layer_proj_norm.weight");
    }
    layers.resize(cfg.n_layers);
    for (int l = 0; l < cfg.n_layers; ++l) {
        const LayerConfig& lc = cfg.layers[l];
        LayerWeights& w = layers[l];
        auto n = [&](const char* suffix) { return layer_tensor_name(l, suffix); };
        w.attn_norm = b.vec(n("attn_norm.weight"));
        w.attn_q = b.mat(n("attn_q.weight"));
        w.q_norm = b.vec(n("attn_q_norm.weight"));
        if (lc.has_kv) {
            w.attn_k = b.mat(n("attn_k.weight"));
            w.k_norm = b.vec(n("attn_k_norm.weight"));
            if (lc.has_v_proj) w.attn_v = b.mat(n("attn_v.weight"));
        }
        w.attn_output = b.mat(n("attn_output.weight"));
        w.post_attention_norm = b.vec(n("post_attention_norm.weight"));
        w.ffn_norm = b.vec(n("ffn_norm.weight"));
        w.ffn_gate = b.mat(n("ffn_gate.weight"));
        w.ffn_up = b.mat(n("ffn_up.weight"));
        w.ffn_down = b.mat(n("ffn_down.weight"));
        w.post_ffw_norm = b.vec(n("post_ffw_norm.weight"));
        if (b.find(n("layer_output_scale.weight")))
            w.output_scale = b.vec(n("layer_output_scale.weight")).at(0);
        if (cfg.has_ple()) {
            w.inp_gate = b.mat(n("inp_gate.weight"));
            w.proj = b.mat(n("proj.weight"));
            w.post_norm = b.vec(n("post_norm.weight"));
        }
        if (cfg.is_moe()) {
            const uint64_t E = cfg.n_experts, F = cfg.expert_ffn_dim;
            w.router = b.mat(n("ffn_gate_inp.weight"));
            w.router_scale = b.vec(n("ffn_gate_inp.scale"));
            w.expert_scale = b.vec(n("ffn_down_exps.scale"));
            w.pre_ffw_norm_2 = b.vec(n("pre_ffw_norm_2.weight"));
            w.post_ffw_norm_1 = b.vec(n("post_ffw_norm_1.weight"));
            w.post_ffw_norm_2 = b.vec(n("post_ffw_norm_2.weight"));
            if (b.find(n("ffn_gate_up_exps.weight"))) {
                // Fused {d, 2F, E}: in each expert the first F rows are gate, the next F up.
                for (const Matrix& e : b.experts(n("ffn_gate_up_exps.weight"), E)) {
                    w.gate_exps.push_back(e.slice_rows(0, F));
                    w.up_exps.push_back(e.slice_rows(F, F));
                }
            } else {
                w.gate_exps = b.experts(n("ffn_gate_exps.weight"), E);
                w.up_exps = b.experts(n("ffn_up_exps.weight"), E);
            }
            w.down_exps = b.experts(n("ffn_down_exps.weight"), E);
        }
    }

    // f32 copies: all or nothing, so a model runs one way throughout.
    std::vector<Matrix*> all = {&token_embd, &per_layer_model_proj};
    if (output.name() != token_embd.name()) all.push_back(&output);
    for (auto& w : layers) {
        for (Matrix* m : {&w.attn_q, &w.attn_k, &w.attn_v, &w.attn_output, &w.ffn_gate, &w.ffn_up,
                          &w.ffn_down, &w.inp_gate, &w.proj, &w.router})
            all.push_back(m);
    }
    uint64_t bytes = 0;
    for (Matrix* m : all) bytes += m->present() ? m->f32_bytes() : 0;
    // Experts and the PLE table: counted once per underlying tensor.
    for (auto& w : layers)
        for (auto* v : {&w.gate_exps, &w.up_exps, &w.down_exps})
            for (auto& m : *v) bytes += m.f32_bytes();
    if (cfg.has_ple()) bytes += per_layer_token_embd.f32_bytes();
    if (opts.f32_copy_limit_bytes == 0 || bytes > opts.f32_copy_limit_bytes) return;

    for (Matrix* m : all) m->make_f32_copy();
    if (output.name() == token_embd.name()) output = token_embd;
    if (cfg.has_ple()) per_layer_token_embd.make_f32_copy();
    for (auto& w : layers)
        for (auto* v : {&w.gate_exps, &w.up_exps, &w.down_exps})
            for (auto& m : *v) m.make_f32_copy();
    f32_copies_ = true;
}

}  // namespace gj::gemma4
