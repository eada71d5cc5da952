// Decode: one token as one CUDA graph per readout, captured on first use and replayed for every
// later token (GEMMAJIT_GRAPHS=0: the same launches, eager).
#include "engine/gpu/session/session_internal.h"

#include <memory>
#include <utility>

namespace gj::gemma4 {

StepOutput GpuSession::decode(int32_t token, Readout readout) {
    check_tokens({&token, 1});
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    const jit::DriverApi& api = jit::driver();
    write_step_state({&token, 1}, pos_);
    if (!graphs_) {
        record_forward(1, true);
        record_readout(0, readout);
    } else {
        Graph* graph = nullptr;
        for (auto& g : graphs_list_)
            if (g->readout == readout) graph = g.get();
        if (!graph) {
            // Captured once per readout; every kernel is already loaded with its shared-memory
            // limit set, and no launch argument depends on the token or its position.
            auto g = std::make_unique<Graph>();
            g->readout = readout;
            jit::check_driver(
                api.cuStreamBeginCapture(dev.stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture(decode step)");
            try {
                record_forward(1, true);
                record_readout(0, readout);
            } catch (...) {
                CUgraph broken = nullptr;
                api.cuStreamEndCapture(dev.stream(), &broken);
                if (broken) api.cuGraphDestroy(broken);
                throw;
            }
            jit::check_driver(api.cuStreamEndCapture(dev.stream(), &g->graph),
                              "cuStreamEndCapture(decode step)");
            jit::check_driver(api.cuGraphInstantiateWithFlags(&g->exec, g->graph, 0),
                              "cuGraphInstantiate(decode step)");
            ++graph_captures_;
            graph = g.get();
            graphs_list_.push_back(std::move(g));
        }
        jit::check_driver(api.cuGraphLaunch(graph->exec, dev.stream()),
                          "cuGraphLaunch(decode step)");
        ++graph_launches_;
    }
    StepOutput out = read_result(readout);
    ++pos_;
    return out;
}

}  // namespace gj::gemma4
