// The CPU fp32 reference forward pass of a Gemma 4 text model (reference/gemma4-spec.md section 2,
// checked against Hugging Face transformers' gemma4 implementation by the golden-logit tests).
// Written to be read, not to be fast: one function per step, f32 activations, f32 dot products
// with a fixed summation order, so a batch prefill and token-by-token decoding produce bitwise
// identical logits. Matrix rows are spread over a thread pool.
//
// Weights: small models (all matrices together <= WeightOptions::f32_copy_limit_bytes as f32)
// are dequantized once at load; larger ones dequantize each row when a matvec needs it, so an
// E4B-size model runs within its file's memory footprint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine/base/thread_pool.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/model_file.h"
#include "engine/model/weights.h"

namespace gj::gemma4 {

struct CpuOptions {
    int threads = 0;  // <= 0: one per hardware thread
    WeightOptions weights;
};

// A loaded model: config, bound weights and the worker threads. Sessions borrow it.
class CpuModel {
  public:
    // Binds the weights of an open model file (kept alive by the model: the weights point into
    // its mapping). ConfigError names a missing or mis-shaped tensor.
    static std::unique_ptr<CpuModel> load(std::shared_ptr<const ModelFile> file,
                                          const CpuOptions& opts = {});
    // Opens the GGUF and loads it (ConfigError / gguf::FormatError name the problem).
    static std::unique_ptr<CpuModel> load(const std::filesystem::path& path,
                                          const CpuOptions& opts = {});
    ~CpuModel();

    const Config& config() const { return file_->config(); }
    const ModelFile& file() const { return *file_; }
    const Weights& weights() const { return *weights_; }
    ThreadPool& pool() const { return *pool_; }

  private:
    CpuModel() = default;
    std::shared_ptr<const ModelFile> file_;
    std::unique_ptr<Weights> weights_;
    std::unique_ptr<ThreadPool> pool_;
};

// The routing of one token in a MoE layer (reference/gemma4-spec.md section 2.5): softmax over
// the E router logits, the K most probable experts (ties: the lower index), their probabilities
// renormalized to sum 1 and times expert_scale[e]; (expert, weight) in ascending expert order.
std::vector<std::pair<int, float>> route_token(const float* logits, int E, int K,
                                               const float* expert_scale);

// One sequence: a KV cache (all positions kept; sliding layers mask by position) and its length.
class CpuSession {
  public:
    explicit CpuSession(const CpuModel& model);

    // Runs `tokens` at positions position() .. position()+T-1 and returns their logits, row-major
    // [T][vocab]. Throws std::invalid_argument for an empty list or a token id outside the vocab.
    std::vector<float> prefill(std::span<const int32_t> tokens);
    // One token at position(); returns [vocab] logits.
    std::vector<float> decode(int32_t token);

    int position() const { return n_past_; }
    void reset();
    // Keeps positions [0, keep) (std::invalid_argument when keep is not in [0, position()]).
    void rewind(int keep);

    // Residual stream after each layer for the last call, [n_layers][T][d] (for debugging a
    // mismatch against another implementation layer by layer).
    const std::vector<float>& layer_outputs() const { return layer_outputs_; }

  private:
    struct LayerCache {
        std::vector<float> k, v;  // [position][n_kv_heads * head_dim]
    };

    void attention_block(int layer, std::vector<float>& x, int T);
    void ffn_block(int layer, std::vector<float>& x, int T);
    void moe_block(int layer, const std::vector<float>& x, std::vector<float>& y, int T);
    void ple_block(int layer, std::vector<float>& x, const std::vector<float>& ple, int T);
    std::vector<float> ple_inputs(std::span<const int32_t> tokens, const std::vector<float>& x);

    const CpuModel& model_;
    const Config& cfg_;
    const Weights& w_;
    std::vector<LayerCache> cache_;
    int n_past_ = 0;
    std::vector<float> layer_outputs_;
};

}  // namespace gj::gemma4
