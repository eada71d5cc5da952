// One sequence of a GPU session (gemma4::GpuSession) behind the generation loop's Forward
// interface, with the readout reduced on the device (argmax, or top-k candidates) unless
// GEMMAJIT_GPU_SAMPLING=0; and the session's batched decode behind BatchDecoder.
#pragma once

#include <functional>

#include "engine/generate/generate.h"
#include "engine/gpu/session.h"

namespace gj::gen {

class GpuForward : public Forward {
  public:
    // Sequence `seq` of the session.
    explicit GpuForward(gemma4::GpuSession& session, int seq = 0);
    int vocab_size() const override { return session_.model().config().vocab_size; }
    int context_length() const override { return session_.context(); }
    int position() const override { return session_.position(seq_); }
    std::vector<float> prefill(std::span<const int32_t> tokens) override;
    std::vector<float> decode(int32_t token) override;
    bool reduces_on_device() const override { return device_readout_; }
    StepResult prefill_step(std::span<const int32_t> tokens, const Readout& readout) override;
    StepResult decode_step(int32_t token, const Readout& readout) override;
    bool rewind(int keep) override {
        if (keep == 0) {
            session_.reset(seq_);
            return true;
        }
        return session_.rewind(keep, seq_);
    }

    // Called after every prefill chunk of a long prompt with (tokens done, total).
    void on_prefill_progress(std::function<void(int, int)> f) { progress_ = std::move(f); }

    gemma4::GpuSession& session() const { return session_; }
    int sequence() const { return seq_; }
    // The readout the session computes for a requested one (GEMMAJIT_GPU_SAMPLING=0: logits).
    gemma4::Readout device_readout(const Readout& readout) const;

  private:
    gemma4::GpuSession& session_;
    int seq_;
    bool device_readout_;
    std::function<void(int, int)> progress_;
};

// The batched decode of one GPU session: every entry's forward must be a GpuForward over it.
class GpuBatchDecoder : public BatchDecoder {
  public:
    explicit GpuBatchDecoder(gemma4::GpuSession& session) : session_(session) {}
    std::vector<StepResult> decode_batch(std::span<const BatchEntry> batch) override;

  private:
    gemma4::GpuSession& session_;
};

}  // namespace gj::gen
