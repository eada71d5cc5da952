// Several processes compile the same kernel into one empty cache at once: all succeed and the
// cache ends with exactly one valid entry. (Forked before this process ever touches NVRTC.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/store.h"
#include "jit/cache_config.h"
#include "jit/env_flags.h"
#include "jit/jit.h"
#include "tests/support/test_env.h"

using namespace gj::jit;

TEST(JitRace, ProcessesFillingOneEmptyCacheAgree) {
    gj::test::ScratchDir tmp("jitrace");
    std::string root = (tmp.path() / "fresh").string();
    KernelSpec spec{"jit_selftest",
                    "jit_selftest.race",
                    {{"SCALE", 9}, {"OFFSET", 2}},
                    {"gj_selftest_axpb"},
                    0};
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> kids;
    for (int i = 0; i < 3; ++i) {
        pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            ::close(go[1]);
            char c;
            (void)!::read(go[0], &c, 1);
            int rc = 1;
            try {
                Jit jit(Flags::parse({{"GEMMAJIT_CACHE_DIR", root}}), [](const std::string&) {});
                CompiledKernel k = jit.compile(spec, "sm_90");
                rc = (!k.cubin.empty() && !k.entry_dir.empty()) ? 0 : 2;
            } catch (...) {
                rc = 3;
            }
            ::_exit(rc);
        }
        kids.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);
    for (pid_t pid : kids) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        EXPECT_TRUE(WIFEXITED(status)) << "child killed";
        EXPECT_EQ(WEXITSTATUS(status), 0);
    }
    Flags flags = Flags::parse({{"GEMMAJIT_CACHE_DIR", root}});
    gj::cache::Store store(cache_config(flags, nullptr));
    EXPECT_EQ(store.stat().entries, 1u);
    EXPECT_TRUE(store.verify(false).empty());
    Jit jit(flags, [](const std::string&) {});
    EXPECT_TRUE(jit.compile(spec, "sm_90").cache_hit);
}
