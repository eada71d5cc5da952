// The JIT/cache CLI: env, cache stat/verify/prune/clear, flag errors, kernels/precompile/show.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
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

namespace {
// `s` as one shell word, whatever it holds.
std::string shq(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}
std::string cli_q(const fs::path& cache, const std::string& args, const std::string& env = "") {
    return "env -u XDG_CACHE_HOME GEMMAJIT_CACHE_DIR=" + shq(cache.string()) + " " + env + " " +
           gj::test::gemmajit_exe() + " " + args;
}
void write_file(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}
// An entry folder as the store names them, whose meta.json says nothing valid: damaged.
fs::path damaged_entry(const fs::path& root) {
    fs::path dir = root / "v1/sm_90/nvrtc-13.0.88/fam/k.x-0123456789abcdef";
    write_file(dir / "meta.json", "{}");
    return dir;
}
// The first rmsnorm spec of the e2b plan (a small kernel that compiles quickly).
std::string small_spec(const fs::path& cache) {
    auto r = run_command(cli_q(cache, "kernels --variant e2b"));
    std::smatch m;
    if (!std::regex_search(r.out, m, std::regex(R"(\n0 +(rmsnorm\.\S+))"))) return {};
    return m[1].str();
}
}  // namespace

// What the cache did not write survives every upkeep command (the reviewer's repro: prune used to
// delete img.jpg and notes.lock as damaged entries and lock files).
TEST(JitCli, CacheUpkeepLeavesForeignFilesAlone) {
    gj::test::ScratchDir tmp("cliforeign");
    const fs::path root = tmp.path() / "U";
    const std::vector<fs::path> foreign = {root / "v2/photos/2023/summer/beach/img.jpg",
                                           root / "v2/docs/a/b/notes.lock",
                                           root / "v1/sm_90/nvrtc-13.0.88/fam/notes/todo.txt"};
    for (const auto& f : foreign) write_file(f, "mine");
    const fs::path entry = damaged_entry(root);
    auto r = run_command(cli_q(root, "cache prune"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("removed 1 entries"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(entry));
    damaged_entry(root);
    r = run_command(cli_q(root, "cache verify"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("1 entries checked, 1 damaged"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(entry));
    damaged_entry(root);
    r = run_command(cli_q(root, "cache clear"));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("removed 1 entries"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(entry));
    r = run_command(cli_q(root, "cache stat"));
    EXPECT_NE(r.out.find("entries    0"), std::string::npos) << r.out;
    for (const auto& f : foreign) EXPECT_TRUE(fs::exists(f)) << f;
}

TEST(JitCli, PruneAndClearRefuseAReadOnlyOrOffCache) {
    gj::test::ScratchDir tmp("clirefuse");
    const fs::path entry = damaged_entry(tmp.path());
    for (const std::string mode : {"ro", "0"})
        for (const std::string action : {"prune", "clear"}) {
            auto r = run_command(cli_q(tmp.path(), "cache " + action, "GEMMAJIT_CACHE=" + mode));
            EXPECT_EQ(r.exit_code, 1) << r.out;
            EXPECT_NE(r.out.find("(GEMMAJIT_CACHE=" + mode + ")"), std::string::npos) << r.out;
            EXPECT_NE(r.out.find("nothing was removed"), std::string::npos) << r.out;
            EXPECT_TRUE(fs::exists(entry / "meta.json")) << mode << " " << action;
        }
    // Read-only verify reports the damaged entry once, and leaves it.
    auto r = run_command(cli_q(tmp.path(), "cache verify", "GEMMAJIT_CACHE=ro"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("1 entries checked, 1 damaged\n"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::exists(entry / "meta.json"));
}

TEST(JitCli, OptionAndTemplateDirErrorsNameTheirSource) {
    gj::test::ScratchDir tmp("clioptions");
    auto r = run_command(cli_q(tmp.path(), "cache prune --max-size 12Q"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("--max-size '12Q' is not valid"), std::string::npos) << r.out;
    r = run_command(cli_q(tmp.path(), "kernels --variant e2b --arch bogus"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("--arch 'bogus' is not valid"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("GEMMAJIT_ARCH"), std::string::npos) << r.out;
    r = run_command(cli_q(tmp.path(), "precompile --variant e2b --arch sm_90,sm_x"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("--arch 'sm_x' is not valid"), std::string::npos) << r.out;
    write_file(tmp.path() / "a_file", "x");
    for (const fs::path& dir : {tmp.path() / "missing", tmp.path() / "a_file"}) {
        r = run_command(cli_q(tmp.path() / "cache", "kernels --variant e2b",
                              "GEMMAJIT_TEMPLATE_DIR=" + shq(dir.string())));
        EXPECT_EQ(r.exit_code, 1) << r.out;
        EXPECT_NE(r.out.find("GEMMAJIT_TEMPLATE_DIR=" + dir.string()), std::string::npos) << r.out;
    }
}

// Crafted meta.json fields: a wrong type makes the entry damaged (rebuilt, with one warning naming
// the field), and a stamp no calendar can show is an error naming the entry: never a crash or a
// bare JSON type error.
TEST(JitCli, ShowAndPtxOnCraftedMetaFields) {
    gj::test::ScratchDir tmp("clicrafted");
    const std::string spec = small_spec(tmp.path());
    ASSERT_FALSE(spec.empty());
    const std::string show = "show " + spec + " --variant e2b";
    auto r = run_command(cli_q(tmp.path(), show));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\nentry +(\S+)\n)"))) << r.out;
    const std::string entry = m[1].str();  // m points into r.out, which is reused below
    const fs::path meta = fs::path(entry) / "meta.json";
    auto patch = [&](const std::function<void(nlohmann::json&)>& change) {
        std::ifstream in(meta);
        nlohmann::json j = nlohmann::json::parse(in);
        change(j);
        std::ofstream(meta) << j.dump();
    };
    for (const char* field : {"created", "last_used"}) {
        patch([&](nlohmann::json& j) { j[field] = int64_t{1} << 62; });
        r = run_command(cli_q(tmp.path(), show));
        EXPECT_EQ(r.exit_code, 1) << r.out;
        EXPECT_NE(r.out.find("cache entry " + entry + ": meta.json field " + field),
                  std::string::npos)
            << r.out;
        patch([&](nlohmann::json& j) { j[field] = 1'700'000'000; });
    }
    const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> cases = {
        {"created", [](nlohmann::json& j) { j["created"] = "x"; }},
        {"compile_ms", [](nlohmann::json& j) { j["compile_ms"] = "x"; }},
        {"key_record.abi", [](nlohmann::json& j) { j["key_record"]["abi"] = "x"; }},
        {"resources", [](nlohmann::json& j) { j["resources"] = "x"; }},
        {"nvrtc_log", [](nlohmann::json& j) { j["nvrtc_log"] = 5; }},
    };
    const std::string ptx = "ptx " + spec + " --variant e2b";
    for (const auto& [field, change] : cases)
        for (const std::string& cmd : {show, ptx, std::string("cache verify")}) {
            if (!fs::exists(meta)) {  // cache verify removed it
                ASSERT_EQ(run_command(cli_q(tmp.path(), ptx)).exit_code, 0);
            }
            patch(change);
            r = run_command(cli_q(tmp.path(), cmd));
            EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.out;
            EXPECT_NE(r.out.find("meta.json field " + field), std::string::npos)
                << cmd << ": " << r.out;
            EXPECT_NE(r.out.find(cmd == ptx || cmd == show ? "is damaged" : "1 damaged"),
                      std::string::npos)
                << cmd << ": " << r.out;
        }
}

// `sass` hands the tool the cubin's path as one argument, with no shell in between: a cache
// folder or TMPDIR holding quotes or shell syntax is just a name.
TEST(JitCli, SassPassesPathsAsArgumentsWithoutAShell) {
    gj::test::ScratchDir tmp("clisass");
    write_file(tmp.path() / "bin/cuobjdump",
               "#!/bin/sh\nfor a in \"$@\"; do echo \"arg[$a]\"; done\n"
               "for a in \"$@\"; do last=\"$a\"; done\ntest -f \"$last\" && echo 'cubin exists'\n"
               "exit ${FAKE_STATUS:-0}\n");
    fs::permissions(tmp.path() / "bin/cuobjdump", fs::perms::owner_all);
    const fs::path cache = tmp.path() / "c'; touch INJECTED; echo '";
    const std::string spec = small_spec(cache);
    ASSERT_FALSE(spec.empty());
    const std::string path = "PATH=" + shq((tmp.path() / "bin").string()) + ":\"$PATH\"";
    const std::string sass = "sass " + spec + " --variant e2b";
    auto r = run_command("cd " + shq(tmp.path().string()) + " && " + cli_q(cache, sass, path));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("arg[-sass]\narg[" + cache.string() + "/v"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("kernel.cubin]\ncubin exists"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(tmp.path() / "INJECTED"));
    // Cache off: the cubin goes to a scratch file in TMPDIR, made there and removed afterwards.
    const fs::path tmpdir = tmp.path() / "t'x";
    fs::create_directories(tmpdir);
    const std::string env = path + " TMPDIR=" + shq(tmpdir.string()) + " GEMMAJIT_CACHE=0";
    r = run_command(cli_q(cache, sass, env));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("arg[" + tmpdir.string() + "/gemmajit-" + spec + "-"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("cubin exists"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::is_empty(tmpdir));
    // A failing tool is an error naming its command; the scratch file still goes.
    r = run_command(cli_q(cache, sass, env + " FAKE_STATUS=3"));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("failed (exit status 3)"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::is_empty(tmpdir));
}
