#include "engine/generate/backend.h"

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
    if (!opts.cpu && !jit::device_available(&why)) {
        status("no usable GPU (" + why + "); running the CPU reference forward");
    }
    if (opts.cpu || !why.empty()) {
        gemma4::CpuOptions co;
        co.threads = opts.threads;
        b->cpu_model_ = gemma4::CpuModel::load(b->file_, co);
        b->cpu_ = std::make_unique<CpuForward>(*b->cpu_model_);
        return b;
    }
    gemma4::GpuModelOptions mo;
    mo.context = opts.context;
    mo.progress = opts.status;
    b->gpu_model_ = gemma4::GpuModel::load(b->file_, mo);
    status(b->gpu_model_->summary());
    b->session_ = std::make_unique<gemma4::GpuSession>(*b->gpu_model_);
    b->gpu_ = std::make_unique<GpuForward>(*b->session_);
    if (opts.prefill_progress) b->gpu_->on_prefill_progress(opts.prefill_progress);
    return b;
}

Forward& Backend::forward() {
    if (gpu_) return *gpu_;
    return *cpu_;
}

void Backend::reset() {
    if (session_) {
        session_->reset();
    } else {
        cpu_->reset();
    }
}

}  // namespace gj::gen
