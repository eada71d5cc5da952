// The chain probe (kernel_templates/chain_probe.cu): a chain of small dependent matvecs run as one
// programmatic-dependent launch per step (the decode graph's form) and as one persistent kernel
// whose blocks meet at a device-wide barrier between steps. The test checks both against the CPU
// and each other, bit for bit; the disabled one measures what a step costs in each form, the
// question issue 13's persistent decode kernel (step 2) rests on:
//   gpu_test_chain_probe --gtest_also_run_disabled_tests --gtest_filter='*StepCost*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf/half.h"
#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/kernel_specs.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::jit::check_driver;
using gj::jit::DeviceBuffer;
using gj::jit::driver;

namespace {

constexpr unsigned kThreads = 256;  // chain_probe_spec()'s THREADS

const gj::jit::Kernel& probe(const char* entry) {
    const gj::jit::KernelSpec s = gj::test::chain_probe_spec();
    return kernels_for(s).get(s.name, entry);
}

// `mats` matrices W (f16, n x n, entries uniform in +-sqrt(3/n), so a step keeps x's scale), two
// fp32 vectors x/y, and the barrier's arrival counter.
struct Chain {
    int n, mats;
    std::vector<uint16_t> w;
    std::vector<float> x0;
    DeviceBuffer dw, buf, arrived;
    Chain(int n_, int mats_, uint32_t seed) : n(n_), mats(mats_) {
        std::mt19937 rng(seed);
        const float a = std::sqrt(3.0f / n);
        std::uniform_real_distribution<float> uw(-a, a), ux(-1.0f, 1.0f);
        w.resize(size_t(mats) * n * n);
        for (auto& v : w) v = gj::f32_to_f16(uw(rng));
        x0.resize(n);
        for (auto& v : x0) v = ux(rng);
        dw = to_device(w);
        buf = DeviceBuffer(size_t(n) * 2 * sizeof(float));
        arrived = DeviceBuffer(16);
    }
    CUdeviceptr mat(int s) const { return dw.ptr() + size_t(s % mats) * n * n * 2; }
    CUdeviceptr vec(int i) const { return buf.ptr() + size_t(i % 2) * n * sizeof(float); }
    void reset() { buf.upload(x0.data(), x0.size() * sizeof(float)); }
    std::vector<float> result(int steps) const {
        std::vector<float> y(n);
        buf.download(y.data(), n * sizeof(float), size_t(steps % 2) * n * sizeof(float));
        return y;
    }
};

// One launch per step on `stream`, each a programmatic dependent of the one before (or not).
void enqueue_launches(Chain& c, int steps, unsigned blocks, CUstream stream,
                      bool dependent = true) {
    const auto& k = probe("probe_step");
    for (int s = 0; s < steps; ++s) {
        CUdeviceptr w = c.mat(s), x = c.vec(s), y = c.vec(s + 1);
        int n = c.n;
        void* args[] = {&w, &x, &y, &n};
        k.launch({blocks}, {kThreads}, 0, stream, args, dependent);
    }
}

// barrier false: no waits between steps (a wrong result; timing only).
void enqueue_persistent(Chain& c, int steps, unsigned blocks, CUstream stream,
                        bool barrier = true) {
    check_driver(driver().cuMemsetD8Async(c.arrived.ptr(), 0, 4, stream), "memset arrived");
    CUdeviceptr w = c.dw.ptr(), buf = c.buf.ptr(), arrived = c.arrived.ptr();
    int mats = c.mats, n = c.n, wait = barrier;
    void* args[] = {&w, &mats, &buf, &n, &steps, &arrived, &wait};
    probe("probe_persistent").launch({blocks}, {kThreads}, 0, stream, args);
}

std::vector<double> cpu_chain(const Chain& c, int steps) {
    std::vector<double> x(c.x0.begin(), c.x0.end()), y(c.n);
    for (int s = 0; s < steps; ++s) {
        const uint16_t* w = c.w.data() + size_t(s % c.mats) * c.n * c.n;
        for (int r = 0; r < c.n; ++r) {
            double acc = 0;
            for (int k = 0; k < c.n; ++k) acc += gj::f16_to_f32(w[size_t(r) * c.n + k]) * x[k];
            y[r] = acc;
        }
        std::swap(x, y);
    }
    return x;
}

// A persistent kernel must have every block resident: one per SM is.
unsigned persistent_blocks() {
    return unsigned(gj::jit::Device::get().sm_count());
}

}  // namespace

TEST(ChainProbe, PersistentBarrierComputesWhatDependentLaunchesDo) {
    GJ_REQUIRE_GPU();
    auto& dev = gj::jit::Device::get();
    Chain c(1024, 3, 7);
    const int steps = 9;
    const std::vector<double> ref = cpu_chain(c, steps);
    double scale = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0.1);

    // On sm_90+ the per-step launches must really be programmatic dependents (the form the
    // decode graph takes): the launch applies the attribute only to an entry that waits on its
    // grid.
    if (dev.compute_capability() >= 90) {
        EXPECT_TRUE(probe("probe_step").waits_on_grid()) << "probe_step launches plainly";
    }
    c.reset();
    enqueue_launches(c, steps, c.n / (kThreads / 32), dev.stream());
    dev.synchronize();
    const std::vector<float> launched = c.result(steps);
    int bad = 0;
    for (int i = 0; i < c.n; ++i)
        if (std::abs(launched[i] - ref[i]) > 1e-4 * scale && ++bad < 5)
            ADD_FAILURE() << "row " << i << ": " << launched[i] << " vs CPU " << ref[i];
    EXPECT_EQ(bad, 0);

    // Fewer blocks than rows (each loops), as the persistent grid does: the same sums.
    for (unsigned blocks : {persistent_blocks(), 7u}) {
        SCOPED_TRACE(blocks);
        c.reset();
        enqueue_persistent(c, steps, blocks, dev.stream());
        dev.synchronize();
        EXPECT_EQ(c.result(steps), launched);
        uint32_t arrived = 0;
        c.arrived.download(&arrived, 4);
        EXPECT_EQ(arrived, steps * blocks) << "every block arrived after every step";
    }
}

// us per step of a chain of `steps` matvecs, weights too large for L2 (H200: 50 MB), each form
// timed as it would run: the launches captured in one CUDA graph, the persistent kernel launched
// once. Median of 5 runs after one unmeasured.
TEST(ChainProbe, DISABLED_StepCost) {
    GJ_REQUIRE_GPU();
    const auto& api = driver();
    auto& dev = gj::jit::Device::get();
    CUstream stream = nullptr;
    check_driver(api.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream");
    CUevent t0 = nullptr, t1 = nullptr;
    check_driver(api.cuEventCreate(&t0, CU_EVENT_DEFAULT), "event");
    check_driver(api.cuEventCreate(&t1, CU_EVENT_DEFAULT), "event");
    const int steps = 480;
    std::printf("%6s %-34s %10s %9s\n", "n", "form", "us/step", "GB/s");
    for (int n : {512, 1024, 2560, 5376}) {
        const size_t mat_bytes = size_t(n) * n * 2;
        Chain c(n, int(std::max<size_t>(2, (256u << 20) / mat_bytes)), 11);
        auto time = [&](const char* form, const std::function<void()>& enqueue) {
            std::vector<float> ms;
            for (int r = 0; r < 6; ++r) {
                c.reset();
                check_driver(api.cuEventRecord(t0, stream), "record");
                enqueue();
                check_driver(api.cuEventRecord(t1, stream), "record");
                check_driver(api.cuEventSynchronize(t1), "sync");
                float m = 0;
                check_driver(api.cuEventElapsedTime(&m, t0, t1), "elapsed");
                if (r) ms.push_back(m);
            }
            std::sort(ms.begin(), ms.end());
            const double us = ms[ms.size() / 2] * 1000.0 / steps;
            std::printf("%6d %-34s %10.2f %9.0f\n", n, form, us, mat_bytes / us / 1e3);
            return c.result(steps);
        };
        auto graph_of = [&](unsigned blocks, bool dependent) {
            CUgraph g = nullptr;
            CUgraphExec exec = nullptr;
            check_driver(api.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                         "capture");
            enqueue_launches(c, steps, blocks, stream, dependent);
            check_driver(api.cuStreamEndCapture(stream, &g), "end capture");
            check_driver(api.cuGraphInstantiateWithFlags(&exec, g, 0), "instantiate");
            check_driver(api.cuGraphDestroy(g), "graph destroy");
            return exec;
        };
        const unsigned rows_blocks = unsigned(n / (kThreads / 32)), sms = persistent_blocks();
        std::vector<float> first;
        for (bool dependent : {true, false})
            for (unsigned blocks : {rows_blocks, sms}) {
                CUgraphExec exec = graph_of(blocks, dependent);
                const std::string form = std::string(dependent ? "dependent" : "plain") +
                                         " launches, graph, " + std::to_string(blocks) + " blocks";
                auto y = time(form.c_str(), [&] {
                    check_driver(api.cuGraphLaunch(exec, stream), "graph launch");
                });
                if (first.empty()) first = y;
                EXPECT_EQ(y, first) << "n " << n << ", " << form;
                check_driver(api.cuGraphExecDestroy(exec), "graph exec destroy");
            }
        const std::string form = "persistent, " + std::to_string(sms) + " blocks";
        const auto y = time(form.c_str(), [&] { enqueue_persistent(c, steps, sms, stream); });
        EXPECT_EQ(y, first) << "n " << n;
        time("persistent, no barrier (timing only)",
             [&] { enqueue_persistent(c, steps, sms, stream, false); });
    }
    dev.synchronize();
    api.cuEventDestroy(t0);
    api.cuEventDestroy(t1);
    api.cuStreamDestroy(stream);
}
