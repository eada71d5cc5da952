// Kernel timing for the DISABLED_ benchmark tests: the launches `record` enqueues are captured
// into one CUDA graph, replayed `reps` times between events; the median time per launch.
#pragma once

#include <algorithm>
#include <vector>

#include "jit/cuda_driver.h"
#include "jit/device.h"

namespace gj::test::kref {

struct GraphTimer {
    const jit::DriverApi& d = jit::driver();
    CUstream stream = jit::Device::get().stream();
    template <class F>
    double time_us(F&& record, int launches_per_graph, int reps) {
        CUgraph graph = nullptr;
        CUgraphExec exec = nullptr;
        jit::check_driver(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED),
                          "begin capture");
        record();
        jit::check_driver(d.cuStreamEndCapture(stream, &graph), "end capture");
        jit::check_driver(d.cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
        CUevent a, b;
        jit::check_driver(d.cuEventCreate(&a, 0), "event");
        jit::check_driver(d.cuEventCreate(&b, 0), "event");
        jit::check_driver(d.cuGraphLaunch(exec, stream), "warm-up");
        std::vector<double> per;
        for (int r = 0; r < reps; ++r) {
            jit::check_driver(d.cuEventRecord(a, stream), "record");
            jit::check_driver(d.cuGraphLaunch(exec, stream), "graph launch");
            jit::check_driver(d.cuEventRecord(b, stream), "record");
            jit::check_driver(d.cuEventSynchronize(b), "sync");
            float ms = 0;
            jit::check_driver(d.cuEventElapsedTime(&ms, a, b), "elapsed");
            per.push_back(ms * 1000.0 / launches_per_graph);
        }
        d.cuEventDestroy(a);
        d.cuEventDestroy(b);
        d.cuGraphExecDestroy(exec);
        d.cuGraphDestroy(graph);
        std::sort(per.begin(), per.end());
        return per[per.size() / 2];
    }
};

}  // namespace gj::test::kref
