// Tensor parallelism behind a front end only rank 0 runs (the server): rank 0's session encodes
// each call that runs the forward pass or moves a sequence; a worker's session replays them in
// order (GpuSession::set_mirror, replay). Front ends that every rank runs alike (bench, run) need
// neither: the same inputs make the same calls.
#include <fmt/format.h>

#include <stdexcept>

#include "engine/gpu/session/session_internal.h"

namespace gj::gemma4 {

void GpuSession::mirror(std::initializer_list<int32_t> head, std::span<const int32_t> tail) {
    if (!mirror_) return;
    std::vector<int32_t> record(head);
    record.insert(record.end(), tail.begin(), tail.end());
    mirror_(record);
}

void GpuSession::replay(const std::function<bool(std::vector<int32_t>& record)>& next) {
    std::vector<int32_t> r;
    while (next(r)) {
        try {
            replay_one(r);
        } catch (const std::invalid_argument&) {
            throw;  // a record this session cannot take: the ranks no longer agree
        } catch (const std::exception&) {
            // Rank 0's call met the same error at the same point (NaN logits in the gathered
            // readout are alike on every rank) and its front end carries on: so does this rank.
        }
    }
}

void GpuSession::replay_one(const std::vector<int32_t>& r) {
    auto bad = [&](const char* why) {
        throw std::invalid_argument(fmt::format("mirrored session call: {} ({} words, call {})",
                                                why, r.size(), r.empty() ? 0 : r[0]));
    };
    auto readout = [&](int32_t v) {
        if (v < int32_t(Readout::Logits) || v > int32_t(Readout::TopK)) bad("unknown readout");
        return Readout(v);
    };
    if (r.size() < 2) bad("too short");
    const int seq = r[1];
    switch (r[0]) {
        case kMirrorPrefill:
            if (r.size() < 4) bad("too short");
            prefill(std::span<const int32_t>(r).subspan(3), readout(r[2]), {}, seq);
            break;
        case kMirrorPrefillLogits:
            if (r.size() < 3) bad("too short");
            prefill_logits(std::span<const int32_t>(r).subspan(2), seq);
            break;
        case kMirrorDecodeBatch: {
            const int rows = r[1];
            if (rows < 1 || r.size() != size_t(2 + 3 * rows)) bad("bad batch");
            std::vector<BatchToken> batch;
            for (int i = 0; i < rows; ++i)
                batch.push_back(
                    {r[size_t(2 + 3 * i)], r[size_t(3 + 3 * i)], readout(r[size_t(4 + 3 * i)])});
            decode_batch(batch);
            break;
        }
        case kMirrorReset:
            reset(seq);
            break;
        case kMirrorRewind:
            if (r.size() != 3) bad("bad rewind");
            if (!rewind(r[2], seq)) bad("a rewind rank 0 made failed here");
            break;
        default:
            bad("unknown call");
    }
}

}  // namespace gj::gemma4
