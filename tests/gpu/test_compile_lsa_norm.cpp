// NVRTC compilation, on the CPU, of the decode post-norms that sum the tensor-parallel ranks'
// products themselves through NCCL's device API (rmsnorm LSA_PEERS, ".lsa<P>"), against the NCCL
// device headers this machine has; and how the engine finds and prepares those headers
// (jit/nccl_device.h).
#include <glob.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/tp_push.h"
#include "jit/env_flags.h"
#include "jit/nccl_device.h"
#include "tests/support/kernel_specs.h"

namespace fs = std::filesystem;
using gj::gemma4::Config;
using gj::gemma4::rmsnorm_bf16_input_specs;
using gj::gemma4::rmsnorm_lsa_push_spec;
using gj::gemma4::rmsnorm_lsa_spec;
using gj::gemma4::rmsnorm_lsa_specs;
using gj::gemma4::rmsnorm_spec;
using gj::gemma4::tp_push_spec;
using gj::test::compile_and_check;
using gj::test::entry_ptx;
using gj::test::occurrences;

namespace {

// Folders with the device headers of NCCL releases the engine supports, one per release, that
// this machine has (the CUDA 13 install carries NCCL 2.28.9's; a GPU machine's /usr/include
// 2.28.3's), GJ_TEST_NCCL_INCLUDE's (colon-separated) first.
std::vector<std::string> local_nccl_headers() {
    std::vector<std::string> dirs;
    if (const char* extra = std::getenv("GJ_TEST_NCCL_INCLUDE")) {
        std::stringstream ss(extra);
        for (std::string d; std::getline(ss, d, ':');)
            if (!d.empty()) dirs.push_back(d);
    }
    for (const char* d : {"/usr/include", "/usr/local/include", "/usr/local/cuda/include"})
        dirs.emplace_back(d);
    glob_t g{};
    if (::glob("/usr/local/cuda-*/include", GLOB_ONLYDIR, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) dirs.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    std::vector<std::string> out;
    std::set<int> versions;
    for (const auto& d : dirs) {
        const int v = gj::jit::nccl_header_version((fs::path(d) / "nccl.h").string());
        const fs::path impl = fs::path(d) / "nccl_device" / "impl";
        if ((v == 22803 || v == 22807 || v == 22809) &&
            (fs::exists(impl / "lsa_barrier__funcs.h") ||
             fs::exists(impl / "mem_barrier__funcs.h")) &&
            versions.insert(v).second)
            out.push_back(d);
    }
    return out;
}

void write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}

// Why this machine cannot compile against NCCL's device headers (empty: it can).
std::string missing_headers(const std::vector<std::string>& dirs) {
    if (dirs.empty()) return "no NCCL 2.28.3/2.28.7/2.28.9 device headers (nccl_device.h) here";
    if (gj::jit::cuda_include_dir().empty()) return "no CUDA headers (cuda_fp16.h)";
    return "";
}

// {d_model, ranks} of every dense preset over 2 GPUs, and of the 31B's width (5376) over each of
// `more` (libcu++'s headers make each compile a few seconds).
std::vector<std::pair<int, int>> split_widths(std::initializer_list<int> more) {
    std::vector<std::pair<int, int>> out;
    for (const auto& v : Config::preset_names()) {
        const Config cfg = Config::preset(v);
        if (cfg.is_moe()) continue;  // (a MoE model is never split)
        out.emplace_back(cfg.d_model, 2);
        if (cfg.d_model == 5376)
            for (int peers : more) out.emplace_back(cfg.d_model, peers);
    }
    return out;
}

// Sorted by name (and headers), each once.
void sort_unique(std::vector<gj::jit::KernelSpec>& specs) {
    std::sort(specs.begin(), specs.end(),
              [](auto& a, auto& b) { return a.name + a.nccl_include < b.name + b.nccl_include; });
    specs.erase(std::unique(specs.begin(), specs.end()), specs.end());
}

}  // namespace

TEST(LsaPostNorms, CompileAgainstNcclDeviceHeaders) {
    const auto dirs = local_nccl_headers();
    if (const std::string why = missing_headers(dirs); !why.empty()) GTEST_SKIP() << why;
    std::vector<gj::jit::KernelSpec> specs;
    // Both post-norms at every split preset's width over 2 GPUs, and the widest over 4 and 8
    // (libcu++'s headers make each compile a few seconds), against the first release's headers;
    // against any other release's, the 31B's over 2.
    for (size_t h = 1; h < dirs.size(); ++h)
        specs.push_back(
            rmsnorm_lsa_spec(rmsnorm_spec(5376, true, true, true, true, true), 2, dirs[h]));
    for (const auto& [d, peers] : split_widths({4, 8}))
        for (auto& s : rmsnorm_lsa_specs(d, peers, dirs[0], false).all())
            specs.push_back(std::move(s));
    sort_unique(specs);
    compile_and_check(specs, [](const gj::jit::CompiledKernel& c, const std::string&) {
        const std::string body = entry_ptx(c.ptx, "rmsnorm_ext_lsa");
        ASSERT_FALSE(body.empty());
        // NCCL's LSA barrier: a release store to each peer's inbox, acquire loads of its own.
        EXPECT_NE(body.find("st.release.sys"), std::string::npos);
        EXPECT_NE(body.find("ld.acquire.sys"), std::string::npos);
        EXPECT_EQ(occurrences(body, "rsqrt.approx.f32"), 2u);  // the post-norm and the next one
        // The device communicator is read where the launch put it (__grid_constant__), not
        // copied to a stack frame.
        ASSERT_EQ(c.resources_per_entry.size(), 1u);
        EXPECT_EQ(c.resources_per_entry[0].stack_bytes, 0);
        // The headers named in the source, so that another NCCL release keys another entry.
        EXPECT_NE(c.source.find("// NCCL device headers: "), std::string::npos);
    });
}

// The push forms (GEMMAJIT_TP_PUSH): both post-norms at every split preset's width over 2 GPUs
// and the 31B's over 8, against the first release's headers. The sum reads the ranks' slots in
// this rank's own window, after the same barrier; lsa_window_pointers asks NCCL for the slots'
// addresses.
TEST(LsaPostNorms, PushFormsCompileAgainstNcclDeviceHeaders) {
    const auto dirs = local_nccl_headers();
    if (const std::string why = missing_headers(dirs); !why.empty()) GTEST_SKIP() << why;
    std::vector<gj::jit::KernelSpec> specs;
    for (const auto& [d, peers] : split_widths({8})) {
        const auto s = rmsnorm_lsa_specs(d, peers, dirs[0], true);
        specs.push_back(*s.push_post_prenorm);
        specs.push_back(*s.push_post_scale_prenorm);
    }
    sort_unique(specs);
    compile_and_check(specs, [](const gj::jit::CompiledKernel& c, const std::string&) {
        const std::string body = entry_ptx(c.ptx, "rmsnorm_ext_lsa_push");
        ASSERT_FALSE(body.empty());
        // The same barrier as the pull form; no pointer arithmetic of NCCL's in the sum.
        EXPECT_NE(body.find("st.release.sys"), std::string::npos);
        EXPECT_NE(body.find("ld.acquire.sys"), std::string::npos);
        EXPECT_EQ(occurrences(body, "rsqrt.approx.f32"), 2u);
        EXPECT_EQ(entry_ptx(c.ptx, "rmsnorm_ext_lsa").size(), 0u) << "the push module's own entry";
        EXPECT_FALSE(entry_ptx(c.ptx, "lsa_window_pointers").empty());
        for (const auto& r : c.resources_per_entry) EXPECT_EQ(r.stack_bytes, 0);
    });
}

// A prefill chunk's push (GEMMAJIT_TP_PREFILL_PUSH, kernel_templates/tp_push.cu) at every split
// preset's width over 2 GPUs and the 31B's over 4 and 8, against the first release's headers:
// bf16 stores to each rank's window, then the barrier; with the post-norms that sum the pushed
// products (rmsnorm X_BF16 = ranks).
TEST(PrefillPush, CompilesAgainstNcclDeviceHeaders) {
    const auto dirs = local_nccl_headers();
    if (const std::string why = missing_headers(dirs); !why.empty()) GTEST_SKIP() << why;
    std::vector<gj::jit::KernelSpec> specs;
    for (const auto& [d, peers] : split_widths({4, 8}))
        specs.push_back(tp_push_spec(d, peers, dirs[0]));
    sort_unique(specs);
    compile_and_check(specs, [](const gj::jit::CompiledKernel& c, const std::string& arch) {
        const std::string body = entry_ptx(c.ptx, "bf16_push_lsa");
        ASSERT_FALSE(body.empty());
        EXPECT_NE(body.find("st.release.sys"), std::string::npos);
        EXPECT_NE(body.find("ld.acquire.sys"), std::string::npos);
        // Only the grid wait: the post-norm after it starts when the push has ended, so its
        // waiting blocks take no SMs from the weight copies meanwhile.
        if (arch != "sm_80") {
            EXPECT_NE(body.find("griddepcontrol.wait"), std::string::npos);
        }
        EXPECT_EQ(body.find("griddepcontrol.launch_dependents"), std::string::npos);
        // 4 bf16 per 8-byte store, to each rank's window.
        EXPECT_TRUE(std::regex_search(body, std::regex(R"(st\.global\.v2\.u32)")));
        EXPECT_FALSE(entry_ptx(c.ptx, "lsa_window_pointers").empty());
        for (const auto& r : c.resources_per_entry) EXPECT_EQ(r.stack_bytes, 0);
    });
    // The post-norms summing 2 ranks' pushed products, every width (no NCCL headers needed).
    std::vector<gj::jit::KernelSpec> norms;
    for (const auto& v : Config::preset_names()) {
        const Config cfg = Config::preset(v);
        if (cfg.is_moe()) continue;
        for (auto& s : rmsnorm_bf16_input_specs(cfg.d_model, cfg.has_ple(), 2).all())
            norms.push_back(std::move(s));
    }
    sort_unique(norms);
    compile_and_check(norms, [](const gj::jit::CompiledKernel& c, const std::string&) {
        EXPECT_NE(c.source.find("#define X_BF16 2"), std::string::npos);
        for (const auto& r : c.resources_per_entry) EXPECT_EQ(r.stack_bytes, 0);
    });
}

TEST(PrefillPush, SpecNamesAndRefusals) {
    const auto s = tp_push_spec(5376, 2, "/x");
    EXPECT_EQ(s.name, "tp_push.n5376.r2");
    EXPECT_EQ(s.entries, (std::vector<std::string>{"bf16_push_lsa", "lsa_window_pointers"}));
    EXPECT_EQ(s.nccl_include, "/x");
    EXPECT_THROW(tp_push_spec(5376, 1, "/x"), std::invalid_argument);
    EXPECT_THROW(tp_push_spec(5376, 9, "/x"), std::invalid_argument);
    EXPECT_THROW(tp_push_spec(5378, 2, "/x"), std::invalid_argument);
    EXPECT_THROW(tp_push_spec(5376, 2, ""), std::invalid_argument);
    // The norms' forms: one bf16 sum, or the ranks' products.
    EXPECT_EQ(rmsnorm_bf16_input_specs(5376, false, 2).post_prenorm[0].name,
              "rmsnorm.n5376.w1.add.n2.q8.xb16x2");
    EXPECT_EQ(rmsnorm_bf16_input_specs(5376, false).post_scale_prenorm[1].name,
              "rmsnorm.n5376.w1.add.scale.n2.h16.xb16");
    EXPECT_THROW(rmsnorm_spec(5376, true, true, true, false, true, 1, false, false, 9),
                 std::invalid_argument);
    EXPECT_THROW(rmsnorm_spec(5376, true, true, true, false, true, 2, false, false, 2),
                 std::invalid_argument);
}

TEST(LsaPostNorms, OnlyForTheDecodePostNormsOfTwoOrMoreRanks) {
    const auto post = rmsnorm_spec(5376, true, true, true, false, true);
    const auto lsa = rmsnorm_lsa_spec(post, 2, "/x");
    EXPECT_EQ(lsa.name, post.name + ".lsa2");
    EXPECT_EQ(lsa.entries, std::vector<std::string>{"rmsnorm_ext_lsa"});
    EXPECT_EQ(lsa.nccl_include, "/x");
    EXPECT_THROW(rmsnorm_lsa_spec(post, 1, "/x"), std::invalid_argument);
    const auto push = rmsnorm_lsa_push_spec(lsa);
    EXPECT_EQ(push.name, lsa.name + ".push");
    EXPECT_EQ(push.entries,
              (std::vector<std::string>{"rmsnorm_ext_lsa_push", "lsa_window_pointers"}));
    EXPECT_THROW(rmsnorm_lsa_push_spec(post), std::invalid_argument);
    EXPECT_THROW(rmsnorm_lsa_spec(post, 2, ""), std::invalid_argument);
    // A pre-norm (entry rmsnorm), split-K planes, a bf16 input: no such form.
    EXPECT_THROW(rmsnorm_lsa_spec(rmsnorm_spec(5376, true, true, true), 2, "/x"),
                 std::invalid_argument);
    EXPECT_THROW(rmsnorm_lsa_spec(rmsnorm_spec(5376, true, true, true, false, true, 3), 2, "/x"),
                 std::invalid_argument);
    EXPECT_THROW(
        rmsnorm_lsa_spec(rmsnorm_spec(5376, true, true, true, false, true, 1, false, false, true),
                         2, "/x"),
        std::invalid_argument);
}

// Headers are taken only when their NCCL_VERSION_CODE is the loaded library's, and the refusal
// names what was looked at.
TEST(NcclDeviceHeaders, FoundOnlyForTheLoadedRelease) {
    const fs::path root = fs::temp_directory_path() / ("gj_nccl_hdr_" + std::to_string(::getpid()));
    fs::remove_all(root);
    write(root / "include" / "nccl.h", "#define NCCL_VERSION_CODE 22809\n");
    write(root / "include" / "nccl_device" / "utility.h", "\n");
    write(root / "include" / "nccl_device" / "impl" / "lsa_barrier__funcs.h", "\n");
    write(root / "include" / "nccl_device" / "impl" / "core__funcs.h", "\n");
    const auto flags =
        gj::jit::Flags::parse({{"GEMMAJIT_NCCL_INCLUDE", (root / "include").string()}});
    std::string why;
    const auto found =
        gj::jit::find_nccl_device_headers(flags, "/nowhere/libnccl.so.2", 22809, &why);
    ASSERT_TRUE(found.has_value()) << why;
    EXPECT_EQ(fs::path(*found), fs::canonical(root / "include"));
    EXPECT_FALSE(gj::jit::find_nccl_device_headers(flags, "/nowhere/libnccl.so.2", 22803, &why));
    EXPECT_NE(why.find("NCCL 22809"), std::string::npos) << why;
    EXPECT_NE(why.find("no device headers of NCCL 22803"), std::string::npos) << why;
    // Beside the library (a Python wheel: nvidia/nccl/lib and nvidia/nccl/include).
    write(root / "lib" / "libnccl.so.2", "");
    const auto plain = gj::jit::Flags::parse({});
    const auto beside = gj::jit::find_nccl_device_headers(
        plain, (root / "lib" / "libnccl.so.2").string(), 22809, &why);
    ASSERT_TRUE(beside.has_value()) << why;
    EXPECT_EQ(fs::path(*beside), fs::canonical(root / "include"));
    // utility.h without the loadConst this engine patches: a clear refusal.
    if (!gj::jit::cuda_include_dir().empty()) {
        try {
            gj::jit::nccl_device_compile_inputs((root / "include").string());
            ADD_FAILURE() << "an unknown utility.h was accepted";
        } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find("loadConst"), std::string::npos) << e.what();
        }
    }
    fs::remove_all(root);
}
