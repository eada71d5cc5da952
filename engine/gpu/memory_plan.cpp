// GpuModel's memory plan: what the weights, the PLE table, the KV cache and the work buffers of a
// load take on the GPU, and the placement that fits the free memory (a default prefill chunk
// shrinks first, then the PLE table moves to pinned host memory, then a default context halves).
#include "engine/gpu/gpu_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/gpu/kv_cache.h"
#include "engine/gpu/session.h"
#include "jit/device.h"
#include "jit/env_flags.h"

namespace gj::gemma4 {

std::string format_gib(uint64_t bytes) {
    return fmt::format("{:.2f} GiB", double(bytes) / double(1ull << 30));
}

uint64_t MemoryPlan::needed() const {
    const uint64_t resident = weights + (ple_on_gpu ? ple_table : 0) + reserve;
    return std::max(resident + staging, resident + kv + work);
}

std::string MemoryPlan::describe() const {
    std::string s = fmt::format("weights {}", format_gib(weights));
    if (ple_table)
        s += fmt::format(" + PLE table {} ({})", format_gib(ple_table),
                         ple_on_gpu ? "GPU" : "pinned host");
    s += fmt::format(" + KV cache{} {} + work buffers {} + reserve {}",
                     sequences > 1 ? fmt::format(" ({} sequences)", sequences) : "", format_gib(kv),
                     format_gib(work), format_gib(reserve));
    if (staging > kv + work)
        s += fmt::format(" (repack staging {} while loading)", format_gib(staging));
    return s;
}

// Where everything goes on this GPU (PLE table on the GPU or pinned host memory, the context the
// KV cache allows) and whether it fits.
void GpuModel::plan_memory(const GpuModelOptions& opts) {
    const jit::Flags& flags = flags_;
    jit::Device& dev = jit::Device::get();
    const Config& c = cfg_;
    // Memory: place the PLE table, then check everything fits. A default prefill chunk shrinks
    // before the PLE table leaves the GPU; without an explicit context the model's own is then
    // halved (down to 4096) until the KV cache fits; each with a notice.
    mem_.reserve = uint64_t(256) << 20;
    mem_.free = dev.free_memory();
    const uint64_t limit = flags.get_size("GEMMAJIT_GPU_MEMORY_LIMIT");
    if (limit > 0) mem_.free = std::min<uint64_t>(mem_.free, limit);
    const std::string& ple_where = flags.get_string("GEMMAJIT_PLE_TABLE");
    // One placement at the current context and chunk; the PLE table may go to pinned host
    // memory (GEMMAJIT_PLE_TABLE=auto) only when `ple_host_ok`.
    auto place = [&](bool ple_host_ok) {
        mem_.kv = kv_cache_bytes(c, kv_geo_);
        mem_.sequences = kv_geo_.sequences;
        mem_.work = session_work_bytes(*this);
        mem_.ple_on_gpu = c.has_ple() && ple_where != "host";
        if (mem_.ple_on_gpu && ple_where == "auto" && ple_host_ok && mem_.needed() > mem_.free)
            mem_.ple_on_gpu = false;
        return mem_.needed() <= mem_.free;
    };
    // At one context, in order of preference: the wanted chunk, a default chunk halved down to
    // kMinAutoChunk (a longer chunk amortizes each layer's F16 copies and fills the GEMMs, but
    // grows every sliding-window ring and the work buffers), all with the PLE table on the GPU;
    // then the same with the table in host memory (it costs decode a little on every token).
    const int wanted_chunk = kv_geo_.max_chunk;
    auto fit_at_context = [&] {
        for (const bool ple_host_ok : {false, true}) {
            kv_geo_.max_chunk = std::min(wanted_chunk, kv_geo_.context);
            while (true) {
                if (place(ple_host_ok)) return true;
                if (!chunk_default_ || kv_geo_.max_chunk <= kMinAutoChunk) break;
                kv_geo_.max_chunk = std::max(kMinAutoChunk, kv_geo_.max_chunk / 2);
            }
        }
        return false;
    };
    bool fits = fit_at_context();
    // Then a shorter context (without an explicit one), each tried with every chunk again.
    const int wanted = kv_geo_.context;
    while (!fits && opts.context == 0 && kv_geo_.context > 4096) {
        kv_geo_.context = std::max(4096, kv_geo_.context / 2);
        fits = fit_at_context();
    }
    if (fits && kv_geo_.max_chunk < std::min(wanted_chunk, kv_geo_.context))
        notices_.push_back(fmt::format(
            "prefill chunk reduced from {} to {} tokens so the KV cache and work buffers fit in "
            "GPU memory (GEMMAJIT_PREFILL_CHUNK sets it)",
            wanted_chunk, kv_geo_.max_chunk));
    ple_table_.on_gpu = mem_.ple_on_gpu;
    if (!fits)
        throw GpuModelError(fmt::format(
            "{}: {} needs {} of GPU memory ({}) but {} has only {} free; use a smaller context "
            "(--ctx, now {} positions), a smaller weight type, or a GPU with more memory",
            path_.string(), c.name, format_gib(mem_.needed()), mem_.describe(), dev.name(),
            format_gib(mem_.free), kv_geo_.context));
    if (kv_geo_.context != wanted)
        notices_.push_back(fmt::format(
            "context reduced from {} to {} positions so the KV cache fits in GPU memory (--ctx "
            "sets it)",
            wanted, kv_geo_.context));
}

void GpuModel::agree_across_ranks(const GpuModelOptions& opts) {
    if (!tp_.active() || !tp_.nccl) return;
    jit::Device& dev = jit::Device::get();
    // (And the fewest SMs of any rank's GPU: the grid of a prefill chunk's push, whose blocks
    // meet the other ranks' same blocks, must be the same on every rank and fit each GPU.)
    int32_t mine[3] = {kv_geo_.context, kv_geo_.max_chunk, dev.sm_count()}, all[3] = {0, 0, 0};
    jit::DeviceBuffer buf(sizeof mine);
    buf.upload(mine, sizeof mine);
    tp_.nccl->all_reduce(tp_.comm, buf.ptr(), 3, jit::NcclType::I32, jit::NcclOp::Min,
                         dev.stream());
    dev.synchronize();
    buf.download(all, sizeof all);
    tp_min_sms_ = all[2];
    if (all[0] == mine[0] && all[1] == mine[1]) return;
    // Smaller than this rank's own choice, so it fits here too.
    GpuModelOptions o = opts;
    o.context = kv_geo_.context = all[0];
    kv_geo_.max_chunk = all[1];
    chunk_default_ = false;
    plan_memory(o);
    notices_.push_back(fmt::format(
        "context {} and prefill chunk {}: the tensor-parallel rank with the least GPU memory "
        "has them",
        all[0], all[1]));
}

std::map<ggml::Type, uint64_t> GpuModel::layer_bytes_by_type() const {
    std::map<ggml::Type, uint64_t> by_type;
    for (const auto& g : layers_) {
        for (const GpuMatrix* m :
             {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down, &g.inp_gate, &g.proj})
            if (m->present()) by_type[m->type] += m->bytes;
        for (const GpuExperts* x : {&g.gate_up, &g.up_exps, &g.down_exps})
            if (x->present()) by_type[x->all.type] += x->all.bytes;
    }
    return by_type;
}

}  // namespace gj::gemma4
