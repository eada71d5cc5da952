// Next-token sampling with llama.cpp's semantics and order:
//   repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw.
//
// Candidates are ordered by (logit descending, token id ascending), so ties are broken the same
// way everywhere. Probabilities are computed in double; a softmax normalizer is always summed in
// ascending token-id order. That fixes every rounding, so the fast paths (which never sort the
// whole vocabulary) are bit-exact against the full-vocabulary reference path:
//   greedy: one argmax scan;  top-k: partial selection of k candidates;
//   top-p without top-k: growing partial selections until the nucleus is proven complete;
//   min-p alone: one scan for the tokens above the cut.
// Only plain temperature sampling over the whole vocabulary uses the full sort.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gj::sample {

struct SamplerError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// Defaults are Gemma's recommended sampling settings.
struct SamplerParams {
    float temperature = 1.0f;     // 0 = greedy; must be >= 0
    int top_k = 64;               // 0 = off; must be >= 0
    float top_p = 0.95f;          // 1 = off; must be in (0, 1]
    float min_p = 0.0f;           // 0 = off; must be in [0, 1]
    float repeat_penalty = 1.0f;  // 1 = off; must be > 0
    int repeat_last_n = 64;       // penalty window in tokens; must be >= 0
    uint64_t seed = 0;

    void validate() const;  // throws SamplerError naming the setting and value
};

enum class Path {
    Greedy,  // temperature 0: argmax
    TopK,    // partial selection of the top-k candidates
    TopP,    // nucleus proven from partial selections
    MinP,    // min-p cut found by one scan
    Full,    // sorted whole vocabulary
};
const char* path_name(Path p);

class Sampler {
  public:
    explicit Sampler(const SamplerParams& params);  // validates

    // Picks the next token from one row of logits (the vocabulary). `force_full` runs the
    // full-vocabulary reference path whatever the settings (used by tests to check the fast
    // paths). Throws SamplerError for empty logits or a NaN logit.
    int32_t sample(std::span<const float> logits, bool force_full = false);
    // Records a token (prompt or generated) for the repetition penalty window.
    void accept(int32_t token);
    // Empties the repetition penalty window (a new conversation); the random stream goes on.
    void clear_history() { history_.clear(); }

    Path last_path() const { return last_path_; }
    const SamplerParams& params() const { return params_; }

  private:
    struct Cand {
        float logit;
        int32_t id;
    };
    void apply_penalties(std::span<const float> logits);
    int32_t finish(std::vector<Cand>& sorted, bool top_k_done, bool top_p_done);
    int32_t sample_full();
    int32_t sample_top_p_proven();
    int32_t sample_min_p_scan();
    double normalizer(const std::vector<Cand>& cands) const;  // sum exp(l - max), id order
    size_t top_p_cut(const std::vector<Cand>& sorted, double z) const;

    SamplerParams params_;
    std::mt19937_64 rng_;
    std::deque<int32_t> history_;
    std::vector<float> work_;  // penalized logits of the current step
    std::vector<Cand> cands_;
    std::vector<double> weights_;  // the draw's weight of each candidate (finish)
    Path last_path_ = Path::Full;
};

}  // namespace gj::sample
