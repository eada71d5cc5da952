// The generation loop: prefill a prompt, then sample, stream and feed back tokens until a Gemma 4
// stop token, a token limit or the end of the context. Runs over an abstract Forward so the CPU
// reference and the GPU path (and test doubles) share it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "engine/tokenizer.h"

namespace gj::gen {

struct GenerateError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// One sequence's forward pass. Positions advance with every token passed in.
class Forward {
  public:
    virtual ~Forward() = default;
    virtual int vocab_size() const = 0;
    virtual int context_length() const = 0;
    // Runs `tokens` at the next positions; returns the logits of the last one ([vocab_size]).
    virtual std::vector<float> prefill(std::span<const int32_t> tokens) = 0;
    // Runs one token at the next position; returns its logits ([vocab_size]).
    virtual std::vector<float> decode(int32_t token) = 0;
};

enum class StopReason { StopToken, MaxTokens, ContextFull };
const char* stop_reason_name(StopReason r);

struct GenerateOptions {
    int max_tokens = -1;  // < 0: until a stop token or the context is full
};

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated, without the stop token
    StopReason reason = StopReason::MaxTokens;
    int32_t stop_token = -1;  // the stop token when reason == StopToken
    int prompt_tokens = 0;
    double prompt_seconds = 0;    // prefill
    double generate_seconds = 0;  // sampling + decoding after the prefill
};

// Checks everything that can be checked before any work (empty prompt, a prompt that leaves no
// room in the context, tokenizer/model vocabulary mismatch) and throws GenerateError naming it.
// Then streams text (only complete UTF-8; control tokens hidden) to `on_text`.
GenerateResult generate(Forward& forward, const tok::Tokenizer& tokenizer, sample::Sampler& sampler,
                        std::span<const int32_t> prompt, const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text);

// The same checks alone, for callers that want to fail before loading weights.
void check_prompt_fits(size_t prompt_tokens, int context_length);

}  // namespace gj::gen
