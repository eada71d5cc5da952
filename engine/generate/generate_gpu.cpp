#include "engine/generate/generate_gpu.h"

namespace gj::gen {

namespace {

gemma4::Readout device_readout(const Readout& r) {
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

GpuForward::GpuForward(gemma4::GpuSession& session)
    : session_(session),
      device_readout_(session.model().flags().get_bool("GEMMAJIT_GPU_SAMPLING")) {}

std::vector<float> GpuForward::prefill(std::span<const int32_t> tokens) {
    return session_.prefill(tokens, gemma4::Readout::Logits, progress_).logits;
}

std::vector<float> GpuForward::decode(int32_t token) {
    return session_.decode(token, gemma4::Readout::Logits).logits;
}

StepResult GpuForward::prefill_step(std::span<const int32_t> tokens, const Readout& readout) {
    const gemma4::Readout r = device_readout_ ? device_readout(readout) : gemma4::Readout::Logits;
    return to_step_result(session_.prefill(tokens, r, progress_));
}

StepResult GpuForward::decode_step(int32_t token, const Readout& readout) {
    const gemma4::Readout r = device_readout_ ? device_readout(readout) : gemma4::Readout::Logits;
    return to_step_result(session_.decode(token, r));
}

}  // namespace gj::gen
