// Model kernels on the GPU against CPU references on random data: quantize_q8_1, rmsnorm (with and
// without weight, per head, residual add, fused quantization, and rmsnorm_ext: the layer output
// scale and the chained second norm) and the Q8_0 / Q4_0 matvecs (both layouts, all epilogues,
// the real widths and the tiny presets' 32 / 96, odd block counts per row, 1 to 8 columns, row
// counts that do not fill the last block), and the K-quant (Q4_K, Q5_K, Q6_K) and Q4_1 / Q5_0 /
// Q5_1 matvecs in their GGUF blocks and their split layouts the same ways (the GPU repack
// checked byte for byte against the CPU's).
// MatvecBench.DISABLED_E4bFfnShapes measures bandwidth (run with --gtest_also_run_disabled_tests).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/quantize_q8_1.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/matvec_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::MatvecLayout;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

struct MatvecCase {
    ggml::Type type;
    MatvecLayout layout;
    int k, n, threads, rows, ncols;
    int unroll = 0;  // 0: the plan's, at most 4
};

void check_matvec(const MatvecCase& c) {
    // Batches of 4 units, or the plan's own smaller batches of the K-quants' larger units.
    const int unroll =
        c.unroll > 0 ? c.unroll
                     : std::min<int>(4, gj::gemma4::spec_constant(
                                            gj::gemma4::matvec_spec(c.type, c.k, c.ncols, c.layout),
                                            "UNROLL"));
    const KernelSpec spec =
        matvec_variant(c.type, c.k, c.ncols, c.layout, c.threads, c.rows, unroll);
    SCOPED_TRACE(spec.name + " n=" + std::to_string(c.n));
    GpuKernels g({spec});
    std::mt19937 rng(c.k * 31 + c.n);
    std::vector<float> wf, uf;
    const auto wb = random_weights(c.type, c.n, c.k, rng, wf);
    const auto ub = random_weights(c.type, c.n, c.k, rng, uf);
    const auto x = random_normal(size_t(c.ncols) * c.k, 1.0f, rng);
    const auto res = random_normal(size_t(c.ncols) * c.n, 1.0f, rng);
    const Q81 q = quantize_q8_1(x.data(), x.size());
    auto dw = weights_on_device(g, spec, c.type, wb, c.n, c.k, c.layout);
    auto du = weights_on_device(g, spec, c.type, ub, c.n, c.k, c.layout);
    auto dxq = to_device(q.q);
    auto dxds = to_device(interleave(q));
    const size_t ny = size_t(c.ncols) * c.n;
    DeviceBuffer y_store(ny * 4), y_geglu(ny * 4);
    auto y_add = to_device(res);  // residual aliases the output
    const std::string base = spec.entries[0];
    const gj::jit::LaunchDims grid{ceil_div(c.n, c.rows)}, block{unsigned(c.threads)};
    const CUdeviceptr none = 0;
    launch(g.get(spec.name, base), grid, block, dw.ptr(), none, dxq.ptr(), dxds.ptr(), none,
           y_store.ptr(), c.n);
    launch(g.get(spec.name, base + "_add"), grid, block, dw.ptr(), none, dxq.ptr(), dxds.ptr(),
           y_add.ptr(), y_add.ptr(), c.n);
    // The GeGLU entry in its own launch shape where the spec gives it one (the plan's GEGLU_*).
    const auto gl = gj::gemma4::matvec_launch(spec, true);
    launch(g.get(spec.name, base + "_geglu"), {ceil_div(c.n, gl.rows)}, {gl.threads}, dw.ptr(),
           du.ptr(), dxq.ptr(), dxds.ptr(), none, y_geglu.ptr(), c.n);
    const auto ys = from_device<float>(y_store, ny);
    const auto ya = from_device<float>(y_add, ny);
    const auto yg = from_device<float>(y_geglu, ny);
    ASSERT_TRUE(all_finite(ys) && all_finite(ya) && all_finite(yg)) << "NaN/inf in the output";

    // The multi entry (a layer's Q, K and V in one launch): each matrix's blocks compute what
    // the plain entry computes, bit for bit, with three matrices and with two (specs that have
    // it: not the batched split K-quants).
    if (std::find(spec.entries.begin(), spec.entries.end(), base + "_multi") !=
        spec.entries.end()) {
        DeviceBuffer y_up(ny * 4), m0(ny * 4), m1(ny * 4), m2(ny * 4);
        launch(g.get(spec.name, base), grid, block, du.ptr(), none, dxq.ptr(), dxds.ptr(), none,
               y_up.ptr(), c.n);
        const auto yu = from_device<float>(y_up, ny);
        const unsigned blocks = ceil_div(c.n, c.rows);
        const auto& multi = g.get(spec.name, base + "_multi");
        launch(multi, {3 * blocks}, block, dw.ptr(), du.ptr(), dw.ptr(), dxq.ptr(), dxds.ptr(),
               m0.ptr(), m1.ptr(), m2.ptr(), c.n, c.n, c.n);
        EXPECT_EQ(from_device<float>(m0, ny), ys) << "multi: first matrix";
        EXPECT_EQ(from_device<float>(m1, ny), yu) << "multi: second matrix";
        EXPECT_EQ(from_device<float>(m2, ny), ys) << "multi: third matrix";
        DeviceBuffer t0(ny * 4), t1(ny * 4);
        launch(multi, {2 * blocks}, block, du.ptr(), dw.ptr(), none, dxq.ptr(), dxds.ptr(),
               t0.ptr(), t1.ptr(), none, c.n, c.n, 0);
        EXPECT_EQ(from_device<float>(t0, ny), yu) << "multi of two: first matrix";
        EXPECT_EQ(from_device<float>(t1, ny), ys) << "multi of two: second matrix";
    }

    int failures = 0;
    for (int col = 0; col < c.ncols && failures < 10; ++col)
        for (int r = 0; r < c.n && failures < 10; ++r) {
            const size_t o = size_t(col) * c.n + r;
            double scale_w, scale_u;
            const double exact =
                matvec_row_q81(&wf[size_t(r) * c.k], q, size_t(col) * c.k, c.k, &scale_w);
            const double up =
                matvec_row_q81(&uf[size_t(r) * c.k], q, size_t(col) * c.k, c.k, &scale_u);
            // Exact path (same int8 activations): only fp32 accumulation order differs, a few
            // roundings of partial sums bounded by sum |w * x|: 1e-5 of that.
            const double tol_w = 1e-5 * scale_w + 1e-30, tol_u = 1e-5 * scale_u + 1e-30;
            // Against fp32 activations: int8 activation rounding, ~6e-3 of the row's magnitude
            // sqrt(sum (w x)^2) in rms; 5e-2 is about 8 sigma.
            double fp32 = 0, mag2 = 0;
            for (int j = 0; j < c.k; ++j) {
                const double t = double(wf[size_t(r) * c.k + j]) * x[size_t(col) * c.k + j];
                fp32 += t;
                mag2 += t * t;
            }
            const double gate_out = gelu_tanh(float(exact));
            const double want_geglu = gate_out * up;
            const double tol_geglu = 1.2 * tol_w * std::fabs(up) + tol_u * std::fabs(gate_out) +
                                     1e-6 * std::fabs(want_geglu);
            const bool ok =
                std::fabs(ys[o] - exact) <= tol_w &&
                std::fabs(ys[o] - fp32) <= 5e-2 * std::sqrt(mag2) &&
                std::fabs(ya[o] - (res[o] + exact)) <= tol_w + 1e-6 * std::fabs(res[o]) &&
                std::fabs(yg[o] - want_geglu) <= tol_geglu;
            if (!ok) {
                ++failures;
                ADD_FAILURE() << "row " << r << " col " << col << ": y " << ys[o] << " exact "
                              << exact << " (tol " << tol_w << ") fp32 " << fp32 << "; add "
                              << ya[o] << " want " << res[o] + exact << "; geglu " << yg[o]
                              << " want " << want_geglu << " (tol " << tol_geglu << ")";
            }
        }
}

}  // namespace

TEST(QuantizeQ81, MatchesCpuBitForBit) {
    GJ_REQUIRE_GPU();
    std::mt19937 rng(11);
    const int k = 2560, rows = 3;
    auto x = random_normal(size_t(k) * rows, 2.0f, rng);
    std::fill(x.begin(), x.begin() + 32, 0.0f);              // all-zero block: d = 0, q = 0
    x[40] = 1000.0f;                                         // one dominant value
    for (int j = 64; j < 96; ++j) x[j] = 1e-30f * (j - 80);  // tiny values
    for (int j = 96; j < 128; ++j) x[j] = 0.5f * (j % 4);    // exact ties after scaling
    const KernelSpec spec = gj::gemma4::quantize_spec();
    GpuKernels g({spec});
    auto dx = to_device(x);
    const int n_blocks = k * rows / 32;
    DeviceBuffer dq(size_t(k) * rows), dds(size_t(n_blocks) * 8);
    launch(g.get(spec.name, "quantize_q8_1"), {ceil_div(8 * n_blocks, 256)}, {256}, dx.ptr(),
           dq.ptr(), dds.ptr(), n_blocks);
    const Q81 want = quantize_q8_1(x.data(), x.size());
    EXPECT_EQ(from_device<int8_t>(dq, x.size()), want.q);
    const auto ds = from_device<float>(dds, 2 * size_t(n_blocks));
    for (int b = 0; b < n_blocks; ++b) {
        EXPECT_EQ(ds[2 * b], want.d[b]) << "block " << b;
        EXPECT_EQ(ds[2 * b + 1], want.s[b]) << "block " << b;
    }
}

struct NormCase {
    int n, rows;
    bool weight, quant, add, in_place;
};

std::string case_name(const NormCase& c) {
    return fmt::format("n{}_rows{}{}{}{}{}", c.n, c.rows, c.weight ? "_w" : "",
                       c.quant ? "_q8" : "", c.add ? "_add" : "", c.in_place ? "_inplace" : "");
}
// gtest prints parameters (and ctest shows them in test names) through PrintTo.
void PrintTo(const NormCase& c, std::ostream* os) {
    *os << case_name(c);
}

class RmsNormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormTest, MatchesCpu) {
    GJ_REQUIRE_GPU();
    const NormCase c = GetParam();
    const KernelSpec spec = gj::gemma4::rmsnorm_spec(c.n, c.weight, c.quant, c.add);
    SCOPED_TRACE(spec.name + " rows=" + std::to_string(c.rows));
    GpuKernels g({spec});
    std::mt19937 rng(c.n + c.rows);
    const size_t total = size_t(c.n) * c.rows;
    const auto x = random_normal(total, 3.0f, rng);
    const auto w = random_normal(c.n, 1.0f, rng);
    const auto res = random_normal(total, 1.0f, rng);
    const float eps = 1e-6f;
    auto dx = to_device(x);
    auto dw = to_device(w);
    auto dres = to_device(res);
    DeviceBuffer dy_sep(total * 4), dq(total), dds(total / 32 * 8 + 8);
    // In place: y aliases x (plain) or the residual (add), as the decode path uses them.
    const CUdeviceptr y = c.in_place ? (c.add ? dres.ptr() : dx.ptr()) : dy_sep.ptr();
    const CUdeviceptr none = 0;
    const unsigned tpr = unsigned(gj::gemma4::spec_constant(spec, "TPR"));
    const unsigned rpb = unsigned(gj::gemma4::spec_constant(spec, "RPB"));
    const auto& k = g.get(spec.name, "rmsnorm");
    launch(k, {ceil_div(c.rows, rpb)}, {tpr * rpb}, dx.ptr(), c.weight ? dw.ptr() : none,
           c.add ? dres.ptr() : none, y, c.quant ? dq.ptr() : none, c.quant ? dds.ptr() : none,
           c.rows, eps);
    const auto want =
        rmsnorm(x, c.rows, c.n, c.weight ? w.data() : nullptr, c.add ? res.data() : nullptr, eps);
    const DeviceBuffer& ybuf = c.in_place ? (c.add ? dres : dx) : dy_sep;
    const auto got = from_device<float>(ybuf, total);
    ASSERT_TRUE(all_finite(got));
    for (size_t i = 0; i < total; ++i) {
        // fp32 vs double: the sum of squares and a few products, ~1e-6 relative; 1e-5 bound on
        // the normed part, plus the residual's own magnitude when added.
        const double normed = want[i] - (c.add ? res[i] : 0.0f);
        ASSERT_NEAR(got[i], want[i],
                    1e-5 * (std::fabs(normed) + (c.add ? std::fabs(res[i]) : 0)) + 1e-7)
            << "element " << i;
    }
    if (c.quant) {
        // The quantized output is exactly the quantization of the fp32 output it wrote.
        const Q81 q = quantize_q8_1(got.data(), got.size());
        EXPECT_EQ(from_device<int8_t>(dq, total), q.q);
        EXPECT_EQ(from_device<float>(dds, total / 16), interleave(q));
        // y may be null when only the quantized output is wanted; same result.
        ASSERT_FALSE(c.add && c.in_place) << "test case: the residual was overwritten";
        DeviceBuffer dq2(total);
        launch(k, {ceil_div(c.rows, rpb)}, {tpr * rpb}, dx.ptr(), c.weight ? dw.ptr() : none,
               c.add ? dres.ptr() : none, none, dq2.ptr(), dds.ptr(), c.rows, eps);
        EXPECT_EQ(from_device<int8_t>(dq2, total), q.q);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RmsNormTest,
    ::testing::Values(NormCase{2560, 1, true, true, false, false},    // attn_norm -> q8
                      NormCase{2560, 3, true, false, true, true},     // post-norm + residual
                      NormCase{1536, 2, true, true, false, false},    // E2B width
                      NormCase{5376, 2, true, true, false, false},    // 31B: last thread partial
                      NormCase{3840, 1, true, false, true, false},    // 12B
                      NormCase{2816, 2, false, false, false, false},  // MoE router norm
                      NormCase{256, 24, true, false, false, true},    // Q/K norm per head
                      NormCase{512, 5, false, false, false, false},   // V-norm, rows % RPB != 0
                      NormCase{256, 13, false, false, false, false},
                      NormCase{256, 9, true, true, false, false},  // PLE slices, quantized
                      NormCase{2560, 2, true, true, true, false},  // residual, quantized
                      NormCase{128, 3, true, true, true, false},   // tiny d
                      NormCase{128, 5, true, false, true, true}),  // tiny post-norm
    [](const ::testing::TestParamInfo<NormCase>& i) { return case_name(i.param); });

namespace {  // beside MatvecCase, so gtest finds PrintTo by argument-dependent lookup
std::string case_name(const MatvecCase& c) {
    return fmt::format("{}{}_k{}_n{}_t{}_r{}_c{}{}", gj::ggml::type_name(c.type),
                       c.layout == MatvecLayout::Split ? "_split" : "", c.k, c.n, c.threads, c.rows,
                       c.ncols, c.unroll > 0 ? fmt::format("_u{}", c.unroll) : "");
}
void PrintTo(const MatvecCase& c, std::ostream* os) {
    *os << case_name(c);
}
}  // namespace

class MatvecTest : public ::testing::TestWithParam<MatvecCase> {};

TEST_P(MatvecTest, MatchesCpu) {
    GJ_REQUIRE_GPU();
    check_matvec(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatvecTest,
    ::testing::Values(
        // K = 256, 2560, 10240; N not a multiple of ROWS; units % THREADS != 0 (2560 / 128).
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Ggml, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Ggml, 2560, 1000, 128, 3, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Ggml, 10240, 301, 256, 2, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Ggml, 2112, 130, 64, 1, 2},  // 2 columns
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 2560, 1000, 64, 3, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 10240, 301, 128, 2, 2},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Ggml, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Ggml, 2560, 1000, 128, 3, 1},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Ggml, 10240, 301, 128, 2, 2},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Ggml, 704, 99, 32, 1, 1},  // MoE expert width
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 2560, 1000, 32, 3, 1},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 10240, 301, 64, 2, 1},
        // Tiny presets' widths (PLE P = 32, tiny-moe FFN 96: odd block counts, so every other
        // ggml row starts 2 bytes past a word) and 65 blocks per row; 8-column prefill batches.
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Ggml, 32, 129, 32, 1, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 32, 128, 32, 1, 8},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Ggml, 32, 131, 32, 1, 2},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 32, 128, 32, 1, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Ggml, 96, 129, 32, 1, 8},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 96, 127, 32, 2, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Ggml, 2080, 33, 64, 1, 1},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Ggml, 2080, 33, 64, 1, 1},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 2560, 300, 32, 1, 8},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 2560, 300, 32, 1, 8},
        // K-quants: one super-block per row (Q6_K rows of 210 bytes: every other row starts 2
        // bytes past a word), three, the E4B / 31B widths; partial thread coverage (5376 / 32 =
        // 168 units over 64 threads); 2 and 8 columns.
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Ggml, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Ggml, 2560, 1000, 32, 3, 1},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Ggml, 10240, 301, 64, 2, 2},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Ggml, 5376, 130, 64, 1, 8},
        // Split Q4_K: one super-block per row, E4B / 31B widths, partial coverage (80 units over
        // 128 threads), several rows per block over a ragged row count, 2 and 8 columns.
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 2560, 1000, 128, 2, 1},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 10240, 301, 32, 3, 2},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 5376, 130, 64, 1, 8},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 2560, 1000, 128, 2, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 10240, 301, 32, 3, 2},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 5376, 130, 64, 1, 8},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 2560, 1000, 128, 2, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 10240, 301, 32, 3, 2},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 5376, 130, 64, 1, 8},
        // The GeGLU shape of rows of at most 64 units (E2B's d 1536: 32 threads over 4 rows,
        // one unit per batch; split Q8_0's 96 16-element units there), ragged rows.
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 1536, 1027, 32, 4, 1, 1},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 1536, 1027, 32, 4, 1, 1},
        MatvecCase{ggml::Type::Q4_1, MatvecLayout::Split, 1536, 1027, 32, 4, 1, 1},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 1536, 1027, 32, 4, 1, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 1536, 1027, 32, 4, 1, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 1536, 1027, 32, 4, 1, 1},
        // E2B's FFN down rows (1536 rows, a Short matrix: 64 threads over 1 row, 2 units per
        // batch), k 6144 and 12288, in every type that takes that shape.
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 6144, 1536, 64, 1, 1, 2},
        MatvecCase{ggml::Type::Q4_0, MatvecLayout::Split, 12288, 1536, 64, 1, 1, 2},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 6144, 1536, 64, 1, 1, 2},
        MatvecCase{ggml::Type::Q8_0, MatvecLayout::Split, 12288, 1536, 64, 1, 1, 2},
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 6144, 1536, 64, 1, 1, 2},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 12288, 1536, 64, 1, 1, 2},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 6144, 1536, 64, 1, 1, 2},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 12288, 1536, 64, 1, 1, 2},
        // The split K-quants' GeGLU shape of rows of 65-96 units (E4B's d 2560: 80 units over
        // 96 threads, two rows), ragged rows.
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 2560, 1001, 96, 2, 1, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 2560, 1001, 96, 2, 1, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 2560, 1001, 96, 2, 1, 1},
        // Split Q4_K's plain / multi shape below 8192 (64 threads over 4 rows), ragged rows.
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 3840, 1001, 64, 4, 1},
        // The 31B's FFN down rows (a Tall matrix: 2 rows per 32-thread block), ragged rows.
        MatvecCase{ggml::Type::Q4_K, MatvecLayout::Split, 21504, 67, 32, 2, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Split, 21504, 67, 32, 2, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Split, 21504, 67, 32, 2, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Ggml, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Ggml, 2560, 1000, 32, 3, 1},
        MatvecCase{ggml::Type::Q5_K, MatvecLayout::Ggml, 768, 131, 32, 1, 8},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Ggml, 256, 77, 32, 1, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Ggml, 768, 131, 32, 2, 2},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Ggml, 2560, 1000, 32, 3, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Ggml, 10240, 301, 128, 2, 1},
        MatvecCase{ggml::Type::Q6_K, MatvecLayout::Ggml, 5376, 130, 32, 1, 8},
        // The 32-block fallbacks of K-quant files: one block per row, three (22-byte Q5_0 rows
        // that start 2 bytes past a word every other row), the 26B's 2112 and 704.
        MatvecCase{ggml::Type::Q4_1, MatvecLayout::Ggml, 32, 129, 32, 1, 1},
        MatvecCase{ggml::Type::Q4_1, MatvecLayout::Ggml, 2112, 300, 64, 3, 2},
        MatvecCase{ggml::Type::Q5_0, MatvecLayout::Ggml, 96, 127, 32, 2, 8},
        MatvecCase{ggml::Type::Q5_0, MatvecLayout::Ggml, 704, 131, 32, 1, 1},
        MatvecCase{ggml::Type::Q5_0, MatvecLayout::Ggml, 2112, 300, 128, 1, 1},
        MatvecCase{ggml::Type::Q5_1, MatvecLayout::Ggml, 96, 127, 32, 1, 2},
        MatvecCase{ggml::Type::Q5_1, MatvecLayout::Ggml, 2560, 1000, 64, 2, 1},
        // ... and in their split layout: one block per row, three, the 26B's 704 and 2112 with
        // several rows per block over ragged row counts, partial thread coverage, 2 and 8
        // columns.
        MatvecCase{ggml::Type::Q4_1, MatvecLayout::Split, 32, 129, 32, 1, 1},
        MatvecCase{ggml::Type::Q4_1, MatvecLayout::Split, 2112, 300, 64, 3, 2},
        MatvecCase{ggml::Type::Q5_0, MatvecLayout::Split, 96, 127, 32, 2, 8},
        MatvecCase{ggml::Type::Q5_0, MatvecLayout::Split, 704, 131, 32, 8, 1},
        MatvecCase{ggml::Type::Q5_0, MatvecLayout::Split, 2112, 300, 64, 4, 1},
        MatvecCase{ggml::Type::Q5_0, MatvecLayout::Split, 2112, 301, 128, 2, 8},
        MatvecCase{ggml::Type::Q5_1, MatvecLayout::Split, 96, 127, 32, 1, 2},
        MatvecCase{ggml::Type::Q5_1, MatvecLayout::Split, 2560, 1000, 64, 2, 1}),
    [](const ::testing::TestParamInfo<MatvecCase>& i) { return case_name(i.param); });

// The plan's own choice of THREADS/ROWS, for the E4B widths and the tiny ones, both layouts,
// decode and 8-column prefill batches; the K-quants at every width of whole super-blocks.
TEST(MatvecPlanSpecs, E4bAndTinyWidthsMatchCpu) {
    GJ_REQUIRE_GPU();
    struct Family {
        std::vector<ggml::Type> types;
        std::vector<MatvecLayout> layouts;
        std::vector<int> widths;
    };
    const std::vector<int> q32_widths = {2112, 704, 96, 32};
    const Family families[] = {
        {{ggml::Type::Q8_0, ggml::Type::Q4_0},
         {MatvecLayout::Ggml, MatvecLayout::Split},
         // ... and the slices of a tensor-parallel split (tiny over 2 GPUs: 64; 31B: 10752).
         {2560, 10240, 2048, 256, 128, 64, 32, 10752}},
        {{ggml::Type::Q4_1, ggml::Type::Q5_0, ggml::Type::Q5_1},
         {MatvecLayout::Ggml, MatvecLayout::Split},
         q32_widths},
        {{ggml::Type::Q4_K, ggml::Type::Q5_K, ggml::Type::Q6_K},
         {MatvecLayout::Ggml},
         {2560, 10240, 2048, 1536, 512, 256}},
        {{ggml::Type::Q4_K, ggml::Type::Q5_K, ggml::Type::Q6_K},
         {MatvecLayout::Split},
         {2560, 10240, 5376, 21504, 2048, 256}}};
    for (const Family& f : families)
        for (auto t : f.types)
            for (auto layout : f.layouts)
                for (int ncols : {1, 8})
                    for (int k : f.widths) {
                        const auto s = gj::gemma4::matvec_spec(t, k, ncols, layout);
                        check_matvec({t, layout, k, 515,
                                      int(gj::gemma4::spec_constant(s, "THREADS")),
                                      int(gj::gemma4::spec_constant(s, "ROWS")), ncols});
                    }
}

// rmsnorm_ext: x = (residual + norm(u) * w) [* scale] then [y2 = norm(x) * w2] [quantized].
struct NormExtCase {
    int n, rows;
    bool scale, norm2, quant;
};

class RmsNormExtTest : public ::testing::TestWithParam<NormExtCase> {};

TEST_P(RmsNormExtTest, MatchesCpu) {
    GJ_REQUIRE_GPU();
    const NormExtCase c = GetParam();
    const KernelSpec spec = gj::gemma4::rmsnorm_spec(c.n, true, c.quant, true, c.scale, c.norm2);
    SCOPED_TRACE(spec.name + " rows=" + std::to_string(c.rows));
    ASSERT_EQ(spec.entries, std::vector<std::string>{"rmsnorm_ext"});
    GpuKernels g({spec});
    std::mt19937 rng(c.n * 3 + c.rows);
    const size_t total = size_t(c.n) * c.rows;
    const auto u = random_normal(total, 3.0f, rng);
    const auto w = random_normal(c.n, 1.0f, rng);
    const auto w2 = random_normal(c.n, 1.0f, rng);
    const auto res = random_normal(total, 5.0f, rng);
    const std::vector<float> scale = {c.scale ? 0.37f : 1.0f};
    const float eps = 1e-6f;
    auto du = to_device(u), dw = to_device(w), dw2 = to_device(w2), dscale = to_device(scale);
    auto dres = to_device(res);  // updated in place: y aliases the residual
    DeviceBuffer dy2(total * 4), dq(total), dds(total / 32 * 8 + 8);
    const CUdeviceptr none = 0;
    const unsigned tpr = unsigned(gj::gemma4::spec_constant(spec, "TPR"));
    const unsigned rpb = unsigned(gj::gemma4::spec_constant(spec, "RPB"));
    launch(g.get(spec.name, "rmsnorm_ext"), {ceil_div(c.rows, rpb)}, {tpr * rpb}, du.ptr(),
           dw.ptr(), dres.ptr(), dres.ptr(), c.scale ? dscale.ptr() : none,
           c.norm2 ? dw2.ptr() : none, c.norm2 ? dy2.ptr() : none, c.quant ? dq.ptr() : none,
           c.quant ? dds.ptr() : none, c.rows, eps);
    const auto y = from_device<float>(dres, total);
    ASSERT_TRUE(all_finite(y));
    const auto want = rmsnorm_chain(u, c.rows, c.n, w.data(), res, scale[0], nullptr, eps);
    const auto normed = rmsnorm(u, c.rows, c.n, w.data(), nullptr, eps);
    for (size_t i = 0; i < total; ++i) {
        // fp32 vs double norm scale (~1e-6 relative), then one add and one multiply.
        const double tol = 1e-5 * (std::fabs(normed[i]) + std::fabs(res[i])) * scale[0] + 1e-7;
        ASSERT_NEAR(y[i], want.y[i], tol) << "element " << i;
    }
    std::vector<float> quantized_source = y;
    if (c.norm2) {
        // The second norm, against the CPU's norm of the GPU's first output.
        const auto y2 = from_device<float>(dy2, total);
        ASSERT_TRUE(all_finite(y2));
        const auto want2 = rmsnorm(y, c.rows, c.n, w2.data(), nullptr, eps);
        for (size_t i = 0; i < total; ++i)
            ASSERT_NEAR(y2[i], want2[i], 1e-5 * std::fabs(want2[i]) + 1e-7) << "y2 " << i;
        quantized_source = y2;
    }
    if (c.quant) {
        const Q81 q = quantize_q8_1(quantized_source.data(), total);
        EXPECT_EQ(from_device<int8_t>(dq, total), q.q);
        EXPECT_EQ(from_device<float>(dds, total / 16), interleave(q));
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RmsNormExtTest,
    ::testing::Values(NormExtCase{2560, 1, true, false, false},  // x = (x + norm(u)) * s
                      NormExtCase{2560, 3, true, true, true},    // ... then the next attn_norm
                      NormExtCase{2560, 2, false, true, true},   // post_attn + ffn_norm
                      NormExtCase{5376, 2, true, true, true},    // 31B: last thread partial
                      NormExtCase{1536, 1, false, true, false},  // float model: fp32 y2
                      NormExtCase{128, 7, true, true, true},     // tiny d: rows share a block
                      NormExtCase{128, 5, true, false, false}));

// Every output of one launch of a residual post-norm `spec` (its rmsnorm entry, or rmsnorm_ext
// with the layer scale 0.37 and the chained norm of weight w2) over `rows` rows of the input at
// `u`, with weight w and the residual `res` updated in place. Each output starts zeroed, so bytes
// a form does not write compare equal: yq holds Q8_1 bytes or f16 halves (QUANT 2), yds the Q8_1
// scales, y2 the chained norm.
namespace {
struct NormOutputs {
    std::vector<float> residual, y2, yds;
    std::vector<uint8_t> yq;
};
NormOutputs run_residual_norm(const GpuKernels& g, const KernelSpec& spec, const DeviceBuffer& u,
                              const std::vector<float>& w, const std::vector<float>& w2,
                              const std::vector<float>& res, int rows) {
    const size_t total = res.size();
    const bool ext = spec.entries.at(0) == "rmsnorm_ext";
    auto dw = to_device(w), dw2 = to_device(w2), dscale = to_device(std::vector<float>{0.37f}),
         dres = to_device(res), dy2 = to_device(std::vector<float>(total, 0.0f)),
         dds = to_device(std::vector<float>(total / 16, 0.0f));
    auto dq = to_device(std::vector<uint8_t>(total * 2, 0));
    const unsigned tpr = unsigned(gj::gemma4::spec_constant(spec, "TPR"));
    const unsigned rpb = unsigned(gj::gemma4::spec_constant(spec, "RPB"));
    if (ext)
        launch(g.get(spec.name, "rmsnorm_ext"), {ceil_div(rows, rpb)}, {tpr * rpb}, u.ptr(),
               dw.ptr(), dres.ptr(), dres.ptr(), dscale.ptr(), dw2.ptr(), dy2.ptr(), dq.ptr(),
               dds.ptr(), rows, 1e-6f);
    else
        launch(g.get(spec.name, "rmsnorm"), {ceil_div(rows, rpb)}, {tpr * rpb}, u.ptr(), dw.ptr(),
               dres.ptr(), dres.ptr(), dq.ptr(), dds.ptr(), rows, 1e-6f);
    return {from_device<float>(dres, total), from_device<float>(dy2, total),
            from_device<float>(dds, total / 16), from_device<uint8_t>(dq, total * 2)};
}

// Two launches' outputs bit for bit, the residual finite.
void expect_same_outputs(const NormOutputs& a, const NormOutputs& b) {
    ASSERT_TRUE(all_finite(a.residual));
    auto same = [](const auto& x, const auto& y) {
        return x.size() == y.size() &&
               std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
    };
    EXPECT_TRUE(same(a.residual, b.residual)) << "residual";
    EXPECT_TRUE(same(a.y2, b.y2)) << "y2";
    EXPECT_TRUE(same(a.yq, b.yq)) << "yq";
    EXPECT_TRUE(same(a.yds, b.yds)) << "yds";
}
}  // namespace

// PARTS: the post-norm reading the split-K partial planes of the int8 GEMM gives bitwise what it
// gives for their sum taken in plane order (as mmq_reduce sums them), for both entries.
TEST(RmsNormParts, SumsThePlanesLikeTheReduce) {
    GJ_REQUIRE_GPU();
    for (const bool ext : {false, true})
        for (const auto& [n, rows] : {std::pair{2560, 37}, std::pair{5376, 3}, std::pair{128, 9}}) {
            const int parts = 3;
            const KernelSpec split = gj::gemma4::rmsnorm_spec(n, true, true, true, ext, ext, parts);
            const KernelSpec whole = gj::gemma4::rmsnorm_spec(n, true, true, true, ext, ext);
            SCOPED_TRACE(split.name + " rows=" + std::to_string(rows));
            GpuKernels g({split, whole});
            std::mt19937 rng(n + rows);
            const size_t total = size_t(n) * rows;
            const auto planes = random_normal(parts * total, 2.0f, rng);
            std::vector<float> sum(total);
            for (size_t i = 0; i < total; ++i)
                sum[i] = (planes[i] + planes[total + i]) + planes[2 * total + i];
            const auto w = random_normal(n, 1.0f, rng), w2 = random_normal(n, 1.0f, rng);
            const auto res = random_normal(total, 5.0f, rng);
            expect_same_outputs(run_residual_norm(g, split, to_device(planes), w, w2, res, rows),
                                run_residual_norm(g, whole, to_device(sum), w, w2, res, rows));
        }
}

// X_BF16: the post-norms that read a tensor-parallel prefill chunk's bf16 all-reduce sum give
// bitwise what their fp32 forms give for the same values widened to fp32 (the conversion pass
// they replace is exact), for every form a split plans: Q8_1 and f16 outputs, with and without
// the layer scale and chained pre-norm, the PLE post-norm; rows sharing a block at a tiny width.
TEST(RmsNormBf16Input, ReadsTheSumLikeItsFloatForm) {
    GJ_REQUIRE_GPU();
    for (const auto& [n, rows] : {std::pair{5376, 3}, std::pair{2560, 37}, std::pair{64, 21}})
        for (const KernelSpec& xb : gj::gemma4::rmsnorm_bf16_input_specs(n, true).all()) {
            auto has = [&](const char* c) { return gj::gemma4::spec_constant(xb, c) != 0; };
            const bool half = gj::gemma4::spec_constant(xb, "QUANT") == 2;
            const KernelSpec fp = gj::gemma4::rmsnorm_spec(n, true, true, true, has("SCALE"),
                                                           has("NORM2"), 1, false, half);
            SCOPED_TRACE(xb.name + " rows=" + std::to_string(rows));
            ASSERT_EQ(xb.name, fp.name + ".xb16");
            GpuKernels g({xb, fp});
            std::mt19937 rng(n + rows);
            const size_t total = size_t(n) * rows;
            // The sum as NCCL leaves it (bf16, round to nearest even) and widened.
            std::vector<uint16_t> bits(total);
            std::vector<float> wide(total);
            const auto u = random_normal(total, 2.0f, rng);
            for (size_t i = 0; i < total; ++i) {
                uint32_t b;
                std::memcpy(&b, &u[i], 4);
                bits[i] = uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
                const uint32_t back = uint32_t(bits[i]) << 16;
                std::memcpy(&wide[i], &back, 4);
            }
            const auto w = random_normal(n, 1.0f, rng), w2 = random_normal(n, 1.0f, rng);
            const auto res = random_normal(total, 5.0f, rng);
            expect_same_outputs(run_residual_norm(g, xb, to_device(bits), w, w2, res, rows),
                                run_residual_norm(g, fp, to_device(wide), w, w2, res, rows));
        }
    // The bf16 input is one plane of a residual update.
    EXPECT_THROW(gj::gemma4::rmsnorm_spec(64, true, true, true, false, true, 2, false, false, true),
                 std::invalid_argument);
    EXPECT_THROW(
        gj::gemma4::rmsnorm_spec(64, true, true, false, false, false, 1, false, false, true),
        std::invalid_argument);
}

// rmsnorm_moe (a MoE layer's four norms after attention in one launch) gives bitwise what the
// separate launches give: rmsnorm_ext for the residual update and ffn_norm (with its Q8_1), the
// plain weighted norm of the updated residual for the router input, and the quantizing pre-norm
// for the experts' input; also over split-K partial planes.
TEST(RmsNormMoe, EqualsTheSeparateNorms) {
    GJ_REQUIRE_GPU();
    for (const auto& [n, rows, parts] :
         {std::tuple{2816, 5, 1}, std::tuple{2816, 37, 3}, std::tuple{128, 9, 1}}) {
        const KernelSpec moe =
            gj::gemma4::rmsnorm_spec(n, true, true, true, false, true, parts, true);
        const KernelSpec ext = gj::gemma4::rmsnorm_spec(n, true, true, true, false, true, parts);
        const KernelSpec plain = gj::gemma4::rmsnorm_spec(n, true);
        const KernelSpec pre = gj::gemma4::rmsnorm_spec(n, true, true);
        SCOPED_TRACE(moe.name + " rows=" + std::to_string(rows));
        ASSERT_EQ(moe.entries, std::vector<std::string>{"rmsnorm_moe"});
        GpuKernels g({moe, ext, plain, pre});
        std::mt19937 rng(n + rows * 5 + parts);
        const size_t total = size_t(n) * rows;
        const auto u = random_normal(parts * total, 2.0f, rng);
        const auto res = random_normal(total, 5.0f, rng);
        std::vector<std::vector<float>> w;
        for (int i = 0; i < 4; ++i) w.push_back(random_normal(n, 1.0f, rng));
        auto du = to_device(u), dw = to_device(w[0]), dw2 = to_device(w[1]), dw3 = to_device(w[2]),
             dw4 = to_device(w[3]);
        auto launch_dims = [](const KernelSpec& spec, int rows) {
            const unsigned tpr = unsigned(gj::gemma4::spec_constant(spec, "TPR"));
            const unsigned rpb = unsigned(gj::gemma4::spec_constant(spec, "RPB"));
            return std::pair{ceil_div(rows, rpb), tpr * rpb};
        };
        // The fused launch.
        auto x = to_device(res);
        DeviceBuffer y2(total * 4), yq(total), yds(total / 32 * 8), y3(total * 4), y4(total * 4),
            yq4(total), yds4(total / 32 * 8);
        auto [gm, bm] = launch_dims(moe, rows);
        launch(g.get(moe.name, "rmsnorm_moe"), {gm}, {bm}, du.ptr(), dw.ptr(), x.ptr(), x.ptr(),
               dw2.ptr(), y2.ptr(), yq.ptr(), yds.ptr(), dw3.ptr(), y3.ptr(), dw4.ptr(), y4.ptr(),
               yq4.ptr(), yds4.ptr(), rows, 1e-6f);
        // The separate launches.
        auto xr = to_device(res);
        DeviceBuffer r2(total * 4), rq(total), rds(total / 32 * 8), r3(total * 4), r4(total * 4),
            rq4(total), rds4(total / 32 * 8);
        const CUdeviceptr none = 0;
        auto [ge, be] = launch_dims(ext, rows);
        launch(g.get(ext.name, "rmsnorm_ext"), {ge}, {be}, du.ptr(), dw.ptr(), xr.ptr(), xr.ptr(),
               none, dw2.ptr(), r2.ptr(), rq.ptr(), rds.ptr(), rows, 1e-6f);
        auto [gp, bp] = launch_dims(plain, rows);
        launch(g.get(plain.name, "rmsnorm"), {gp}, {bp}, xr.ptr(), dw3.ptr(), none, r3.ptr(), none,
               none, rows, 1e-6f);
        auto [gq, bq] = launch_dims(pre, rows);
        launch(g.get(pre.name, "rmsnorm"), {gq}, {bq}, xr.ptr(), dw4.ptr(), none, r4.ptr(),
               rq4.ptr(), rds4.ptr(), rows, 1e-6f);
        const auto got_x = from_device<float>(x, total);
        ASSERT_TRUE(all_finite(got_x));
        EXPECT_EQ(got_x, from_device<float>(xr, total));
        EXPECT_EQ(from_device<float>(y2, total), from_device<float>(r2, total));
        EXPECT_EQ(from_device<int8_t>(yq, total), from_device<int8_t>(rq, total));
        EXPECT_EQ(from_device<float>(yds, total / 16), from_device<float>(rds, total / 16));
        EXPECT_EQ(from_device<float>(y3, total), from_device<float>(r3, total));
        EXPECT_EQ(from_device<float>(y4, total), from_device<float>(r4, total));
        EXPECT_EQ(from_device<int8_t>(yq4, total), from_device<int8_t>(rq4, total));
        EXPECT_EQ(from_device<float>(yds4, total / 16), from_device<float>(rds4, total / 16));
    }
}

// Decode bandwidth for the E4B FFN shapes (gate/up: 10240 x 2560, down: 2560 x 10240) over a
// grid of launch constants, plain and GeGLU entries. Weights rotate over enough copies to defeat
// the L2 cache. GJ_BENCH_TYPES picks the weight types (default q8_0,q4_0; K-quants and float
// types: ggml layout), GJ_BENCH_SHAPES the matrices ("NxK,...", default the E4B FFN pair),
// GJ_BENCH_LAYOUT one layout alone.
TEST(MatvecBench, DISABLED_E4bFfnShapes) {
    GJ_REQUIRE_GPU();
    struct Cfg {
        int threads, rows, unroll;
    };
    const std::vector<Cfg> cfgs = {{32, 1, 4},  {64, 1, 4},  {128, 1, 4}, {256, 1, 4}, {128, 2, 4},
                                   {64, 2, 4},  {128, 1, 8}, {256, 1, 8}, {128, 1, 2}, {128, 4, 2},
                                   {256, 2, 8}, {32, 2, 2},  {32, 4, 1},  {64, 2, 2},  {64, 4, 1},
                                   {32, 1, 2},  {256, 1, 2}, {512, 1, 1}, {32, 8, 1},  {64, 8, 1},
                                   {64, 1, 2},  {64, 4, 2},  {32, 2, 4},  {128, 2, 2}};
    struct Shape {
        int n, k;
    };
    // GJ_BENCH_SHAPES: "NxK,NxK,..." (rows x input width), default the E4B FFN pair.
    std::vector<Shape> shapes;
    const char* shapes_env = std::getenv("GJ_BENCH_SHAPES");
    const std::string shape_list = shapes_env ? shapes_env : "10240x2560,2560x10240";
    for (size_t p = 0; p < shape_list.size();) {
        const size_t e = std::min(shape_list.find(',', p), shape_list.size());
        Shape sh{};
        if (std::sscanf(shape_list.substr(p, e - p).c_str(), "%dx%d", &sh.n, &sh.k) == 2)
            shapes.push_back(sh);
        p = e + 1;
    }
    const char* env = std::getenv("GJ_BENCH_TYPES");
    std::vector<ggml::Type> types;
    std::string list = env ? env : "q8_0,q4_0";
    for (size_t p = 0; p <= list.size();) {
        const size_t e = std::min(list.find(',', p), list.size());
        if (auto t = ggml::type_from_name(list.substr(p, e - p))) types.push_back(*t);
        p = e + 1;
    }
    // GJ_BENCH_LAYOUT: "split" or "ggml" alone (default both, where the type has a split one).
    const char* layout_env = std::getenv("GJ_BENCH_LAYOUT");
    const std::string layout_only = layout_env ? layout_env : "";
    namespace su = gj::gemma4::spec_util;
    std::vector<std::pair<KernelSpec, int>> specs;  // spec, rows of its matrix
    for (auto t : types)
        for (auto layout : {MatvecLayout::Ggml, MatvecLayout::Split}) {
            if (!su::has_split(t) && layout == MatvecLayout::Split) continue;
            if (!layout_only.empty() &&
                layout_only != (layout == MatvecLayout::Split ? "split" : "ggml"))
                continue;
            for (const auto& sh : shapes) {
                for (const auto& c : cfgs)
                    specs.push_back(
                        {matvec_variant(t, sh.k, 1, layout, c.threads, c.rows, c.unroll), sh.n});
                KernelSpec plan = gj::gemma4::matvec_spec(t, sh.k, 1, layout);  // the plan's
                plan.name += fmt::format(".n{}", sh.n);
                specs.push_back({plan, sh.n});
            }
        }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<KernelSpec> unique;
    for (const auto& [spec, n] : specs)
        if (std::none_of(unique.begin(), unique.end(),
                         [&](const KernelSpec& u) { return u.name == spec.name; }))
            unique.push_back(spec);
    GpuKernels g(unique);
    std::printf("compiled %zu bench specs in %.1f s\n", unique.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::printf("%-44s %6s %6s %6s %9s %8s\n", "spec", "entry", "N", "K", "us", "GB/s");
    std::mt19937 rng(99);
    auto& dev = gj::jit::Device::get();
    std::map<std::tuple<int, int, int>, std::vector<uint8_t>> matrices;  // (type, n, k) -> blocks
    for (const auto& [spec, n] : specs) {
        const int k = int(gj::gemma4::spec_constant(spec, "K"));
        const bool is_f = spec.family == "matvec_f";
        const auto t = is_f ? ggml::Type(gj::gemma4::spec_constant(spec, "WTYPE"))
                            : *ggml::type_from_name(spec.family.substr(7));
        const auto layout = !is_f && gj::gemma4::spec_constant(spec, "LAYOUT") == 1
                                ? MatvecLayout::Split
                                : MatvecLayout::Ggml;
        const size_t bytes = gj::gemma4::matrix_bytes(t, layout, n, k);
        const int copies = int(std::max<size_t>(8, (400u << 20) / bytes));
        // Random bytes are fine for timing except the fp16 scales, which must not be NaN/inf:
        // all copies share one valid matrix's bytes.
        auto& blocks = matrices[{int(t) + 1000 * int(layout), n, k}];
        if (blocks.empty()) {
            std::vector<float> unused;
            blocks = random_weights(t, n, k, rng, unused);
            if (layout == MatvecLayout::Split) blocks = split_layout(t, blocks, n, k);
        }
        std::vector<DeviceBuffer> w;
        for (int i = 0; i < copies; ++i) w.push_back(to_device(blocks));
        const auto x = random_normal(k, 1.0f, rng);
        const Q81 q = quantize_q8_1(x.data(), x.size());
        auto dxq = to_device(q.q);
        auto dxds = to_device(interleave(q));
        auto dxf = to_device(x);
        DeviceBuffer y(size_t(n) * 4);
        const CUdeviceptr none = 0;
        for (int geglu = 0; geglu < 2; ++geglu) {
            const auto [threads, rows] = gj::gemma4::matvec_launch(spec, geglu == 1);
            const auto& kern = g.get(spec.name, spec.entries[geglu ? 2 : 0]);
            auto round = [&] {
                for (int i = 0; i < copies; i += 1 + geglu) {
                    const CUdeviceptr wu = geglu ? w[(i + 1) % copies].ptr() : none;
                    if (is_f)
                        launch_async(kern, {ceil_div(n, rows)}, {threads}, w[i].ptr(), wu,
                                     dxf.ptr(), none, y.ptr(), n);
                    else
                        launch_async(kern, {ceil_div(n, rows)}, {threads}, w[i].ptr(), wu,
                                     dxq.ptr(), dxds.ptr(), none, y.ptr(), n);
                }
            };
            round();
            dev.synchronize();
            const int reps = 10;
            const auto s = std::chrono::steady_clock::now();
            for (int r = 0; r < reps; ++r) round();
            dev.synchronize();
            const double sec =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
            const double per = sec / (reps * ((copies + geglu) / (1 + geglu)));
            const double moved = (1 + geglu) * double(bytes) + k + k / 32 * 8 + n * 4.0;
            std::printf("%-44s %6s %6d %6d %9.2f %8.1f\n", spec.name.c_str(),
                        geglu ? "geglu" : "plain", n, k, per * 1e6, moved / per / 1e9);
        }
    }
}
