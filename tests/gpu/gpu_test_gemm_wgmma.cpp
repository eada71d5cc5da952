// gemm_wgmma (kernel_templates/gemm_wgmma.cu, sm_90a) on the GPU against CPU references: every
// entry, Q8_0 and Q4_0 weights in the split layout, the plan's tile and every tile the planner may
// pick, T from 1 to 512 and row counts with partial tiles (odd ones too), K from 64 to 21504
// including a half last pipeline step (K % 64 == 32). Skipped (with the reason) on a GPU that is
// not sm_90.
//
// Reference: the exactly dequantized weights w (random_weights), rounded to bf16 as the kernel
// rounds them, times the bf16 activations, summed in double. Tolerances:
//  - against that reference, only fp32 accumulation differs: each of the K / 16 wgmma steps and
//    the 16-term sums inside them round at 2^-23 of the running magnitude, bounded by
//    (K / 16 + 32) * 2^-23 * sum |w x| (a worst case; a wrong scale or element of one block is
//    32 / K of sum |w x| and far above it);
//  - against the unrounded fp32 product (w not rounded to bf16): additionally 2^-8 * sum |w x|
//    (bf16 rounding of w, at most 2^-9 relative per weight, plus slack);
//  - GeGLU: the gate's error through gelu' (< 1.2) times |up|, the up error times |gelu(gate)|,
//    and 1e-6 relative for tanhf;
//  - gemm_wgmma_geglu_bf16 equals the bf16 rounding of gemm_wgmma_geglu's output, bit for bit.
// Every output element must be written, nothing past [T][n_rows]. Large cases check a sample of
// tokens and rows that includes the first and last tiles.
// GemmWgmmaBench.DISABLED_Shapes times the E4B and 31B shapes at T = 512, or at the T of
// GJ_BENCH_T (--gtest_also_run_disabled_tests); GJ_BENCH_PLAN_ONLY=1 times the plan's tiles only.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "engine/gguf/half.h"
#include "engine/gpu/kernels/gemm_wgmma.h"
#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::GemmWgmmaTile;
using gj::gemma4::spec_constant;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

struct WgCase {
    ggml::Type type;
    int k, n, T;
    bool plan;           // the plan's tile (gemm_wgmma_spec(type, k, n, tile.producer)), else
    GemmWgmmaTile tile;  // `tile`
};

// Tiles the planner picks or the bench compares, in both forms (all threads copy / a producer
// warpgroup copies: BN 64 only).
const std::vector<GemmWgmmaTile> kTiles = {
    {256, 128, 4},         {256, 128, 3},         {256, 128, 5},        {128, 128, 4},
    {128, 128, 6},         {64, 128, 4},          {256, 64, 4},         {128, 64, 4},
    {64, 64, 4},           {256, 128, 4, 2},      {256, 128, 4, 3},     {128, 128, 4, 2},
    {128, 128, 4, 3},      {128, 64, 4, 3},       {64, 128, 4, 3},      {256, 64, 4, 1, true},
    {256, 64, 5, 1, true}, {128, 64, 4, 1, true}, {64, 64, 4, 1, true}, {64, 64, 3, 1, true},
    {128, 64, 4, 3, true}, {256, 64, 4, 3, true}};

KernelSpec spec_of(const WgCase& c) {
    return c.plan ? gj::gemma4::gemm_wgmma_spec(c.type, c.k, c.n, c.tile.producer)
                  : gj::gemma4::gemm_wgmma_spec(c.type, c.k, c.tile);
}

// The GPU tests need an sm_90 device (the kernel is compiled for sm_90a).
#define GJ_REQUIRE_SM90()                                                         \
    do {                                                                          \
        GJ_REQUIRE_GPU();                                                         \
        if (gj::jit::Device::get().arch() != "sm_90")                             \
            GTEST_SKIP() << "gemm_wgmma needs an sm_90 GPU (wgmma); this one is " \
                         << gj::jit::Device::get().arch();                        \
    } while (0)

std::string case_name(const WgCase& c) {
    return spec_of(c).name + " n" + std::to_string(c.n) + " T" + std::to_string(c.T);
}

std::vector<WgCase> cases() {
    std::vector<WgCase> v;
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        // The plan's tile at small and real shapes.
        for (const auto& [k, n, T] : std::vector<std::tuple<int, int, int>>{{64, 32, 1},
                                                                            {64, 200, 5},
                                                                            {128, 200, 63},
                                                                            {128, 32, 65},
                                                                            {96, 200, 64},
                                                                            {160, 512, 130},
                                                                            {64, 33, 65},
                                                                            {2560, 2560, 512},
                                                                            {2560, 512, 130},
                                                                            {2560, 200, 65},
                                                                            {10240, 2560, 65},
                                                                            {10240, 512, 5},
                                                                            {2560, 2048, 512},
                                                                            {2560, 4096, 64},
                                                                            {2560, 10240, 130},
                                                                            {2048, 2560, 130},
                                                                            {21504, 520, 70},
                                                                            {5376, 1000, 512}})
            for (bool producer : {true, false})  // the flag's two plans (the same for BN 128)
                v.push_back({t, k, n, T, true, GemmWgmmaTile{.producer = producer}});
        // Every tile: partial tiles in both directions, odd rows, a half last step.
        for (const auto& tl : kTiles) {
            v.push_back({t, 2560, 201, 130, false, tl});
            v.push_back({t, 96, 200, 65, false, tl});
        }
    }
    std::set<std::string> seen;  // one case per spec and shape
    std::erase_if(v, [&](const WgCase& c) { return !seen.insert(case_name(c)).second; });
    return v;
}

// Launches one entry: grid (ceil(n / R), ceil(T / BM)) with R = BN for the plain entry and BN / 2
// for the GeGLU ones, block THREADS, SMEM bytes. A split-K plain entry writes its SPLITS planes to
// `work` (T * n * SPLITS floats), then gemm_wgmma_reduce sums them into y (and, with y_bf16,
// gemm_wgmma_reduce_bf16 into y_bf16).
void run_entry(const GpuKernels& g, const KernelSpec& s, const char* entry, CUdeviceptr w,
               CUdeviceptr u, CUdeviceptr x, CUdeviceptr y, int T, int n, bool sync = true,
               CUdeviceptr work = 0, CUdeviceptr y_bf16 = 0) {
    const unsigned bm = unsigned(spec_constant(s, "BM")), bn = unsigned(spec_constant(s, "BN"));
    const bool plain = std::strcmp(entry, "gemm_wgmma") == 0;
    const unsigned rows = plain ? bn : bn / 2;
    const unsigned splits = plain ? unsigned(spec_constant(s, "SPLITS")) : 1;
    std::unique_ptr<DeviceBuffer> own;
    if (splits > 1 && !work) {
        own = std::make_unique<DeviceBuffer>(size_t(T) * n * splits * 4);
        work = own->ptr();
    }
    launch_smem_async(g.get(s.name, entry), {ceil_div(n, rows), ceil_div(T, bm), splits},
                      {unsigned(spec_constant(s, "THREADS"))}, unsigned(spec_constant(s, "SMEM")),
                      w, u, x, splits > 1 ? work : y, T, n);
    if (splits > 1)
        launch_smem_async(g.get(s.name, "gemm_wgmma_reduce"), {ceil_div(size_t(T) * n, 256)}, {256},
                          0, work, y, T * n);
    if (splits > 1 && y_bf16)
        launch_smem_async(g.get(s.name, "gemm_wgmma_reduce_bf16"), {ceil_div(size_t(T) * n, 256)},
                          {256}, 0, work, y_bf16, T * n);
    if (sync || own) gj::jit::Device::get().synchronize();
}

float bf16_round(float v) {
    return gj::bf16_to_f32(gj::f32_to_bf16(v));
}

// Sampled indices: all of [0, n) when n <= all, else the first and last `edge` and every
// `stride`-th in between.
std::vector<int> sample(int n, int all, int edge, int stride) {
    std::vector<int> v;
    for (int i = 0; i < n; ++i)
        if (n <= all || i < edge || i >= n - edge || i % stride == 0) v.push_back(i);
    return v;
}

class GemmWgmma : public ::testing::TestWithParam<WgCase> {};

TEST_P(GemmWgmma, MatchesDequantizedReference) {
    GJ_REQUIRE_SM90();
    const WgCase c = GetParam();
    const KernelSpec spec = spec_of(c);
    SCOPED_TRACE(case_name(c));
    const GpuKernels& g = kernels_for(spec);
    std::mt19937 rng(c.k * 131 + c.n * 7 + c.T);
    std::vector<float> wf, uf;
    const auto wb = random_weights(c.type, c.n, c.k, rng, wf);
    const auto ub = random_weights(c.type, c.n, c.k, rng, uf);
    const auto x = random_normal(size_t(c.T) * c.k, 1.0f, rng);
    std::vector<uint16_t> xb(x.size());
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = gj::f32_to_bf16(x[i]);
        xr[i] = gj::bf16_to_f32(xb[i]);
    }
    auto dw = to_device(split_layout(c.type, wb, c.n, c.k));
    auto du = to_device(split_layout(c.type, ub, c.n, c.k));
    auto dx = to_device(xb);
    // Outputs with a guard tail; all bytes 0xff first (fp32 NaN / bf16 NaN patterns), so unwritten
    // elements show up and writes past the end change the guard.
    const size_t ny = size_t(c.T) * c.n, guard = 4096;
    const std::vector<uint8_t> ones((ny + guard) * 4, 0xff);
    auto y = to_device(ones), yg = to_device(ones), yb = to_device(ones), ys16 = to_device(ones);
    run_entry(g, spec, "gemm_wgmma", dw.ptr(), 0, dx.ptr(), y.ptr(), c.T, c.n, true, 0, ys16.ptr());
    run_entry(g, spec, "gemm_wgmma_geglu", dw.ptr(), du.ptr(), dx.ptr(), yg.ptr(), c.T, c.n);
    run_entry(g, spec, "gemm_wgmma_geglu_bf16", dw.ptr(), du.ptr(), dx.ptr(), yb.ptr(), c.T, c.n);
    const auto ys = from_device<float>(y, ny + guard);
    const auto ygs = from_device<float>(yg, ny + guard);
    const auto ybs = from_device<uint16_t>(yb, (ny + guard) * 2);

    uint32_t pattern;
    std::memcpy(&pattern, ones.data(), 4);
    for (size_t i = ny; i < ny + guard; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &ys[i], 4);
        std::memcpy(&b, &ygs[i], 4);
        ASSERT_TRUE(a == pattern && b == pattern) << "write past [T][n_rows] at " << i;
    }
    for (size_t i = ny; i < 2 * (ny + guard); ++i)
        ASSERT_EQ(ybs[i], 0xffff) << "bf16 write past [T][n_rows] at " << i;
    // A split-K spec's bf16 sum (the input of a tensor-parallel bf16 all-reduce): the fp32 sum
    // rounded, bit for bit, and nothing written past it.
    if (spec_constant(spec, "SPLITS") > 1) {
        const auto s16 = from_device<uint16_t>(ys16, (ny + guard) * 2);
        size_t wrong = 0;
        for (size_t i = 0; i < ny; ++i) wrong += s16[i] != gj::f32_to_bf16(ys[i]);
        EXPECT_EQ(wrong, 0u) << "gemm_wgmma_reduce_bf16 outputs that are not bf16(the fp32 sum)";
        for (size_t i = ny; i < 2 * (ny + guard); ++i)
            ASSERT_EQ(s16[i], 0xffff) << "reduce_bf16 write past [T][n_rows] at " << i;
    }
    int failures = 0;
    for (size_t o = 0; o < ny && failures < 10; ++o) {
        if (!std::isfinite(ys[o]) || !std::isfinite(ygs[o])) {
            ADD_FAILURE() << "output " << o / c.n << "," << o % c.n << " not written or not finite";
            ++failures;
        } else if (ybs[o] != gj::f32_to_bf16(ygs[o])) {
            ADD_FAILURE() << "bf16 GeGLU at " << o / c.n << "," << o % c.n << ": " << ybs[o]
                          << " vs bf16(" << ygs[o] << ") = " << gj::f32_to_bf16(ygs[o]);
            ++failures;
        }
    }

    // bf16-rounded weights, as the kernel's mma sees them.
    std::vector<float> wr(wf.size()), ur(uf.size());
    for (size_t i = 0; i < wf.size(); ++i) wr[i] = bf16_round(wf[i]), ur[i] = bf16_round(uf[i]);
    const double acc_eps = (c.k / 16 + 32) * 0x1p-23;
    const auto tokens = sample(c.T, 130, 64, 17);
    const auto rows = sample(c.n, 640, 160, 5);
    for (int t : tokens)
        for (int r : rows) {
            if (failures >= 10) break;
            const float* xt = &xr[size_t(t) * c.k];
            const float* x32 = &x[size_t(t) * c.k];
            double gate = 0, up = 0, mag_w = 0, mag_u = 0, exact = 0;
            for (int j = 0; j < c.k; ++j) {
                const size_t wi = size_t(r) * c.k + j;
                gate += double(wr[wi]) * xt[j];
                up += double(ur[wi]) * xt[j];
                mag_w += std::fabs(double(wr[wi]) * xt[j]);
                mag_u += std::fabs(double(ur[wi]) * xt[j]);
                exact += double(wf[wi]) * x32[j];
            }
            const double tol_w = acc_eps * mag_w + 1e-30, tol_u = acc_eps * mag_u + 1e-30;
            const size_t o = size_t(t) * c.n + r;
            const double gelu = gelu_tanh(float(gate));
            const double want_geglu = gelu * up;
            const double tol_geglu = 1.2 * tol_w * std::fabs(up) + tol_u * std::fabs(gelu) +
                                     1e-6 * std::fabs(want_geglu);
            const bool ok = std::fabs(ys[o] - gate) <= tol_w &&
                            std::fabs(ys[o] - exact) <= tol_w + 0x1p-8 * mag_w &&
                            std::fabs(ygs[o] - want_geglu) <= tol_geglu;
            if (!ok) {
                ++failures;
                ADD_FAILURE() << "t=" << t << " row=" << r << ": gemm_wgmma " << ys[o] << " vs "
                              << gate << " (tol " << tol_w << ", fp32 product " << exact
                              << "); geglu " << ygs[o] << " vs " << want_geglu << " (tol "
                              << tol_geglu << ")";
            }
        }
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmWgmma, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<WgCase>& info) {
                             std::string s = case_name(info.param);
                             for (char& ch : s)
                                 if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return s;
                         });

// Timing at the E4B and 31B prefill shapes, T = 512 (or GJ_BENCH_T): the plan's tile and the
// candidates. TFLOP/s = 2 * T * n * k (times 2 for the GeGLU entries) / time.
TEST(GemmWgmmaBench, DISABLED_Shapes) {
    GJ_REQUIRE_SM90();
    struct Shape {
        int k, n;
        bool geglu;
    };
    const std::vector<Shape> shapes = {
        {2560, 2048, false},  {2560, 512, false},   {2048, 2560, false}, {2560, 10240, true},
        {10240, 2560, false}, {5376, 8192, false},  {5376, 4096, false}, {8192, 5376, false},
        {5376, 16384, false}, {16384, 5376, false}, {5376, 21504, true}, {21504, 5376, false}};
    const int T = gj::test::env_positive_int("GJ_BENCH_T", 512);  // the chunk length
    // GJ_BENCH_PLAN_ONLY=1: only the plan's tile, in both forms (producer warpgroup or not).
    const char* plan_only_env = std::getenv("GJ_BENCH_PLAN_ONLY");
    const bool plan_only = plan_only_env && std::strcmp(plan_only_env, "1") == 0;
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto candidates = [&](ggml::Type t, const Shape& sh) {
        std::vector<KernelSpec> v = {gj::gemma4::gemm_wgmma_spec(t, sh.k, sh.n, true),
                                     gj::gemma4::gemm_wgmma_spec(t, sh.k, sh.n, false)};
        if (!plan_only)
            for (const auto& tl : kTiles) v.push_back(gj::gemma4::gemm_wgmma_spec(t, sh.k, tl));
        return v;
    };
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0})
        for (const auto& sh : shapes)
            for (const auto& s : candidates(t, sh))
                if (seen.insert(s.name).second) specs.push_back(s);
    const auto t0 = std::chrono::steady_clock::now();
    GpuKernels g(specs);
    std::printf("compiled %zu bench specs in %.1f s\n", specs.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const auto& c : g.compiled()) {
        std::printf("%-40s", c.spec.name.c_str());
        for (size_t i = 0; i < c.spec.entries.size(); ++i)
            std::printf(" %s:r%d/s%d", c.spec.entries[i].c_str(),
                        c.resources_per_entry[i].registers,
                        c.resources_per_entry[i].spill_store_bytes);
        std::printf("\n");
    }
    auto& dev = gj::jit::Device::get();
    std::mt19937 rng(5);
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0})
        for (const auto& sh : shapes) {
            std::vector<float> unused;
            const auto wb = random_weights(t, sh.n, sh.k, rng, unused);
            auto dw = to_device(split_layout(t, wb, sh.n, sh.k));
            auto du = to_device(split_layout(t, wb, sh.n, sh.k));
            std::vector<uint16_t> xb(size_t(T) * sh.k);
            for (auto& v : xb) v = gj::f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
            auto dx = to_device(xb);
            DeviceBuffer y(size_t(T) * sh.n * 4), work(size_t(T) * sh.n * 4 * 4);
            const std::string plan = gj::gemma4::gemm_wgmma_spec(t, sh.k, sh.n, true).name;
            for (const auto& s : candidates(t, sh))
                for (const char* entry :
                     {"gemm_wgmma", "gemm_wgmma_geglu", "gemm_wgmma_geglu_bf16"}) {
                    if (sh.geglu != (std::strcmp(entry, "gemm_wgmma") != 0)) continue;
                    auto one = [&] {
                        run_entry(g, s, entry, dw.ptr(), du.ptr(), dx.ptr(), y.ptr(), T, sh.n,
                                  false, work.ptr());
                    };
                    dev.synchronize();
                    for (int i = 0; i < 5; ++i) one();
                    dev.synchronize();
                    const int reps = 50;
                    const auto st = std::chrono::steady_clock::now();
                    for (int i = 0; i < reps; ++i) one();
                    dev.synchronize();
                    const double sec =
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - st)
                            .count() /
                        reps;
                    const double flop =
                        2.0 * T * sh.n * double(sh.k) * (std::strcmp(entry, "gemm_wgmma") ? 2 : 1);
                    std::printf("%-5s %-36s %-22s k%-6d n%-6d %8.2f us %6.1f TFLOP/s%s\n",
                                ggml::type_name(t).c_str(), s.name.c_str(), entry, sh.k, sh.n,
                                sec * 1e6, flop / sec / 1e12, s.name == plan ? "  <- plan" : "");
                }
        }
}

}  // namespace
