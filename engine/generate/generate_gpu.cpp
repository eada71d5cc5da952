#include "engine/generate/generate_gpu.h"

#include <stdexcept>

namespace gj::gen {

namespace {

gemma4::Readout to_device_readout(const Readout& r) {
    switch (r.kind) {
        case Readout::Kind::Argmax:
            return gemma4::Readout::Argmax;
        case Readout::Kind::TopK:
            return gemma4::Readout::TopK;
        case Readout::Kind::Logits:
            break;
    }
    return gemma4::Readout::Logits;
}

StepResult to_step_result(gemma4::StepOutput&& o) {
    StepResult r;
    r.logits = std::move(o.logits);
    r.token = o.token;
    r.ids = std::move(o.ids);
    r.values = std::move(o.values);
    return r;
}

}  // namespace

GpuForward::GpuForward(gemma4::GpuSession& session, int seq)
    : session_(session),
      seq_(seq),
      device_readout_(session.model().flags().get_bool("GEMMAJIT_GPU_SAMPLING")) {
    if (seq < 0 || seq >= session.sequences())
        throw std::out_of_range("sequence " + std::to_string(seq) + " of a GPU session holding " +
                                std::to_string(session.sequences()));
}

gemma4::Readout GpuForward::device_readout(const Readout& readout) const {
    return device_readout_ ? to_device_readout(readout) : gemma4::Readout::Logits;
}

std::vector<float> GpuForward::prefill(std::span<const int32_t> tokens) {
    return session_.prefill(tokens, gemma4::Readout::Logits, progress_, seq_).logits;
}

std::vector<float> GpuForward::decode(int32_t token) {
    return session_.decode(token, gemma4::Readout::Logits, seq_).logits;
}

StepResult GpuForward::prefill_step(std::span<const int32_t> tokens, const Readout& readout) {
    return to_step_result(session_.prefill(tokens, device_readout(readout), progress_, seq_));
}

StepResult GpuForward::decode_step(int32_t token, const Readout& readout) {
    return to_step_result(session_.decode(token, device_readout(readout), seq_));
}

std::vector<StepResult> GpuBatchDecoder::decode_batch(std::span<const BatchEntry> batch) {
    std::vector<gemma4::BatchToken> tokens;
    tokens.reserve(batch.size());
    for (const BatchEntry& e : batch) {
        const auto* f = dynamic_cast<const GpuForward*>(e.forward);
        if (!f || &f->session() != &session_)
            throw std::invalid_argument("a batched decode entry is not a sequence of this session");
        tokens.push_back({f->sequence(), e.token, f->device_readout(e.readout)});
    }
    std::vector<gemma4::StepOutput> outs = session_.decode_batch(tokens);
    std::vector<StepResult> results;
    results.reserve(outs.size());
    for (auto& o : outs) results.push_back(to_step_result(std::move(o)));
    return results;
}

}  // namespace gj::gen
