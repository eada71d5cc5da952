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
      pos_(size_t(model.kv_geometry().sequences), 0),
      graphs_(model.flags().get_bool("GEMMAJIT_GRAPHS")),
      streams_(model.flags().get_bool("GEMMAJIT_STREAMS")),
      pdl_(model.flags().get_bool("GEMMAJIT_PDL")),
      fuse_qkv_(model.flags().get_bool("GEMMAJIT_FUSE_QKV")),
      fuse_ple_(model.flags().get_bool("GEMMAJIT_FUSE_PLE")),
      ple_input_(model.flags().get_bool("GEMMAJIT_PLE_INPUT")),
      tp_bf16_rows_(int(model.flags().get_int("GEMMAJIT_TP_BF16_ROWS"))),
      copy_sms_(int(model.flags().get_int("GEMMAJIT_COPY_SMS"))) {
    jit::Device& dev = jit::Device::get();
    if (copy_sms_ >= dev.sm_count())
        throw jit::FlagError(fmt::format(
            "GEMMAJIT_COPY_SMS={} leaves no SM to the cuBLAS products: this GPU has {} SMs",
            copy_sms_, dev.sm_count()));
    dev.make_current();
    const jit::DriverApi& api = jit::driver();
    stream_ = dev.stream();
    for (int i = 0; i < 2; ++i) {
        side_[i] = dev.create_stream();
        jit::check_driver(api.cuEventCreate(&joined_[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    jit::check_driver(api.cuEventCreate(&forked_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (model.dequant_slot_bytes() > 0) {
        // Dequantization in the background: its blocks fill what the GEMMs leave idle.
        deq_stream_ = dev.create_stream(true);
        jit::check_driver(api.cuEventCreate(&slot_free_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        for (CUevent& e : deq_ready_)
            jit::check_driver(api.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    find_push_targets();
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

void GpuSession::dequantize_layer(int l, int T) {
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
        if (m->present() && !m->spec_dequant.empty() && blas_for(*m, T)) dequantized(*m, l % 2);
    if (side) {
        jit::check_driver(api.cuEventRecord(deq_ready_[l % 2], deq_stream_),
                          "cuEventRecord(dequantized)");
        stream_ = main;
        ++paths_.dequant_ahead;
    }
}

int GpuSession::blas_sm_target(int T) const {
    if (!copies_beside_ || !model_.blas()->sm_target_supported()) return 0;
    // cuBLAS's Hopper kernels take a whole SM's registers and shared memory, so without a target
    // the low-priority copy blocks run only in the gaps between products: at 512 rows the copies
    // are a third of a 31B chunk's time and hardly overlap. With 12 of 132 SMs left to them the
    // two overlap (31B Q4_0 pp512 +4%, E4B Q8_0 +2.4% on the H100); from 2048 rows the copies
    // are a small share and the products lose more than the overlap gains. A tensor-parallel
    // rank gains as well since its all-reduces run on NCCL's symmetric kernels (2x H200, 31B
    // Q4_0 pp512 TP=2 +4.8%, 12B +0.3%; 8 or 16 SMs no better; docs/PERFORMANCE.md).
    const int sms = jit::Device::get().sm_count();
    const int reserve = copy_sms_ >= 0 ? copy_sms_ : T < 1024 ? sms / 11 : 0;
    return reserve > 0 ? sms - reserve : 0;
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

bool GpuSession::rewind(int keep, int seq) {
    select(seq);
    const int pos = pos_[size_t(seq)];
    if (keep < 0 || keep > pos)
        throw std::invalid_argument(
            fmt::format("rewind to {}: the sequence holds {} positions", keep, pos));
    if (!kv_.can_rewind(pos, keep)) return false;
    mirror({kMirrorRewind, seq, keep});
    pos_[size_t(seq)] = keep;
    return true;
}

void GpuSession::reset(int seq) {
    select(seq);
    mirror({kMirrorReset, seq});
    pos_[size_t(seq)] = 0;
}

void GpuSession::select(int seq) {
    if (seq < 0 || seq >= sequences())
        throw std::out_of_range(
            fmt::format("sequence {} does not exist: the session holds {}", seq, sequences()));
    seq_ = seq;
}

void GpuSession::check_tokens(std::span<const int32_t> tokens, int seq) const {
    if (tokens.empty()) throw std::invalid_argument("prefill needs at least one token");
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
            throw std::invalid_argument(
                fmt::format("token id {} (input position {}) is outside the vocabulary [0, {})",
                            tokens[i], i, cfg_.vocab_size));
    const int pos = pos_.at(size_t(seq));
    if (int64_t(pos) + int64_t(tokens.size()) > context())
        throw std::invalid_argument(
            fmt::format("{} tokens at position {} do not fit the context of {} positions",
                        tokens.size(), pos, context()));
}

void GpuSession::write_step_state(std::span<const int32_t> tokens, std::span<const int> positions,
                                  std::span<const int> seqs) {
    const int R = w_->layout.rows;
    int32_t* s = w_->state_host.as<int32_t>();
    const int T = int(tokens.size());
    s[0] = T;
    s[1] = positions[0];
    s[2] = s[3] = 0;
    row_pos_.assign(positions.begin(), positions.end());
    row_seq_.assign(seqs.begin(), seqs.end());
    for (int t = 0; t < T; ++t) {
        s[kStateHeader + t] = positions[t];
        s[kStateHeader + R + t] = tokens[t];
        s[kStateHeader + 2 * R + t] = seqs[t];
    }
    jit::check_driver(jit::driver().cuMemcpyHtoDAsync(w_->state.ptr(), s, w_->layout.state_bytes(),
                                                      jit::Device::get().stream()),
                      "cuMemcpyHtoDAsync(step state)");
}

void GpuSession::write_chunk_state(std::span<const int32_t> tokens) {
    const int T = int(tokens.size()), pos0 = pos_[size_t(seq_)];
    std::vector<int> positions(static_cast<size_t>(T)), seqs(static_cast<size_t>(T), seq_);
    std::iota(positions.begin(), positions.end(), pos0);
    write_step_state(tokens, positions, seqs);
}

std::vector<StepOutput> GpuSession::read_results(std::span<const Readout> readouts) {
    if (model_.tensor_parallel().active()) return merge_readouts(readouts);
    const jit::DriverApi& api = jit::driver();
    const CUstream stream = jit::Device::get().stream();
    const Work& w = *w_;
    uint8_t* host = w.result_host.as<uint8_t>();
    const int n = int(readouts.size());
    auto fetch = [&](uint64_t offset, uint64_t bytes, const char* what) {
        jit::check_driver(
            api.cuMemcpyDtoHAsync(host + offset, w.readout.ptr() + offset, bytes, stream), what);
    };
    const bool any_token = std::count(readouts.begin(), readouts.end(), Readout::Argmax) > 0;
    const bool any_topk = std::count(readouts.begin(), readouts.end(), Readout::TopK) > 0;
    if (any_token) fetch(0, uint64_t(n) * 4, "cuMemcpyDtoHAsync(argmax)");
    if (any_topk) {  // the ids and values of the first n slots
        fetch(w.ids_offset(0), uint64_t(n) * kMaxTopK * 4, "cuMemcpyDtoHAsync(top-k ids)");
        fetch(w.values_offset(0), uint64_t(n) * kMaxTopK * 4, "cuMemcpyDtoHAsync(top-k values)");
    }
    jit::check_driver(api.cuStreamSynchronize(stream), "forward step");
    std::vector<StepOutput> outs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        StepOutput& out = outs[size_t(i)];
        switch (readouts[size_t(i)]) {
            case Readout::Argmax:
                out.token = *reinterpret_cast<const int32_t*>(host + w.token_offset(i));
                if (out.token < 0)
                    throw std::runtime_error(
                        "the forward pass produced NaN logits (argmax found no largest value)");
                break;
            case Readout::TopK: {
                const int32_t* ids = reinterpret_cast<const int32_t*>(host + w.ids_offset(i));
                const float* vals = reinterpret_cast<const float*>(host + w.values_offset(i));
                const int k = std::min(kMaxTopK, cfg_.vocab_size);
                std::vector<int> order(k);
                std::iota(order.begin(), order.end(), 0);
                std::sort(order.begin(), order.end(),
                          [&](int a, int b) { return ids[a] < ids[b]; });
                for (int j : order) out.ids.push_back(ids[j]), out.values.push_back(vals[j]);
                break;
            }
            case Readout::Logits:
                out.logits.resize(size_t(cfg_.vocab_size));  // the whole vocabulary here
                w.logits.download(out.logits.data(), out.logits.size() * 4,
                                  uint64_t(i) * cfg_.vocab_size * 4);
                break;
        }
    }
    return outs;
}

}  // namespace gj::gemma4
