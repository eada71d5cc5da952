// The NCCL loader without GPUs: where it looks (GEMMAJIT_NCCL_LIB alone when set, a folder
// standing for the library in it), the error naming every place tried when the library is
// missing, NVLink multicast left off and the symmetric kernels' block count set. The collectives
// themselves: gpu_test_nccl.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/nccl.h"
#include "tests/support/test_env.h"

using gj::jit::Flags;
using gj::jit::Nccl;

namespace {
// The process's own environment, read before any test loads NCCL (which sets what is unset).
std::string initial_env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}
const std::string kInitialSymCtas = initial_env("NCCL_SYM_CTAS");
}  // namespace

TEST(Nccl, CandidatesFollowTheFlag) {
    const auto file = Flags::parse({{"GEMMAJIT_NCCL_LIB", "/opt/nccl/libnccl.so.2.99"}});
    EXPECT_EQ(Nccl::candidates(file), std::vector<std::string>{"/opt/nccl/libnccl.so.2.99"});
    gj::test::ScratchDir dir("nccl-folder");
    const auto folder = Flags::parse({{"GEMMAJIT_NCCL_LIB", dir.path().string()}});
    EXPECT_EQ(Nccl::candidates(folder),
              std::vector<std::string>{(dir.path() / "libnccl.so.2").string()});
    // Unset: the loader's own search first, then only copies that exist on this machine.
    const auto plain = Nccl::candidates(Flags::parse({}));
    ASSERT_FALSE(plain.empty());
    EXPECT_EQ(plain[0], "libnccl.so.2");
    for (size_t i = 1; i < plain.size(); ++i)
        EXPECT_TRUE(std::filesystem::exists(plain[i])) << plain[i];
}

// A library that is not there: one error naming what was tried and the flag that fixes it (also
// when this process loaded NCCL from elsewhere before: one library per process).
TEST(Nccl, MissingLibraryNamesWhereItLooked) {
    const auto f = Flags::parse({{"GEMMAJIT_NCCL_LIB", "/nonexistent/gemmajit/libnccl.so.2"}});
    try {
        Nccl::get(f);
        ADD_FAILURE() << "loaded NCCL from a path that does not exist";
    } catch (const gj::jit::DeviceUnavailable& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("/nonexistent/gemmajit/libnccl.so.2"), std::string::npos) << m;
        EXPECT_NE(m.find("GEMMAJIT_NCCL_LIB"), std::string::npos) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
    // Multicast stays off, and the symmetric kernels take 16 blocks, unless the user chose
    // otherwise (then the user's value stays).
    ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
    ASSERT_NE(std::getenv("NCCL_SYM_CTAS"), nullptr);
    EXPECT_EQ(std::string(std::getenv("NCCL_SYM_CTAS")),
              kInitialSymCtas.empty() ? std::string("16") : kInitialSymCtas);
}

// Where this machine has NCCL (the CUDA install's copy here, the Python wheel's on the GPU
// machines), it loads with no flag and reports a 2.x version; without one the test says so.
TEST(Nccl, LoadsFromTheUsualPlacesWithoutAFlag) {
    try {
        const Nccl& n = Nccl::get(Flags::parse({}));
        EXPECT_GE(n.version(), 20000) << n.path();
        EXPECT_LT(n.version(), 30000) << n.path();
        EXPECT_FALSE(n.path().empty());
    } catch (const gj::jit::DeviceUnavailable& e) {
        GTEST_SKIP() << "no NCCL on this machine: " << e.what();
    }
}
