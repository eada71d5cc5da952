#include "tests/support/test_env.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>
#include <system_error>

namespace gj::test {

std::filesystem::path data_dir() {
    return GJ_TEST_DATA_DIR;
}
std::filesystem::path source_dir() {
    return GJ_SOURCE_DIR;
}
int env_positive_int(const char* name, int fallback) {
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') return fallback;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 1 || v > std::numeric_limits<int>::max())
        throw std::invalid_argument(std::string(name) + "=" + env + " is not a positive integer");
    return int(v);
}

std::string gemmajit_exe() {
    return GJ_GEMMAJIT_EXE;
}

ScratchDir::ScratchDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("gemmajit-test-" + tag + "-" + std::to_string(::getpid()) + "-" +
             std::to_string(counter++) + "-" + std::to_string(rd() % 100000));
    std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
    std::error_code ec;
    // Tests may leave read-only directories behind (cache permission tests): make them writable.
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
        std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add, ec);
    }
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
}

int run_in_child(const std::function<int()>& body) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        int code = 3;
        try {
            code = body();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "child %d: %s\n", int(::getpid()), e.what());
        }
        std::fflush(stdout);
        std::fflush(stderr);
        ::_exit(code);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

CommandResult run_command(const std::string& cmdline) {
    CommandResult r;
    std::string full = cmdline + " 2>&1";
    FILE* p = ::popen(full.c_str(), "r");
    if (!p) throw std::runtime_error("popen failed for: " + cmdline);
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

}  // namespace gj::test
