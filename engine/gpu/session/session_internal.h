// What the files of GpuSession (engine/gpu/session/) share and its public header hides: the
// launch-geometry helpers, the work buffers, a captured decode graph and the profiler's events.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/session.h"
#include "engine/gpu/session/work_layout.h"
#include "jit/cuda_driver.h"

namespace gj::gemma4 {

// The calls a mirror record encodes (GpuSession::set_mirror): the first word of each record.
enum MirrorCall : int32_t {
    kMirrorPrefill = 1,        // seq, readout, tokens...
    kMirrorPrefillLogits = 2,  // seq, tokens...
    kMirrorDecodeBatch = 3,    // rows, then (seq, token, readout) per row
    kMirrorReset = 4,          // seq
    kMirrorRewind = 5,         // seq, keep
};

inline unsigned ceil_div(uint64_t a, uint64_t b) {
    return unsigned((a + b - 1) / b);
}

inline unsigned constant(const jit::KernelSpec& spec, std::string_view name) {
    return unsigned(spec_constant(spec, name));
}

// A captured decode step: its batch size is readouts.size(), one readout per row.
struct GpuSession::Graph {
    std::vector<Readout> readouts;
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    ~Graph() {
        if (exec) jit::driver().cuGraphExecDestroy(exec);
        if (graph) jit::driver().cuGraphDestroy(graph);
    }
};

struct GpuSession::Profiler {
    struct Entry {
        std::string label;
        LaunchCost cost;
        CUevent start, stop;
    };
    std::vector<Entry> entries;
    ~Profiler() {
        for (auto& e : entries) {
            jit::driver().cuEventDestroy(e.start);
            jit::driver().cuEventDestroy(e.stop);
        }
    }
};

template <class F>
void GpuSession::profiled(const std::string& label, LaunchCost cost, F&& enqueue) {
    if (!profiler_) {
        enqueue();
        return;
    }
    const jit::DriverApi& api = jit::driver();
    Profiler::Entry e{label, cost, nullptr, nullptr};
    jit::check_driver(api.cuEventCreate(&e.start, CU_EVENT_DEFAULT), "cuEventCreate");
    jit::check_driver(api.cuEventCreate(&e.stop, CU_EVENT_DEFAULT), "cuEventCreate");
    profiler_->entries.push_back(e);
    jit::check_driver(api.cuEventRecord(e.start, stream_), "cuEventRecord");
    enqueue();
    jit::check_driver(api.cuEventRecord(e.stop, stream_), "cuEventRecord");
}

}  // namespace gj::gemma4
