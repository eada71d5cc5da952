// Helpers shared by the tests: data paths, scratch directories, running the CLI, GPU skip.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include "jit/device.h"

namespace gj::test {

std::filesystem::path data_dir();    // tests/data in the source tree
std::filesystem::path source_dir();  // the repository root
std::string gemmajit_exe();          // path of the built CLI

// The test knob `name` (an environment variable) as a positive integer, `fallback` when it is
// unset or empty; std::invalid_argument naming the variable when it is anything else.
int env_positive_int(const char* name, int fallback);

// A fresh directory under the build's temp area, removed when the object dies.
class ScratchDir {
  public:
    explicit ScratchDir(const std::string& tag);
    ~ScratchDir();
    const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
};

struct CommandResult {
    int exit_code = -1;
    std::string out;  // stdout and stderr together
};
// Runs a shell command line (with `env` prefix if needed); captures output.
CommandResult run_command(const std::string& cmdline);

// Runs `body` in a forked child of the test process and returns the child's exit status: what
// `body` returns, 3 when it threw (the message on stderr), 128 + the signal that killed it.
// Processes `body` forks itself (tensor-parallel workers) end there too, never in gtest. For tests
// that must keep the GPU driver out of the test process (it does not survive fork()).
int run_in_child(const std::function<int()>& body);

}  // namespace gj::test

// Skips the current test with the reason when there is no usable GPU.
#define GJ_REQUIRE_GPU()                                                   \
    do {                                                                   \
        std::string gj_why_;                                               \
        if (!gj::jit::device_available(&gj_why_)) GTEST_SKIP() << gj_why_; \
    } while (0)
