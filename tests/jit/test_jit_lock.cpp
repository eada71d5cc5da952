// The cross-process compile dedupe (cache/entry_lock.h through Jit): processes racing on one empty
// cache compile each kernel once in total; a lock holder that dies does not hold the others up; a
// holder that never finishes holds them up only until GEMMAJIT_CACHE_LOCK_TIMEOUT; read-only and
// disabled caches take no lock. The kernels are small jit_selftest specs (tens of ms each), and the
// processes are forked before the parent touches NVRTC.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "cache/entry_lock.h"
#include "cache/store.h"
#include "jit/cache_config.h"
#include "jit/env_flags.h"
#include "jit/jit.h"
#include "tests/support/test_env.h"

using namespace gj::jit;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

KernelSpec selftest(int scale) {
    return {"jit_selftest",
            "jit_selftest.lock" + std::to_string(scale),
            {{"SCALE", scale}, {"OFFSET", 1}},
            {"gj_selftest_axpb"},
            0};
}

std::vector<KernelSpec> small_plan() {
    return {selftest(2), selftest(3), selftest(4), selftest(5)};
}

// A child's exit code: 100 + kernels it compiled * 2 + (1 if it waited for another process);
// below 100 it failed.
int outcome_code(const JitStats& s) {
    return 100 + static_cast<int>(s.compiled) * 2 + (s.lock_waits > 0 ? 1 : 0);
}

struct Outcome {
    bool ok = false;
    int compiled = 0;
    bool waited = false;
};

Outcome wait_child(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    Outcome o;
    if (!WIFEXITED(status) || WEXITSTATUS(status) < 100) return o;
    o.ok = true;
    o.compiled = (WEXITSTATUS(status) - 100) / 2;
    o.waited = (WEXITSTATUS(status) - 100) % 2 == 1;
    return o;
}

// Forks a process that waits for the `go` pipe to close, then runs `body` and exits with its code.
template <typename Body>
pid_t fork_child(int go_read, int go_write, Body body) {
    pid_t pid = ::fork();
    if (pid != 0) return pid;
    if (go_write >= 0) ::close(go_write);
    if (go_read >= 0) {
        char c;
        (void)!::read(go_read, &c, 1);  // all children start together
    }
    int rc = 1;
    try {
        rc = body();
    } catch (...) {
        rc = 3;
    }
    ::_exit(rc);
}

size_t lock_files_under(const fs::path& root) {
    size_t n = 0;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
        n += it->path().extension() == ".lock";
    return n;
}

struct Lines {
    std::vector<std::string> lines;
    LogSink sink() {
        return [this](const std::string& l) { lines.push_back(l); };
    }
    size_t count(const std::string& needle) const {
        size_t n = 0;
        for (const auto& l : lines) n += l.find(needle) != std::string::npos;
        return n;
    }
};

}  // namespace

TEST(JitLock, RacingProcessesCompileEachKernelOnce) {
    gj::test::ScratchDir tmp("jitlock-race");
    std::string root = (tmp.path() / "fresh").string();
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> kids;
    for (int i = 0; i < 8; ++i)
        kids.push_back(fork_child(go[0], go[1], [&] {
            Jit jit(Flags::parse({{"GEMMAJIT_CACHE_DIR", root}}), [](const std::string&) {});
            auto out = jit.compile_plan(small_plan(), "sm_90", 1);
            for (const auto& k : out)
                if (k.cubin.empty() || k.entry_dir.empty()) return 2;
            return outcome_code(jit.stats());
        }));
    ::close(go[0]);
    ::close(go[1]);  // EOF releases every child at once
    int compiled = 0;
    for (pid_t pid : kids) {
        Outcome o = wait_child(pid);
        EXPECT_TRUE(o.ok);
        compiled += o.compiled;
    }
    EXPECT_EQ(compiled, 4) << "each of the 4 kernels must be compiled by exactly one process";
    Flags flags = Flags::parse({{"GEMMAJIT_CACHE_DIR", root}});
    gj::cache::Store store(cache_config(flags, nullptr));
    EXPECT_EQ(store.stat().entries, 4u);
    EXPECT_TRUE(store.verify(false).empty());
    EXPECT_EQ(lock_files_under(root), 0u) << "every holder removes its lock file";
}

TEST(JitLock, KilledHolderDoesNotBlockTheOthers) {
    gj::test::ScratchDir tmp("jitlock-kill");
    std::string root = (tmp.path() / "cache").string();
    const EnvMap env = {{"GEMMAJIT_CACHE_DIR", root}, {"GEMMAJIT_CACHE_LOCK_TIMEOUT", "60"}};
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    // The holder takes the kernel's lock as a compiling process would, says so, and hangs.
    pid_t holder = fork_child(-1, -1, [&] {
        Jit jit(Flags::parse(env), [](const std::string&) {});
        std::string path = jit.lock_path(selftest(7), "sm_90");
        fs::create_directories(fs::path(path).parent_path());
        auto lock = gj::cache::EntryLock::acquire(path, std::chrono::milliseconds(0));
        if (!lock.held()) return 4;
        (void)!::write(ready[1], "x", 1);
        for (;;) ::pause();
    });
    ::close(ready[1]);
    char c = 0;
    ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the holder could not take the lock";
    ::close(ready[0]);
    std::vector<pid_t> waiters;
    for (int i = 0; i < 3; ++i)
        waiters.push_back(fork_child(-1, -1, [&] {
            Jit jit(Flags::parse(env), [](const std::string&) {});
            CompiledKernel k = jit.compile(selftest(7), "sm_90");
            return k.cubin.empty() ? 2 : outcome_code(jit.stats());
        }));
    // Give the waiters time to reach the lock; none may get past it while the holder lives.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    for (pid_t pid : waiters) {
        int status = 0;
        EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "a waiter finished past a held lock";
    }
    auto killed_at = Clock::now();
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    int compiled = 0, waited = 0;
    for (pid_t pid : waiters) {
        Outcome o = wait_child(pid);
        EXPECT_TRUE(o.ok);
        compiled += o.compiled;
        waited += o.waited;
    }
    double after_kill = std::chrono::duration<double>(Clock::now() - killed_at).count();
    EXPECT_LT(after_kill, 30.0) << "waiters must not sit out the 60 s timeout";
    EXPECT_EQ(compiled, 1);
    EXPECT_GE(waited, 1);
    Jit jit(Flags::parse(env), [](const std::string&) {});
    EXPECT_TRUE(jit.compile(selftest(7), "sm_90").cache_hit);
}

TEST(JitLock, WaiterCompilesItselfAfterTheTimeout) {
    gj::test::ScratchDir tmp("jitlock-timeout");
    Lines log;
    Jit jit(Flags::parse({{"GEMMAJIT_CACHE_DIR", (tmp.path() / "c").string()},
                          {"GEMMAJIT_CACHE_LOCK_TIMEOUT", "1"}}),
            log.sink());
    // A holder that never publishes (another open file description conflicts like a process).
    std::string path = jit.lock_path(selftest(8), "sm_90");
    fs::create_directories(fs::path(path).parent_path());
    auto holder = gj::cache::EntryLock::acquire(path, std::chrono::milliseconds(0));
    ASSERT_TRUE(holder.held());
    auto t0 = Clock::now();
    CompiledKernel k = jit.compile(selftest(8), "sm_90");
    EXPECT_GE(Clock::now() - t0, std::chrono::seconds(1));
    EXPECT_FALSE(k.cache_hit);
    EXPECT_FALSE(k.entry_dir.empty()) << "published without the lock (the rename is atomic)";
    EXPECT_EQ(jit.stats().lock_timeouts, 1u);
    EXPECT_EQ(jit.stats().compiled, 1u);
    // A second timeout (another kernel, another holder) is not warned about again.
    std::string path2 = jit.lock_path(selftest(9), "sm_90");
    auto holder2 = gj::cache::EntryLock::acquire(path2, std::chrono::milliseconds(0));
    ASSERT_TRUE(holder2.held());
    jit.compile(selftest(9), "sm_90");
    EXPECT_EQ(log.count("GEMMAJIT_CACHE_LOCK_TIMEOUT"), 1u);
}

TEST(JitLock, ReadOnlyDisabledAndNoWaitCachesTakeNoLock) {
    gj::test::ScratchDir tmp("jitlock-modes");
    fs::path root = tmp.path() / "c";
    // Someone holds the kernel's lock for the whole test.
    Jit rw(Flags::parse({{"GEMMAJIT_CACHE_DIR", root.string()}}), [](const std::string&) {});
    std::string path = rw.lock_path(selftest(10), "sm_90");
    fs::create_directories(fs::path(path).parent_path());
    auto holder = gj::cache::EntryLock::acquire(path, std::chrono::milliseconds(0));
    ASSERT_TRUE(holder.held());
    for (EnvMap env : {EnvMap{{"GEMMAJIT_CACHE", "ro"}}, EnvMap{{"GEMMAJIT_CACHE", "0"}},
                       EnvMap{{"GEMMAJIT_CACHE_LOCK_TIMEOUT", "0"}}}) {
        env["GEMMAJIT_CACHE_DIR"] = root.string();
        Lines log;
        Jit jit(Flags::parse(env), log.sink());
        auto t0 = Clock::now();
        CompiledKernel k = jit.compile(selftest(10), "sm_90");
        EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20)) << env.begin()->second;
        EXPECT_FALSE(k.cache_hit);
        EXPECT_EQ(jit.stats().lock_waits, 0u);
        EXPECT_TRUE(log.lines.empty()) << log.lines.front();
    }
    // Only the no-wait read-write run published; nobody else created a lock file.
    gj::cache::Store store(
        cache_config(Flags::parse({{"GEMMAJIT_CACHE_DIR", root.string()}}), nullptr));
    EXPECT_EQ(store.stat().entries, 1u);
    EXPECT_EQ(lock_files_under(root), 1u);
    // Read-only and disabled caches on an empty root create nothing at all.
    fs::path empty = tmp.path() / "empty";
    for (const char* mode : {"ro", "0"}) {
        Jit jit(Flags::parse({{"GEMMAJIT_CACHE_DIR", empty.string()}, {"GEMMAJIT_CACHE", mode}}),
                [](const std::string&) {});
        EXPECT_FALSE(jit.compile(selftest(11), "sm_90").cache_hit);
        EXPECT_FALSE(fs::exists(empty)) << mode;
    }
}
