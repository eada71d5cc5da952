// The GPU session (gemma4::GpuSession) behind the generation loop's Forward interface, with the
// readout reduced on the device (argmax, or top-k candidates) unless GEMMAJIT_GPU_SAMPLING=0.
#pragma once

#include <functional>

#include "engine/generate/generate.h"
#include "engine/gpu/session.h"

namespace gj::gen {

class GpuForward : public Forward {
  public:
    explicit GpuForward(gemma4::GpuSession& session);
    int vocab_size() const override { return session_.model().config().vocab_size; }
    int context_length() const override { return session_.context(); }
    int position() const override { return session_.position(); }
    std::vector<float> prefill(std::span<const int32_t> tokens) override;
    std::vector<float> decode(int32_t token) override;
    bool reduces_on_device() const override { return device_readout_; }
    StepResult prefill_step(std::span<const int32_t> tokens, const Readout& readout) override;
    StepResult decode_step(int32_t token, const Readout& readout) override;
    bool rewind(int keep) override {
        if (keep == 0) {
            session_.reset();
            return true;
        }
        return session_.rewind(keep);
    }

    // Called after every prefill chunk of a long prompt with (tokens done, total).
    void on_prefill_progress(std::function<void(int, int)> f) { progress_ = std::move(f); }

  private:
    gemma4::GpuSession& session_;
    bool device_readout_;
    std::function<void(int, int)> progress_;
};

}  // namespace gj::gen
