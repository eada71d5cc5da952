// GpuSession: construction (streams and events for the K/V side streams), the position (rewind),
// the token checks, and the step plumbing around a forward pass: the step state written before it
// and the readout copied back after it.
#include "engine/gpu/session/session_internal.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace gj::gemma4 {

GpuSession::GpuSession(GpuModel& model)
    : model_(model),
      cfg_(model.config()),
      kv_(model.config(), model.kv_geometry()),
      w_(std::make_unique<Work>(model)),
      graphs_(model.flags().get_bool("GEMMAJIT_GRAPHS")),
      streams_(model.flags().get_bool("GEMMAJIT_STREAMS")) {
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    const jit::DriverApi& api = jit::driver();
    stream_ = dev.stream();
    for (int i = 0; i < 2; ++i) {
        jit::check_driver(api.cuStreamCreate(&side_[i], CU_STREAM_NON_BLOCKING),
                          "cuStreamCreate(side stream)");
        jit::check_driver(api.cuEventCreate(&joined_[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    jit::check_driver(api.cuEventCreate(&forked_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (model.dequant_slot_bytes() > 0) {
        jit::check_driver(api.cuStreamCreate(&deq_stream_, CU_STREAM_NON_BLOCKING),
                          "cuStreamCreate(dequantization stream)");
        jit::check_driver(api.cuEventCreate(&slot_free_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        for (CUevent& e : deq_ready_)
            jit::check_driver(api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
}

GpuSession::~GpuSession() {
    const jit::DriverApi& api = jit::driver();
    for (int i = 0; i < 2; ++i) {
        if (side_[i]) api.cuStreamDestroy(side_[i]);
        if (joined_[i]) api.cuEventDestroy(joined_[i]);
    }
    if (forked_) api.cuEventDestroy(forked_);
    if (deq_stream_) api.cuStreamDestroy(deq_stream_);
    if (slot_free_) api.cuEventDestroy(slot_free_);
    for (CUevent e : deq_ready_)
        if (e) api.cuEventDestroy(e);
}

void GpuSession::fork(int branches) {
    const jit::DriverApi& api = jit::driver();
    const CUstream main = jit::Device::get().stream();
    jit::check_driver(api.cuEventRecord(forked_, main), "cuEventRecord(fork)");
    for (int i = 0; i < branches; ++i)
        jit::check_driver(api.cuStreamWaitEvent(side_[i], forked_, 0), "cuStreamWaitEvent(fork)");
}

void GpuSession::join(int branches) {
    const jit::DriverApi& api = jit::driver();
    const CUstream main = jit::Device::get().stream();
    for (int i = 0; i < branches; ++i) {
        jit::check_driver(api.cuEventRecord(joined_[i], side_[i]), "cuEventRecord(join)");
        jit::check_driver(api.cuStreamWaitEvent(main, joined_[i], 0), "cuStreamWaitEvent(join)");
    }
    stream_ = main;
}

void GpuSession::dequantize_layer(int l) {
    const jit::DriverApi& api = jit::driver();
    const CUstream main = jit::Device::get().stream();
    const bool side = streams_ && !profiler_;
    if (side) {  // slot l % 2 is free once everything enqueued so far (layer l - 2) has run
        jit::check_driver(api.cuEventRecord(slot_free_, main), "cuEventRecord(slot free)");
        jit::check_driver(api.cuStreamWaitEvent(deq_stream_, slot_free_, 0),
                          "cuStreamWaitEvent(slot free)");
        stream_ = deq_stream_;
    }
    const GpuLayer& g = model_.layers()[l];
    for (const GpuMatrix* m :
         {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down, &g.inp_gate, &g.proj})
        if (m->present() && !m->spec_dequant.empty()) dequantized(*m, l % 2);
    if (side) {
        jit::check_driver(api.cuEventRecord(deq_ready_[l % 2], deq_stream_),
                          "cuEventRecord(dequantized)");
        stream_ = main;
        ++paths_.dequant_ahead;
    }
}

void GpuSession::wait_dequantized(int l) {
    if (!streams_ || profiler_) return;  // made in order on the compute stream
    jit::check_driver(
        jit::driver().cuStreamWaitEvent(jit::Device::get().stream(), deq_ready_[l % 2], 0),
        "cuStreamWaitEvent(dequantized)");
}

int GpuSession::context() const {
    return kv_.geometry().context;
}

bool GpuSession::rewind(int keep) {
    if (keep < 0 || keep > pos_)
        throw std::invalid_argument(
            fmt::format("rewind to {}: the sequence holds {} positions", keep, pos_));
    if (!kv_.can_rewind(pos_, keep)) return false;
    pos_ = keep;
    return true;
}

void GpuSession::check_tokens(std::span<const int32_t> tokens) const {
    if (tokens.empty()) throw std::invalid_argument("prefill needs at least one token");
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
            throw std::invalid_argument(
                fmt::format("token id {} (input position {}) is outside the vocabulary [0, {})",
                            tokens[i], i, cfg_.vocab_size));
    if (int64_t(pos_) + int64_t(tokens.size()) > context())
        throw std::invalid_argument(
            fmt::format("{} tokens at position {} do not fit the context of {} positions",
                        tokens.size(), pos_, context()));
}

void GpuSession::write_step_state(std::span<const int32_t> tokens, int pos0) {
    const int R = w_->layout.rows;
    int32_t* s = w_->state_host.as<int32_t>();
    const int T = int(tokens.size());
    s[0] = T;
    s[1] = pos0;
    s[2] = s[3] = 0;
    for (int t = 0; t < T; ++t) {
        s[kStateHeader + t] = pos0 + t;
        s[kStateHeader + R + t] = tokens[t];
    }
    jit::check_driver(
        jit::driver().cuMemcpyHtoDAsync(w_->state.ptr(), s, (kStateHeader + 2 * R) * 4,
                                        jit::Device::get().stream()),
        "cuMemcpyHtoDAsync(step state)");
}

StepOutput GpuSession::read_result(Readout readout) {
    const jit::DriverApi& api = jit::driver();
    const CUstream stream = jit::Device::get().stream();
    StepOutput out;
    uint8_t* host = w_->result_host.as<uint8_t>();
    if (readout == Readout::Argmax)
        jit::check_driver(api.cuMemcpyDtoHAsync(host, w_->result_token(), 4, stream),
                          "cuMemcpyDtoHAsync(argmax)");
    if (readout == Readout::TopK)
        jit::check_driver(api.cuMemcpyDtoHAsync(host, w_->result_ids(), 2 * kMaxTopK * 4, stream),
                          "cuMemcpyDtoHAsync(top-k)");
    jit::check_driver(api.cuStreamSynchronize(stream), "forward step");
    switch (readout) {
        case Readout::Argmax:
            out.token = *reinterpret_cast<const int32_t*>(host);
            if (out.token < 0)
                throw std::runtime_error(
                    "the forward pass produced NaN logits (argmax found no largest value)");
            break;
        case Readout::TopK: {
            const int32_t* ids = reinterpret_cast<const int32_t*>(host);
            const float* vals = reinterpret_cast<const float*>(host + kMaxTopK * 4);
            const int k = std::min(kMaxTopK, cfg_.vocab_size);
            std::vector<int> order(k);
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
            for (int i : order) out.ids.push_back(ids[i]), out.values.push_back(vals[i]);
            break;
        }
        case Readout::Logits:
            out.logits.resize(size_t(cfg_.vocab_size));
            w_->logits.download(out.logits.data(), out.logits.size() * 4);
            break;
    }
    return out;
}

}  // namespace gj::gemma4
