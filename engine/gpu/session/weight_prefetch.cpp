// A decode step's weight prefetch (GEMMAJIT_PREFETCH_AHEAD_MB): between its matvecs a decode step
// runs chains of small dependent kernels (norms, attention, on a tensor-parallel rank the NCCL
// all-reduces) that read almost nothing from HBM. A side branch of the step asks L2 for the
// weights the next matvecs read while those chains run, so HBM keeps streaming weights through
// the whole step. The branch's l2_prefetch kernels wait on nothing and nothing waits on them:
// each asks for its ranges and exits, and the step's results are the same with or without them.
#include "engine/gpu/session/session_internal.h"

#include <algorithm>

namespace gj::gemma4 {

void GpuSession::prefetch_begin() {
    prefetching_ = false;
    if (prefetch_ahead_ == 0 || !decoding_ || profiler_) return;
    if (weight_order_.empty()) {
        // The matrices in the order a decode step's matvecs read them (its layers' matrices in
        // layer_pass.cpp's order, then the LM head); routed experts are not in it (which ones
        // run is known only on the GPU).
        auto add = [&](const GpuMatrix& m) {
            if (!m.present() || m.bytes == 0) return;
            const uint64_t end = (weight_order_.empty() ? 0 : weight_order_.back().end) + m.bytes;
            weight_order_.push_back({m.ptr, m.bytes, end});
            weight_end_.emplace_back(&m, end);
        };
        if (cfg_.has_ple()) add(model_.ple_model_proj());
        for (const GpuLayer& g : model_.layers())
            for (const GpuMatrix* m :
                 {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down, &g.inp_gate, &g.proj})
                add(*m);
        add(model_.lm_head());
    }
    if (weight_order_.empty()) return;
    prefetching_ = true;
    prefetch_frontier_ = 0;
    // A model without PLE reads its first layer's matrices two small kernels after the step
    // starts (the embedding and the first norm): their prefetch starts with the step. A PLE
    // model's first matvec (the context projection) follows the embedding at once.
    if (!cfg_.has_ple()) prefetch_to(0);
}

void GpuSession::prefetch_after(const GpuMatrix& m) {
    if (!prefetching_) return;
    for (const auto& [matrix, end] : weight_end_)
        if (matrix == &m) return prefetch_to(end);
}

void GpuSession::prefetch_to(uint64_t consumed) {
    const uint64_t total = weight_order_.back().end;
    const uint64_t from = std::max(prefetch_frontier_, consumed);
    const uint64_t to = std::min(total, consumed + prefetch_ahead_);
    if (to <= from) return;
    prefetch_frontier_ = to;
    const jit::DriverApi& api = jit::driver();
    const CUstream main = jit::Device::get().stream();
    // After everything enqueued so far (the matvec that read up to `consumed`).
    jit::check_driver(api.cuEventRecord(prefetch_fork_, main), "cuEventRecord(prefetch)");
    jit::check_driver(api.cuStreamWaitEvent(prefetch_stream_, prefetch_fork_, 0),
                      "cuStreamWaitEvent(prefetch)");
    const std::string& name = model_.spec_l2_prefetch();
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const jit::Kernel& k = model_.kernels().get(name, "l2_prefetch");
    const unsigned threads = constant(spec, "THREADS");
    const uint64_t per_block = uint64_t(threads) * constant(spec, "CHUNK");
    // The ranges of [from, to), four to a launch.
    CUdeviceptr p[4];
    uint64_t n[4];
    int used = 0;
    uint64_t bytes = 0;
    auto flush = [&] {
        if (used == 0) return;
        for (int i = used; i < 4; ++i) p[i] = 0, n[i] = 0;
        void* args[] = {&p[0], &n[0], &p[1], &n[1], &p[2], &n[2], &p[3], &n[3]};
        k.launch({ceil_div(bytes, per_block)}, {threads}, 0, prefetch_stream_, args, false);
        ++paths_.l2_prefetch;  // not in paths_.launches: the chain's launches stay as they are
        used = 0;
        bytes = 0;
    };
    for (const WeightRange& r : weight_order_) {
        const uint64_t start = r.end - r.bytes;
        if (r.end <= from || start >= to) continue;
        // Whole 16-byte pieces: every matrix starts 256-byte aligned.
        const uint64_t lo = std::max(from, start) - start, hi = std::min(to, r.end) - start;
        const uint64_t off = lo & ~uint64_t(15);
        p[used] = r.ptr + off;
        n[used] = hi - off;
        bytes += n[used];
        if (++used == 4) flush();
    }
    flush();
}

void GpuSession::prefetch_end() {
    if (!prefetching_) return;
    prefetching_ = false;
    const jit::DriverApi& api = jit::driver();
    const CUstream main = jit::Device::get().stream();
    jit::check_driver(api.cuEventRecord(prefetch_join_, prefetch_stream_),
                      "cuEventRecord(prefetch join)");
    jit::check_driver(api.cuStreamWaitEvent(main, prefetch_join_, 0),
                      "cuStreamWaitEvent(prefetch join)");
}

}  // namespace gj::gemma4
