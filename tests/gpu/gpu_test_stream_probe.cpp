// The stream probe (kernel_templates/stream_probe.cu): an FFN gate|up matvec whose few resident
// blocks stream their weights through shared memory, with or without making their own input
// from the post-attention norm pair. The test checks both entries against the CPU; the disabled
// one measures them against the engine's norm launch + GeGLU launch in a dependent chain, the
// question of whether a decode layer's norm launches can go into the matvec after them:
//   gpu_test_stream_probe --gtest_also_run_disabled_tests --gtest_filter='*Cost*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/quantize_q8_1.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "jit/device.h"
#include "tests/support/graph_timer.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/kernel_specs.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::jit::DeviceBuffer;
namespace ggml = gj::ggml;

namespace {

constexpr float kEps = 1e-6f;

// One stream probe spec, compiled (the loader allows its dynamic shared memory).
struct Probe {
    int k, threads, stages, smem;
    gj::jit::KernelSpec spec;
    const gj::jit::Kernel *q8, *norm, *rows32;
    Probe(int k_, int threads_, int stages_)
        : k(k_),
          threads(threads_),
          stages(stages_),
          spec(gj::test::stream_probe_spec(k_, threads_, stages_)) {
        smem = int(gj::gemma4::spec_constant(spec, "SMEM"));
        const auto& g = kernels_for(spec);
        q8 = &g.get(spec.name, "stream_geglu_q8");
        norm = &g.get(spec.name, "stream_geglu_norm");
        rows32 = &g.get(spec.name, "geglu_rows32_q8");
    }
    int group() const { return threads / 32; }
    // The most blocks of this probe one SM holds (shared memory and threads).
    int blocks_per_sm() const {
        const auto& dev = gj::jit::Device::get();
        return std::max(1,
                        std::min(dev.max_shared_per_block_optin() / (smem + 1024), 2048 / threads));
    }
};

// Inputs of one post-attention step: attention output u, residual x, the two norm weights.
struct NormInputs {
    std::vector<float> u, x, w1, w2;
    DeviceBuffer du, dx, dw1, dw2, dx_out;
    NormInputs(int k, std::mt19937& rng) {
        u = random_normal(k, 3.0f, rng);
        x = random_normal(k, 1.0f, rng);
        w1 = random_norm_weights(k, 0.5f, rng);
        w2 = random_norm_weights(k, 0.5f, rng);
        du = to_device(u);
        dx = to_device(x);
        dw1 = to_device(w1);
        dw2 = to_device(w2);
        dx_out = DeviceBuffer(size_t(k) * 4);
    }
    // x' = x + rmsnorm(u) w1 and h = rmsnorm(x') w2, in double.
    void reference(std::vector<double>& xn, std::vector<float>& h) const {
        const size_t k = u.size();
        double ss = 0;
        for (float v : u) ss += double(v) * v;
        const double s1 = 1.0 / std::sqrt(ss / k + kEps);
        xn.resize(k);
        double ss2 = 0;
        for (size_t i = 0; i < k; ++i) {
            xn[i] = x[i] + u[i] * s1 * w1[i];
            ss2 += xn[i] * xn[i];
        }
        const double s2 = 1.0 / std::sqrt(ss2 / k + kEps);
        h.resize(k);
        for (size_t i = 0; i < k; ++i) h[i] = float(xn[i] * s2 * w2[i]);
    }
};

double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEST(StreamProbe, GegluEntriesMatchTheCpu) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(5);
    for (const int k : {2560, 1536}) {
        SCOPED_TRACE(k);
        Probe p(k, 128, 4);
        const int n = 40 * p.group();  // more row groups than the smaller grids have blocks
        std::vector<float> wg, wu;
        const auto bg = random_weights(ggml::Type::Q4_0, n, k, rng, wg);
        const auto bu = random_weights(ggml::Type::Q4_0, n, k, rng, wu);
        auto dg = to_device(split_layout(ggml::Type::Q4_0, bg, n, k));
        auto du = to_device(split_layout(ggml::Type::Q4_0, bu, n, k));
        NormInputs in(k, rng);
        std::vector<double> xn;
        std::vector<float> h;
        in.reference(xn, h);
        const Q81 q = quantize_q8_1(h.data(), h.size());
        auto dxq = to_device(q.q);
        auto dxds = to_device(interleave(q));
        // Exact Q8_1 products, within the fp32 rounding of sums of |w x| (as the engine's GeGLU
        // test bounds them).
        std::vector<double> want_q8(n), tol(n);
        for (int r = 0; r < n; ++r) {
            double sg = 0, su = 0;
            const double a = matvec_row_q81(&wg[size_t(r) * k], q, 0, k, &sg);
            const double b = matvec_row_q81(&wu[size_t(r) * k], q, 0, k, &su);
            want_q8[r] = gelu_tanh(a) * b;
            tol[r] = 1.2e-5 * sg * std::abs(b) + 1e-5 * su * std::abs(gelu_tanh(a)) +
                     1e-6 * std::abs(want_q8[r]) + 1e-30;
        }
        std::vector<float> first;
        const auto& dev = gj::jit::Device::get();
        for (const unsigned blocks : {1u, 7u, unsigned(2 * dev.sm_count())}) {
            SCOPED_TRACE(blocks);
            DeviceBuffer y(size_t(n) * 4);
            CUdeviceptr g = dg.ptr(), up = du.ptr(), xq = dxq.ptr(), xds = dxds.ptr(), yp = y.ptr();
            int rows = n;
            void* a8[] = {&g, &up, &rows, &xq, &xds, &yp};
            dev.synchronize();
            p.q8->launch({blocks}, {unsigned(p.threads)}, p.smem, dev.stream(), a8);
            dev.synchronize();
            const auto y8 = from_device<float>(y, n);
            for (int r = 0; r < n; ++r)
                ASSERT_NEAR(y8[r], want_q8[r], tol[r]) << "q8 entry, row " << r;
            // Every row is one warp's sum in a fixed order, whatever the grid.
            if (first.empty()) first = y8;
            EXPECT_EQ(y8, first);

            CUdeviceptr u = in.du.ptr(), x = in.dx.ptr(), w1 = in.dw1.ptr(), w2 = in.dw2.ptr(),
                        xo = in.dx_out.ptr();
            float eps = kEps;
            void* an[] = {&g, &up, &rows, &u, &x, &w1, &w2, &xo, &eps, &yp};
            y.zero();  // not the q8 entry's results
            in.dx_out.zero();
            p.norm->launch({blocks}, {unsigned(p.threads)}, p.smem, dev.stream(), an);
            dev.synchronize();
            const auto yn = from_device<float>(y, n);
            // Its own h is the CPU's up to rounding (rsqrtf), which may move an activation to the
            // next int8 step now and then: a change of about |w| amax / 127 in a sum, far below
            // 2e-3 of the largest output.
            double scale = 0;
            for (double v : want_q8) scale = std::max(scale, std::abs(v));
            for (int r = 0; r < n; ++r)
                ASSERT_NEAR(yn[r], want_q8[r], 2e-3 * scale) << "norm entry, row " << r;
            const auto xo_h = from_device<float>(in.dx_out, k);
            for (int i = 0; i < k; ++i)
                ASSERT_NEAR(xo_h[i], xn[i], 1e-5 * (1 + std::abs(xn[i]))) << "x' " << i;
        }

        // 32 rows a block, their Q8_1 form made by the block: the products as the q8 entry's
        // (same sums, same order), and their Q8_1 form the CPU's of those products, bit for bit.
        DeviceBuffer y32(size_t(n) * 4), yq(size_t(n) + 16), yds(size_t(n) / 32 * 8);
        CUdeviceptr g = dg.ptr(), up = du.ptr(), xq = dxq.ptr(), xds = dxds.ptr(), yp = y32.ptr(),
                    yqp = yq.ptr(), ydsp = yds.ptr();
        int rows = n;
        void* a32[] = {&g, &up, &rows, &xq, &xds, &yp, &yqp, &ydsp};
        p.rows32->launch({unsigned(n / 32)}, {256}, 0, dev.stream(), a32);
        dev.synchronize();
        const auto y32h = from_device<float>(y32, n);
        for (int r = 0; r < n; ++r)
            ASSERT_NEAR(y32h[r], want_q8[r], tol[r]) << "rows32 entry, row " << r;
        const Q81 want = quantize_q8_1(y32h.data(), n);
        EXPECT_EQ(from_device<int8_t>(yq, n), want.q);
        EXPECT_EQ(from_device<float>(yds, n / 32 * 2), interleave(want));
    }
}

// us per layer of a chain of `layers` post-attention steps at a model's FFN shape (split Q4_0),
// captured in one CUDA graph with every launch a programmatic dependent of the one before, the
// weights cycling through more than L2 holds: the engine's norm launch + GeGLU launch, the
// GeGLU alone, the GeGLU + the quantize launch of its product, the 32-row GeGLU making that Q8_1
// form itself, and the streaming entries over grids of 1..4 blocks per SM (not with
// GJ_PROBE_ROWS32_ONLY set). Median of 5 replays.
TEST(StreamProbe, DISABLED_NormAndGegluCost) {
    GJ_REQUIRE_GPU();
    auto& dev = gj::jit::Device::get();
    GraphTimer timer;
    const CUstream stream = timer.stream;
    std::mt19937 rng(9);
    const int layers = 64;
    struct Shape {
        const char* model;
        int k, n;
    };
    std::printf("%-5s %-52s %9s %8s\n", "model", "form", "us/layer", "GB/s");
    for (const Shape sh : {Shape{"E4B", 2560, 10240}, Shape{"E2B", 1536, 12288},
                           Shape{"12B", 3840, 15360}, Shape{"31B", 5376, 21504}}) {
        const int k = sh.k, n = sh.n;
        const size_t mat = size_t(n) * (k / 2 + k / 16);
        const int copies = int(std::max<size_t>(4, (320u << 20) / (2 * mat)));
        std::vector<float> unused;
        const auto blocks = split_layout(ggml::Type::Q4_0,
                                         random_weights(ggml::Type::Q4_0, n, k, rng, unused), n, k);
        std::vector<DeviceBuffer> w;
        for (int i = 0; i < 2 * copies; ++i) w.push_back(to_device(blocks));
        NormInputs in(k, rng);
        const Q81 q = quantize_q8_1(in.x.data(), k);
        auto dxq = to_device(q.q);
        auto dxds = to_device(interleave(q));
        DeviceBuffer y(size_t(n) * 4);
        CUdeviceptr none = 0, yp = y.ptr(), xq = dxq.ptr(), xds = dxds.ptr();
        CUdeviceptr u = in.du.ptr(), x = in.dx.ptr(), w1 = in.dw1.ptr(), w2 = in.dw2.ptr(),
                    xo = in.dx_out.ptr();
        float eps = kEps;
        int rows = n, one = 1;

        const auto mv = gj::gemma4::with_decode_prefetch(
            gj::gemma4::matvec_spec(ggml::Type::Q4_0, k, 1, gj::gemma4::MatvecLayout::Split), 2);
        const auto& geglu = kernels_for(mv).get(mv.name, mv.entries[2]);
        const auto shape = gj::gemma4::matvec_launch(mv, true);
        const auto ns = gj::gemma4::rmsnorm_spec(k, true, true, true, false, true);
        const auto& norm = kernels_for(ns).get(ns.name, "rmsnorm_ext");
        const unsigned tpr = unsigned(gj::gemma4::spec_constant(ns, "TPR"));
        const auto qs = gj::gemma4::quantize_spec();
        const auto& quantize = kernels_for(qs).get(qs.name, "quantize_q8_1");
        const unsigned q_threads = unsigned(gj::gemma4::spec_constant(qs, "THREADS"));
        DeviceBuffer yq(size_t(n) + 16), yds(size_t(n) / 32 * 8);
        CUdeviceptr yqp = yq.ptr(), ydsp = yds.ptr();
        int y_blocks = n / 32;

        // with_norm: the norm launch before each GeGLU; with_quantize: the quantize launch of its
        // product after it.
        auto enqueue_engine = [&](bool with_norm, bool with_quantize) {
            for (int l = 0; l < layers; ++l) {
                if (with_norm) {
                    void* a[] = {&u, &w1, &x, &xo, &none, &w2, &none, &xq, &xds, &one, &eps};
                    norm.launch({1}, {tpr}, 0, stream, a, true);
                }
                CUdeviceptr g = w[2 * (l % copies)].ptr(), up = w[2 * (l % copies) + 1].ptr();
                void* a[] = {&g, &up, &xq, &xds, &none, &yp, &rows};
                geglu.launch({ceil_div(n, shape.rows)}, {shape.threads}, 0, stream, a, true);
                if (with_quantize) {
                    void* b[] = {&yp, &yqp, &ydsp, &y_blocks};
                    quantize.launch({ceil_div(size_t(y_blocks) * 8, q_threads)}, {q_threads}, 0,
                                    stream, b, true);
                }
            }
        };
        auto enqueue_rows32 = [&](const Probe& p) {
            for (int l = 0; l < layers; ++l) {
                CUdeviceptr g = w[2 * (l % copies)].ptr(), up = w[2 * (l % copies) + 1].ptr();
                void* a[] = {&g, &up, &rows, &xq, &xds, &none, &yqp, &ydsp};
                p.rows32->launch({unsigned(n / 32)}, {256}, 0, stream, a, true);
            }
        };
        auto enqueue_probe = [&](const Probe& p, unsigned grid, bool with_norm) {
            for (int l = 0; l < layers; ++l) {
                CUdeviceptr g = w[2 * (l % copies)].ptr(), up = w[2 * (l % copies) + 1].ptr();
                if (with_norm) {
                    void* a[] = {&g, &up, &rows, &u, &x, &w1, &w2, &xo, &eps, &yp};
                    p.norm->launch({grid}, {unsigned(p.threads)}, p.smem, stream, a, true);
                } else {
                    void* a[] = {&g, &up, &rows, &xq, &xds, &yp};
                    p.q8->launch({grid}, {unsigned(p.threads)}, p.smem, stream, a, true);
                }
            }
        };
        auto time = [&](const std::string& form, const std::function<void()>& enqueue) {
            const double us = timer.time_us(enqueue, layers, 5);
            std::printf("%-5s %-52s %9.2f %8.0f\n", sh.model, form.c_str(), us, 2 * mat / us / 1e3);
        };
        dev.synchronize();
        time("engine: norm launch + GeGLU " + std::to_string(shape.threads) + "x" +
                 std::to_string(shape.rows),
             [&] { enqueue_engine(true, false); });
        time("engine: GeGLU alone", [&] { enqueue_engine(false, false); });
        time("engine: GeGLU + quantize launch", [&] { enqueue_engine(false, true); });
        const Probe p32(k, 256, 3);
        time("rows32: GeGLU making its Q8_1 form", [&] { enqueue_rows32(p32); });
        if (std::getenv("GJ_PROBE_ROWS32_ONLY")) continue;
        for (const auto& [threads, stages] :
             {std::pair{128, 4}, std::pair{128, 6}, std::pair{256, 3}, std::pair{64, 8}}) {
            Probe p(k, threads, stages);
            for (int per_sm = 1; per_sm <= std::min(4, p.blocks_per_sm()); ++per_sm) {
                const unsigned grid = unsigned(per_sm * dev.sm_count());
                const std::string form = "stream t" + std::to_string(threads) + " s" +
                                         std::to_string(stages) + " x" + std::to_string(per_sm);
                time(form + " q8", [&] { enqueue_probe(p, grid, false); });
                time(form + " norm", [&] { enqueue_probe(p, grid, true); });
            }
        }
    }
    dev.synchronize();
}
