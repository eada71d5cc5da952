// The forward pass behind a front end (`gemmajit run`, `chat`, a server): the GPU when one is
// present (unless told to use the CPU), else the CPU reference, owning the model, the session and
// the Forward the generation loop runs over. Built on an open ModelFile, so the caller's
// tokenizer and config come from the same single parse of the file.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/cpu/cpu_forward.h"
#include "engine/generate/generate.h"
#include "engine/generate/generate_cpu.h"
#include "engine/generate/generate_gpu.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/session.h"
#include "engine/model/model_file.h"

namespace gj::gen {

struct BackendOptions {
    bool cpu = false;  // force the CPU reference forward
    int threads = 0;   // CPU worker threads
    // Positions a sequence holds; 0: the model's (on the GPU reduced to what fits, with a
    // notice; the CPU holds each sequence to it: CpuForward).
    int context = 0;
    // GPU tokens per prefill chunk; 0: GEMMAJIT_PREFILL_CHUNK (its default shrinks to fit).
    int prefill_chunk = 0;
    // One-line notices: why there is no GPU, loading and compiling progress, the loaded model's
    // summary. Null: silent.
    std::function<void(const std::string&)> status;
    // Called on the GPU after every prefill chunk of a prompt with (tokens done, total).
    std::function<void(int, int)> prefill_progress;
    // Sequences the GPU session holds (a server's slots; the memory plan counts each one's KV
    // cache): forward() is sequence 0 when default_sequence, new_sequence() hands out the rest.
    int sequences = 1;
    // Whether open() also creates the one sequence forward() returns. A server that runs several
    // sequences over the loaded model (new_sequence()) sets this false, so every sequence is a
    // slot.
    bool default_sequence = true;
    // Tensor parallelism: this process's rank and communicator (the GPU only).
    gemma4::TensorParallel tp;
};

class Backend {
  public:
    // Loads `file` on the GPU, or on the CPU when asked or without a usable GPU (one status line
    // naming why). GPU errors (MoE, memory) propagate: they say what to do.
    static std::unique_ptr<Backend> open(std::shared_ptr<const gemma4::ModelFile> file,
                                         const BackendOptions& opts);

    Forward& forward();  // std::logic_error when opened without the default sequence
    // One more independent sequence (its own KV cache and position) over the same loaded weights:
    // a CpuSession over the CpuModel (any number), or the next sequence of the GPU session
    // (std::logic_error past BackendOptions::sequences). All sequences and the batch decoder are
    // used by one thread at a time; the Backend must outlive them.
    std::unique_ptr<Forward> new_sequence();
    // Runs one token of several of this backend's sequences per step: on the GPU as one forward
    // pass over all of them, on the CPU one after the other.
    BatchDecoder& batch_decoder() { return *batch_; }
    bool on_gpu() const { return gpu_model_ != nullptr; }
    // The GPU session (null on the CPU): a tensor-parallel server mirrors its calls to the
    // workers (GpuSession::set_mirror).
    gemma4::GpuSession* gpu_session() { return session_.get(); }
    // Empties the sequence (a new conversation); the weights stay loaded.
    void reset();
    const gemma4::ModelFile& file() const { return *file_; }
    const gemma4::Config& config() const { return file_->config(); }
    const tok::Tokenizer& tokenizer() const { return file_->tokenizer(); }

  private:
    std::shared_ptr<const gemma4::ModelFile> file_;
    std::unique_ptr<gemma4::CpuModel> cpu_model_;
    std::unique_ptr<CpuForward> cpu_;
    std::unique_ptr<gemma4::GpuModel> gpu_model_;
    std::unique_ptr<gemma4::GpuSession> session_;
    std::unique_ptr<GpuForward> gpu_;
    std::unique_ptr<BatchDecoder> batch_;
    int next_seq_ = 0;     // the GPU session's next sequence for new_sequence()
    int cpu_context_ = 0;  // BackendOptions::context, for the CPU's sequences
    std::function<void(int, int)> prefill_progress_;
};

}  // namespace gj::gen
