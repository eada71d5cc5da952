// GPU: a kernel compiled into the cache by one Jit is loaded as a hit by a second Jit, launched,
// and its result checked; the Driver API table and device come up where a GPU exists.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/jit.h"
#include "tests/support/test_env.h"

using namespace gj::jit;

namespace {
KernelSpec affine_spec() {
    return {"jit_selftest",
            "jit_selftest.s3.o5",
            {{"SCALE", 3}, {"OFFSET", 5}},
            {"gj_selftest_axpb"},
            0};
}
}  // namespace

TEST(GpuJit, DeviceIsAvailableWhereAGpuExists) {
    GJ_REQUIRE_GPU();
    EXPECT_NO_THROW(driver());
    Device& d = Device::get();
    EXPECT_FALSE(d.name().empty());
    EXPECT_TRUE(d.arch().starts_with("sm_")) << d.arch();
    EXPECT_GT(d.sm_count(), 0);
    EXPECT_GT(d.total_memory(), d.free_memory() / 2);
    EXPECT_GE(d.driver_version(), 12000);
}

TEST(GpuJit, WarmCacheHitLoadsAndLaunches) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir tmp("gpujit");
    Flags flags = Flags::parse({{"GEMMAJIT_CACHE_DIR", tmp.path().string()}});
    std::string arch = Device::get().arch();
    {
        Jit cold(flags);
        EXPECT_FALSE(cold.compile(affine_spec(), arch).cache_hit);
    }
    Jit warm(flags);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<CompiledKernel> kernels = {warm.compile(affine_spec(), arch)};
    ASSERT_TRUE(kernels[0].cache_hit);
    ModuleSet modules;
    warm.load(modules, kernels);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("warm cache hit to loaded module: %.2f ms\n", ms);
    ASSERT_EQ(modules.size(), 1u);
    const Kernel& k = modules.kernel("jit_selftest.s3.o5", "gj_selftest_axpb");
    EXPECT_GT(k.attribute(CU_FUNC_ATTRIBUTE_NUM_REGS), 0);
    EXPECT_EQ(&modules.kernel("", "gj_selftest_axpb"), &k);

    const int n = 1000;
    std::vector<float> x(n), y(n, -1.0f);
    for (int i = 0; i < n; ++i) x[i] = 0.5f * i;
    DeviceBuffer dx(n * sizeof(float)), dy(n * sizeof(float));
    dx.upload(x.data(), n * sizeof(float));
    dy.zero();
    CUdeviceptr px = dx.ptr(), py = dy.ptr();
    int nn = n;
    void* args[] = {&px, &py, &nn};
    k.launch({(n + 127) / 128}, {128}, 0, Device::get().stream(), args);
    Device::get().synchronize();
    dy.download(y.data(), n * sizeof(float));
    for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * 3.0f + 5.0f) << i;
}

TEST(GpuJit, DriverRejectedCubinIsEvictedAndRebuilt) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir tmp("gpureject");
    Flags flags = Flags::parse({{"GEMMAJIT_CACHE_DIR", tmp.path().string()}});
    std::string arch = Device::get().arch();
    std::vector<std::string> warnings;
    Jit jit(flags, [&](const std::string& l) { warnings.push_back(l); });
    std::vector<CompiledKernel> kernels = {jit.compile(affine_spec(), arch)};
    kernels[0].cache_hit = true;                   // pretend it came from disk
    kernels[0].cubin = std::string(4096, '\x7f');  // garbage the driver must refuse
    ModuleSet modules;
    jit.load(modules, kernels);
    EXPECT_FALSE(kernels[0].cache_hit);  // rebuilt
    EXPECT_EQ(modules.size(), 1u);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("rejected"), std::string::npos) << warnings[0];
}

TEST(GpuJit, LaunchErrorsNameTheKernel) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir tmp("gpulaunch");
    Jit jit(Flags::parse({{"GEMMAJIT_CACHE_DIR", tmp.path().string()}}));
    std::vector<CompiledKernel> kernels = {jit.compile(affine_spec(), Device::get().arch())};
    ModuleSet modules;
    jit.load(modules, kernels);
    const Kernel& k = modules.kernel("", "gj_selftest_axpb");
    int n = 0;
    CUdeviceptr p = 0;
    void* args[] = {&p, &p, &n};
    try {
        k.launch({1}, {4096}, 0, Device::get().stream(), args);  // too many threads per block
        FAIL() << "expected DeviceError";
    } catch (const DeviceError& e) {
        EXPECT_NE(std::string(e.what()).find("gj_selftest_axpb"), std::string::npos) << e.what();
    }
    EXPECT_THROW(k.launch({1}, {32}, 100 * 1024, Device::get().stream(), args), DeviceError);
}
