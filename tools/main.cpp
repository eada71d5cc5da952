#include <chrono>
#include <cstdio>
#include <exception>

#include "tools/commands.h"

namespace gj::tools {

namespace {
std::chrono::steady_clock::time_point main_entered;
}

void status_line(const std::string& line) {
    std::fprintf(stderr, "gemmajit: %s\n", line.c_str());
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
        std::fprintf(stderr, "gemmajit: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
