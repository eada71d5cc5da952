// Profiling: a decode step or a prefill run eagerly with an event pair around every launch, the
// times summed per kernel label.
#include "engine/gpu/session/session_internal.h"

#include <algorithm>
#include <map>

namespace gj::gemma4 {

std::vector<KernelTime> GpuSession::profile_decode_step(int32_t token) {
    check_tokens({&token, 1}, 0);
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    Profiler prof;
    const int pos = pos_[0], seq = 0;
    write_step_state({&token, 1}, {&pos, 1}, {&seq, 1});
    profiler_ = &prof;
    const Readout argmax = Readout::Argmax;
    try {
        record_forward(1, true);
        record_readout(0, {&argmax, 1});
    } catch (...) {
        profiler_ = nullptr;
        throw;
    }
    profiler_ = nullptr;
    dev.synchronize();
    return collect_profile(prof);
}

std::vector<KernelTime> GpuSession::profile_prefill(std::span<const int32_t> tokens) {
    Profiler prof;
    profiler_ = &prof;
    try {
        prefill(tokens, Readout::Argmax);
    } catch (...) {
        profiler_ = nullptr;
        throw;
    }
    profiler_ = nullptr;
    return collect_profile(prof);
}

std::vector<KernelTime> GpuSession::collect_profile(const Profiler& prof) const {
    std::map<std::string, KernelTime> by_label;
    for (const auto& e : prof.entries) {
        float ms = 0;
        jit::check_driver(jit::driver().cuEventElapsedTime(&ms, e.start, e.stop),
                          "cuEventElapsedTime");
        KernelTime& k = by_label[e.label];
        k.label = e.label;
        k.kind = e.cost.kind;
        k.launches += 1;
        k.microseconds += double(ms) * 1000.0;
        k.weight_bytes += e.cost.bytes;
        k.flops += e.cost.flops;
    }
    std::vector<KernelTime> out;
    for (auto& [label, k] : by_label) out.push_back(k);
    std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) {
        return a.microseconds > b.microseconds;
    });
    return out;
}

}  // namespace gj::gemma4
