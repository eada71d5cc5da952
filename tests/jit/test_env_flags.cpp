#include <gtest/gtest.h>

#include <set>

#include "jit/env_flags.h"

using namespace gj::jit;

TEST(EnvFlags, DefaultsParseAndHaveTypedValues) {
    Flags f = Flags::parse({});
    EXPECT_EQ(f.get_string("GEMMAJIT_CACHE"), "1");
    EXPECT_EQ(f.get_size("GEMMAJIT_CACHE_MAX_SIZE"), 2ULL << 30);
    EXPECT_FALSE(f.get_bool("GEMMAJIT_REQUIRE_CACHED"));
    EXPECT_TRUE(f.get_bool("GEMMAJIT_GRAPHS"));
    EXPECT_EQ(f.get_int("GEMMAJIT_DEBUG"), 0);
    EXPECT_EQ(f.get_string("GEMMAJIT_KV_TYPE"), "f16");
    EXPECT_FALSE(f.is_set("GEMMAJIT_DEBUG"));
}

TEST(EnvFlags, EveryDeclarationIsComplete) {
    std::set<std::string_view> names;
    for (const auto& d : flag_table()) {
        EXPECT_TRUE(d.name.starts_with("GEMMAJIT_")) << d.name;
        EXPECT_TRUE(names.insert(d.name).second) << "declared twice: " << d.name;
        EXPECT_FALSE(d.help.empty()) << d.name;
        EXPECT_FALSE(d.family.empty()) << d.name;
        if (d.type == FlagType::Enum) {
            EXPECT_FALSE(d.choices.empty()) << d.name;
        }
        if (d.type == FlagType::Int) {
            EXPECT_LE(d.min, d.max) << d.name;
        }
    }
    for (auto n :
         {"GEMMAJIT_CACHE_DIR", "GEMMAJIT_CACHE", "GEMMAJIT_CACHE_MAX_SIZE",
          "GEMMAJIT_REQUIRE_CACHED", "GEMMAJIT_ARCH", "GEMMAJIT_LINEINFO", "GEMMAJIT_MAXRREG",
          "GEMMAJIT_NVRTC_FLAGS", "GEMMAJIT_DEBUG", "GEMMAJIT_DUMP_DIR", "GEMMAJIT_TEMPLATE_DIR",
          "GEMMAJIT_THREADS", "GEMMAJIT_DEVICE", "GEMMAJIT_GRAPHS", "GEMMAJIT_KV_TYPE"})
        EXPECT_TRUE(names.count(n)) << n;
    // The compile flags change the binary and must be keyed; cache/debug ones must not be.
    for (auto n :
         {"GEMMAJIT_ARCH", "GEMMAJIT_LINEINFO", "GEMMAJIT_MAXRREG", "GEMMAJIT_NVRTC_FLAGS"})
        EXPECT_EQ(find_flag(n)->cls, FlagClass::OutputChanging) << n;
    for (auto n : {"GEMMAJIT_CACHE_DIR", "GEMMAJIT_DEBUG", "GEMMAJIT_THREADS", "GEMMAJIT_DUMP_DIR"})
        EXPECT_EQ(find_flag(n)->cls, FlagClass::Neutral) << n;
}

TEST(EnvFlags, ParsesValuesFromAnExplicitEnvironment) {
    Flags f = Flags::parse({{"GEMMAJIT_CACHE", "ro"},
                            {"GEMMAJIT_CACHE_MAX_SIZE", "512M"},
                            {"GEMMAJIT_LINEINFO", "on"},
                            {"GEMMAJIT_MAXRREG", "128"},
                            {"GEMMAJIT_ARCH", "sm_90a"},
                            {"GEMMAJIT_GRAPHS", "false"}});
    EXPECT_EQ(f.get_string("GEMMAJIT_CACHE"), "ro");
    EXPECT_EQ(f.get_size("GEMMAJIT_CACHE_MAX_SIZE"), 512ULL << 20);
    EXPECT_TRUE(f.get_bool("GEMMAJIT_LINEINFO"));
    EXPECT_EQ(f.get_int("GEMMAJIT_MAXRREG"), 128);
    EXPECT_EQ(f.get_string("GEMMAJIT_ARCH"), "sm_90a");
    EXPECT_FALSE(f.get_bool("GEMMAJIT_GRAPHS"));
    EXPECT_TRUE(f.is_set("GEMMAJIT_CACHE"));
    EXPECT_EQ(f.canonical("GEMMAJIT_LINEINFO"), "1");  // "on" and "1" key the same
}

namespace {
std::string error_for(const std::string& name, const std::string& value) {
    try {
        Flags::parse({{name, value}});
    } catch (const FlagError& e) {
        return e.what();
    }
    return "(no error)";
}
}  // namespace

TEST(EnvFlags, BadValuesNameTheFlagAndWhatIsAllowed) {
    std::string e = error_for("GEMMAJIT_CACHE", "yes");
    EXPECT_NE(e.find("GEMMAJIT_CACHE='yes'"), std::string::npos) << e;
    EXPECT_NE(e.find("1|0|ro"), std::string::npos) << e;
    e = error_for("GEMMAJIT_DEBUG", "9");
    EXPECT_NE(e.find("GEMMAJIT_DEBUG"), std::string::npos) << e;
    EXPECT_NE(e.find("from 0 to 5"), std::string::npos) << e;
    e = error_for("GEMMAJIT_THREADS", "four");
    EXPECT_NE(e.find("GEMMAJIT_THREADS='four'"), std::string::npos) << e;
    e = error_for("GEMMAJIT_LINEINFO", "maybe");
    EXPECT_NE(e.find("0 or 1"), std::string::npos) << e;
    e = error_for("GEMMAJIT_CACHE_MAX_SIZE", "2X");
    EXPECT_NE(e.find("GEMMAJIT_CACHE_MAX_SIZE='2X'"), std::string::npos) << e;
    e = error_for("GEMMAJIT_ARCH", "hopper");
    EXPECT_NE(e.find("sm_<digits>"), std::string::npos) << e;
    e = error_for("GEMMAJIT_KV_TYPE", "f32");
    EXPECT_NE(e.find("f16|bf16|q8_0"), std::string::npos) << e;
    // The tensor-parallel prefill push: ranks of one host, a grid that cannot be negative.
    e = error_for("GEMMAJIT_TP_PREFILL_PUSH", "9");
    EXPECT_NE(e.find("GEMMAJIT_TP_PREFILL_PUSH"), std::string::npos) << e;
    EXPECT_NE(e.find("from 0 to 8"), std::string::npos) << e;
    e = error_for("GEMMAJIT_TP_PUSH_BLOCKS", "-1");
    EXPECT_NE(e.find("GEMMAJIT_TP_PUSH_BLOCKS"), std::string::npos) << e;
    EXPECT_NE(e.find("from 0 to 1024"), std::string::npos) << e;
}

TEST(EnvFlags, UnknownNameGetsOneTypoWarningWithTheClosestName) {
    std::vector<std::string> warnings;
    Flags::parse({{"GEMMAJIT_CACHEDIR", "/x"}, {"GEMMAJIT_DEBUG", "1"}, {"OTHER", "1"}}, &warnings);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("GEMMAJIT_CACHEDIR"), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find("did you mean GEMMAJIT_CACHE_DIR?"), std::string::npos)
        << warnings[0];
    warnings.clear();
    Flags::parse({{"GEMMAJIT_COMPLETELY_DIFFERENT_THING", "1"}}, &warnings);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0].find("did you mean"), std::string::npos) << warnings[0];
}

TEST(EnvFlags, UndeclaredOrMistypedReadsAreProgrammingErrors) {
    Flags f = Flags::parse({});
    EXPECT_THROW(f.get_bool("GEMMAJIT_NOT_A_FLAG"), std::logic_error);
    EXPECT_THROW(f.get_int("GEMMAJIT_CACHE_DIR"), std::logic_error);
}

TEST(EnvFlags, OutputChangingListHasExactlyTheKeyedFlags) {
    Flags f = Flags::parse({{"GEMMAJIT_MAXRREG", "64"}, {"GEMMAJIT_DEBUG", "3"}});
    auto keyed = f.output_changing();
    size_t expected = 0;
    for (const auto& d : flag_table()) expected += d.cls == FlagClass::OutputChanging;
    EXPECT_EQ(keyed.size(), expected);
    bool saw_maxrreg = false;
    for (const auto& [n, v] : keyed) {
        EXPECT_NE(n, "GEMMAJIT_DEBUG");
        if (n == "GEMMAJIT_MAXRREG") saw_maxrreg = v == "64";
    }
    EXPECT_TRUE(saw_maxrreg);
}

TEST(EnvFlags, ParseSize) {
    EXPECT_EQ(parse_size("2G"), 2ULL << 30);
    EXPECT_EQ(parse_size("64k"), 64ULL << 10);
    EXPECT_EQ(parse_size("3MiB"), 3ULL << 20);
    EXPECT_EQ(parse_size("100"), 100u);
    EXPECT_EQ(parse_size("0"), 0u);
    EXPECT_THROW(parse_size("G"), std::invalid_argument);
    EXPECT_THROW(parse_size("1Q"), std::invalid_argument);
    EXPECT_THROW(parse_size("99999999999T"), std::invalid_argument);
}
