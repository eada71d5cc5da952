// The PLE kernels on the GPU against the CPU reference: ple_finish (per-slice RMSNorm of the
// context projection mixed with the token rows) for the E2B, E4B and tiny shapes, T = 1 and
// T > 1, in place and not; gelu_mul (PLE injection) with the layer-strided PLE operand; and
// gelu_mul_q8, whose Q8_1 output must be exactly the quantization of gelu_mul's fp32 output.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/gpu/kernels/ple.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;

namespace {

struct Shape {
    int layers, p, T;
};

class PleFinishTest : public ::testing::TestWithParam<Shape> {};

TEST_P(PleFinishTest, MatchesCpu) {
    GJ_REQUIRE_GPU();
    const Shape c = GetParam();
    const KernelSpec spec = gj::gemma4::ple_finish_spec(c.layers, c.p);
    SCOPED_TRACE(spec.name + " T=" + std::to_string(c.T));
    GpuKernels g({spec});
    std::mt19937 rng(c.layers * c.p + c.T);
    const size_t total = size_t(c.T) * c.layers * c.p;
    const int d = 2560;
    // ctx = W_proj . e with e ~ sqrt(d) scale: entries of size ~sqrt(d); tok ~ 16 * N(0, 0.05).
    const auto ctx = random_normal(total, std::sqrt(float(d)), rng);
    const auto tok = random_normal(total, 0.8f, rng);
    const auto w = random_normal(c.p, 1.0f, rng);
    const float inv_sqrt_d = float(1.0 / std::sqrt(double(d))), eps = 1e-6f;
    const auto want = ple_finish(ctx, tok, w, c.p, inv_sqrt_d, eps);
    auto dctx = to_device(ctx), dtok = to_device(tok), dw = to_device(w);
    DeviceBuffer dout(total * 4);
    const auto& k = g.get(spec.name, "ple_finish");
    const unsigned grid = ceil_div(size_t(c.T) * c.layers, 4);
    launch(k, {grid}, {128}, dctx.ptr(), dtok.ptr(), dw.ptr(), dout.ptr(), c.T, inv_sqrt_d, eps);
    launch(k, {grid}, {128}, dctx.ptr(), dtok.ptr(), dw.ptr(), dctx.ptr(), c.T, inv_sqrt_d,
           eps);  // in place over ctx
    const auto got = from_device<float>(dout, total);
    const auto got_in_place = from_device<float>(dctx, total);
    ASSERT_TRUE(all_finite(got));
    for (size_t i = 0; i < total; ++i) {
        // The slice's sum of squares in fp32 vs double (~1e-6 relative on the norm scale) and
        // fused multiply-adds on the mix: 1e-5 of the two terms' magnitudes.
        const double normed = want[i] / 0.70710677 - tok[i];
        const double tol = 1e-5 * (std::fabs(normed) + std::fabs(tok[i])) + 1e-7;
        ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
        ASSERT_EQ(got_in_place[i], got[i]) << "in-place result differs at " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PleFinishTest,
                         ::testing::Values(Shape{42, 256, 1}, Shape{42, 256, 5},  // E4B
                                           Shape{35, 256, 3},                     // E2B
                                           Shape{8, 32, 1}, Shape{8, 32, 7}));    // tiny

class GeluMulTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GeluMulTest, MatchesCpuAndQuantizesItsOwnOutput) {
    GJ_REQUIRE_GPU();
    const Shape c = GetParam();
    const KernelSpec spec = gj::gemma4::gelu_mul_spec(c.p);
    SCOPED_TRACE(spec.name + " T=" + std::to_string(c.T));
    GpuKernels g({spec});
    std::mt19937 rng(c.p + c.T);
    const int lp = c.layers * c.p, layer = c.layers - 1;  // the last layer's slice
    const auto gate = random_normal(size_t(c.T) * c.p, 2.0f, rng);
    const auto ple = random_normal(size_t(c.T) * lp, 1.0f, rng);
    auto dgate = to_device(gate), dple = to_device(ple);
    const CUdeviceptr other = dple.ptr() + size_t(layer) * c.p * sizeof(float);
    const size_t n = size_t(c.T) * c.p;
    DeviceBuffer dout(n * 4), dq(n), dds(n / 32 * 8);
    launch(g.get(spec.name, "gelu_mul"), {ceil_div(n, 128)}, {128}, dgate.ptr(), other, lp,
           dout.ptr(), c.T);
    launch(g.get(spec.name, "gelu_mul_q8"), {ceil_div(n, 512)}, {128}, dgate.ptr(), other, lp,
           dq.ptr(), dds.ptr(), c.T);
    const auto got = from_device<float>(dout, n);
    ASSERT_TRUE(all_finite(got));
    for (int t = 0; t < c.T; ++t)
        for (int j = 0; j < c.p; ++j) {
            const size_t i = size_t(t) * c.p + j;
            const float o = ple[size_t(t) * lp + size_t(layer) * c.p + j];
            const double want = double(gelu_tanh(gate[i])) * o;
            // tanhf on the GPU vs the CPU: a few ulp of tanh, times 0.5 |x|, times |o|.
            const double tol = 1e-6 * std::fabs(gate[i] * o) + 1e-6 * std::fabs(want) + 1e-12;
            ASSERT_NEAR(got[i], want, tol) << "t " << t << " j " << j;
        }
    // Same fp32 values inside both entries: the quantized output is their exact quantization.
    const Q81 q = quantize_q8_1(got.data(), n);
    EXPECT_EQ(from_device<int8_t>(dq, n), q.q);
    const auto ds = from_device<float>(dds, n / 16);
    for (size_t b = 0; b < n / 32; ++b) {
        EXPECT_EQ(ds[2 * b], q.d[b]) << "block " << b;
        EXPECT_EQ(ds[2 * b + 1], q.s[b]) << "block " << b;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GeluMulTest,
                         ::testing::Values(Shape{42, 256, 1}, Shape{42, 256, 6}, Shape{35, 256, 1},
                                           Shape{8, 32, 1}, Shape{8, 32, 9}));

}  // namespace
