#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>

#include "jit/env_flags.h"
#include "tools/commands.h"

namespace gj::tools {

namespace {
std::chrono::steady_clock::time_point main_entered;
int process_rank = 0;
}  // namespace

void status_line(const std::string& line) {
    if (process_rank == 0) std::fprintf(stderr, "gemmajit: %s\n", line.c_str());
}

void set_process_rank(int rank) {
    process_rank = rank;
}

bool is_worker() {
    return process_rank > 0;
}

void add_tp_option(CLI::App* cmd, int& tp) {
    tp = 0;  // GEMMAJIT_TP's, read when the command runs (tp_ranks)
    cmd->add_option("--tp", tp,
                    "split the model over this many GPUs (tensor parallelism on devices 0..N-1, "
                    "one process each; default: GEMMAJIT_TP, else 1)");
}

int tp_ranks(int tp, bool cpu) {
    const int ranks = tp == 0 ? int(jit::Flags::process().get_int("GEMMAJIT_TP")) : tp;
    if (ranks != 1 && cpu)
        throw std::invalid_argument("--tp splits the model over GPUs; --cpu runs it whole");
    return ranks;  // RankGroup checks the range
}

double seconds_since_start() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - main_entered).count();
}

}  // namespace gj::tools

int main(int argc, char** argv) {
    gj::tools::main_entered = std::chrono::steady_clock::now();
    CLI::App app{"gemmajit: Gemma 4 inference with runtime-specialized CUDA kernels"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "gemmajit " GEMMAJIT_VERSION);
    gj::tools::add_jit_commands(app);
    gj::tools::add_model_commands(app);
    gj::tools::add_run_commands(app);
    gj::tools::add_chat_command(app);
    gj::tools::add_bench_command(app);
    gj::tools::add_serve_command(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::fflush(stdout);
        if (gj::tools::is_worker())
            std::fprintf(stderr, "gemmajit: tensor-parallel rank %d: error: %s\n",
                         gj::tools::process_rank, e.what());
        else
            std::fprintf(stderr, "gemmajit: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
