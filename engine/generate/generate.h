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

#include "engine/text/sampler.h"
#include "engine/text/tokenizer.h"

namespace gj::gen {

struct GenerateError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// How much of a step's result the forward pass hands back. A forward on a GPU reduces the logits
// row on the device, so only the chosen token or a short candidate list crosses to the host.
struct Readout {
    enum class Kind { Logits, Argmax, TopK };
    Kind kind = Kind::Logits;
    int k = 0;  // TopK: number of candidates
};

// The result of a step. A forward may hand back more than was asked for (the logits row for any
// readout); sample_step() uses the most complete part present.
struct StepResult {
    std::vector<float> logits;  // [vocab], or empty
    int32_t token = -1;         // Argmax: the greedy token, or -1
    std::vector<int32_t> ids;   // TopK: candidate ids in ascending id order
    std::vector<float> values;  // TopK: their logits
};

// One sequence's forward pass. Positions advance with every token passed in.
class Forward {
  public:
    virtual ~Forward() = default;
    virtual int vocab_size() const = 0;
    virtual int context_length() const = 0;
    virtual int position() const = 0;  // tokens already in the sequence
    // Runs `tokens` at the next positions; returns the logits of the last one ([vocab_size]).
    virtual std::vector<float> prefill(std::span<const int32_t> tokens) = 0;
    // Runs one token at the next position; returns its logits ([vocab_size]).
    virtual std::vector<float> decode(int32_t token) = 0;

    // Whether prefill_step/decode_step honour Argmax and TopK readouts on the device. The
    // defaults below return the logits row whatever the readout.
    virtual bool reduces_on_device() const { return false; }
    virtual StepResult prefill_step(std::span<const int32_t> tokens, const Readout&) {
        return StepResult{prefill(tokens), -1, {}, {}};
    }
    virtual StepResult decode_step(int32_t token, const Readout&) {
        return StepResult{decode(token), -1, {}, {}};
    }
    // Keeps positions [0, keep) and drops the rest, so a new prompt that extends the kept tokens
    // (the next turn of a chat) prefills only what is new. rewind(0) always succeeds; any other
    // keep may fail (a GPU sliding-window ring has overwritten keys those positions need), and
    // then nothing changed and the caller starts over with rewind(0).
    virtual bool rewind(int keep) {
        (void)keep;
        return false;
    }
};

// One row of a batched decode step: a token for the sequence `forward`.
struct BatchEntry {
    Forward* forward = nullptr;
    int32_t token = 0;
    Readout readout;
};

// Runs one token of each of several sequences per step. The GPU backend's runs them as one
// forward pass (every weight read once for the whole batch; a server's continuous batching);
// SequentialBatchDecoder runs them one at a time. Results come back in entry order.
class BatchDecoder {
  public:
    virtual ~BatchDecoder() = default;
    // Every entry's sequence must come from the backend that made this decoder, each at most
    // once; throws what the forward throws (a token outside the vocabulary, a full sequence).
    virtual std::vector<StepResult> decode_batch(std::span<const BatchEntry> batch) = 0;
};

class SequentialBatchDecoder : public BatchDecoder {
  public:
    std::vector<StepResult> decode_batch(std::span<const BatchEntry> batch) override;
};

// Most candidates a device-side top-k readout hands back.
inline constexpr int kMaxReadoutTopK = 64;

// The smallest readout from which `params` pick exactly the token they would pick from the whole
// row: Argmax for greedy sampling, TopK(top_k) for top-k sampling with top_k <= kMaxReadoutTopK;
// both only without a repetition penalty (it needs logits outside the candidates). Else Logits.
Readout readout_for(const sample::SamplerParams& params);

// Picks the next token from a step's result: the sampler over the logits row, the argmax token
// as is, or the sampler over the candidates (in ascending id order, so its tie-breaking and
// summation order are those of the whole row restricted to them).
int32_t sample_step(sample::Sampler& sampler, const StepResult& result);

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
