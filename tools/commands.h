// Each file tools/cmd_*.cpp adds its subcommands to the `gemmajit` CLI11 app.
// A subcommand's callback returns normally on success and throws on failure; main() prints
// "gemmajit: error: <what>" and exits 1, so every bad input ends in one clear sentence.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/text/sampler.h"

namespace gj::gen {
struct BackendOptions;  // engine/generate/backend.h
}

namespace gj::tools {

void add_jit_commands(CLI::App& app);    // env, kernels, precompile, show, src, ptx, sass, cache
void add_model_commands(CLI::App& app);  // synth, quantize, info, logits
void add_run_commands(CLI::App& app);    // run, tokenize
void add_chat_command(CLI::App& app);    // chat (interactive, KV cache kept across turns)
void add_bench_command(CLI::App& app);   // bench (GPU pp/tg speed, llama-bench style)
void add_serve_command(CLI::App& app);   // serve (OpenAI-compatible HTTP server)

// The sampling options run and chat share (names and meanings as llama.cpp's).
void add_sampling_options(CLI::App* cmd, sample::SamplerParams& s);

// The backend settings of run and chat: status lines on stderr and, when stderr is a terminal,
// the progress of a long prompt.
gen::BackendOptions backend_options(bool cpu, int threads, int context);

// "gemmajit: <line>" on stderr (loading progress, notices); nothing in a tensor-parallel worker.
void status_line(const std::string& line);

// --tp N (tensor parallelism over GPUs 0..N-1) on bench, run and serve, and its value when the
// command runs: GEMMAJIT_TP's when not given (RankGroup checks the range). Throws
// std::invalid_argument for a split with `cpu` (--cpu).
void add_tp_option(CLI::App* cmd, int& tp);
int tp_ranks(int tp, bool cpu = false);
// Marks this process as tensor-parallel rank `rank`: a worker (rank > 0) prints no status lines
// and its errors name its rank.
void set_process_rank(int rank);
bool is_worker();

// Seconds since main() was entered (for the time to the first generated token).
double seconds_since_start();

}  // namespace gj::tools
