// The forward pass behind run, chat and logits: the GPU when one is present (unless --cpu), else
// the CPU reference, owning the model and session. Status lines go to stderr.
#pragma once

#include <memory>
#include <string>

#include "engine/cpu/cpu_forward.h"
#include "engine/generate/generate.h"
#include "engine/generate/generate_cpu.h"
#include "engine/generate/generate_gpu.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/session.h"

namespace gj::tools {

struct BackendOptions {
    bool cpu = false;     // force the CPU reference forward
    int threads = 0;      // CPU worker threads
    int context = 0;      // GPU context; 0: the model's (reduced to what fits, with a notice)
    bool verbose = true;  // loading/compiling progress on stderr
};

class Backend {
  public:
    // Loads `model` on the GPU, or on the CPU with --cpu or without a usable GPU (one notice
    // naming why). GPU errors (MoE, memory) propagate: they say what to do.
    static std::unique_ptr<Backend> open(const std::string& model, const BackendOptions& opts);

    gen::Forward& forward();
    bool on_gpu() const { return session_ != nullptr; }
    gemma4::GpuSession& session() { return *session_; }  // GPU only
    const gemma4::Config& config() const;

  private:
    std::unique_ptr<gemma4::CpuModel> cpu_model_;
    std::unique_ptr<gen::CpuForward> cpu_;
    std::unique_ptr<gemma4::GpuModel> gpu_model_;
    std::unique_ptr<gemma4::GpuSession> session_;
    std::unique_ptr<gen::GpuForward> gpu_;
};

// "gemmajit: <line>" on stderr.
void status_line(const std::string& line);

}  // namespace gj::tools
