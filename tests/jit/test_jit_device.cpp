// Without a GPU driver (CI), every GPU entry point throws DeviceUnavailable with one sentence.
#include <gtest/gtest.h>

#include "jit/cuda_driver.h"
#include "jit/device.h"

using namespace gj::jit;

TEST(JitDevice, NoDriverMeansOneClearSentenceEverywhere) {
    std::string why;
    if (device_available(&why)) GTEST_SKIP() << "a GPU is present; covered by gpu_test_jit";
    EXPECT_FALSE(why.empty());
    EXPECT_NE(why.find("needs a GPU"), std::string::npos) << why;
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    auto expect_unavailable = [&](auto&& fn, const char* what) {
        try {
            fn();
            ADD_FAILURE() << what << " did not throw";
        } catch (const DeviceUnavailable& e) {
            EXPECT_EQ(std::string(e.what()), why) << what;
        }
    };
    expect_unavailable([] { driver(); }, "driver()");
    expect_unavailable([] { Device::get(); }, "Device::get()");
    expect_unavailable([] { DeviceBuffer b(16); }, "DeviceBuffer");
    expect_unavailable(
        [] {
            ModuleSet m;
            CompiledKernel k;
            m.load(k);
        },
        "ModuleSet::load");
    // Error text formatting works without a driver too.
    EXPECT_NE(driver_error_text(CUDA_ERROR_OUT_OF_MEMORY).find("2"), std::string::npos);
}
