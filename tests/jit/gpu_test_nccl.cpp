// NCCL across the GPUs of one process (tensor parallelism's collectives, docs/TENSOR_PARALLEL.md):
// an in-place sum all-reduce of d-wide rows, fp32 and bf16, eagerly and captured into one CUDA
// graph per GPU (as the decode step will hold it), against the sums computed on the host; and
// (disabled, run by hand) the latency of one all-reduce of the residual width inside a graph, the
// number the tensor-parallel decode speed-up hangs on. Needs two GPUs: skips with the reason on
// one.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/gguf/half.h"
#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/nccl.h"
#include "tests/support/test_env.h"

using gj::jit::check_driver;
using gj::jit::driver;
using gj::jit::Nccl;
using gj::jit::NcclType;

namespace {

// One rank: its device's primary context, a stream and a buffer of `bytes`.
struct Rank {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    CUdeviceptr buf = 0;
};

class NcclGpus : public ::testing::Test {
  protected:
    void SetUp() override {
        std::string why;
        if (!gj::jit::device_available(&why)) GTEST_SKIP() << why;
        int count = 0;
        check_driver(driver().cuDeviceGetCount(&count), "cuDeviceGetCount");
        if (count < 2)
            GTEST_SKIP() << "tensor parallelism needs 2 GPUs; this machine has " << count;
        try {
            nccl_ = &Nccl::get(gj::jit::Flags::process());
        } catch (const gj::jit::DeviceUnavailable& e) {
            FAIL() << "NCCL did not load on a machine with " << count << " GPUs: " << e.what();
        }
        std::printf("NCCL %d from %s\n", nccl_->version(), nccl_->path().c_str());
        for (int i = 0; i < 2; ++i) {
            Rank r;
            check_driver(driver().cuDeviceGet(&r.dev, i), "cuDeviceGet");
            check_driver(driver().cuDevicePrimaryCtxRetain(&r.ctx, r.dev),
                         "cuDevicePrimaryCtxRetain");
            check_driver(driver().cuCtxSetCurrent(r.ctx), "cuCtxSetCurrent");
            check_driver(driver().cuStreamCreate(&r.stream, CU_STREAM_NON_BLOCKING),
                         "cuStreamCreate");
            check_driver(driver().cuMemAlloc(&r.buf, kMaxBytes), "cuMemAlloc");
            ranks_.push_back(r);
        }
        comms_ = nccl_->init_all({0, 1});
    }
    void TearDown() override {
        for (auto c : comms_) nccl_->destroy(c);
        for (auto& r : ranks_) {
            driver().cuCtxSetCurrent(r.ctx);
            driver().cuMemFree(r.buf);
            driver().cuStreamDestroy(r.stream);
            driver().cuDevicePrimaryCtxRelease(r.dev);
        }
    }
    void upload(int r, const void* host, size_t bytes) {
        check_driver(driver().cuCtxSetCurrent(ranks_[r].ctx), "cuCtxSetCurrent");
        check_driver(driver().cuMemcpyHtoDAsync(ranks_[r].buf, host, bytes, ranks_[r].stream),
                     "cuMemcpyHtoDAsync");
        sync();
    }
    void download(int r, void* host, size_t bytes) {
        check_driver(driver().cuCtxSetCurrent(ranks_[r].ctx), "cuCtxSetCurrent");
        check_driver(driver().cuMemcpyDtoHAsync(host, ranks_[r].buf, bytes, ranks_[r].stream),
                     "cuMemcpyDtoHAsync");
        sync();
    }
    void sync() {
        for (auto& r : ranks_) {
            check_driver(driver().cuCtxSetCurrent(r.ctx), "cuCtxSetCurrent");
            check_driver(driver().cuStreamSynchronize(r.stream), "cuStreamSynchronize");
        }
    }
    std::vector<CUdeviceptr> bufs() const { return {ranks_[0].buf, ranks_[1].buf}; }
    std::vector<CUstream> streams() const { return {ranks_[0].stream, ranks_[1].stream}; }
    void all_reduce(size_t n, NcclType t) {
        const auto b = bufs();
        const auto s = streams();
        nccl_->all_reduce_sum(comms_, b, n, t, s);
    }
    // One graph per rank holding `reps` all-reduces of n elements (captured on every rank's
    // stream at once: NCCL's group spans the ranks).
    std::vector<CUgraphExec> capture(size_t n, NcclType t, int reps) {
        const auto& api = driver();
        for (auto& r : ranks_) {
            check_driver(api.cuCtxSetCurrent(r.ctx), "cuCtxSetCurrent");
            check_driver(api.cuStreamBeginCapture(r.stream, CU_STREAM_CAPTURE_MODE_RELAXED),
                         "cuStreamBeginCapture");
        }
        for (int i = 0; i < reps; ++i) all_reduce(n, t);
        std::vector<CUgraphExec> execs;
        for (auto& r : ranks_) {
            check_driver(api.cuCtxSetCurrent(r.ctx), "cuCtxSetCurrent");
            CUgraph g = nullptr;
            check_driver(api.cuStreamEndCapture(r.stream, &g), "cuStreamEndCapture");
            CUgraphExec e = nullptr;
            check_driver(api.cuGraphInstantiateWithFlags(&e, g, 0), "cuGraphInstantiate");
            api.cuGraphDestroy(g);
            execs.push_back(e);
        }
        return execs;
    }
    void launch(const std::vector<CUgraphExec>& execs) {
        for (size_t i = 0; i < ranks_.size(); ++i) {
            check_driver(driver().cuCtxSetCurrent(ranks_[i].ctx), "cuCtxSetCurrent");
            check_driver(driver().cuGraphLaunch(execs[i], ranks_[i].stream), "cuGraphLaunch");
        }
    }
    void destroy(const std::vector<CUgraphExec>& execs) {
        for (auto e : execs) driver().cuGraphExecDestroy(e);
    }

    static constexpr size_t kMaxBytes = size_t(1) << 20;
    Nccl* nccl_ = nullptr;
    std::vector<Rank> ranks_;
    std::vector<Nccl::Comm> comms_;
};

// Rank r's value i: small integers, so sums are exact in fp32 and bf16 alike.
float value(int r, size_t i) {
    return float(int((i * 7 + size_t(r) * 13) % 23) - 11);
}

}  // namespace

TEST_F(NcclGpus, AllReduceSumsEveryRankEagerlyAndInAGraph) {
    for (size_t n : {size_t(5376), size_t(2560 * 3 + 4)}) {
        for (NcclType t : {NcclType::F32, NcclType::BF16}) {
            const bool bf16 = t == NcclType::BF16;
            SCOPED_TRACE(std::to_string(n) + (bf16 ? " bf16" : " f32"));
            const size_t bytes = n * (bf16 ? 2 : 4);
            auto fill = [&] {
                for (int r = 0; r < 2; ++r) {
                    std::vector<uint8_t> host(bytes);
                    for (size_t i = 0; i < n; ++i) {
                        if (bf16) {
                            const uint16_t h = gj::f32_to_bf16(value(r, i));
                            std::memcpy(host.data() + 2 * i, &h, 2);
                        } else {
                            const float f = value(r, i);
                            std::memcpy(host.data() + 4 * i, &f, 4);
                        }
                    }
                    upload(r, host.data(), bytes);
                }
            };
            // After k all-reduces every rank holds 2^(k-1) * (v0 + v1).
            auto expect_sums = [&](float times, const char* what) {
                for (int r = 0; r < 2; ++r) {
                    std::vector<uint8_t> host(bytes);
                    download(r, host.data(), bytes);
                    int bad = 0;
                    for (size_t i = 0; i < n && bad < 5; ++i) {
                        float got;
                        if (bf16) {
                            uint16_t h;
                            std::memcpy(&h, host.data() + 2 * i, 2);
                            got = gj::bf16_to_f32(h);
                        } else {
                            std::memcpy(&got, host.data() + 4 * i, 4);
                        }
                        const float want = times * (value(0, i) + value(1, i));
                        if (got != want) {
                            ++bad;
                            ADD_FAILURE() << what << ": rank " << r << " element " << i << " got "
                                          << got << " want " << want;
                        }
                    }
                }
            };
            fill();
            all_reduce(n, t);
            sync();
            expect_sums(1, "eager");
            fill();
            const auto graphs = capture(n, t, 1);
            launch(graphs);
            sync();
            expect_sums(1, "graph");
            launch(graphs);  // a replay reduces the buffers again
            sync();
            expect_sums(2, "graph replayed");
            destroy(graphs);
        }
    }
}

// Latency of one all-reduce of d values inside a graph (the decode step's form), per width and
// type; NCCL_PROTO / NCCL_ALGO in the environment pick the protocol to compare. Prints us per
// all-reduce, median of 5 runs of a graph holding 100 of them.
TEST_F(NcclGpus, DISABLED_AllReduceLatency) {
    for (size_t d : {size_t(2560), size_t(3840), size_t(5376)})
        for (NcclType t : {NcclType::F32, NcclType::BF16}) {
            constexpr int kReps = 100;
            const auto graphs = capture(d, t, kReps);
            launch(graphs);  // warm-up
            sync();
            std::vector<double> us;
            for (int run = 0; run < 5; ++run) {
                const auto t0 = std::chrono::steady_clock::now();
                launch(graphs);
                sync();
                us.push_back(
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count() /
                    kReps);
            }
            std::sort(us.begin(), us.end());
            std::printf("all-reduce d %zu %s in a graph: %.2f us (%.2f..%.2f)\n", d,
                        t == NcclType::F32 ? "f32" : "bf16", us[2], us[0], us[4]);
            destroy(graphs);
            // Eagerly, for comparison (one group call per all-reduce).
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < kReps; ++i) all_reduce(d, t);
            sync();
            std::printf(
                "all-reduce d %zu %s eager: %.2f us\n", d, t == NcclType::F32 ? "f32" : "bf16",
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count() /
                    kReps);
        }
}
