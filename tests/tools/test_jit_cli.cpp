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
    EXPECT_NE(r.out.find("gemmajit: error: GEMMAJIT_CACHE='maybe' is not valid"), std::string::npos)
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

TEST(JitCli, KernelsPrecompileShowOnTheRealPlan) {
    gj::test::ScratchDir tmp("cliplan");
    auto r = run_command(cli(tmp.path(), "kernels --variant e2b --status"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("missing"), std::string::npos) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\n0 +(rmsnorm\.\S+))"))) << r.out;
    std::string spec = m[1].str();

    r = run_command(cli(tmp.path(), "precompile --variant e2b --jobs 2"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("compiling "), std::string::npos) << r.out;
    EXPECT_TRUE(std::regex_search(r.out, std::regex("total: (\\d+) kernels, 0 hits, \\1 misses")))
        << r.out;
    r = run_command(cli(tmp.path(), "precompile --variant e2b"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(std::regex_search(r.out, std::regex("total: (\\d+) kernels, \\1 hits, 0 misses")))
        << r.out;
    EXPECT_EQ(r.out.find("compiling "), std::string::npos) << r.out;  // all hits: no banner

    r = run_command(cli(tmp.path(), "kernels --variant e2b --status"));
    EXPECT_EQ(r.out.find("missing"), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "show " + spec + " --variant e2b"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("key record:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--gpu-architecture=sm_"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("registers"), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "src " + spec + " --variant e2b"));
    EXPECT_NE(r.out.find("// gemmajit kernel " + spec), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "ptx " + spec + " --variant e2b"));
    EXPECT_NE(r.out.find(".entry"), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "show no_such_kernel --variant e2b"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("no_such_kernel is not in the plan"), std::string::npos) << r.out;

    r = run_command(cli(tmp.path(), "cache stat"));
    EXPECT_FALSE(std::regex_search(r.out, std::regex("entries +0\n"))) << r.out;
    r = run_command(cli(tmp.path(), "precompile --variant e2b", "GEMMAJIT_REQUIRE_CACHED=1"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    r = run_command(
        cli(tmp.path(), "precompile --variant e2b --arch sm_80", "GEMMAJIT_REQUIRE_CACHED=1"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("GEMMAJIT_REQUIRE_CACHED"), std::string::npos) << r.out;
}

TEST(JitCli, TwoPrecompilesRacingOnOneEmptyCacheBothSucceed) {
    gj::test::ScratchDir tmp("clirace");
    fs::path root = tmp.path() / "fresh";
    auto a = std::async(std::launch::async, [&] {
        return run_command(cli(root, "precompile --variant e2b --jobs 1"));
    });
    auto b = std::async(std::launch::async, [&] {
        return run_command(cli(root, "precompile --variant e2b --jobs 1"));
    });
    auto ra = a.get(), rb = b.get();
    EXPECT_EQ(ra.exit_code, 0) << ra.out;
    EXPECT_EQ(rb.exit_code, 0) << rb.out;
    auto v = run_command(cli(root, "cache verify"));
    EXPECT_EQ(v.exit_code, 0) << v.out;
    EXPECT_NE(v.out.find(" 0 damaged"), std::string::npos) << v.out;
    auto k = run_command(cli(root, "kernels --variant e2b --status"));
    EXPECT_EQ(k.out.find("missing"), std::string::npos) << k.out;
    // Exactly one entry per kernel: no duplicates, no leftover temp dirs.
    size_t entries = 0, hidden = 0;
    for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
         ++it) {
        if (it->path().filename() == "meta.json") ++entries;
        if (it->path().filename().string().starts_with(".")) ++hidden;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_search(ra.out, m, std::regex("total: (\\d+) kernels"))) << ra.out;
    EXPECT_EQ(entries, std::stoul(m[1].str()));
    EXPECT_EQ(hidden, 0u);
    // And each kernel was compiled by one of them only (the cache entry's cross-process lock).
    auto misses = [](const std::string& out) {
        std::smatch mm;
        return std::regex_search(out, mm, std::regex("(\\d+) misses")) ? std::stoul(mm[1].str())
                                                                       : 0ul;
    };
    EXPECT_EQ(misses(ra.out) + misses(rb.out), entries) << ra.out << rb.out;
}

// `kernels --tp N`: one line per rank (its query heads, KV heads, FFN slice, vocabulary rows) and
// the union of the ranks' kernels at their shard shapes, for a preset and for a file; the splits
// that cannot be made end in one clear error.
TEST(JitCli, KernelsOfATensorParallelSplit) {
    gj::test::ScratchDir tmp("jit-cli-tp");
    auto r = run_command(cli(tmp.path(), "kernels --variant 31b --wtype q4_0 --tp 2 --arch sm_90"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("tensor parallel over 2 GPUs"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank 1: query heads 16..31, KV heads sliding 8..15 / global 2..3, FFN "
                         "10752 columns, vocabulary rows 131072..262143"),
              std::string::npos)
        << r.out;
    for (const char* want : {"matvec_q4_0.k10752.split.tall ", "logits.v131072.k64 "})
        EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
    EXPECT_EQ(r.out.find("matvec_q4_0.k21504"), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "kernels --variant 12b --tp 3"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("16 query heads do not split evenly"), std::string::npos) << r.out;
    r = run_command(cli(tmp.path(), "kernels --variant 26b-a4b --tp 2"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("mixture-of-experts"), std::string::npos) << r.out;
    // A file: every rank's load planned, each at its own slice (synth tiny: vocabulary 1024, FFN
    // 256).
    const auto tiny = tmp.path() / "tiny.gguf";
    r = run_command(gj::test::gemmajit_exe() + " synth --variant tiny -o " + tiny.string());
    ASSERT_EQ(r.exit_code, 0) << r.out;
    r = run_command(cli(tmp.path(), "kernels --model " + tiny.string() + " --tp 2"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("tensor parallel over 2 GPUs"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("logits.v512.k64 "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("logits.v1024"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("matvec_q8_0.k128."), std::string::npos) << r.out;  // down: 256 / 2
    r = run_command(cli(tmp.path(), "kernels --variant 31b --tp 9"));
    EXPECT_NE(r.exit_code, 0) << r.out;
}

// The split's decode forms built against NCCL's device headers are in its plan when a load on
// this machine would take them (the library loads, its release's headers are found), and the
// plan says why not when it would not.
TEST(JitCli, KernelsOfASplitHoldTheNcclDeviceForms) {
    gj::test::ScratchDir tmp("jit-cli-tp-nccl");
    const std::string plan = "kernels --variant 31b --wtype q4_0 --tp 2 --arch sm_90";
    auto r = run_command("GEMMAJIT_NCCL_LIB=/nonexistent/libnccl.so.2 " + cli(tmp.path(), plan));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("fused all-reduce norms off: no NCCL to plan them for"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("/nonexistent/libnccl.so.2"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(".lsa2"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(".push2"), std::string::npos) << r.out;
    r = run_command("GEMMAJIT_TP_FUSED_NORM=0 " + cli(tmp.path(), plan));
    EXPECT_NE(r.out.find("fused all-reduce norms off: GEMMAJIT_TP_FUSED_NORM=0"), std::string::npos)
        << r.out;
    r = run_command(cli(tmp.path(), plan));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    if (r.out.find("fused all-reduce norms off") != std::string::npos)
        GTEST_SKIP() << "no NCCL with device headers here: " << r.out;
    EXPECT_NE(r.out.find("decode post-norms sum the ranks' products themselves, products pushed"),
              std::string::npos)
        << r.out;
    // With a prefill chunk's push (GEMMAJIT_TP_PREFILL_PUSH, by default on 2 GPUs) and the
    // post-norms summing the pushed products.
    EXPECT_NE(r.out.find("; prefill chunks' products pushed into every rank's window"),
              std::string::npos)
        << r.out;
    for (const char* want :
         {"rmsnorm.n5376.w1.add.n2.q8.lsa2.push ", "rmsnorm.n5376.w1.add.scale.n2.q8.lsa2 ",
          "matvec_q4_0.k10752.split.tall.push2 ", "matvec_q4_0.k4096.split.push2 ",
          "tp_push.n5376.r2 ", "rmsnorm.n5376.w1.add.n2.h16.xb16x2 "})
        EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
    r = run_command("GEMMAJIT_TP_PREFILL_PUSH=0 " + cli(tmp.path(), plan));
    EXPECT_EQ(r.out.find("tp_push."), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(".xb16x2"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("prefill chunks' products pushed"), std::string::npos) << r.out;
    r = run_command("GEMMAJIT_TP_PUSH=0 " + cli(tmp.path(), plan));
    EXPECT_NE(r.out.find("rmsnorm.n5376.w1.add.n2.q8.lsa2 "), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(".push"), std::string::npos) << r.out;
}
