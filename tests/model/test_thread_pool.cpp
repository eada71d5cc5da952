// ThreadPool (engine/base/thread_pool.h), which the model writers (synth, quantize) and the CPU
// forward run on: the thread limit, and a worker that cannot start. The latter runs in a child
// process whose address space is capped so that only a few thread stacks fit: the workers already
// started must be stopped and joined, and the constructor must throw a clear error (before the
// fix the joinable threads' destructors called std::terminate, or the destruction of the
// condition variables the workers waited on hung).
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/base/thread_pool.h"
#include "tests/support/test_env.h"

namespace {

// Bytes of address space this process maps now (/proc/self/statm, first field, in pages).
size_t mapped_bytes() {
    std::ifstream f("/proc/self/statm");
    size_t pages = 0;
    f >> pages;
    return pages * size_t(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST(ThreadPool, RunsEveryIndexOnce) {
    gj::ThreadPool pool(3);
    EXPECT_EQ(pool.size(), 3);
    std::vector<std::atomic<int>> hits(1000);
    pool.parallel_for(hits.size(), [&](size_t i) { hits[i].fetch_add(1); });
    for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, MoreThanTheLimitIsRefusedBeforeAnyThreadStarts) {
    EXPECT_EQ(gj::kMaxThreads, 1024);  // GEMMAJIT_THREADS's maximum (jit/env_flags.cpp)
    try {
        gj::ThreadPool pool(gj::kMaxThreads + 1);
        FAIL() << "a pool of " << gj::kMaxThreads + 1 << " threads was built";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("at most 1024"), std::string::npos) << e.what();
    }
    gj::ThreadPool automatic(0);  // one per hardware thread, capped at the limit
    EXPECT_GE(automatic.size(), 1);
    EXPECT_LE(automatic.size(), gj::kMaxThreads);
}

TEST(ThreadPool, AWorkerThatCannotStartIsAnErrorAfterTheOthersAreJoined) {
#if defined(__SANITIZE_ADDRESS__)
    // Under AddressSanitizer a thread's start also maps the sanitizer's own per-thread memory,
    // which an address-space cap makes it abort on instead of failing pthread_create; the
    // Release pass runs this.
    GTEST_SKIP() << "an address-space cap and AddressSanitizer's per-thread mappings do not mix";
#endif
    pthread_attr_t attr;
    size_t stack = 0;
    ASSERT_EQ(pthread_getattr_default_np(&attr), 0);
    ASSERT_EQ(pthread_attr_getstacksize(&attr, &stack), 0);
    pthread_attr_destroy(&attr);
    const int status = gj::test::run_in_child([stack] {
        ::alarm(60);  // the unfixed pool could also hang destroying its condition variables
        // Room for about three more thread stacks: 63 workers are asked for, a few start.
        const rlim_t cap = mapped_bytes() + 3 * stack + (size_t(4) << 20);
        const rlimit lim{cap, cap};
        if (::setrlimit(RLIMIT_AS, &lim) != 0) return 10;
        try {
            gj::ThreadPool pool(64);
            return 11;  // every worker started: the cap did not bite
        } catch (const std::runtime_error& e) {
            const std::string what = e.what();
            std::fprintf(stderr, "%s\n", what.c_str());
            if (what.find("cannot start worker thread") == std::string::npos) return 12;
            // At least one worker had started and was joined (the path that used to abort).
            if (what.find("worker thread 1 of") != std::string::npos) return 13;
            return 0;
        }
    });
    EXPECT_EQ(status, 0) << "10: setrlimit failed, 11: no thread failed to start, 12: wrong "
                            "message, 13: the first thread failed, 3: another exception, "
                            ">= 128: killed by a signal (134: std::terminate, 142: hung)";
}
