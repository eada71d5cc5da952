// Prefill: a prompt in chunks of up to prefill_chunk() tokens, each one forward pass over its
// rows; the readout is of the last token, or (prefill_logits) the logits of every one.
#include "engine/gpu/session/session_internal.h"

#include <algorithm>

namespace gj::gemma4 {

StepOutput GpuSession::prefill(std::span<const int32_t> tokens, Readout readout,
                               const std::function<void(int, int)>& progress, int seq) {
    select(seq);
    check_tokens(tokens, seq);
    mirror({kMirrorPrefill, seq, int32_t(readout)}, tokens);
    const int chunk = model_.prefill_chunk();
    const int total = int(tokens.size());
    jit::Device::get().make_current();
    for (int t0 = 0; t0 < total; t0 += chunk) {
        const int T = std::min(chunk, total - t0);
        write_chunk_state(tokens.subspan(t0, T));
        record_forward(T, false);
        if (t0 + T == total) record_readout(T - 1, {&readout, 1});
        pos_[size_t(seq)] += T;
        if (t0 + T < total) {
            // The pinned step state is rewritten by the next chunk.
            jit::check_driver(jit::driver().cuStreamSynchronize(jit::Device::get().stream()),
                              "prefill chunk");
            if (progress) progress(t0 + T, total);
        }
    }
    StepOutput out = std::move(read_results({&readout, 1})[0]);
    if (progress) progress(total, total);
    return out;
}

std::vector<float> GpuSession::prefill_logits(std::span<const int32_t> tokens, int seq) {
    select(seq);
    check_tokens(tokens, seq);
    mirror({kMirrorPrefillLogits, seq}, tokens);
    const int chunk = model_.prefill_chunk();
    const int total = int(tokens.size());
    const uint64_t V = uint64_t(cfg_.vocab_size);
    jit::Device::get().make_current();
    if (w_->all_logits.size() == 0)  // [rows][V]: only for callers that want every row
        w_->all_logits = jit::DeviceBuffer(uint64_t(w_->layout.rows) * V * 4);
    std::vector<float> out(uint64_t(total) * V);
    for (int t0 = 0; t0 < total; t0 += chunk) {
        const int T = std::min(chunk, total - t0);
        write_chunk_state(tokens.subspan(t0, T));
        record_forward(T, false);
        record_all_logits(T);
        pos_[size_t(seq)] += T;
        jit::check_driver(jit::driver().cuStreamSynchronize(jit::Device::get().stream()),
                          "prefill chunk");
        if (model_.tensor_parallel().active())
            gather_all_logits(T, out.data() + uint64_t(t0) * V);
        else
            w_->all_logits.download(out.data() + uint64_t(t0) * V, uint64_t(T) * V * 4);
    }
    return out;
}

}  // namespace gj::gemma4
