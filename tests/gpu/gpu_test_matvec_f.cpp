// matvec_f (float weights: f32, f16, bf16) on the GPU against a double-precision CPU reference
// over the widths of the tiny presets and the real models, row counts that do not fill the last
// block, 1/2/8 columns and all three epilogues, with the plan's launch constants and with
// overridden ones. MatvecFBench.DISABLED_E4bShapes measures bandwidth (run with
// --gtest_also_run_disabled_tests).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

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

// The plan's spec, or with THREADS / ROWS / UNROLL overridden (0 keeps the plan's value).
KernelSpec matvec_f_variant(ggml::Type t, int k, int ncols, int threads, int rows, int unroll) {
    KernelSpec s = gj::gemma4::matvec_f_spec(t, k, ncols);
    if (threads == 0 && rows == 0 && unroll == 0) return s;
    for (auto& [name, value] : s.constants) {
        if (name == "THREADS" && threads) value = threads;
        if (name == "ROWS" && rows) value = rows;
        if (name == "UNROLL" && unroll) value = unroll;
    }
    s.name += ".t" + std::to_string(gj::gemma4::spec_constant(s, "THREADS")) + ".r" +
              std::to_string(gj::gemma4::spec_constant(s, "ROWS")) + ".u" +
              std::to_string(gj::gemma4::spec_constant(s, "UNROLL"));
    return s;
}

struct Case {
    ggml::Type type;
    int k, n, ncols;
    int threads = 0, rows = 0, unroll = 0;  // 0: the plan's choice
};

void check(const Case& c) {
    const KernelSpec spec = matvec_f_variant(c.type, c.k, c.ncols, c.threads, c.rows, c.unroll);
    SCOPED_TRACE(spec.name + " n=" + std::to_string(c.n));
    GpuKernels g({spec});
    std::mt19937 rng(c.k * 7 + c.n * 3 + c.ncols);
    std::vector<float> wf, uf;  // the weights exactly as stored (rounded to the type)
    const auto wb = random_weights(c.type, c.n, c.k, rng, wf);
    const auto ub = random_weights(c.type, c.n, c.k, rng, uf);
    const auto x = random_normal(size_t(c.ncols) * c.k, 1.0f, rng);
    const auto res = random_normal(size_t(c.ncols) * c.n, 1.0f, rng);
    auto dw = to_device(wb), du = to_device(ub), dx = to_device(x);
    const size_t ny = size_t(c.ncols) * c.n;
    DeviceBuffer y_store(ny * 4), y_geglu(ny * 4);
    auto y_add = to_device(res);  // the residual aliases the output, as in the decode path
    const unsigned threads = unsigned(gj::gemma4::spec_constant(spec, "THREADS"));
    const unsigned rows = unsigned(gj::gemma4::spec_constant(spec, "ROWS"));
    const gj::jit::LaunchDims grid{ceil_div(c.n, rows)}, block{threads};
    const CUdeviceptr none = 0;
    launch(g.get(spec.name, "matvec_f"), grid, block, dw.ptr(), none, dx.ptr(), none, y_store.ptr(),
           c.n);
    launch(g.get(spec.name, "matvec_f_add"), grid, block, dw.ptr(), none, dx.ptr(), y_add.ptr(),
           y_add.ptr(), c.n);
    launch(g.get(spec.name, "matvec_f_geglu"), grid, block, dw.ptr(), du.ptr(), dx.ptr(), none,
           y_geglu.ptr(), c.n);
    const auto ys = from_device<float>(y_store, ny);
    const auto ya = from_device<float>(y_add, ny);
    const auto yg = from_device<float>(y_geglu, ny);
    ASSERT_TRUE(all_finite(ys) && all_finite(ya) && all_finite(yg)) << "NaN/inf in the output";

    // fp32 accumulation: each thread chains ceil(units / THREADS) * (weights per unit) fused
    // multiply-adds, then the warp and block reductions add about 15 more roundings. Every
    // rounding is at most 2^-24 of a partial sum bounded by sum |w x|, so that many ulps of
    // sum |w x| bound the error (rigorously; the typical error is far smaller).
    const int per_unit = c.type == ggml::Type::F32 ? 4 : 8;
    const int chain = (c.k / per_unit + int(threads) - 1) / int(threads) * per_unit;
    const double ulps = (chain + 16) * std::ldexp(1.0, -24);
    int failures = 0;
    for (int col = 0; col < c.ncols && failures < 10; ++col)
        for (int r = 0; r < c.n && failures < 10; ++r) {
            const size_t o = size_t(col) * c.n + r;
            double mag_w, mag_u;
            const float* xc = &x[size_t(col) * c.k];
            const double want = dot_f64(&wf[size_t(r) * c.k], xc, c.k, &mag_w);
            const double up = dot_f64(&uf[size_t(r) * c.k], xc, c.k, &mag_u);
            const double tol_w = ulps * mag_w + 1e-30, tol_u = ulps * mag_u + 1e-30;
            const double gate_out = gelu_tanh(float(want));
            const double want_geglu = gate_out * up;
            // gelu' <= 1.13 carries the gate's error; the product and tanhf add ~1e-6 relative.
            const double tol_geglu = 1.2 * tol_w * std::fabs(up) + tol_u * std::fabs(gate_out) +
                                     1e-6 * std::fabs(want_geglu) + 1e-30;
            const bool ok =
                std::fabs(ys[o] - want) <= tol_w &&
                std::fabs(ya[o] - (res[o] + want)) <= tol_w + 1e-7 * std::fabs(res[o]) &&
                std::fabs(yg[o] - want_geglu) <= tol_geglu;
            if (!ok) {
                ++failures;
                ADD_FAILURE() << "row " << r << " col " << col << ": y " << ys[o] << " want "
                              << want << " (tol " << tol_w << "); add " << ya[o] << " want "
                              << res[o] + want << "; geglu " << yg[o] << " want " << want_geglu
                              << " (tol " << tol_geglu << ")";
            }
        }
}

class MatvecFTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatvecFTest, MatchesCpu) {
    GJ_REQUIRE_GPU();
    check(GetParam());
}

constexpr auto F32 = ggml::Type::F32, F16 = ggml::Type::F16, BF16 = ggml::Type::BF16;

INSTANTIATE_TEST_SUITE_P(
    PlanConstants, MatvecFTest,
    ::testing::Values(
        // Tiny presets: PLE width 32, d 128, q widths 128/256/512, tiny-moe's FFN 96.
        Case{F32, 32, 128, 1}, Case{F16, 32, 130, 1}, Case{BF16, 32, 129, 8},
        Case{BF16, 96, 128, 1}, Case{F16, 128, 257, 2}, Case{F32, 256, 77, 8},
        Case{BF16, 512, 128, 1},
        // Real widths: E2B d, E4B d / q / FFN, 26B dense FFN, 31B d and FFN; N % rows != 0.
        Case{BF16, 1536, 1001, 1}, Case{BF16, 2560, 1000, 1}, Case{F16, 2560, 515, 8},
        Case{F32, 2560, 300, 2}, Case{BF16, 2048, 2561, 1}, Case{F16, 10240, 301, 1},
        Case{BF16, 2112, 333, 2}, Case{BF16, 5376, 129, 1}, Case{F32, 21504, 67, 1},
        Case{BF16, 21504, 65, 8}));

INSTANTIATE_TEST_SUITE_P(
    OverriddenConstants, MatvecFTest,
    ::testing::Values(Case{BF16, 2560, 1001, 1, 32, 2, 8},  // several rows per block
                      Case{F16, 2560, 999, 2, 128, 3, 2}, Case{F32, 96, 77, 1, 64, 4, 1},
                      Case{BF16, 10240, 257, 1, 256, 2, 4}, Case{BF16, 32, 5, 1, 32, 8, 4}));

// Bandwidth at E4B shapes (bf16 and f16; gate/up 10240 x 2560, down 2560 x 10240, q-proj
// 2048 x 2560, o-proj 2560 x 2048, the tied LM head 262144 x 2560) over a grid of launch
// constants. Weights rotate over enough copies to defeat the L2 cache; CUDA events time
// back-to-back launches.
TEST(MatvecFBench, DISABLED_E4bShapes) {
    GJ_REQUIRE_GPU();
    struct Cfg {
        int threads, rows, unroll;
    };
    // The plan's choice first, then alternatives.
    const std::vector<Cfg> cfgs = {{0, 0, 0},   {32, 1, 4}, {64, 1, 4}, {128, 1, 4},
                                   {128, 2, 4}, {64, 1, 8}, {64, 4, 2}};
    struct Shape {
        int n, k;
    };
    const std::vector<Shape> shapes = {
        {10240, 2560}, {2560, 10240}, {2048, 2560}, {2560, 2048}, {262144, 2560}};
    auto& dev = gj::jit::Device::get();
    const auto& api = gj::jit::driver();
    CUevent e0, e1;
    gj::jit::check_driver(api.cuEventCreate(&e0, 0), "cuEventCreate");
    gj::jit::check_driver(api.cuEventCreate(&e1, 0), "cuEventCreate");
    std::mt19937 rng(5);
    std::printf("%-36s %7s %6s %5s %9s %8s\n", "spec", "N", "K", "epi", "us", "GB/s");
    for (auto t : {BF16, F16})
        for (const auto& sh : shapes) {
            std::vector<KernelSpec> specs;
            for (const auto& c : cfgs)
                if (sh.n < 100000 || c.threads == 0)  // the LM head only with the plan's choice
                    specs.push_back(matvec_f_variant(t, sh.k, 1, c.threads, c.rows, c.unroll));
            GpuKernels g(specs);
            std::vector<float> unused;
            const auto blocks = random_weights(t, sh.n, sh.k, rng, unused);
            const size_t bytes = blocks.size();
            const int copies = int(std::max<size_t>(2, (600u << 20) / bytes));
            std::vector<DeviceBuffer> w;
            for (int i = 0; i < copies; ++i) w.push_back(to_device(blocks));
            auto dx = to_device(random_normal(sh.k, 1.0f, rng));
            DeviceBuffer y(size_t(sh.n) * 4);
            dev.synchronize();  // uploads land before the first asynchronous launch
            const CUdeviceptr none = 0;
            for (const auto& spec : specs)
                for (const char* entry : {"matvec_f", "matvec_f_geglu"}) {
                    const bool geglu = std::string(entry) == "matvec_f_geglu";
                    if (geglu && sh.n != 10240) continue;
                    const auto& kern = g.get(spec.name, entry);
                    const unsigned threads = unsigned(gj::gemma4::spec_constant(spec, "THREADS"));
                    const unsigned rows = unsigned(gj::gemma4::spec_constant(spec, "ROWS"));
                    auto round = [&] {
                        for (int i = 0; i < copies; ++i)
                            launch_async(kern, {ceil_div(sh.n, rows)}, {threads}, w[i].ptr(),
                                         geglu ? w[(i + 1) % copies].ptr() : none, dx.ptr(), none,
                                         y.ptr(), sh.n);
                    };
                    round();
                    dev.synchronize();
                    const int reps = std::max(2, 40 / copies);
                    api.cuEventRecord(e0, dev.stream());
                    for (int r = 0; r < reps; ++r) round();
                    api.cuEventRecord(e1, dev.stream());
                    api.cuEventSynchronize(e1);
                    float ms = 0;
                    api.cuEventElapsedTime(&ms, e0, e1);
                    const double per = ms * 1e-3 / (reps * copies);
                    const double moved =
                        (geglu ? 2.0 : 1.0) * double(bytes) + sh.k * 4.0 + sh.n * 4.0;
                    std::printf("%-36s %7d %6d %5s %9.2f %8.1f\n", spec.name.c_str(), sh.n, sh.k,
                                geglu ? "geglu" : "store", per * 1e6, moved / per / 1e9);
                }
        }
    api.cuEventDestroy(e0);
    api.cuEventDestroy(e1);
}

}  // namespace
