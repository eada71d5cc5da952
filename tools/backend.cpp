#include "tools/backend.h"

#include <unistd.h>
#include <cstdio>

#include "jit/device.h"

namespace gj::tools {

void status_line(const std::string& line) {
    std::fprintf(stderr, "gemmajit: %s\n", line.c_str());
}

std::unique_ptr<Backend> Backend::open(const std::string& model, const BackendOptions& opts) {
    std::unique_ptr<Backend> b(new Backend());
    std::string why;
    if (!opts.cpu && !jit::device_available(&why)) {
        status_line("no usable GPU (" + why + "); running the CPU reference forward");
    }
    if (opts.cpu || !why.empty()) {
        gemma4::CpuOptions co;
        co.threads = opts.threads;
        b->cpu_model_ = gemma4::CpuModel::load(model, co);
        b->cpu_ = std::make_unique<gen::CpuForward>(*b->cpu_model_);
        return b;
    }
    gemma4::GpuModelOptions mo;
    mo.context = opts.context;
    if (opts.verbose) mo.progress = status_line;
    b->gpu_model_ = gemma4::GpuModel::load(model, mo);
    if (opts.verbose) status_line(b->gpu_model_->summary());
    b->session_ = std::make_unique<gemma4::GpuSession>(*b->gpu_model_);
    b->gpu_ = std::make_unique<gen::GpuForward>(*b->session_);
    if (opts.verbose && isatty(STDERR_FILENO)) {
        b->gpu_->on_prefill_progress([](int done, int total) {
            if (total >= 1024)
                std::fprintf(stderr, "\rgemmajit: prompt %d / %d tokens%s", done, total,
                             done == total ? "\n" : "");
        });
    }
    return b;
}

gen::Forward& Backend::forward() {
    if (gpu_) return *gpu_;
    return *cpu_;
}

const gemma4::Config& Backend::config() const {
    return gpu_model_ ? gpu_model_->config() : cpu_model_->config();
}

}  // namespace gj::tools
