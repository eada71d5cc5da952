// The JIT/cache CLI: env, cache stat/verify/prune/clear, flag errors, kernels/precompile/show.
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <regex>

#include "tests/support/test_env.h"

namespace fs = std::filesystem;
using gj::test::run_command;

namespace {
std::string cli(const fs::path& cache, const std::string& args, const std::string& env = "") {
    return "env -u XDG_CACHE_HOME GEMMAJIT_CACHE_DIR='" + cache.string() + "' " + env + " " +
           gj::test::gemmajit_exe() + " " + args;
}
}  // namespace

TEST(JitCli, EnvListsEveryFlagWithValueDefaultAndClass) {
    gj::test::ScratchDir tmp("clienv");
    auto r = run_command(cli(tmp.path(), "env", "GEMMAJIT_MAXRREG=96"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("GEMMAJIT_CACHE_MAX_SIZE"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("output-changing"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("neutral"), std::string::npos) << r.out;
    EXPECT_TRUE(std::regex_search(r.out, std::regex("GEMMAJIT_MAXRREG +96 +0 +output-changing")))
        << r.out;
    EXPECT_NE(r.out.find("cache: " + tmp.path().string()), std::string::npos) << r.out;
}

TEST(JitCli, BadFlagValueIsOneClearErrorAndTyposWarn) {
    gj::test::ScratchDir tmp("clibad");
    auto r = run_command(cli(tmp.path(), "env", "GEMMAJIT_CACHE=maybe"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("gemmajit: error: GEMMAJIT_CACHE='maybe' is not valid"),
              std::string::npos)
        << r.out;
    r = run_command(cli(tmp.path(), "cache stat", "GEMMAJIT_DEBGU=1"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("did you mean GEMMAJIT_DEBUG?"), std::string::npos) << r.out;
}

TEST(JitCli, CacheStatVerifyPruneClearOnAnEmptyCache) {
    gj::test::ScratchDir tmp("clicache");
    auto r = run_command(cli(tmp.path(), "cache stat"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("entries    0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("cap        2.0 GiB"), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "cache verify"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("0 entries checked, 0 damaged"), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "cache prune --max-size 1M"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    r = run_command(cli(tmp.path(), "cache clear"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    r = run_command(cli(tmp.path(), "cache explode"));
    EXPECT_NE(r.exit_code, 0) << r.out;
}
