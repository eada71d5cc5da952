// Tensor parallelism in the forward pass (docs/TENSOR_PARALLEL.md): the all-reduce after each
// row-parallel product (output projection, FFN down) and the gather of the readout, each rank
// holding a slice of the vocabulary. Every collective is enqueued on the compute stream, so a
// decode step's graph captures it like any kernel.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "engine/gpu/session/session_internal.h"

namespace gj::gemma4 {

namespace {

// Row t of the logits every rank gathered, [rank][per_rank floats] with each rank's rows as long
// as its own vocabulary slice, as one whole row `out` [V].
void join_vocab_row(const float* gathered, uint64_t per_rank, int t, int V, int ranks, float* out) {
    for (int r = 0; r < ranks; ++r) {
        const Range v = part_of(V, 1, r, ranks);
        std::copy_n(gathered + r * per_rank + uint64_t(t) * v.count, v.count, out + v.first);
    }
}

}  // namespace

GpuSession::Reduced GpuSession::all_reduce(CUdeviceptr buf, uint64_t floats, const char* what,
                                           int which, bool bf16_ok, bool lsa_ok) {
    const TensorParallel& tp = model_.tensor_parallel();
    if (!tp.active()) return {buf, false};
    // The post-norm after it sums the ranks' products itself: a decode step's products are in
    // the symmetric window, every rank's at the same offset.
    if (lsa_ok && decoding_ && w_->tp_dev_comm.made() && w_->tp_sym.holds(buf)) {
        ++paths_.norm_lsa;
        return {buf, false, true};
    }
    // A prefill chunk's bf16 products: converted and stored into this rank's slot of every
    // rank's window by one kernel (a block per SM at most), which ends once every rank's same
    // block has stored its part (an LSA barrier per block); the post-norm then sums the slots.
    const int T = int(floats / uint64_t(cfg_.d_model));
    if (prefill_pushes(T, bf16_ok)) {
        const std::string& name = model_.spec_tp_push();
        const unsigned threads = constant(model_.kernels().spec(name), "THREADS");
        CUdeviceptr* to = w_->prefill_push_to[which];  // the kernel takes 8 of them, by value
        int rows = T;
        void* args[] = {&buf, &rows, to, w_->tp_dev_comm.bytes()};
        launch(model_.kernels().get(name, "bf16_push_lsa"), {unsigned(w_->layout.push_blocks)},
               {threads}, 0, args, fmt::format("{} {}", name, what));
        ++paths_.prefill_push;
        return {w_->tp_bf16_slots(which), true, false, w_->layout.ranks};
    }
    ++paths_.all_reduce;
    // On sm_90+ NCCL's symmetric kernel may start as soon as the kernel before lets dependents
    // launch, and (NCCL 2.28-2.30.5) reads its input without waiting for that kernel: a one-byte
    // memset (of the window's barrier byte) between them makes it wait like any launch
    // (measured on 2 H200s: the 31B-shaped test model's decode logits about 30% of the largest
    // off without it, bitwise those of ordinary buffers with it; an event record node in
    // between did not help).
    const bool barrier = tp.nccl->symmetric_kernels_skip_grid_wait() &&
                         jit::Device::get().compute_capability() >= 90;
    auto symmetric = [&](const SymmetricBuffer& window) {
        ++paths_.all_reduce_symmetric;
        if (!barrier) return;
        jit::check_driver(jit::driver().cuMemsetD8Async(window.barrier_byte(), 0, 1, stream_),
                          "cuMemsetD8Async (before a symmetric all-reduce)");
        ++paths_.symmetric_barrier;
    };
    // A long prefill chunk's all-reduce is bound by NVLink bandwidth: its partial products go as
    // bf16 (half the bytes; converted on the GPU, the sum read as bf16 by the post-norm after
    // it). A decode step's is bound by latency (bf16 gains nothing there) and keeps fp32.
    // (Or the product's split-K sum wrote it there as bf16 already: row_parallel_product.)
    if (bf16_all_reduce(T, bf16_ok)) {
        const CUdeviceptr half = w_->tp_bf16_ptr();
        if (buf != half) convert(buf, int(floats), "f32_to_bf16", half, what);
        if (w_->tp_bf16_sym.ptr()) symmetric(w_->tp_bf16_sym);
        profiled(fmt::format("nccl all_reduce bf16 {}", what), LaunchCost{}, [&] {
            tp.nccl->all_reduce(tp.comm, half, floats, jit::NcclType::BF16, jit::NcclOp::Sum,
                                stream_);
        });
        ++paths_.all_reduce_bf16;
        return {half, true};
    }
    if (w_->tp_sym.holds(buf)) symmetric(w_->tp_sym);  // the decode window (row_parallel_out)
    profiled(fmt::format("nccl all_reduce {}", what), LaunchCost{}, [&] {
        tp.nccl->all_reduce(tp.comm, buf, floats, jit::NcclType::F32, jit::NcclOp::Sum, stream_);
    });
    return {buf, false};
}

bool GpuSession::bf16_all_reduce(int T, bool bf16_ok) const {
    return bf16_ok && model_.tensor_parallel().active() && !decoding_ && tp_bf16_rows_ > 0 &&
           T >= tp_bf16_rows_;
}

bool GpuSession::tp_fused_norm() const {
    return w_->tp_dev_comm.made();
}

bool GpuSession::tp_prefill_push() const {
    return w_->prefill_push_to[0][0] != 0;
}

bool GpuSession::prefill_pushes(int T, bool bf16_ok) const {
    return tp_prefill_push() && bf16_all_reduce(T, bf16_ok);
}

bool GpuSession::tp_push() const {
    return w_->push_to[0][0] != 0;
}

bool GpuSession::pushes(int T) const {
    return T == 1 && decoding_ && tp_push();
}

void GpuSession::find_push_targets() {
    Work& w = *w_;
    if (!w.tp_dev_comm.made()) return;
    const int self = model_.tensor_parallel().rank;
    // A prefill chunk's: the base of each half's slots in every rank's bf16 window.
    if (model_.tp_prefill_push() && w.tp_bf16_sym.ptr())
        for (int half = 0; half < 2; ++half)
            window_pointers(model_.spec_tp_push(), w.tp_bf16_sym,
                            uint64_t(half) * w.tp_bf16_half_bytes(), w.prefill_push_to[half]);
    // A decode step's: this rank's slot of each half in every rank's window.
    if (model_.tp_push())
        for (int half = 0; half < 2; ++half)
            window_pointers(model_.spec_push_post_prenorm(), w.tp_sym,
                            w.push_slot(half, self) - w.tp_sym.ptr(), w.push_to[half]);
}

void GpuSession::window_pointers(const std::string& spec, const SymmetricBuffer& window,
                                 uint64_t offset, CUdeviceptr out[8]) {
    // NCCL's own pointer arithmetic (ncclGetLsaPointer, of the headers of the library loaded) on
    // the GPU, once: the window's peer mappings never move.
    const int ranks = w_->layout.ranks, self = model_.tensor_parallel().rank;
    jit::DeviceBuffer dev(8 * sizeof(CUdeviceptr));
    jit::Nccl::Window win = window.window();
    CUdeviceptr dst = dev.ptr();
    void* args[] = {&win, &offset, &dst};
    model_.kernels().get(spec, "lsa_window_pointers").launch({1}, {32}, 0, stream_, args);
    CUdeviceptr host[8] = {};
    jit::check_driver(jit::driver().cuMemcpyDtoHAsync(host, dev.ptr(), sizeof host, stream_),
                      "cuMemcpyDtoHAsync (window pointers)");
    jit::check_driver(jit::driver().cuStreamSynchronize(stream_), "cuStreamSynchronize");
    // This rank's own through its ordinary address (NCCL's flat LSA mapping is an alias of the
    // same memory); every peer's must have been given.
    host[self] = window.ptr() + offset;
    for (int p = 0; p < ranks; ++p)
        if (!host[p])
            throw jit::DeviceError(
                fmt::format("tensor parallelism: NCCL gave no address in rank {}'s window", p));
    std::copy_n(host, 8, out);
}

void GpuSession::gather_readouts(int n_rows, bool logits) {
    const TensorParallel& tp = model_.tensor_parallel();
    const Work& w = *w_;
    profiled("nccl all_gather readout", LaunchCost{}, [&] {
        tp.nccl->all_gather(tp.comm, w.readout.ptr(), w.tp_results.ptr(),
                            w.layout.result_bytes() / 4, jit::NcclType::I32, stream_);
        // Rows of the largest slice from every rank (a smaller slice sends a few values past its
        // rows; the merge reads each rank's own row count).
        if (logits)
            tp.nccl->all_gather(tp.comm, w.logits.ptr(), w.tp_logits.ptr(),
                                uint64_t(n_rows) * w.layout.vocab, jit::NcclType::F32, stream_);
    });
    ++paths_.all_gather;
}

std::vector<StepOutput> GpuSession::merge_readouts(std::span<const Readout> readouts) {
    const jit::DriverApi& api = jit::driver();
    const CUstream stream = jit::Device::get().stream();
    const Work& w = *w_;
    const int ranks = w.layout.ranks, n = int(readouts.size()), V = cfg_.vocab_size;
    const uint64_t block = w.layout.result_bytes();
    uint8_t* host = w.result_host.as<uint8_t>();
    jit::check_driver(
        api.cuMemcpyDtoHAsync(host, w.tp_results.ptr(), uint64_t(ranks) * block, stream),
        "cuMemcpyDtoHAsync(gathered readouts)");
    jit::check_driver(api.cuStreamSynchronize(stream), "forward step");
    // Logits rows, when asked for: every rank's rows of its largest-slice stride, in one copy.
    const uint64_t per_rank = uint64_t(n) * w.layout.vocab;
    std::vector<float> gathered;
    if (std::find(readouts.begin(), readouts.end(), Readout::Logits) != readouts.end()) {
        gathered.resize(per_rank * ranks);
        w.tp_logits.download(gathered.data(), gathered.size() * 4);
    }
    struct Candidate {
        float value;
        int32_t id;
    };
    // Larger logit first; of equal ones the lower id (the single-GPU argmax's choice).
    auto better = [](const Candidate& a, const Candidate& b) {
        return a.value > b.value || (a.value == b.value && a.id < b.id);
    };
    std::vector<StepOutput> outs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        StepOutput& out = outs[size_t(i)];
        if (readouts[size_t(i)] == Readout::Logits) {
            out.logits.resize(size_t(V));
            join_vocab_row(gathered.data(), per_rank, i, V, ranks, out.logits.data());
            continue;
        }
        std::vector<Candidate> all;
        bool nan = false;
        for (int r = 0; r < ranks; ++r) {
            const Range v = part_of(V, 1, r, ranks);
            const uint8_t* base = host + r * block;
            const auto* ids = reinterpret_cast<const int32_t*>(base + w.ids_offset(i));
            const auto* vals = reinterpret_cast<const float*>(base + w.values_offset(i));
            for (int j = 0; j < std::min(kMaxTopK, v.count); ++j) {
                nan = nan || std::isnan(vals[j]);
                all.push_back({vals[j], ids[j] + v.first});
            }
        }
        if (nan)
            throw std::runtime_error(
                "the forward pass produced NaN logits (argmax found no largest value)");
        if (readouts[size_t(i)] == Readout::Argmax) {
            out.token = std::min_element(all.begin(), all.end(), better)->id;
            continue;
        }
        const size_t k = std::min<size_t>(size_t(std::min(kMaxTopK, V)), all.size());
        std::partial_sort(all.begin(), all.begin() + ptrdiff_t(k), all.end(), better);
        all.resize(k);
        std::sort(all.begin(), all.end(),
                  [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
        for (const Candidate& c : all) out.ids.push_back(c.id), out.values.push_back(c.value);
    }
    return outs;
}

void GpuSession::gather_all_logits(int T, float* out) {
    const TensorParallel& tp = model_.tensor_parallel();
    const Work& w = *w_;
    const int ranks = tp.ranks, V = cfg_.vocab_size;
    const uint64_t per_rank = uint64_t(T) * w.layout.vocab;  // rows of the largest slice
    jit::DeviceBuffer gathered(per_rank * ranks * 4);
    tp.nccl->all_gather(tp.comm, w.all_logits.ptr(), gathered.ptr(), per_rank, jit::NcclType::F32,
                        jit::Device::get().stream());
    ++paths_.all_gather;
    jit::check_driver(jit::driver().cuStreamSynchronize(jit::Device::get().stream()),
                      "all-gather of the logits");
    std::vector<float> host(per_rank * ranks);
    gathered.download(host.data(), host.size() * 4);
    for (int t = 0; t < T; ++t)
        join_vocab_row(host.data(), per_rank, t, V, ranks, out + uint64_t(t) * V);
}

}  // namespace gj::gemma4
