#include "engine/generate/generate.h"

#include <chrono>
#include <string>

namespace gj::gen {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* stop_reason_name(StopReason r) {
    switch (r) {
        case StopReason::StopToken:
            return "stop token";
        case StopReason::MaxTokens:
            return "token limit";
        case StopReason::ContextFull:
            return "context full";
    }
    return "?";
}

void check_prompt_fits(size_t prompt_tokens, int context_length) {
    if (prompt_tokens == 0) throw GenerateError("the prompt is empty (no tokens)");
    if (prompt_tokens >= static_cast<size_t>(context_length)) {
        throw GenerateError("the prompt has " + std::to_string(prompt_tokens) +
                            " tokens but the model's context holds " +
                            std::to_string(context_length) +
                            ", leaving no room to generate; shorten the prompt");
    }
}

std::vector<StepResult> SequentialBatchDecoder::decode_batch(std::span<const BatchEntry> batch) {
    std::vector<StepResult> out;
    out.reserve(batch.size());
    for (const BatchEntry& e : batch) out.push_back(e.forward->decode_step(e.token, e.readout));
    return out;
}

Readout readout_for(const sample::SamplerParams& p) {
    if (p.repeat_penalty != 1.0f) return {};
    if (p.temperature == 0.0f) return {Readout::Kind::Argmax, 0};
    if (p.top_k >= 1 && p.top_k <= kMaxReadoutTopK) return {Readout::Kind::TopK, p.top_k};
    return {};
}

int32_t sample_step(sample::Sampler& sampler, const StepResult& r) {
    if (!r.logits.empty()) return sampler.sample(r.logits);
    if (r.token >= 0) return r.token;
    if (r.ids.empty() || r.ids.size() != r.values.size())
        throw GenerateError("the forward pass returned neither logits, a token nor candidates");
    return r.ids.at(static_cast<size_t>(sampler.sample(r.values)));
}

GenerateResult generate(Forward& forward, const tok::Tokenizer& tokenizer, sample::Sampler& sampler,
                        std::span<const int32_t> prompt, const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text) {
    if (forward.vocab_size() != tokenizer.vocab_size()) {
        throw GenerateError("the model has " + std::to_string(forward.vocab_size()) +
                            " output logits but its tokenizer " +
                            std::to_string(tokenizer.vocab_size()) + " tokens");
    }
    const int context = forward.context_length();
    check_prompt_fits(prompt.size(), context);
    for (int32_t t : prompt) {
        if (t < 0 || t >= tokenizer.vocab_size()) {
            throw GenerateError("prompt token " + std::to_string(t) + " is outside the vocabulary");
        }
    }

    if (static_cast<size_t>(forward.position()) + prompt.size() >= static_cast<size_t>(context)) {
        throw GenerateError("the prompt has " + std::to_string(prompt.size()) + " tokens and " +
                            std::to_string(forward.position()) +
                            " are already in the sequence, but the context holds " +
                            std::to_string(context) + ", leaving no room to generate");
    }
    const Readout readout = forward.reduces_on_device() ? readout_for(sampler.params()) : Readout{};

    GenerateResult r;
    r.prompt_tokens = static_cast<int>(prompt.size());
    auto t0 = std::chrono::steady_clock::now();
    StepResult step = forward.prefill_step(prompt, readout);
    r.prompt_seconds = seconds_since(t0);
    for (int32_t t : prompt) sampler.accept(t);  // the penalty window sees the prompt too

    t0 = std::chrono::steady_clock::now();
    tok::StreamDecoder text(tokenizer);
    size_t position = static_cast<size_t>(forward.position());
    for (;;) {
        if (options.max_tokens >= 0 && r.tokens.size() >= static_cast<size_t>(options.max_tokens)) {
            r.reason = StopReason::MaxTokens;
            break;
        }
        const int32_t next = sample_step(sampler, step);
        if (tok::Tokenizer::is_stop_token(next)) {
            r.reason = StopReason::StopToken;
            r.stop_token = next;
            break;
        }
        sampler.accept(next);
        r.tokens.push_back(next);
        if (on_text) on_text(text.push(next));
        if (position >= static_cast<size_t>(context)) {  // no position left to decode it at
            r.reason = StopReason::ContextFull;
            break;
        }
        step = forward.decode_step(next, readout);
        ++position;
    }
    if (on_text) on_text(text.finish());
    r.generate_seconds = seconds_since(t0);
    return r;
}

}  // namespace gj::gen
