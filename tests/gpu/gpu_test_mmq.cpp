// The int8 tensor-core GEMM (kernel_templates/mmq.cu) on random Q8_0 / Q4_0 weights in the split
// layout against Q8_1 activations: every entry against a CPU reference (exact integer block dots,
// scaled in double), token counts and row counts that leave partial tiles (T = 1 .. 512, n_rows
// 32 .. 2560, odd), widths from the tiny presets' 64 / 128 to 10240, the plan's tiles and others
// (1 to 8 blocks per stage, ragged last stages, 1 or 2 GeGLU passes, 4 to 16 warps); mmq against
// the batched dp4a matvec (the exact path it replaces in prefill); mmq_geglu_q8 bit-identical to
// quantize_q8_1 over mmq_geglu's output; nothing written outside the outputs. All specs compile
// once, in parallel, when the first test runs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "engine/gguf/half.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/mmq.h"
#include "engine/gpu/kernels/moe.h"
#include "engine/gpu/kernels/quantize_q8_1.h"
#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::MatvecLayout;
using gj::gemma4::MmqTile;
using gj::gemma4::spec_constant;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

// Output buffers start as this NaN pattern; what lies past the output must keep it.
constexpr uint32_t kSentinel = 0x7fbadbadu;
constexpr size_t kGuardWords = 256;

DeviceBuffer sentinel_buffer(size_t words) {
    return to_device(std::vector<uint32_t>(words + kGuardWords, kSentinel));
}

void expect_guard_intact(const DeviceBuffer& b, size_t used_bytes, const char* what) {
    const size_t words = (used_bytes + 3) / 4;
    const auto all = from_device<uint32_t>(b, words + kGuardWords);
    std::vector<uint32_t> want(kGuardWords, kSentinel);
    // A partial last word (int8 outputs) keeps its unused bytes too.
    if (used_bytes % 4) {
        uint32_t tail = all[words - 1], mask = 0;
        for (size_t i = used_bytes % 4; i < 4; ++i) mask |= 0xffu << (8 * i);
        EXPECT_EQ(tail & mask, kSentinel & mask) << what << ": written past the output";
    }
    EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + words))
        << what << ": written past the output";
}

// Exact results of the quantized path: y[t][n] = sum over blocks of dx * sum(w * qx), in double
// (each block dot is exact), for all T tokens and n rows; split over the host's cores.
std::vector<double> reference(const std::vector<float>& w, const Q81& x, int T, int n, int k) {
    std::vector<double> y(size_t(T) * n);
    const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int id = 0; id < threads; ++id)
        pool.emplace_back([&, id] {
            for (int r = id; r < n; r += threads)
                for (int t = 0; t < T; ++t)
                    y[size_t(t) * n + r] =
                        matvec_row_q81(&w[size_t(r) * k], x, size_t(t) * k, k, nullptr);
        });
    for (auto& th : pool) th.join();
    return y;
}

double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double d : v) m = std::max(m, std::fabs(d));
    return m;
}

struct MmqCase {
    ggml::Type type;
    int k, n, T;
    std::optional<MmqTile> tile;  // default: the plan's tile for (k, n)
};

// The plan's tile for (k, n).
MmqCase planned(ggml::Type type, int k, int n, int T) {
    return MmqCase{type, k, n, T, std::nullopt};
}

std::string case_name(const MmqCase& c) {
    std::string s = fmt::format("{}_k{}_n{}_T{}", ggml::type_name(c.type), c.k, c.n, c.T);
    if (c.tile)
        s += fmt::format("_m{}n{}w{}x{}s{}b{}o{}p{}k{}", c.tile->bm, c.tile->bn, c.tile->warps_m,
                         c.tile->warps_n, c.tile->stages, c.tile->kbs, c.tile->min_blocks,
                         c.tile->geglu_passes, c.tile->splits);
    return s;
}
void PrintTo(const MmqCase& c, std::ostream* os) {
    *os << case_name(c);
}

KernelSpec case_spec(const MmqCase& c) {
    return c.tile ? gj::gemma4::mmq_spec(c.type, c.k, *c.tile)
                  : gj::gemma4::mmq_spec(c.type, c.k, c.n);
}

// The cases of the two MmqTest suites (below) and the matvec shapes of MmqVsMatvec.
std::vector<MmqCase> shape_cases();
std::vector<MmqCase> tile_cases();
struct MatvecShape {
    ggml::Type type;
    int k, n, T;
};
const std::vector<MatvecShape> kMatvecShapes = {{ggml::Type::Q8_0, 2560, 512, 130},
                                                {ggml::Type::Q4_0, 2560, 512, 130},
                                                {ggml::Type::Q8_0, 10240, 200, 21},
                                                {ggml::Type::Q4_0, 10240, 200, 21}};
KernelSpec matvec_spec_of(const MatvecShape& s) {
    return gj::gemma4::matvec_spec(s.type, s.k, 8, MatvecLayout::Split);
}

// Launches one mmq spec's entries from the shared module set.
struct Launcher {
    const KernelSpec& spec;
    // With y_bf16, a split-K plain entry's planes are also summed by mmq_reduce_bf16 into it.
    void run(const std::string& entry, CUdeviceptr w, CUdeviceptr w_up, CUdeviceptr xq,
             CUdeviceptr xds, CUdeviceptr y, CUdeviceptr yds, int T, int n,
             CUdeviceptr y_bf16 = 0) const {
        const unsigned bm = unsigned(spec_constant(spec, "BM"));
        const unsigned bn = unsigned(spec_constant(spec, "BN"));
        auto& dev = gj::jit::Device::get();
        dev.synchronize();
        // A split-K spec's plain entry writes SPLITS partial planes, summed by mmq_reduce.
        const unsigned splits = entry == "mmq" ? unsigned(spec_constant(spec, "SPLITS")) : 1;
        gj::jit::DeviceBuffer part(splits > 1 ? size_t(splits) * T * n * 4 : 16);
        launch_smem_async(
            kernels_for(spec).get(spec.name, entry), {ceil_div(n, bn), ceil_div(T, bm), splits},
            {unsigned(spec_constant(spec, "THREADS"))}, unsigned(spec_constant(spec, "SMEM")), w,
            w_up, xq, xds, splits > 1 ? part.ptr() : y, yds, T, n);
        if (splits > 1)
            launch_smem_async(kernels_for(spec).get(spec.name, "mmq_reduce"),
                              {ceil_div(T * n, 256)}, {256}, 0, part.ptr(), y, T * n);
        if (splits > 1 && y_bf16)
            launch_smem_async(kernels_for(spec).get(spec.name, "mmq_reduce_bf16"),
                              {ceil_div(T * n, 256)}, {256}, 0, part.ptr(), y_bf16, T * n);
        dev.synchronize();
    }
};

}  // namespace

class MmqTest : public ::testing::TestWithParam<MmqCase> {};

TEST_P(MmqTest, EveryEntryMatchesCpu) {
    GJ_REQUIRE_GPU();
    const MmqCase c = GetParam();
    const KernelSpec spec = case_spec(c);
    SCOPED_TRACE(spec.name + " n=" + std::to_string(c.n) + " T=" + std::to_string(c.T));
    const KernelSpec quant = gj::gemma4::quantize_spec();
    const Launcher l{spec};
    std::mt19937 rng(c.k * 7 + c.n * 3 + c.T);
    std::vector<float> wf, uf;
    const auto wb = random_weights(c.type, c.n, c.k, rng, wf);
    const auto ub = random_weights(c.type, c.n, c.k, rng, uf);
    const auto x = random_normal(size_t(c.T) * c.k, 1.0f, rng);
    const Q81 q = quantize_q8_1(x.data(), x.size());
    auto dw = to_device(split_layout(c.type, wb, c.n, c.k));
    auto du = to_device(split_layout(c.type, ub, c.n, c.k));
    auto dxq = to_device(q.q);  // exactly T rows: rows past T must not be read
    auto dxds = to_device(interleave(q));
    const size_t ny = size_t(c.T) * c.n;
    DeviceBuffer y = sentinel_buffer(ny), yg = sentinel_buffer(ny),
                 yb = sentinel_buffer(ny / 2 + 1);
    const CUdeviceptr none = 0;
    l.run("mmq", dw.ptr(), none, dxq.ptr(), dxds.ptr(), y.ptr(), none, c.T, c.n, yb.ptr());
    l.run("mmq_geglu", dw.ptr(), du.ptr(), dxq.ptr(), dxds.ptr(), yg.ptr(), none, c.T, c.n);
    expect_guard_intact(y, ny * 4, "mmq");
    expect_guard_intact(yg, ny * 4, "mmq_geglu");

    const auto got = from_device<float>(y, ny);
    // A split-K spec's bf16 sum (the input of a tensor-parallel bf16 all-reduce): the fp32 sum
    // rounded, bit for bit.
    if (spec_constant(spec, "SPLITS") > 1) {
        expect_guard_intact(yb, ny * 2, "mmq_reduce_bf16");
        const auto got_b = from_device<uint16_t>(yb, ny);
        size_t wrong = 0;
        for (size_t i = 0; i < ny; ++i) wrong += got_b[i] != gj::f32_to_bf16(got[i]);
        EXPECT_EQ(wrong, 0u) << "mmq_reduce_bf16 outputs that are not bf16(mmq_reduce)";
    }
    const auto got_g = from_device<float>(yg, ny);
    const auto gate = reference(wf, q, c.T, c.n, c.k);
    const auto up = reference(uf, q, c.T, c.n, c.k);
    // fp32 accumulation of K / 32 scaled block dots (each exact in int32) against double: a few
    // roundings of partial sums no larger than the outputs, ~1e-6 of max|y| even at K = 10240;
    // 1e-5 of max|y| leaves margin and still catches any lost or misplaced block (~3% of |y|).
    const double tol = 1e-5 * max_abs(gate) + 1e-30, tol_up = 1e-5 * max_abs(up) + 1e-30;
    int failures = 0;
    for (size_t i = 0; i < ny && failures < 10; ++i) {
        const double g_out = gelu_tanh(float(gate[i]));
        const double want_g = g_out * up[i];
        // gelu_tanh' is at most 1.13: the gate's error carries over scaled by |up|.
        const double tol_g =
            1.13 * tol * std::fabs(up[i]) + tol_up * std::fabs(g_out) + 1e-6 * std::fabs(want_g);
        if (!(std::fabs(got[i] - gate[i]) <= tol) || !(std::fabs(got_g[i] - want_g) <= tol_g)) {
            ++failures;
            ADD_FAILURE() << "t " << i / c.n << " row " << i % c.n << ": mmq " << got[i] << " want "
                          << gate[i] << " (tol " << tol << "); geglu " << got_g[i] << " want "
                          << want_g << " (tol " << tol_g << ")";
        }
    }

    if (c.n % 32 != 0) return;  // the quantized output needs whole 32-row blocks
    const size_t nb = ny / 32;
    DeviceBuffer yq = sentinel_buffer(ny / 4 + 1), yds = sentinel_buffer(2 * nb);
    l.run("mmq_geglu_q8", dw.ptr(), du.ptr(), dxq.ptr(), dxds.ptr(), yq.ptr(), yds.ptr(), c.T, c.n);
    expect_guard_intact(yq, ny, "mmq_geglu_q8 q");
    expect_guard_intact(yds, nb * 8, "mmq_geglu_q8 ds");
    // quantize_q8_1 over mmq_geglu's fp32 output, on the GPU and on the CPU (which agree bit for
    // bit: gpu_test_kernels), must give exactly the fused output.
    DeviceBuffer rq(ny), rds(nb * 8);
    launch(kernels_for(quant).get(quant.name, "quantize_q8_1"), {ceil_div(8 * nb, 256)}, {256},
           yg.ptr(), rq.ptr(), rds.ptr(), int(nb));
    const auto fused_q = from_device<int8_t>(yq, ny);
    const auto fused_ds = from_device<float>(yds, 2 * nb);
    EXPECT_EQ(fused_q, from_device<int8_t>(rq, ny));
    EXPECT_EQ(fused_ds, from_device<float>(rds, 2 * nb));
    const Q81 cpu = quantize_q8_1(got_g.data(), ny);
    EXPECT_EQ(fused_q, cpu.q);
    EXPECT_EQ(fused_ds, interleave(cpu));
}

namespace {
std::vector<MmqCase> shape_cases() {
    return {// Tiny widths (2 and 4 blocks: one ragged or whole stage), every token count.
            planned(ggml::Type::Q8_0, 64, 32, 1), planned(ggml::Type::Q8_0, 64, 32, 5),
            planned(ggml::Type::Q8_0, 64, 32, 63), planned(ggml::Type::Q8_0, 64, 32, 64),
            planned(ggml::Type::Q8_0, 64, 32, 65), planned(ggml::Type::Q8_0, 64, 32, 130),
            planned(ggml::Type::Q8_0, 64, 32, 512), planned(ggml::Type::Q4_0, 64, 32, 1),
            planned(ggml::Type::Q4_0, 64, 32, 5), planned(ggml::Type::Q4_0, 64, 32, 63),
            planned(ggml::Type::Q4_0, 64, 32, 64), planned(ggml::Type::Q4_0, 64, 32, 65),
            planned(ggml::Type::Q4_0, 64, 32, 130), planned(ggml::Type::Q4_0, 64, 32, 512),
            planned(ggml::Type::Q8_0, 64, 200, 65), planned(ggml::Type::Q4_0, 128, 200, 130),
            // Odd row counts (scalar stores; no quantized output).
            planned(ggml::Type::Q8_0, 64, 77, 130), planned(ggml::Type::Q4_0, 128, 77, 5),
            planned(ggml::Type::Q8_0, 128, 2560, 130), planned(ggml::Type::Q4_0, 128, 512, 512),
            // Real widths: E4B d_model and FFN.
            planned(ggml::Type::Q8_0, 2560, 2560, 65), planned(ggml::Type::Q4_0, 2560, 2560, 64),
            planned(ggml::Type::Q8_0, 2560, 200, 512), planned(ggml::Type::Q4_0, 2560, 512, 130),
            planned(ggml::Type::Q8_0, 10240, 512, 63), planned(ggml::Type::Q4_0, 10240, 512, 63),
            planned(ggml::Type::Q8_0, 10240, 2560, 5), planned(ggml::Type::Q4_0, 10240, 2560, 1),
            // One block per stage (its scales copied synchronously) with 128 x 128 tiles.
            MmqCase{ggml::Type::Q8_0, 2560, 160, 200, MmqTile{128, 128, 4, 2, 1, 2}},
            MmqCase{ggml::Type::Q4_0, 96, 160, 200, MmqTile{128, 128, 4, 2, 1, 2}}};
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(Shapes, MmqTest, ::testing::ValuesIn(shape_cases()),
                         [](const ::testing::TestParamInfo<MmqCase>& i) {
                             return case_name(i.param);
                         });

// Every tile the plan picks and the others measured for it (2 or 1 GeGLU passes, 1 to 3 blocks
// per SM, 1 to 8 blocks per stage, 4 to 16 warps), each on a ragged width (5 blocks: a partial
// last stage, scales copied synchronously) and a real one, with partial tiles in both directions.
namespace {
const std::vector<MmqTile> kTiles = {
    {64, 128, 2, 4, 2, 4, 2, 1},
    {128, 128, 2, 4, 2, 4, 2, 2},
    {64, 128, 2, 4, 4, 3, 1, 2},
    {128, 64, 4, 2, 4, 3, 1, 2},
    {64, 64, 2, 2, 4, 4, 2, 1},
    {64, 64, 2, 2, 2, 4, 3, 1},
    {32, 64, 1, 2, 4, 4, 2, 1},
    {128, 128, 2, 4, 4, 3, 1, 2},
    {64, 128, 2, 4, 2, 3, 2, 1},
    {32, 128, 1, 4, 2, 4, 2, 1},
    {64, 128, 2, 4, 4, 2, 2, 1},
    {128, 128, 4, 4, 2, 4, 1, 2},
    {128, 64, 4, 2, 2, 4, 2, 2},
    {64, 128, 2, 4, 8, 2, 1, 1},
    // split K (the plan's deep n 2560 products), also into uneven and single-step splits
    {128, 128, 2, 4, 4, 3, 1, 2, 3},
    {64, 64, 2, 2, 4, 4, 2, 1, 2},
    {64, 64, 2, 2, 1, 2, 2, 1, 8}};

std::vector<MmqCase> tile_cases() {
    std::vector<MmqCase> cases;
    for (const MmqTile& t : kTiles)
        for (auto type : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
            cases.push_back(MmqCase{type, 160, 224, 130, t});
            cases.push_back(MmqCase{type, 2560, 320, 200, t});
        }
    return cases;
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(Tiles, MmqTest, ::testing::ValuesIn(tile_cases()),
                         [](const ::testing::TestParamInfo<MmqCase>& i) {
                             return case_name(i.param);
                         });

// The GPU tests above cover every tile the plan can pick (for any row count).
TEST(MmqTiles, EveryPlanTileIsTested) {
    GJ_REQUIRE_GPU();
    auto same = [](const MmqTile& a, const MmqTile& b) {
        return a.bm == b.bm && a.bn == b.bn && a.warps_m == b.warps_m && a.warps_n == b.warps_n &&
               a.kbs == b.kbs && a.stages == b.stages && a.min_blocks == b.min_blocks &&
               a.geglu_passes == b.geglu_passes && a.splits == b.splits;
    };
    for (auto type : {ggml::Type::Q8_0, ggml::Type::Q4_0})
        for (int k : {64, 2048, 2560, 4096, 5376, 10240, 21504})
            for (int n = 32; n <= 65536; n += n < 1024 ? 32 : 512) {
                const MmqTile t = gj::gemma4::mmq_tile(type, k, n);
                EXPECT_TRUE(std::any_of(kTiles.begin(), kTiles.end(),
                                        [&](const MmqTile& c) { return same(c, t); }))
                    << gj::gemma4::mmq_spec(type, k, t).name << " (n_rows " << n << ")";
            }
}

// mmq and mmq_geglu against the batched dp4a matvec (8 columns per launch, split layout): the
// same int8 products, summed in another order, so they agree to fp32 rounding.
TEST(MmqVsMatvec, SameResultsAsTheBatchedMatvec) {
    GJ_REQUIRE_GPU();
    for (const MatvecShape& s : kMatvecShapes) {
        const KernelSpec spec = gj::gemma4::mmq_spec(s.type, s.k, s.n);
        const KernelSpec mv = matvec_spec_of(s);
        SCOPED_TRACE(spec.name + " vs " + mv.name + " T=" + std::to_string(s.T));
        const Launcher l{spec};
        std::mt19937 rng(s.k + s.n + s.T);
        std::vector<float> wf, uf;
        const auto wb = random_weights(s.type, s.n, s.k, rng, wf);
        const auto ub = random_weights(s.type, s.n, s.k, rng, uf);
        const int rows = (s.T + 7) / 8 * 8;  // the matvec reads and writes whole 8-column groups
        const auto x = random_normal(size_t(rows) * s.k, 1.0f, rng);
        const Q81 q = quantize_q8_1(x.data(), x.size());
        auto dw = to_device(split_layout(s.type, wb, s.n, s.k));
        auto du = to_device(split_layout(s.type, ub, s.n, s.k));
        auto dxq = to_device(q.q);
        auto dxds = to_device(interleave(q));
        const size_t ny = size_t(rows) * s.n;
        DeviceBuffer y(ny * 4), yg(ny * 4), my(ny * 4), myg(ny * 4);
        const CUdeviceptr none = 0;
        l.run("mmq", dw.ptr(), none, dxq.ptr(), dxds.ptr(), y.ptr(), none, s.T, s.n);
        l.run("mmq_geglu", dw.ptr(), du.ptr(), dxq.ptr(), dxds.ptr(), yg.ptr(), none, s.T, s.n);
        const std::string base = mv.entries[0];
        const unsigned threads = unsigned(spec_constant(mv, "THREADS"));
        const unsigned mrows = unsigned(spec_constant(mv, "ROWS"));
        for (int c0 = 0; c0 < s.T; c0 += 8) {
            const CUdeviceptr xq_c = dxq.ptr() + size_t(c0) * s.k;
            const CUdeviceptr xds_c = dxds.ptr() + size_t(c0) * (s.k / 32) * 8;
            const size_t y_off = size_t(c0) * s.n * 4;
            launch(kernels_for(mv).get(mv.name, base), {ceil_div(s.n, mrows)}, {threads}, dw.ptr(),
                   none, xq_c, xds_c, none, my.ptr() + y_off, s.n);
            launch(kernels_for(mv).get(mv.name, base + "_geglu"), {ceil_div(s.n, mrows)}, {threads},
                   dw.ptr(), du.ptr(), xq_c, xds_c, none, myg.ptr() + y_off, s.n);
        }
        const size_t used = size_t(s.T) * s.n;
        const auto a = from_device<float>(y, used), b = from_device<float>(my, used);
        const auto ag = from_device<float>(yg, used), bg = from_device<float>(myg, used);
        double m = 0, mg = 0;
        for (size_t i = 0; i < used; ++i)
            m = std::max(m, double(std::fabs(b[i]))), mg = std::max(mg, double(std::fabs(bg[i])));
        int failures = 0;
        for (size_t i = 0; i < used && failures < 10; ++i) {
            // Both within ~1e-6 of max|y| of the exact value (MmqTest, gpu_test_kernels).
            if (!(std::fabs(a[i] - b[i]) <= 2e-5 * m) || !(std::fabs(ag[i] - bg[i]) <= 4e-5 * mg)) {
                ++failures;
                ADD_FAILURE() << "t " << i / s.n << " row " << i % s.n << ": mmq " << a[i]
                              << " matvec " << b[i] << "; geglu " << ag[i] << " vs " << bg[i];
            }
        }
    }
}

// The grouped expert GEMM (MOE entries) of MoE prefill: E experts, each a split-layout matrix of
// its own (every block type; gate|up:
// gate then up half of every expert, one stride apart; gate|up and down in the types a K-quant file
// mixes, e.g. Q4_K with Q5_0 where F is no multiple of 256), slots grouped by expert in groups of
// BM (the grouping moe_group makes: gpu_test_moe checks it), activations gathered by slot / in_div
// and results scattered to the slot's row. Against the exact CPU products per slot, with experts
// that get no slot, more than one group, and a batch all in one expert; mmq_moe_geglu_q8
// bit-identical to the CPU quantizer over mmq_moe_geglu's output; no row outside the slots written.
namespace {

struct MoeGemmCase {
    ggml::Type type, down_type;  // gate|up's, down's
    int d, F, E, K, T;
    bool one_expert;  // every slot routed to expert E / 2
};

struct Stacked {
    std::vector<uint8_t> bytes;         // E experts of `pieces` matrices of rows x k
    std::vector<std::vector<float>> w;  // [piece][E * rows * k] the exact weights
    uint64_t expert_bytes = 0, piece_bytes = 0;
};

Stacked stacked_experts(ggml::Type type, int E, int pieces, int rows, int k, std::mt19937& rng) {
    Stacked s;
    s.w.resize(pieces);
    std::vector<std::vector<uint8_t>> blocks(pieces);
    for (int p = 0; p < pieces; ++p) blocks[p] = random_weights(type, E * rows, k, rng, s.w[p]);
    const size_t piece_blocks = blocks[0].size() / E;
    for (int e = 0; e < E; ++e)
        for (int p = 0; p < pieces; ++p) {
            const std::vector<uint8_t> one(blocks[p].begin() + e * piece_blocks,
                                           blocks[p].begin() + (e + 1) * piece_blocks);
            const auto split = split_layout(type, one, rows, k);
            // Split Q4_K / Q5_K matrices are larger than their blocks (148 / 180 bytes per 256).
            s.piece_bytes = split.size();
            s.bytes.insert(s.bytes.end(), split.begin(), split.end());
        }
    s.expert_bytes = s.piece_bytes * pieces;
    return s;
}

}  // namespace

class MmqMoeTest : public ::testing::TestWithParam<MoeGemmCase> {};

TEST_P(MmqMoeTest, GroupedExpertProductsMatchCpu) {
    GJ_REQUIRE_GPU();
    const MoeGemmCase c = GetParam();
    const KernelSpec up_spec = gj::gemma4::mmq_moe_spec(c.type, c.d, c.F);
    const KernelSpec down_spec = gj::gemma4::mmq_moe_spec(c.down_type, c.F, c.d);
    SCOPED_TRACE(up_spec.name + " / " + down_spec.name + " T=" + std::to_string(c.T));
    const int BM = int(spec_constant(up_spec, "BM"));
    ASSERT_EQ(BM, int(spec_constant(down_spec, "BM")));
    std::mt19937 rng(c.d + c.F * 3 + c.T * 7 + c.E);
    const Stacked gu = stacked_experts(c.type, c.E, 2, c.F, c.d, rng);
    const Stacked dn = stacked_experts(c.down_type, c.E, 1, c.d, c.F, rng);

    // Routing: K distinct experts per token (or all slots to one expert), then the groups.
    const int S = c.T * c.K;
    std::vector<int> ids(S);
    for (int t = 0; t < c.T; ++t) {
        std::vector<int> e(c.E);
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.begin() + c.E / 2, rng);  // the upper half never chosen
        for (int k = 0; k < c.K; ++k) ids[t * c.K + k] = c.one_expert ? c.E / 2 : e[k];
    }
    std::vector<int> slots, groups;
    for (int e = 0; e < c.E; ++e) {
        const int first = int(slots.size());
        for (int s = 0; s < S; ++s)
            if (ids[s] == e) slots.push_back(s);
        for (int j = first; j < int(slots.size()); j += BM)
            groups.insert(groups.end(), {e, j, std::min(BM, int(slots.size()) - j), 0});
    }
    const int n_groups = int(groups.size() / 4);
    const int bound = gj::gemma4::moe_group_bound(c.T, c.K, c.E, BM);
    ASSERT_LE(n_groups, bound);
    groups.resize(size_t(bound) * 4, -1);  // groups past n_groups must not be read

    const auto x = random_normal(size_t(c.T) * c.d, 1.0f, rng);
    const Q81 qx = quantize_q8_1(x.data(), x.size());
    auto dgu = to_device(gu.bytes), ddn = to_device(dn.bytes), dxq = to_device(qx.q),
         dxds = to_device(interleave(qx)), dslots = to_device(slots), dgroups = to_device(groups),
         dn_groups = to_device(std::vector<int>{n_groups});
    const size_t nh = size_t(S) * c.F, nd = size_t(S) * c.d;
    DeviceBuffer h = sentinel_buffer(nh), hq = sentinel_buffer(nh / 4 + 1),
                 hds = sentinel_buffer(nh / 32 * 2), y = sentinel_buffer(nd);
    auto run = [&](const KernelSpec& spec, const std::string& entry, CUdeviceptr w,
                   CUdeviceptr w_up, long long expert_bytes, CUdeviceptr xq, CUdeviceptr xds,
                   int in_div, CUdeviceptr out, CUdeviceptr out_ds, int n_rows) {
        gj::jit::Device::get().synchronize();
        launch_smem_async(kernels_for(spec).get(spec.name, entry),
                          {ceil_div(n_rows, unsigned(spec_constant(spec, "BN"))), unsigned(bound)},
                          {unsigned(spec_constant(spec, "THREADS"))},
                          unsigned(spec_constant(spec, "SMEM")), w, w_up, expert_bytes, xq, xds,
                          dgroups.ptr(), dn_groups.ptr(), dslots.ptr(), in_div, out, out_ds,
                          n_rows);
        gj::jit::Device::get().synchronize();
    };
    const long long gu_stride = (long long)gu.expert_bytes, dn_stride = (long long)dn.expert_bytes;
    run(up_spec, "mmq_moe_geglu", dgu.ptr(), dgu.ptr() + gu.piece_bytes, gu_stride, dxq.ptr(),
        dxds.ptr(), c.K, h.ptr(), 0, c.F);
    run(up_spec, "mmq_moe_geglu_q8", dgu.ptr(), dgu.ptr() + gu.piece_bytes, gu_stride, dxq.ptr(),
        dxds.ptr(), c.K, hq.ptr(), hds.ptr(), c.F);
    expect_guard_intact(h, nh * 4, "mmq_moe_geglu");
    expect_guard_intact(hq, nh, "mmq_moe_geglu_q8 q");
    expect_guard_intact(hds, nh / 32 * 8, "mmq_moe_geglu_q8 ds");
    const auto got_h = from_device<float>(h, nh);
    const Q81 want_hq = quantize_q8_1(got_h.data(), nh);
    EXPECT_EQ(from_device<int8_t>(hq, nh), want_hq.q);
    EXPECT_EQ(from_device<float>(hds, nh / 32 * 2), interleave(want_hq));
    // down over the fused Q8_1 rows.
    run(down_spec, "mmq_moe", ddn.ptr(), 0, dn_stride, hq.ptr(), hds.ptr(), 1, y.ptr(), 0, c.d);
    expect_guard_intact(y, nd * 4, "mmq_moe");
    const auto got_y = from_device<float>(y, nd);

    // CPU: per slot, the expert's exact products (double), as the mmq test checks them; slots
    // split over the host's cores.
    std::vector<double> gate(nh), up(nh), down(nd);
    const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int id = 0; id < threads; ++id)
        pool.emplace_back([&, id] {
            for (int s = id; s < S; s += threads) {
                const int e = ids[s], t = s / c.K;
                for (int r = 0; r < c.F; ++r) {
                    const size_t row = size_t(e) * c.F + r;
                    gate[size_t(s) * c.F + r] =
                        matvec_row_q81(&gu.w[0][row * c.d], qx, size_t(t) * c.d, c.d, nullptr);
                    up[size_t(s) * c.F + r] =
                        matvec_row_q81(&gu.w[1][row * c.d], qx, size_t(t) * c.d, c.d, nullptr);
                }
                for (int r = 0; r < c.d; ++r) {
                    const size_t row = size_t(e) * c.d + r;
                    down[size_t(s) * c.d + r] =
                        matvec_row_q81(&dn.w[0][row * c.F], want_hq, size_t(s) * c.F, c.F, nullptr);
                }
            }
        });
    for (auto& th : pool) th.join();
    auto max_of = [](const std::vector<double>& v) {
        double m = 0;
        for (double x : v) m = std::max(m, std::fabs(x));
        return m;
    };
    const double gmax = max_of(gate), umax = max_of(up), ymax = max_of(down);
    const double tol = 1e-5 * gmax, tol_up = 1e-5 * umax, tol_y = 1e-5 * ymax + 1e-30;
    int failures = 0;
    for (size_t i = 0; i < nh && failures < 10; ++i) {
        const double g_out = gelu_tanh(float(gate[i])), want = g_out * up[i];
        const double t = 1.13 * tol * std::fabs(up[i]) + tol_up * std::fabs(g_out) +
                         1e-6 * std::fabs(want) + 1e-30;
        if (!(std::fabs(got_h[i] - want) <= t)) {
            ++failures;
            ADD_FAILURE() << "gate|up slot " << i / c.F << " row " << i % c.F << ": " << got_h[i]
                          << " want " << want;
        }
    }
    for (size_t i = 0; i < nd && failures < 10; ++i)
        if (!(std::fabs(got_y[i] - down[i]) <= tol_y)) {
            ++failures;
            ADD_FAILURE() << "down slot " << i / c.d << " row " << i % c.d << ": " << got_y[i]
                          << " want " << down[i];
        }
}

namespace {
constexpr ggml::Type Q8_0 = ggml::Type::Q8_0, Q4_0 = ggml::Type::Q4_0, Q4_1 = ggml::Type::Q4_1,
                     Q5_0 = ggml::Type::Q5_0, Q5_1 = ggml::Type::Q5_1, Q4_K = ggml::Type::Q4_K,
                     Q5_K = ggml::Type::Q5_K, Q6_K = ggml::Type::Q6_K;
}  // namespace

INSTANTIATE_TEST_SUITE_P(
    Shapes, MmqMoeTest,
    ::testing::Values(
        // tiny-moe (d 128, F 64, 16 experts, top 4): one token, a ragged group, a chunk.
        MoeGemmCase{Q8_0, Q8_0, 128, 64, 16, 4, 1, false},
        MoeGemmCase{Q4_0, Q4_0, 128, 64, 16, 4, 37, false},
        MoeGemmCase{Q8_0, Q8_0, 128, 64, 16, 4, 512, false},
        MoeGemmCase{Q4_0, Q4_0, 128, 64, 16, 4, 100, true},
        MoeGemmCase{Q5_0, Q8_0, 128, 64, 16, 4, 1, false},
        MoeGemmCase{Q4_1, Q5_1, 128, 64, 16, 4, 100, true},
        // K-quant gate|up over d 256 (and down over F 256: the plain entry), fallbacks for F 64.
        MoeGemmCase{Q4_K, Q5_0, 256, 64, 16, 4, 37, false},
        MoeGemmCase{Q5_K, Q5_1, 256, 64, 16, 4, 512, false},
        MoeGemmCase{Q5_0, Q4_K, 256, 256, 16, 4, 64, false},
        MoeGemmCase{Q4_K, Q5_K, 2048, 512, 32, 4, 80, false},  // down's 128-row tiles, 2 a stage
        MoeGemmCase{Q6_K, Q8_0, 256, 64, 16, 4, 37, false},
        MoeGemmCase{Q5_1, Q6_K, 256, 256, 16, 4, 512, false},
        MoeGemmCase{Q6_K, Q6_K, 2048, 512, 32, 4, 80, true},
        // 26B-A4B (d 2816, F 704, 128 experts, top 8); its Q4_K_M / Q5_K_M pairs.
        MoeGemmCase{Q4_0, Q4_0, 2816, 704, 128, 8, 200, false},
        MoeGemmCase{Q8_0, Q8_0, 2816, 704, 128, 8, 67, false},
        MoeGemmCase{Q4_0, Q4_0, 2816, 704, 128, 8, 20, true},
        MoeGemmCase{Q4_K, Q5_0, 2816, 704, 128, 8, 200, false},
        MoeGemmCase{Q4_K, Q8_0, 2816, 704, 128, 8, 67, false},
        MoeGemmCase{Q5_K, Q5_1, 2816, 704, 128, 8, 100, false},
        MoeGemmCase{Q5_K, Q8_0, 2816, 704, 128, 8, 20, true},
        MoeGemmCase{Q6_K, Q8_0, 2816, 704, 128, 8, 100, false}),
    [](const ::testing::TestParamInfo<MoeGemmCase>& i) {
        const MoeGemmCase& c = i.param;
        return fmt::format("{}_{}_d{}_F{}_E{}_K{}_T{}{}", ggml::type_name(c.type),
                           ggml::type_name(c.down_type), c.d, c.F, c.E, c.K, c.T,
                           c.one_expert ? "_one_expert" : "");
    });
