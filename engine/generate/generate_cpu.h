// The CPU reference forward (gemma4::CpuSession) behind the generation loop's Forward interface.
#pragma once

#include "engine/cpu/cpu_forward.h"
#include "engine/generate/generate.h"

namespace gj::gen {

class CpuForward : public Forward {
  public:
    // `context` > 0 holds the sequence to that many positions (--ctx), as the GPU's KV cache
    // does; the reference itself keeps the model's whole context. At most the model's.
    explicit CpuForward(const gemma4::CpuModel& model, int context = 0);
    int vocab_size() const override { return model_.config().vocab_size; }
    int context_length() const override { return context_; }
    int position() const override { return session_.position(); }
    // The session returns logits for every prefilled position; prefilling in chunks keeps that to
    // kPrefillChunk rows (64 MiB on a 262144-token vocabulary) instead of one per prompt token.
    // The reference forward gives bitwise the same logits however the prompt is split.
    std::vector<float> prefill(std::span<const int32_t> tokens) override;
    std::vector<float> decode(int32_t token) override { return session_.decode(token); }
    void reset() { session_.reset(); }  // empties the sequence
    bool rewind(int keep) override {
        session_.rewind(keep);  // every position stays in the reference cache: always possible
        return true;
    }

    static constexpr size_t kPrefillChunk = 64;

  private:
    const gemma4::CpuModel& model_;
    gemma4::CpuSession session_;
    int context_;
};

}  // namespace gj::gen
