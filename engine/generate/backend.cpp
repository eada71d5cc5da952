#include "engine/generate/backend.h"

#include <stdexcept>
#include <string>

#include "jit/device.h"

namespace gj::gen {

std::unique_ptr<Backend> Backend::open(std::shared_ptr<const gemma4::ModelFile> file,
                                       const BackendOptions& opts) {
    std::unique_ptr<Backend> b(new Backend());
    b->file_ = std::move(file);
    auto status = [&](const std::string& line) {
        if (opts.status) opts.status(line);
    };
    std::string why;
    if (opts.tp.active() && opts.cpu)
        throw std::invalid_argument(
            "tensor parallelism (--tp) splits the model over GPUs; "
            "the CPU reference runs it whole");
    if (!opts.cpu && !jit::device_available(&why)) {
        if (opts.tp.active())
            throw std::runtime_error("tensor parallelism (--tp) needs GPUs: " + why);
        status("no usable GPU (" + why + "); running the CPU reference forward");
    }
    if (opts.cpu || !why.empty()) {
        gemma4::CpuOptions co;
        co.threads = opts.threads;
        b->cpu_model_ = gemma4::CpuModel::load(b->file_, co);
        b->cpu_context_ = opts.context;
        if (opts.default_sequence)
            b->cpu_ = std::make_unique<CpuForward>(*b->cpu_model_, opts.context);
        b->batch_ = std::make_unique<SequentialBatchDecoder>();
        return b;
    }
    gemma4::GpuModelOptions mo;
    mo.context = opts.context;
    mo.prefill_chunk = opts.prefill_chunk;
    mo.progress = opts.status;
    mo.sequences = opts.sequences;
    mo.tp = opts.tp;
    b->gpu_model_ = gemma4::GpuModel::load(b->file_, mo);
    status(b->gpu_model_->summary());
    b->prefill_progress_ = opts.prefill_progress;
    b->session_ = std::make_unique<gemma4::GpuSession>(*b->gpu_model_);
    b->batch_ = std::make_unique<GpuBatchDecoder>(*b->session_);
    if (!opts.default_sequence) return b;
    b->gpu_ = std::make_unique<GpuForward>(*b->session_, b->next_seq_++);
    if (opts.prefill_progress) b->gpu_->on_prefill_progress(opts.prefill_progress);
    return b;
}

Forward& Backend::forward() {
    if (gpu_) return *gpu_;
    if (cpu_) return *cpu_;
    throw std::logic_error("the backend was opened without its default sequence");
}

std::unique_ptr<Forward> Backend::new_sequence() {
    if (cpu_model_) return std::make_unique<CpuForward>(*cpu_model_, cpu_context_);
    if (next_seq_ >= session_->sequences())
        throw std::logic_error("the GPU backend holds " + std::to_string(session_->sequences()) +
                               " sequences, all handed out (BackendOptions::sequences)");
    auto f = std::make_unique<GpuForward>(*session_, next_seq_++);
    if (prefill_progress_) f->on_prefill_progress(prefill_progress_);
    return f;
}

void Backend::reset() {
    if (gpu_) {
        session_->reset(gpu_->sequence());
    } else if (cpu_) {
        cpu_->reset();
    }
}

}  // namespace gj::gen
