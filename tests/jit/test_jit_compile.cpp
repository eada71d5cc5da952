// Render -> key -> NVRTC -> cache on the CPU (NVRTC needs no GPU). Uses the tiny jit_selftest
// template so each compile takes a fraction of a second.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "cache/store.h"
#include "jit/cache_key.h"
#include "jit/env_flags.h"
#include "jit/grid_dependency.h"
#include "jit/jit.h"
#include "jit/nvrtc_compiler.h"
#include "jit/render.h"
#include "tests/support/test_env.h"

using namespace gj::jit;
namespace fs = std::filesystem;

namespace {

KernelSpec selftest_spec(int scale = 2, int offset = 1) {
    KernelSpec s;
    s.family = "jit_selftest";
    s.name = "jit_selftest.s" + std::to_string(scale) + ".o" + std::to_string(offset);
    s.constants = {{"SCALE", scale}, {"OFFSET", offset}};
    s.entries = {"gj_selftest_axpb"};
    return s;
}

struct Logged {
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

Flags flags_with(const fs::path& cache, EnvMap extra = {}) {
    extra.emplace("GEMMAJIT_CACHE_DIR", cache.string());
    return Flags::parse(extra);
}

void write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}

}  // namespace

TEST(JitRender, PrologueDefinesConstantsAndHelpersAreInlined) {
    std::string src = render(selftest_spec(3, 7), TemplateSource());
    EXPECT_NE(src.find("// gemmajit kernel jit_selftest.s3.o7"), std::string::npos);
    EXPECT_NE(src.find("#define SCALE 3\n#define OFFSET 7\n"), std::string::npos);
    EXPECT_NE(src.find("gj_selftest_affine"), std::string::npos);  // from the .cuh
    EXPECT_EQ(src.find("#include \"jit_selftest.cuh\""), std::string::npos);
    EXPECT_EQ(src.find("#pragma once"), std::string::npos);
}

TEST(JitRender, UnknownHeaderAndMissingTemplateAreNamed) {
    gj::test::ScratchDir tmp("render");
    write(tmp.path() / "bad_include.cu", "#include \"nope.cuh\"\n");
    TemplateSource t(tmp.path());
    KernelSpec s = selftest_spec();
    s.family = "bad_include";
    s.name = "bad_include.x";
    try {
        render(s, t);
        FAIL() << "expected RenderError";
    } catch (const RenderError& e) {
        EXPECT_NE(std::string(e.what()).find("\"nope.cuh\""), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("bad_include.cu:1"), std::string::npos) << e.what();
    }
    s.family = "no_such_family";
    EXPECT_THROW(render(s, t), RenderError);
    KernelSpec bad_name = selftest_spec();
    bad_name.name = "Has Spaces";
    EXPECT_THROW(render(bad_name, t), RenderError);
}

TEST(JitRender, TemplateDirOverridesEmbeddedFiles) {
    gj::test::ScratchDir tmp("override");
    write(tmp.path() / "jit_selftest.cuh",
          "__device__ float gj_selftest_affine(float v) { return v; }  // overridden\n");
    std::string src = render(selftest_spec(), TemplateSource(tmp.path()));
    EXPECT_NE(src.find("// overridden"), std::string::npos);
}

TEST(JitCompile, ColdCompileThenWarmHitFromASecondJit) {
    gj::test::ScratchDir tmp("compile");
    Logged log;
    CompiledKernel cold;
    {
        Jit jit(flags_with(tmp.path()), log.sink());
        cold = jit.compile(selftest_spec(), "sm_90");
        EXPECT_FALSE(cold.cache_hit);
        EXPECT_GT(cold.compile_ms, 0);
        EXPECT_FALSE(cold.cubin.empty());
        EXPECT_NE(cold.ptx.find(".entry gj_selftest_axpb"), std::string::npos);
        EXPECT_EQ(cold.key.size(), 64u);
        ASSERT_EQ(cold.resources_per_entry.size(), 1u);
        EXPECT_GT(cold.resources.registers, 0);
        EXPECT_EQ(cold.resources.spill_store_bytes, 0);
        EXPECT_EQ(cold.options.front(), "--gpu-architecture=sm_90");
        // NVRTC's own cache (12.9+) would hide the ptxas report on a machine with a driver.
        if (nvrtc_identity().version_number() >= 12090) {
            EXPECT_NE(std::find(cold.options.begin(), cold.options.end(), "--no-cache"),
                      cold.options.end());
        }
        fs::path expect_dir = tmp.path() / ("v" + std::to_string(kEngineAbi)) / "sm_90" /
                              ("nvrtc-" + nvrtc_identity().build) / "jit_selftest" /
                              ("jit_selftest.s2.o1-" + cold.key.substr(0, 16));
        EXPECT_EQ(cold.entry_dir, expect_dir.string());
        for (auto f : {"kernel.cu", "kernel.ptx", "kernel.cubin", "meta.json"})
            EXPECT_TRUE(fs::exists(expect_dir / f)) << f;
    }
    Jit warm(flags_with(tmp.path()), log.sink());
    EXPECT_EQ(warm.cache_state(selftest_spec(), "sm_90"), CacheState::Hit);
    CompiledKernel hit = warm.compile(selftest_spec(), "sm_90");
    EXPECT_TRUE(hit.cache_hit);
    EXPECT_EQ(hit.compile_ms, 0);
    EXPECT_EQ(hit.key, cold.key);
    EXPECT_EQ(hit.cubin, cold.cubin);
    EXPECT_EQ(hit.source, cold.source);
    EXPECT_EQ(hit.resources.registers, cold.resources.registers);
    EXPECT_EQ(log.count("warning"), 0u);
}

TEST(JitCompile, DamagedEntriesAreRebuiltWithOneWarning) {
    gj::test::ScratchDir tmp("damaged");
    Logged log;
    fs::path dir;
    {
        Jit jit(flags_with(tmp.path()), log.sink());
        dir = jit.compile(selftest_spec(), "sm_90").entry_dir;
    }
    // Truncated cubin.
    fs::resize_file(dir / "kernel.cubin", 16);
    {
        Jit jit(flags_with(tmp.path()), log.sink());
        EXPECT_EQ(jit.cache_state(selftest_spec(), "sm_90"), CacheState::Damaged);
        CompiledKernel k = jit.compile(selftest_spec(), "sm_90");
        EXPECT_FALSE(k.cache_hit);
        EXPECT_EQ(log.count("is damaged"), 1u);
    }
    // Bit-flipped PTX.
    {
        std::fstream f(dir / "kernel.ptx", std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(10);
        char c = static_cast<char>(f.get());
        f.seekp(10);
        f.put(static_cast<char>(c ^ 1));
    }
    {
        Jit jit(flags_with(tmp.path()), log.sink());
        EXPECT_FALSE(jit.compile(selftest_spec(), "sm_90").cache_hit);
        EXPECT_EQ(log.count("is damaged"), 2u);
    }
    Jit jit(flags_with(tmp.path()), log.sink());
    EXPECT_TRUE(jit.compile(selftest_spec(), "sm_90").cache_hit);
}

TEST(JitCompile, ReadOnlyAndUnwritableCachesKeepRunning) {
    gj::test::ScratchDir tmp("modes");
    Logged log;
    {
        Jit ro(flags_with(tmp.path(), {{"GEMMAJIT_CACHE", "ro"}}), log.sink());
        CompiledKernel k = ro.compile(selftest_spec(), "sm_90");
        EXPECT_FALSE(k.cubin.empty());
        EXPECT_TRUE(k.entry_dir.empty());
        EXPECT_FALSE(fs::exists(tmp.path() / "v1"));
    }
    std::ofstream(tmp.path() / "file") << "x";
    {
        Jit bad(flags_with(tmp.path() / "file" / "sub"), log.sink());
        CompiledKernel k = bad.compile(selftest_spec(), "sm_90");
        EXPECT_FALSE(k.cubin.empty());
        // The second kernel compiles too; the warning is not repeated.
        EXPECT_FALSE(bad.compile(selftest_spec(4, 0), "sm_90").cubin.empty());
        EXPECT_EQ(log.count("not writable"), 1u);
    }
    Jit off(flags_with(tmp.path(), {{"GEMMAJIT_CACHE", "0"}}), log.sink());
    EXPECT_EQ(off.cache_state(selftest_spec(), "sm_90"), CacheState::Disabled);
    EXPECT_TRUE(off.cache_root().empty());
}

TEST(JitCompile, RequireCachedTurnsAMissIntoAnErrorNamingTheSpec) {
    gj::test::ScratchDir tmp("require");
    Jit jit(flags_with(tmp.path(), {{"GEMMAJIT_REQUIRE_CACHED", "1"}}), [](const std::string&) {});
    try {
        jit.compile(selftest_spec(), "sm_90");
        FAIL() << "expected CacheMissError";
    } catch (const CacheMissError& e) {
        EXPECT_NE(std::string(e.what()).find("jit_selftest.s2.o1"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("GEMMAJIT_REQUIRE_CACHED"), std::string::npos);
    }
}

TEST(JitCompile, CompileErrorHasTheLogAndANumberedListingAndIsDumped) {
    gj::test::ScratchDir tmp("error");
    write(tmp.path() / "tpl" / "broken.cu",
          "extern \"C\" __global__ void broken_entry(float* x) {\n"
          "    x[0] = undefined_symbol_xyz;\n"
          "}\n");
    Jit jit(
        flags_with(tmp.path() / "cache", {{"GEMMAJIT_TEMPLATE_DIR", (tmp.path() / "tpl").string()},
                                          {"GEMMAJIT_DUMP_DIR", (tmp.path() / "dump").string()}}),
        [](const std::string&) {});
    KernelSpec s{"broken", "broken.v1", {{"N", 4}}, {"broken_entry"}, 0};
    try {
        jit.compile(s, "sm_90");
        FAIL() << "expected CompileError";
    } catch (const CompileError& e) {
        std::string m = e.what();
        EXPECT_NE(m.find("undefined_symbol_xyz"), std::string::npos) << m;  // NVRTC log
        EXPECT_NE(e.log().find("error"), std::string::npos) << e.log();
        EXPECT_NE(m.find("    1 | // gemmajit kernel broken.v1"), std::string::npos) << m;
        EXPECT_NE(m.find("x[0] = undefined_symbol_xyz;"), std::string::npos) << m;
    }
    bool dumped = false;
    for (const auto& f : fs::directory_iterator(tmp.path() / "dump"))
        dumped |= f.path().string().ends_with(".failed.log");
    EXPECT_TRUE(dumped);
}

TEST(JitCompile, MissingEntryPointIsACompileError) {
    gj::test::ScratchDir tmp("entry");
    Jit jit(flags_with(tmp.path()), [](const std::string&) {});
    KernelSpec s = selftest_spec();
    s.entries = {"gj_selftest_axpb", "not_defined_anywhere"};
    try {
        jit.compile(s, "sm_90");
        FAIL() << "expected CompileError";
    } catch (const CompileError& e) {
        EXPECT_NE(std::string(e.what()).find("not_defined_anywhere"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("gj_selftest_axpb"), std::string::npos);
    }
}

TEST(JitCompile, BadArchIsAClearError) {
    gj::test::ScratchDir tmp("arch");
    Jit jit(flags_with(tmp.path()), [](const std::string&) {});
    EXPECT_THROW(jit.key(selftest_spec(), "sm_20"), std::invalid_argument);
    EXPECT_THROW(jit.key(selftest_spec(), "hopper"), std::invalid_argument);
}

namespace {
// A valid value different from the default for any declared flag.
std::string other_value(const FlagDef& d, const fs::path& scratch) {
    switch (d.type) {
        case FlagType::Bool:
            return d.default_value == "1" ? "0" : "1";
        case FlagType::Int:
            return d.name == "GEMMAJIT_MAXRREG" ? "64" : std::to_string(d.min + 1);
        case FlagType::Size:
            return "1M";
        case FlagType::Enum:
            for (auto c : d.choices)
                if (c != d.default_value) return std::string(c);
            return {};
        case FlagType::String:
            if (d.name == "GEMMAJIT_ARCH") return "sm_80";
            if (d.name == "GEMMAJIT_MATVEC_SHAPE") return "q4_k.k2560=64x2x1";
            return "-DGJ_TEST_FLAG=1";
        case FlagType::Path:
            return (scratch / "flagdir").string();
    }
    return {};
}
}  // namespace

TEST(JitKey, EveryOutputChangingFlagMovesTheKeyAndNoNeutralFlagDoes) {
    gj::test::ScratchDir tmp("key");
    fs::create_directories(tmp.path() / "flagdir");  // an empty template dir: embedded files win
    auto key_with = [&](EnvMap env) {
        env.emplace("GEMMAJIT_CACHE_DIR", (tmp.path() / "cache").string());
        Jit jit(Flags::parse(env), [](const std::string&) {});
        return jit.key(selftest_spec(), jit.default_arch());
    };
    const std::string base = key_with({});
    EXPECT_EQ(base, key_with({}));  // deterministic
    for (const auto& d : flag_table()) {
        if (d.name == "GEMMAJIT_CACHE_DIR") continue;  // set by key_with itself
        std::string v = other_value(d, tmp.path());
        ASSERT_FALSE(v.empty()) << d.name;
        std::string k = key_with({{std::string(d.name), v}});
        if (d.cls == FlagClass::OutputChanging)
            EXPECT_NE(k, base) << d.name << "=" << v << " must move the key";
        else
            EXPECT_EQ(k, base) << d.name << "=" << v << " must not move the key";
    }
    EXPECT_EQ(key_with({{"GEMMAJIT_CACHE_DIR", (tmp.path() / "elsewhere").string()}}), base);
}

TEST(JitKey, SourceEntriesArchAndTemplateOverrideMoveTheKey) {
    gj::test::ScratchDir tmp("key2");
    Jit jit(flags_with(tmp.path()), [](const std::string&) {});
    std::string base = jit.key(selftest_spec(), "sm_90");
    EXPECT_NE(jit.key(selftest_spec(3), "sm_90"), base);
    EXPECT_NE(jit.key(selftest_spec(), "sm_90a"), base);
    EXPECT_NE(jit.key(selftest_spec(), "sm_80"), base);
    KernelSpec more_entries = selftest_spec();
    more_entries.entries.push_back("another_entry");
    EXPECT_NE(jit.key(more_entries, "sm_90"), base);
    write(tmp.path() / "tpl" / "jit_selftest.cuh",
          "__device__ float gj_selftest_affine(float v) { return v * SCALE - OFFSET; }\n");
    Jit over(flags_with(tmp.path(), {{"GEMMAJIT_TEMPLATE_DIR", (tmp.path() / "tpl").string()}}),
             [](const std::string&) {});
    EXPECT_NE(over.key(selftest_spec(), "sm_90"), base);
    KeyRecord r;
    r.source = "s";
    KeyRecord r2 = r;
    r2.abi = kEngineAbi + 1;
    EXPECT_NE(r.hash(), r2.hash());
    // Length prefixes keep field boundaries unambiguous.
    KeyRecord a, b;
    a.entries = {"ab", "c"};
    b.entries = {"a", "bc"};
    EXPECT_NE(a.hash(), b.hash());
}

TEST(JitPlan, CompilesInParallelInOrderWithDedupeAndProgress) {
    gj::test::ScratchDir tmp("plan");
    Logged log;
    Jit jit(flags_with(tmp.path()), log.sink());
    std::vector<KernelSpec> plan = {selftest_spec(1, 0), selftest_spec(2, 0), selftest_spec(1, 0),
                                    selftest_spec(3, 0)};
    plan[3].priority = 2;
    plan[1].priority = 1;
    auto out = jit.compile_plan(plan, "sm_90", 2);
    ASSERT_EQ(out.size(), 4u);
    for (size_t i = 0; i < plan.size(); ++i) EXPECT_EQ(out[i].spec, plan[i]) << i;
    EXPECT_EQ(out[0].key, out[2].key);
    EXPECT_EQ(out[0].cubin, out[2].cubin);
    ASSERT_GE(log.lines.size(), 1u);
    EXPECT_NE(log.lines[0].find("compiling 3 of 4 kernels for sm_90 into " + tmp.path().string()),
              std::string::npos)
        << log.lines[0];
    EXPECT_EQ(log.count("] jit_selftest."), 3u);  // one progress line per compile
    // All hits now: a second plan compiles nothing and prints no "compiling" line.
    Logged quiet;
    Jit warm(flags_with(tmp.path()), quiet.sink());
    auto again = warm.compile_plan(plan, "sm_90", 2);
    for (const auto& k : again) EXPECT_TRUE(k.cache_hit);
    EXPECT_EQ(quiet.count("compiling"), 0u);
}

// The scan behind programmatic dependent launches: only an entry whose own body holds the wait
// may be launched as a dependent.
TEST(GridDependency, FindsTheWaitInTheNamedEntryOnly) {
    const std::string ptx =
        ".version 8.8\n.target sm_90\n"
        ".visible .entry matvec(\n.param .u64 a\n)\n{\n\tgriddepcontrol.wait;\n\tret;\n}\n"
        ".visible .entry matvec_add(\n.param .u64 a\n)\n{\n\tret;\n}\n"
        ".func helper()\n{\n\tgriddepcontrol.wait;\n\tret;\n}\n"
        ".visible .entry matvec_geglu(\n)\n{\n\tcall helper;\n\tret;\n}\n";
    EXPECT_TRUE(ptx_entry_waits_on_grid(ptx, "matvec"));
    EXPECT_FALSE(ptx_entry_waits_on_grid(ptx, "matvec_add"));    // no wait of its own
    EXPECT_FALSE(ptx_entry_waits_on_grid(ptx, "matvec_geglu"));  // only through a .func
    EXPECT_FALSE(ptx_entry_waits_on_grid(ptx, "matv"));          // a prefix is not an entry
    EXPECT_FALSE(ptx_entry_waits_on_grid(ptx, "softcap"));       // absent
    EXPECT_FALSE(ptx_entry_waits_on_grid("", "matvec"));
}

// A meta.json field the Jit reads, in another type, makes the entry damaged: the Jit's store says
// so, deletes it with one warning naming the field and compiles it again (instead of failing
// with a JSON type error naming no file, on every run).
TEST(JitCompile, WrongTypedMetaFieldsAreDamagedAndRebuilt) {
    gj::test::ScratchDir tmp("metatypes");
    fs::path dir;
    {
        Jit jit(flags_with(tmp.path()), [](const std::string&) {});
        dir = jit.compile(selftest_spec(), "sm_90").entry_dir;
    }
    ASSERT_FALSE(dir.empty());
    const std::vector<std::pair<std::string, nlohmann::json>> cases = {
        {"resources", "x"},
        {"nvrtc_log", 5},
        {"resources", nlohmann::json::array({7})},
        {"resources", nlohmann::json::array({{{"registers", "x"}}})},
        {"compile_ms", "x"},
        {"key_record", {{"abi", "x"}}},
        {"created", "x"},
    };
    for (const auto& [field, value] : cases) {
        auto meta = nlohmann::json::parse(*gj::cache::read_file(dir / "meta.json"));
        meta[field] = value;
        std::ofstream(dir / "meta.json") << meta.dump();
        Logged log;
        {
            // Read-only: reported, never a type error, left in place.
            Jit ro(flags_with(tmp.path(), {{"GEMMAJIT_CACHE", "ro"}}), log.sink());
            EXPECT_EQ(ro.cache_state(selftest_spec(), "sm_90"), CacheState::Damaged) << field;
            EXPECT_FALSE(ro.compile(selftest_spec(), "sm_90").cache_hit) << field;
            EXPECT_TRUE(fs::exists(dir / "meta.json"));
        }
        Jit jit(flags_with(tmp.path()), log.sink());
        CompiledKernel k = jit.compile(selftest_spec(), "sm_90");
        EXPECT_FALSE(k.cache_hit) << field;
        EXPECT_EQ(k.entry_dir, dir.string());
        EXPECT_EQ(log.count("is damaged"), 2u) << field;
        EXPECT_EQ(log.count("meta.json field " + field), 2u) << field << ": " << log.lines.at(0);
        Jit again(flags_with(tmp.path()), [](const std::string&) {});
        EXPECT_TRUE(again.compile(selftest_spec(), "sm_90").cache_hit) << field;
    }
    nlohmann::json ok = nlohmann::json::parse(*gj::cache::read_file(dir / "meta.json"));
    EXPECT_EQ(kernel_meta_problem(ok), "");
    EXPECT_EQ(kernel_meta_problem({{"nvrtc_log", 5}}),
              "field nvrtc_log is number, expected a string");
    EXPECT_EQ(kernel_meta_problem({{"resources", {{{"registers", 32}}, {{"stack_bytes", "x"}}}}}),
              "field resources[1].stack_bytes is string, expected an integer");
    EXPECT_EQ(kernel_meta_problem({{"key_record", {{"flags", 1}}}}),
              "field key_record.flags is number, expected an object");
}

// The prune after a compile (GEMMAJIT_CACHE_MAX_SIZE) removes entries and nothing else of what is
// under the cache root, even inside the partition folders the Jit writes to.
TEST(JitCompile, TheAutoPruneLeavesForeignFilesAlone) {
    gj::test::ScratchDir tmp("autoprune");
    fs::path partition;
    {
        Jit jit(flags_with(tmp.path()), [](const std::string&) {});
        partition = fs::path(jit.compile(selftest_spec(), "sm_90").entry_dir).parent_path();
    }
    const std::vector<fs::path> foreign = {
        tmp.path() / "v2/photos/2023/summer/beach/img.jpg",
        tmp.path() / "v2/docs/a/b/notes.lock",
        partition / "holiday/pic.jpg",
        partition / "todo.lock",
    };
    for (const auto& f : foreign) write(f, "mine");
    Jit jit(flags_with(tmp.path(), {{"GEMMAJIT_CACHE_MAX_SIZE", "1"}}), [](const std::string&) {});
    auto out = jit.compile_plan({selftest_spec(5, 0)}, "sm_90", 1);  // publishes, then prunes
    ASSERT_EQ(out.size(), 1u);
    EXPECT_FALSE(fs::exists(out[0].entry_dir)) << "pruned to the 1-byte cap";
    for (const auto& f : foreign) EXPECT_TRUE(fs::exists(f)) << f;
}

TEST(JitCompile, ATemplateDirThatIsNoFolderIsAnErrorNamingTheVariable) {
    gj::test::ScratchDir tmp("tpldir");
    write(tmp.path() / "a_file", "x");
    for (const fs::path& bad : {tmp.path() / "missing", tmp.path() / "a_file"}) {
        try {
            Jit jit(flags_with(tmp.path() / "cache", {{"GEMMAJIT_TEMPLATE_DIR", bad.string()}}),
                    [](const std::string&) {});
            ADD_FAILURE() << "expected an error for " << bad;
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("GEMMAJIT_TEMPLATE_DIR=" + bad.string()),
                      std::string::npos)
                << e.what();
        }
    }
}
