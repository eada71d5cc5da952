// Decode: one token of each of B sequences as one CUDA graph per batch size and readout list,
// captured on first use and replayed for every later step (GEMMAJIT_GRAPHS=0: the same
// launches, eager).
#include "engine/gpu/session/session_internal.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>

namespace gj::gemma4 {

StepOutput GpuSession::decode(int32_t token, Readout readout, int seq) {
    const BatchToken one{seq, token, readout};
    return std::move(decode_batch({&one, 1})[0]);
}

std::vector<StepOutput> GpuSession::decode_batch(std::span<const BatchToken> batch) {
    if (batch.empty()) throw std::invalid_argument("a decode batch needs at least one token");
    const int B = int(batch.size());
    // Rows ordered by readout kind (stable), so a graph is captured per batch size and count of
    // each kind, not per order in which a server's slots happen to want them.
    std::vector<int> order(static_cast<size_t>(B));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return batch[a].readout < batch[b].readout; });
    std::vector<int32_t> tokens;
    std::vector<int> positions, seqs;
    std::vector<Readout> readouts;
    std::vector<bool> seen(size_t(sequences()), false);
    for (int i : order) {
        const BatchToken& b = batch[size_t(i)];
        select(b.seq);
        if (seen[size_t(b.seq)])
            throw std::invalid_argument(
                fmt::format("sequence {} appears twice in one decode batch", b.seq));
        seen[size_t(b.seq)] = true;
        check_tokens({&b.token, 1}, b.seq);
        tokens.push_back(b.token);
        positions.push_back(pos_[size_t(b.seq)]);
        seqs.push_back(b.seq);
        readouts.push_back(b.readout);
    }
    if (mirroring()) {  // a tensor-parallel server's rank 0 (no record on the usual path)
        std::vector<int32_t> rows;
        for (int i = 0; i < B; ++i)
            rows.insert(rows.end(),
                        {seqs[size_t(i)], tokens[size_t(i)], int32_t(readouts[size_t(i)])});
        mirror({kMirrorDecodeBatch, B}, rows);
    }
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    const jit::DriverApi& api = jit::driver();
    write_step_state(tokens, positions, seqs);
    auto record = [&] {
        record_forward(B, true);
        record_readout(0, readouts);
    };
    if (!graphs_) {
        record();
    } else {
        Graph* graph = nullptr;
        for (auto& g : graphs_list_)
            if (g->readouts == readouts) graph = g.get();
        if (!graph) {
            // Captured once per batch size and readout list; every kernel is already loaded with
            // its shared-memory limit set, and no launch argument depends on the tokens, their
            // positions or sequences.
            auto g = std::make_unique<Graph>();
            g->readouts = readouts;
            jit::check_driver(
                api.cuStreamBeginCapture(dev.stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture(decode step)");
            try {
                record();
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
    std::vector<StepOutput> rows = read_results(readouts);
    for (int s : seqs) ++pos_[size_t(s)];
    std::vector<StepOutput> out(rows.size());
    for (int r = 0; r < B; ++r) out[size_t(order[size_t(r)])] = std::move(rows[size_t(r)]);
    return out;
}

}  // namespace gj::gemma4
