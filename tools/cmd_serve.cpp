// `gemmajit serve`: an OpenAI-compatible HTTP server. It listens at once (/health answers 503
// "loading" until the model is ready), loads the model, creates one sequence per --parallel slot
// over it and runs them with the slot scheduler; SIGINT/SIGTERM cancel in-flight requests and
// end the process with status 0.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <thread>

#include "engine/generate/backend.h"
#include "engine/gpu/tensor_parallel.h"
#include "engine/model/model_file.h"
#include "engine/serve/scheduler.h"
#include "jit/env_flags.h"
#include "tools/cmd_options.h"
#include "tools/commands.h"
#include "tools/http_server.h"

namespace gj::tools {

namespace {

struct ServeArgs {
    std::string model;
    ServeConfig http;
    int parallel = 1;
    int context = 0;
    int prefill_chunk = 0;
    bool cpu = false;
    int threads = 0;
    int tp = 0;            // --tp (0: GEMMAJIT_TP)
    int http_threads = 0;  // --http-threads (0: default_http_threads(parallel))
};

// The GPU backend settings of a server, alike on every tensor-parallel rank (the same model
// shapes, sequences and chunk, so the same collectives).
gen::BackendOptions server_backend_options(const ServeArgs& a, int gpu_chunk) {
    gen::BackendOptions bo = backend_options(a.cpu, a.threads, a.context);
    bo.prefill_progress = nullptr;  // many prompts at once: no progress line on the terminal
    bo.default_sequence = false;
    bo.sequences = a.parallel;
    bo.prefill_chunk = gpu_chunk;
    return bo;
}

// A tensor-parallel worker of the server: no HTTP, the same model on its own GPU, replaying the
// session calls rank 0's scheduler makes until rank 0 closes the stream. Ctrl-C and SIGTERM are
// rank 0's to handle (the worker ends with the stream, or with rank 0).
void serve_worker(const ServeArgs& a, int gpu_chunk, gemma4::RankGroup& group) {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    gen::BackendOptions bo = server_backend_options(a, gpu_chunk);
    bo.tp = group.connect(jit::Flags::process());
    auto backend = gen::Backend::open(gemma4::ModelFile::open(a.model), bo);
    backend->gpu_session()->replay([&](std::vector<int32_t>& r) { return group.receive(r); });
}

void run_serve(ServeArgs a) {
    a.http.sampling.validate();
    if (a.parallel < 1 || a.parallel > gemma4::kMaxSequences) {
        throw std::invalid_argument("--parallel must be in [1, " +
                                    std::to_string(gemma4::kMaxSequences) + "]; got " +
                                    std::to_string(a.parallel));
    }
    if (a.context < 0) throw std::invalid_argument("--ctx must be >= 0");
    // Every slot's request holds a thread, and kFreeHttpThreads more stay free for /health and
    // /metrics; fewer threads would leave slots idle while clients are turned away.
    const int min_threads = a.parallel + kFreeHttpThreads;
    if (a.http_threads != 0 && (a.http_threads < min_threads || a.http_threads > 4096)) {
        throw std::invalid_argument(
            "--http-threads must be 0 (automatic) or in [" + std::to_string(min_threads) +
            ", 4096] (--parallel + " + std::to_string(kFreeHttpThreads) +
            " at least: one thread per slot and " + std::to_string(kFreeHttpThreads) +
            " kept free for /health and /metrics); got " + std::to_string(a.http_threads));
    }
    a.http.http_threads = a.http_threads != 0 ? a.http_threads : default_http_threads(a.parallel);
    if (!std::filesystem::is_regular_file(a.model)) {
        throw std::runtime_error("model file " + a.model + " does not exist or is not a file");
    }
    if (a.http.model_name.empty())
        a.http.model_name = std::filesystem::path(a.model).stem().string();
    // On the GPU the scheduler feeds a prompt in chunks of this many tokens and the session
    // is sized for exactly them: a longer session chunk would only grow every slot's
    // sliding-window rings. Shorter chunks than run's also bound how long one prompt's
    // chunk holds up the other slots' decode steps.
    const jit::Flags& env = jit::Flags::process();
    const int gpu_chunk = a.prefill_chunk > 0 ? a.prefill_chunk
                          : env.is_set("GEMMAJIT_PREFILL_CHUNK")
                              ? int(env.get_int("GEMMAJIT_PREFILL_CHUNK"))
                              : 512;
    const int ranks = tp_ranks(a.tp, a.cpu);
    // Tensor parallelism: the workers are forked first (before any thread or GPU use); only rank
    // 0 serves HTTP, and its session hands every call to the workers (GpuSession::set_mirror).
    gemma4::RankGroup group(ranks);
    set_process_rank(group.rank());
    if (!group.leader()) return serve_worker(a, gpu_chunk, group);

    // Every thread started from here on inherits the blocked signals; only the watcher below
    // receives them, so a signal never interrupts a worker in the middle of a step.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client that disconnects is a failed write, not a dead server

    HttpServer server(a.http);
    const int port = server.bind();
    status_line("listening on http://" + a.http.host + ":" + std::to_string(port) + " (loading " +
                a.model + ")");
    std::thread listener([&] { server.listen(); });

    std::atomic<bool> quit{false};
    std::atomic<serve::Scheduler*> scheduler{nullptr};
    std::thread watcher([&] {
        const timespec tick{0, 200'000'000};
        while (!quit.load()) {
            if (sigtimedwait(&signals, nullptr, &tick) > 0) {
                status_line("stopping: cancelling in-flight requests");
                quit = true;
                // The scheduler first: every waiting handler gets its "cancelled" event, so the
                // server's worker threads can finish and stop() can join them.
                if (serve::Scheduler* s = scheduler.load()) s->stop();
                server.stop();
            }
        }
    });
    auto shut_down = [&] {
        quit = true;
        server.stop();
        listener.join();
        watcher.join();
    };

    std::unique_ptr<gen::Backend> backend;
    std::unique_ptr<serve::Scheduler> sched;
    try {
        const std::shared_ptr<const gemma4::ModelFile> file = gemma4::ModelFile::open(a.model);
        gen::BackendOptions bo = server_backend_options(a, gpu_chunk);
        if (ranks > 1) bo.tp = group.connect(env);
        backend = gen::Backend::open(file, bo);
        if (ranks > 1)
            backend->gpu_session()->set_mirror(
                [&group](std::span<const int32_t> r) { group.send(r); });
        std::vector<std::unique_ptr<gen::Forward>> sequences;
        for (int i = 0; i < a.parallel; ++i) sequences.push_back(backend->new_sequence());
        serve::SchedulerOptions so;
        so.context = a.context;
        // The CPU reference runs a chunk in time proportional to its length, so short chunks keep
        // other streams flowing.
        so.prefill_chunk = backend->on_gpu()     ? gpu_chunk
                           : a.prefill_chunk > 0 ? a.prefill_chunk
                                                 : 32;
        sched = std::make_unique<serve::Scheduler>(file->tokenizer(), std::move(sequences), so,
                                                   &backend->batch_decoder());
        scheduler = sched.get();
        server.set_ready(file, sched.get());
        status_line("ready: " + std::to_string(a.parallel) + " slot(s) of " +
                    std::to_string(sched->context()) + " tokens on the " +
                    (!backend->on_gpu() ? std::string("CPU reference")
                     : ranks > 1        ? std::to_string(ranks) + " GPUs (tensor parallel)"
                                        : std::string("GPU")));
    } catch (...) {
        shut_down();
        throw;
    }
    if (quit.load()) sched->stop();  // a signal that came while loading
    listener.join();
    quit = true;
    watcher.join();
    sched->stop();
    sched.reset();
    backend.reset();
    group.finish();  // the workers' command streams end; throws when one failed
    status_line("stopped");
}

}  // namespace

void add_serve_command(CLI::App& app) {
    auto a = std::make_shared<ServeArgs>();
    auto* cmd = app.add_subcommand(
        "serve", "OpenAI-compatible HTTP server (chat, completions, SSE streaming)");
    cmd->add_option("--model,-m", a->model, "GGUF model file")->required();
    cmd->add_option("--host", a->http.host, "address to listen on")->capture_default_str();
    // Range-checked: the socket layer would take 70000 modulo 65536 and listen elsewhere.
    cmd->add_option("--port", a->http.port, "port to listen on (0: any free port)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    cmd->add_option("--parallel", a->parallel, "slots: requests run at the same time")
        ->capture_default_str();
    cmd->add_option("--ctx", a->context,
                    "context per slot in tokens (0: the model's; on the GPU reduced to what fits)");
    cmd->add_option("--api-key", a->http.api_key,
                    "require 'Authorization: Bearer KEY' on every endpoint but /health");
    cmd->add_option("--alias", a->http.model_name,
                    "model name in /v1/models (default: the file's stem)");
    cmd->add_option("--prefill-chunk", a->prefill_chunk,
                    "prompt tokens per prefill step of a slot (0: 32 on the CPU; on the GPU "
                    "GEMMAJIT_PREFILL_CHUNK when set, else 512)")
        ->check(CLI::Range(0, 4096));
    cmd->add_option("--http-threads", a->http_threads,
                    "HTTP threads, one per open connection (0: max(32, 4 x --parallel + 8)); "
                    "past this minus 4 generation requests in flight (running or queued) a new "
                    "one is answered 503 'server busy' with Retry-After: 1")
        ->capture_default_str();
    add_sampling_options(cmd, a->http.sampling);
    cmd->add_flag("--cpu", a->cpu, "use the CPU reference forward (default: the GPU when present)");
    cmd->add_option("--threads", a->threads, "CPU worker threads (0 = all cores)")
        ->check(threads_check());
    add_tp_option(cmd, a->tp);
    cmd->callback([a] { run_serve(*a); });
}

}  // namespace gj::tools
