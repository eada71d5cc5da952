// The logits kernels on the GPU: softcap against the CPU's tanh(z / cap) * cap, and
// softcap_argmax / softcap_topk exactly against a CPU argmax / top-k of the same capped values
// (ids, order and values), including ties (lowest index first), saturation ties (different raw
// logits that cap to the same float), -0 vs +0, NaN (token -1 / NaN first), the uncapped form,
// vocabularies of the tiny presets and of the real models, and back-to-back launches on one
// workspace (the arrival counters must reset themselves).
// LogitsBench.DISABLED_LmHeadPath times the greedy LM-head path of E4B Q8_0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>

#include "engine/gpu/kernels/logits.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/spec_util.h"
#include "jit/cuda_driver.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

constexpr float kCap = 30.0f;
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// One compiled logits spec with its workspace, zeroed once as the contract asks.
class Logits {
  public:
    Logits(int vocab, int topk)
        : spec_(gj::gemma4::logits_spec(vocab, topk)),
          g_({spec_}),
          work_(size_t(gj::gemma4::spec_constant(spec_, "WORK_BYTES"))),
          vocab_(vocab),
          topk_(topk) {
        work_.zero();
    }
    int threads() const { return int(gj::gemma4::spec_constant(spec_, "THREADS")); }

    std::vector<float> softcap(const std::vector<float>& z, float cap) const {
        auto d = to_device(z);
        launch(g_.get(spec_.name, "softcap"), {ceil_div(z.size(), threads())},
               {unsigned(threads())}, d.ptr(), cap, int(z.size()));
        return from_device<float>(d, z.size());
    }
    int argmax(const DeviceBuffer& logits, float cap) const {
        DeviceBuffer token(4);
        const unsigned blocks = unsigned(gj::gemma4::spec_constant(spec_, "ARGMAX_BLOCKS"));
        launch(g_.get(spec_.name, "softcap_argmax"), {blocks}, {unsigned(threads())}, logits.ptr(),
               cap, work_.ptr(), token.ptr());
        return from_device<int>(token, 1)[0];
    }
    void topk(const DeviceBuffer& logits, float cap, std::vector<int>& ids,
              std::vector<float>& values) const {
        DeviceBuffer dids(size_t(topk_) * 4), dvalues(size_t(topk_) * 4);
        const unsigned blocks = unsigned(gj::gemma4::spec_constant(spec_, "TOPK_BLOCKS"));
        launch(g_.get(spec_.name, "softcap_topk"), {blocks}, {unsigned(threads())}, logits.ptr(),
               cap, work_.ptr(), dids.ptr(), dvalues.ptr());
        ids = from_device<int>(dids, topk_);
        values = from_device<float>(dvalues, topk_);
    }
    int vocab() const { return vocab_; }
    int k() const { return topk_; }

  private:
    KernelSpec spec_;
    GpuKernels g_;
    DeviceBuffer work_;
    int vocab_, topk_;
};

// Checks argmax and top-k of `z` against the CPU on the GPU's own capped values (same function
// in every entry), and those capped values against the CPU's tanh within 4 ulp.
void check_row(const Logits& l, const std::vector<float>& z, float cap, const std::string& what) {
    SCOPED_TRACE(what);
    const auto capped = l.softcap(z, cap);
    for (size_t i = 0; i < z.size(); ++i) {
        const float want = softcap(z[i], cap);
        if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(capped[i])) << i;
            continue;
        }
        // CUDA's tanhf is within 2 ulp of tanh, glibc's within 2 more: 4 ulp of the tanh value,
        // scaled by cap, plus the final rounding of the product. Uncapped: the identity, exact.
        const float t = std::fabs(std::tanh(z[i] / cap));
        const float tol = cap > 0 ? 4 * cap * (std::nextafter(t, kInf) - t) +
                                        std::fabs(std::nextafter(want, kInf) - want)
                                  : 0.0f;
        ASSERT_LE(std::fabs(capped[i] - want), tol) << "softcap of " << z[i] << " at " << i;
    }
    auto dz = to_device(z);
    EXPECT_EQ(l.argmax(dz, cap), argmax(capped));
    std::vector<int> ids;
    std::vector<float> values;
    l.topk(dz, cap, ids, values);
    const auto want = topk(capped, l.k());
    ASSERT_EQ(ids, want);
    for (int i = 0; i < l.k(); ++i) {
        const float v = capped[want[i]];
        if (std::isnan(v))
            EXPECT_TRUE(std::isnan(values[i])) << "candidate " << i;
        else
            EXPECT_EQ(values[i], v) << "candidate " << i;  // -0 comes back as +0: equal
    }
}

std::vector<float> random_logits(int vocab, std::mt19937& rng) {
    auto z = random_normal(vocab, 4.0f, rng);
    for (int i = 0; i < 20; ++i) z[rng() % vocab] = 15.0f + float(i);  // a realistic head
    return z;
}

struct Vocab {
    int vocab, topk;
};

class LogitsTest : public ::testing::TestWithParam<Vocab> {};

TEST_P(LogitsTest, RandomAndTiedRowsMatchCpu) {
    GJ_REQUIRE_GPU();
    const auto [vocab, k] = GetParam();
    Logits l(vocab, k);
    std::mt19937 rng(vocab + k);
    // Several rows through one workspace: each launch must leave its counter at zero.
    for (int rep = 0; rep < 3; ++rep) check_row(l, random_logits(vocab, rng), kCap, "random");
    check_row(l, random_logits(vocab, rng), 0.0f, "uncapped");

    // Heavy ties: values on a coarse grid, so every rank holds many equal logits.
    auto z = random_normal(vocab, 3.0f, rng);
    for (float& v : z) v = std::round(v);
    check_row(l, z, kCap, "coarse grid");

    // The maximum at several places: the lowest index wins, at both ends of the row.
    z = random_logits(vocab, rng);
    for (int i : {vocab - 1, vocab / 2, 7, vocab - 5}) z[i] = 50.0f;
    check_row(l, z, kCap, "repeated maximum");

    // Saturation: different raw logits that cap to the same float (30.0f) tie by index, so
    // the larger raw value at the higher index loses.
    z = random_logits(vocab, rng);
    z[vocab - 3] = 900.0f;
    z[vocab / 3] = 400.0f;
    z[vocab / 4 + 1] = 350.0f;
    check_row(l, z, kCap, "saturation");

    // -0 and +0 are equal; everything else -inf.
    z.assign(vocab, -kInf);
    z[vocab / 2] = -0.0f;
    z[5] = 0.0f;
    z[3] = -0.0f;
    check_row(l, z, kCap, "signed zeros");

    // All -inf: index 0 first; a NaN anywhere: argmax -1 and NaN at the top of the list.
    z.assign(vocab, -kInf);
    check_row(l, z, kCap, "all -inf");
    z = random_logits(vocab, rng);
    z[vocab - 2] = kNan;
    check_row(l, z, kCap, "NaN");
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, LogitsTest,
                         ::testing::Values(Vocab{1024, 64},    // tiny presets
                                           Vocab{1280, 64},    // tiny-keqv (not a power of 2)
                                           Vocab{262144, 64},  // every real model
                                           Vocab{262144, 1},   // greedy through top-k
                                           Vocab{262144, 40},  // a k that does not divide
                                           Vocab{1024, 33},
                                           // several blocks at a size that runs quickly
                                           Vocab{16384, 64},    // argmax 8, top-k 4 blocks
                                           Vocab{65536, 16}));  // argmax 32, top-k 16

// The greedy LM-head path of E4B Q8_0 (tied token_embd 262144 x 2560, split layout): matvec
// and softcap_argmax back to back, plus each part and softcap_topk alone. CUDA events over 50
// iterations; the matvec reads 713 MB, so the L2 holds nothing useful between iterations.
TEST(LogitsBench, DISABLED_LmHeadPath) {
    GJ_REQUIRE_GPU();
    const int vocab = 262144, d = 2560;
    const auto mv =
        gj::gemma4::matvec_spec(ggml::Type::Q8_0, d, 1, gj::gemma4::MatvecLayout::Split);
    GpuKernels g({mv});
    Logits l(vocab, 64);
    std::mt19937 rng(17);
    // Random Q8_0 blocks made directly (the CPU quantizer over 671M weights would be slow):
    // finite fp16 scales near 2^-9, random int8 payloads, so logits come out at a realistic size.
    const size_t n_blocks = size_t(vocab) * (d / 32);
    std::vector<uint8_t> blocks(n_blocks * 34);
    for (size_t b = 0; b < n_blocks; ++b) {
        const uint16_t scale = 0x1800 + uint16_t(rng() % 64);
        blocks[b * 34] = uint8_t(scale & 0xff);
        blocks[b * 34 + 1] = uint8_t(scale >> 8);
        for (int j = 0; j < 32; j += 4) {
            const uint32_t r = rng();
            for (int i = 0; i < 4; ++i) blocks[b * 34 + 2 + j + i] = uint8_t(r >> (8 * i));
        }
    }
    auto src = to_device(blocks);
    DeviceBuffer w(blocks.size() + 16);
    launch(g.get(mv.name, "repack_q8_0"), {ceil_div(n_blocks, 256)}, {256}, src.ptr(), w.ptr(),
           vocab);
    src = DeviceBuffer();
    const auto x = random_normal(d, 1.0f, rng);
    const Q81 q = quantize_q8_1(x.data(), d);
    std::vector<float> ds;
    for (size_t i = 0; i < q.d.size(); ++i) ds.push_back(q.d[i]), ds.push_back(q.s[i]);
    auto dxq = to_device(q.q), dxds = to_device(ds);
    DeviceBuffer logits(size_t(vocab) * 4), token(4), ids(64 * 4), values(64 * 4);
    DeviceBuffer work(
        size_t(gj::gemma4::spec_constant(gj::gemma4::logits_spec(vocab, 64), "WORK_BYTES")));
    work.zero();
    const auto lspec = gj::gemma4::logits_spec(vocab, 64);
    GpuKernels gl({lspec});
    const CUdeviceptr none = 0;
    const unsigned mv_threads = unsigned(gj::gemma4::spec_constant(mv, "THREADS"));
    auto run_matvec = [&] {
        launch_async(g.get(mv.name, "matvec_q8_0"), {unsigned(vocab)}, {mv_threads}, w.ptr(), none,
                     dxq.ptr(), dxds.ptr(), none, logits.ptr(), vocab);
    };
    auto run_argmax = [&] {
        launch_async(gl.get(lspec.name, "softcap_argmax"),
                     {unsigned(gj::gemma4::spec_constant(lspec, "ARGMAX_BLOCKS"))}, {256},
                     logits.ptr(), kCap, work.ptr(), token.ptr());
    };
    auto run_topk = [&] {
        launch_async(gl.get(lspec.name, "softcap_topk"),
                     {unsigned(gj::gemma4::spec_constant(lspec, "TOPK_BLOCKS"))}, {256},
                     logits.ptr(), kCap, work.ptr(), ids.ptr(), values.ptr());
    };
    auto& dev = gj::jit::Device::get();
    dev.synchronize();  // uploads and the workspace memset land before the asynchronous launches
    const auto& api = gj::jit::driver();
    CUevent e0, e1;
    gj::jit::check_driver(api.cuEventCreate(&e0, 0), "cuEventCreate");
    gj::jit::check_driver(api.cuEventCreate(&e1, 0), "cuEventCreate");
    auto time = [&](const char* what, const std::function<void()>& f, double bytes) {
        f();
        dev.synchronize();
        const int reps = 50;
        api.cuEventRecord(e0, dev.stream());
        for (int r = 0; r < reps; ++r) f();
        api.cuEventRecord(e1, dev.stream());
        api.cuEventSynchronize(e1);
        float ms = 0;
        api.cuEventElapsedTime(&ms, e0, e1);
        const double us = ms * 1e3 / reps;
        std::printf("%-34s %9.2f us", what, us);
        if (bytes > 0) std::printf("  %8.1f GB/s", bytes / (us * 1e-6) / 1e9);
        std::printf("\n");
    };
    const double mv_bytes = double(n_blocks) * 34 + vocab * 4.0;
    time("lm_head q8_0 split matvec", run_matvec, mv_bytes);
    time("softcap_argmax", run_argmax, vocab * 4.0);
    time("softcap_topk (k=64)", run_topk, vocab * 4.0);
    time(
        "matvec + softcap_argmax", [&] { run_matvec(), run_argmax(); }, 0);
    time(
        "matvec + softcap_topk", [&] { run_matvec(), run_topk(); }, 0);
    // The measured path chose the same token as a CPU argmax of the downloaded logits.
    run_matvec();
    run_argmax();
    dev.synchronize();
    const auto z = from_device<float>(logits, vocab);
    std::vector<float> capped(vocab);
    for (int i = 0; i < vocab; ++i) capped[i] = softcap(z[i], kCap);
    const int got = from_device<int>(token, 1)[0];
    ASSERT_GE(got, 0);
    // GPU and CPU tanh may differ by an ulp or two: the chosen logit is the maximum up to that.
    EXPECT_NEAR(capped[got], capped[argmax(capped)], 1e-5) << got;
    api.cuEventDestroy(e0);
    api.cuEventDestroy(e1);
}

}  // namespace
