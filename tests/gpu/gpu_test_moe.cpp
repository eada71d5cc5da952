// The MoE layer (26B-A4B) on the GPU: the routing kernel (softmax, top-K, renormalized and
// scaled weights) and the slot grouping against plain CPU loops (experts with no token, every
// slot in one expert, groups of 1 and 8), then the whole forward pass against the CPU reference
// on tiny-moe in Q8_0, Q4_0 and F16 (prefill chunks of 1, 7, 64 and 512 tokens, decode steps past
// the sliding window) and on the real 26B-A4B shapes cut to two layers, graph replay against
// eager launches, and the grouped expert kernels asserted to have run.
//
// Tolerances: as gpu_test_forward.cpp (int8 activations 3e-2 of the largest |logit|; float
// weights through cuBLAS in prefill 2e-2). The router picks experts by comparing probabilities,
// so a near tie at the K-th place could pick another expert on either side; the synthetic routers
// (weights 2 N(0, 1)) make ties rarer than the rounding that could flip them.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "engine/cpu/cpu_forward.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/kernels/moe.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/session.h"
#include "tests/support/gpu_forward_check.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using gj::gemma4::GpuSession;
using gj::gemma4::MatvecLayout;
using gj::gemma4::Readout;
using gj::jit::DeviceBuffer;
using namespace gj::test;
using namespace gj::test::kref;
namespace ggml = gj::ggml;

namespace {

constexpr float kTolQuant = 3e-2f;
constexpr float kTolBlas = 2e-2f;

// The CPU reference's routing of every token (gemma4::route_token), as ids and weights.
void route_cpu(const std::vector<float>& logits, const std::vector<float>& scale, int T, int E,
               int K, std::vector<int>& ids, std::vector<float>& wts) {
    ids.clear();
    wts.clear();
    for (int t = 0; t < T; ++t)
        for (auto [e, w] : gj::gemma4::route_token(&logits[size_t(t) * E], E, K, scale.data())) {
            ids.push_back(e);
            wts.push_back(w);
        }
}

struct Grouping {
    std::vector<int> slots;                  // by expert, ascending slot within an expert
    std::vector<std::array<int, 3>> groups;  // {expert, first, count}
};

// The grouping moe_group documents, as a plain loop.
Grouping group_cpu(const std::vector<int>& ids, int E, int cols) {
    Grouping g;
    for (int e = 0; e < E; ++e) {
        const int first = int(g.slots.size());
        for (size_t s = 0; s < ids.size(); ++s)
            if (ids[s] == e) g.slots.push_back(int(s));
        const int n = int(g.slots.size()) - first;
        for (int j = 0; j < n; j += cols) g.groups.push_back({e, first + j, std::min(cols, n - j)});
    }
    return g;
}

// A grouping kernel's output (the group count, the slot list, the groups) against group_cpu.
void expect_grouping(const std::vector<int>& ids, int E, int cols, const DeviceBuffer& n_groups,
                     const DeviceBuffer& groups, const DeviceBuffer& slots) {
    const Grouping want = group_cpu(ids, E, cols);
    const int n = from_device<int>(n_groups, 1)[0];
    ASSERT_EQ(n, int(want.groups.size()));
    EXPECT_EQ(from_device<int>(slots, ids.size()), want.slots);
    const auto got = from_device<int>(groups, size_t(n) * 4);
    for (int i = 0; i < n; ++i) {
        EXPECT_EQ(got[i * 4], want.groups[i][0]) << "group " << i;
        EXPECT_EQ(got[i * 4 + 1], want.groups[i][1]) << "group " << i;
        EXPECT_EQ(got[i * 4 + 2], want.groups[i][2]) << "group " << i;
    }
}

void check_grouping(const gj::jit::KernelSpec& spec, const std::vector<int>& ids, int T, int E,
                    int K, int cols, const char* what) {
    SCOPED_TRACE(std::string(what) + " T " + std::to_string(T) + " cols " + std::to_string(cols));
    const int bound = gj::gemma4::moe_group_bound(T, K, E, cols);
    ASSERT_LE(int(group_cpu(ids, E, cols).groups.size()), bound) << "moe_group_bound is too small";
    auto dids = to_device(ids);
    DeviceBuffer n_groups(16), groups(size_t(bound) * 16 + 16), slots(ids.size() * 4 + 16);
    launch(kernels_for(spec).get(spec.name, "moe_group"), {1},
           {unsigned(gj::gemma4::spec_constant(spec, "THREADS"))}, dids.ptr(), T, cols,
           n_groups.ptr(), groups.ptr(), slots.ptr());
    expect_grouping(ids, E, cols, n_groups, groups, slots);
}

// Per position: max |got - ref| over the row, relative to the largest |logit| of the reference.
std::vector<float> position_errors(const std::vector<float>& ref, const std::vector<float>& got,
                                   int V) {
    float scale = 0;
    for (float v : ref) scale = std::max(scale, std::fabs(v));
    std::vector<float> e(ref.size() / size_t(V));
    for (size_t p = 0; p < e.size(); ++p)
        for (int i = 0; i < V; ++i) {
            const size_t j = p * size_t(V) + size_t(i);
            e[p] = std::max(e[p], std::fabs(got[j] - ref[j]) / scale);
        }
    return e;
}

// MoE logits against the CPU reference. Routing is discontinuous: where the K-th and (K+1)-th
// router logits of some layer are closer than the two sides' rounding apart (int8 activations,
// fp16 KV), the two sides pick different experts, and that position (and, through its keys, a few
// after it) moves by far more than rounding. So: the argmax agrees at every position (near ties
// excepted), most positions agree within `tol` and the median is well inside it.
void expect_moe_agree(const std::vector<float>& ref, const std::vector<float>& got, int V,
                      float tol, const std::string& what) {
    const Agreement a = compare(ref, got, V, tol);
    EXPECT_EQ(a.mismatches, 0) << what << ": argmax differs away from a near tie";
    std::vector<float> e = position_errors(ref, got, V);
    const size_t n = e.size();
    const size_t within =
        size_t(std::count_if(e.begin(), e.end(), [&](float x) { return x <= tol; }));
    std::sort(e.begin(), e.end());
    std::printf(
        "  %-40s positions within %.3g: %zu/%zu; error p50 %.3g p90 %.3g p99 %.3g max %.3g; "
        "%d near ties\n",
        what.c_str(), tol, within, n, e[n / 2], e[n * 9 / 10], e[n * 99 / 100], e[n - 1],
        a.near_ties);
    EXPECT_LE(e[n / 2], tol / 2) << what;
    EXPECT_GE(double(within), 0.75 * double(n)) << what;
}

}  // namespace

TEST(Moe, RoutingAndGroupingMatchPlainLoops) {
    GJ_REQUIRE_GPU();
    // 512 experts: moe_group's table of warps x experts leaves it 16 warps.
    for (auto [E, K] : {std::pair{16, 4}, std::pair{128, 8}, std::pair{512, 8}}) {
        const auto spec = gj::gemma4::moe_spec(E, K, 128);
        const auto& g = kernels_for(spec);
        std::mt19937 rng(E * 31 + K);
        std::normal_distribution<float> normal(0.0f, 2.0f);
        std::uniform_real_distribution<float> uni(0.5f, 1.5f);
        std::vector<float> scale(E);
        for (float& v : scale) v = uni(rng);
        auto dscale = to_device(scale);
        for (int T : {1, 7, 64, 512}) {
            SCOPED_TRACE("E " + std::to_string(E) + " T " + std::to_string(T));
            std::vector<float> logits(size_t(T) * E);
            for (float& v : logits) v = normal(rng);
            if (T > 1) logits[E + 3] = logits[E + 5];  // an exact tie: the lower index wins
            std::vector<int> want_ids;
            std::vector<float> want_wts;
            route_cpu(logits, scale, T, E, K, want_ids, want_wts);
            auto dl = to_device(logits);
            DeviceBuffer ids(size_t(T) * K * 4 + 16), wts(size_t(T) * K * 4 + 16);
            launch(g.get(spec.name, "moe_route"), {ceil_div(T, 4)}, {128}, dl.ptr(), dscale.ptr(),
                   ids.ptr(), wts.ptr(), T);
            const auto got_ids = from_device<int>(ids, size_t(T) * K);
            const auto got_wts = from_device<float>(wts, size_t(T) * K);
            EXPECT_EQ(got_ids, want_ids);
            for (size_t i = 0; i < got_wts.size(); ++i)
                EXPECT_NEAR(got_wts[i], want_wts[i], 1e-6f * (1 + std::fabs(want_wts[i]))) << i;
            for (int cols : {1, 8, 64}) check_grouping(spec, got_ids, T, E, K, cols, "routed");
        }
        // A decode step's routing and grouping in one launch: the same ids and weights as
        // moe_route, bit for bit, and the documented groups.
        const int max_t = gj::gemma4::moe_route_group_max_tokens(K);
        ASSERT_GE(max_t, 1);
        for (int T = 1; T <= max_t; ++T)
            for (int cols : {1, 8}) {
                SCOPED_TRACE("moe_route_group E " + std::to_string(E) + " T " + std::to_string(T) +
                             " cols " + std::to_string(cols));
                std::vector<float> logits(size_t(T) * E);
                for (float& v : logits) v = normal(rng);
                auto dl = to_device(logits);
                DeviceBuffer ids(size_t(T) * K * 4 + 16), wts(size_t(T) * K * 4 + 16),
                    ids2(size_t(T) * K * 4 + 16), wts2(size_t(T) * K * 4 + 16);
                launch(g.get(spec.name, "moe_route"), {1}, {128}, dl.ptr(), dscale.ptr(), ids.ptr(),
                       wts.ptr(), T);
                const int bound = gj::gemma4::moe_group_bound(T, K, E, cols);
                DeviceBuffer n_groups(16), groups(size_t(bound) * 16 + 16),
                    slots(size_t(T) * K * 4 + 16);
                launch(g.get(spec.name, "moe_route_group"), {1}, {128}, dl.ptr(), dscale.ptr(),
                       ids2.ptr(), wts2.ptr(), T, cols, n_groups.ptr(), groups.ptr(), slots.ptr());
                const auto got_ids = from_device<int>(ids2, size_t(T) * K);
                EXPECT_EQ(got_ids, from_device<int>(ids, size_t(T) * K));
                EXPECT_EQ(from_device<float>(wts2, size_t(T) * K),
                          from_device<float>(wts, size_t(T) * K));
                expect_grouping(got_ids, E, cols, n_groups, groups, slots);
            }
        // Hand-made slot lists: every slot in one expert (most experts get none), and a few
        // experts only.
        for (int T : {1, 64, 512}) {
            for (int cols : {1, 8, 64}) {
                check_grouping(spec, std::vector<int>(size_t(T) * K, E - 1), T, E, K, cols,
                               "one expert");
                std::vector<int> few(size_t(T) * K);
                for (size_t i = 0; i < few.size(); ++i) few[i] = int((i * 7) % 3) * 2;
                check_grouping(spec, few, T, E, K, cols, "three experts");
            }
        }
    }
}

// moe_ffn_out: y = norm(dense) * w1 + norm(sum_k w_k expert_k) * w2 per row, against double.
TEST(Moe, FfnOutputMatchesThePlainNormsAndSum) {
    GJ_REQUIRE_GPU();
    for (auto [E, K, D] : {std::tuple{16, 4, 128}, std::tuple{128, 8, 2816}}) {
        const auto spec = gj::gemma4::moe_spec(E, K, D);
        for (int T : {1, 5, 64}) {
            SCOPED_TRACE("D " + std::to_string(D) + " T " + std::to_string(T));
            std::mt19937 rng(D + T);
            std::normal_distribution<float> normal(0.0f, 1.5f);
            auto fill = [&](size_t n) {
                std::vector<float> v(n);
                for (float& x : v) x = normal(rng);
                return v;
            };
            const auto dense = fill(size_t(T) * D), ed = fill(size_t(T) * K * D),
                       wts = fill(size_t(T) * K), w1 = fill(D), w2 = fill(D);
            const float eps = 1e-6f;
            auto dd = to_device(dense), ded = to_device(ed), dw = to_device(wts),
                 dw1 = to_device(w1), dw2 = to_device(w2);
            DeviceBuffer y(size_t(T) * D * 4);
            launch(kernels_for(spec).get(spec.name, "moe_ffn_out"), {unsigned(T)}, {256}, dd.ptr(),
                   ded.ptr(), dw.ptr(), dw1.ptr(), dw2.ptr(), y.ptr(), T, eps);
            const auto got = from_device<float>(y, size_t(T) * D);
            for (int t = 0; t < T; ++t) {
                std::vector<double> e(D, 0.0);
                double sa = 0, sb = 0;
                for (int i = 0; i < D; ++i) {
                    for (int k = 0; k < K; ++k)
                        e[i] += double(wts[t * K + k]) * ed[(size_t(t) * K + k) * D + i];
                    sa += double(dense[size_t(t) * D + i]) * dense[size_t(t) * D + i];
                    sb += e[i] * e[i];
                }
                const double ra = 1.0 / std::sqrt(sa / D + eps), rb = 1.0 / std::sqrt(sb / D + eps);
                for (int i = 0; i < D; ++i) {
                    const double a = dense[size_t(t) * D + i] * ra * w1[i], b = e[i] * rb * w2[i];
                    ASSERT_NEAR(got[size_t(t) * D + i], a + b,
                                1e-5 * (std::fabs(a) + std::fabs(b)) + 1e-6)
                        << "row " << t << " element " << i;
                }
            }
        }
    }
}

namespace {

class MoeVsCpu : public ::testing::TestWithParam<ggml::Type> {};

}  // namespace

// 600 tokens past the window of 8, against the CPU reference, with prefill chunks of 1, 7, 64
// and 512 tokens, then token-by-token decode (the graph).
TEST_P(MoeVsCpu, TinyMoeMatchesTheCpuReference) {
    GJ_REQUIRE_GPU();
    const ggml::Type wtype = GetParam();
    ScratchDir dir("gpu-moe");
    // Whole-model Q5_0 is written as a quant mix (synth's plain types are the unmixed ones).
    const auto path = wtype == ggml::Type::Q5_0 ? synth_mix(dir, "tiny-moe", "q5_0")
                                                : synth(dir, "tiny-moe", wtype);
    const auto f = flags();
    const bool quant = wtype != ggml::Type::F16;
    const bool gemm = quant;  // split Q8_0 / Q4_0 / Q5_0 experts: the grouped int8 GEMM
    const auto probe = load_gpu(path, 1024, 8, f);
    // Every quantized type's experts are split (Q5_0: the fallback of a Q4_K_M file's expert
    // down).
    EXPECT_EQ(probe->layers()[0].down_exps.all.layout,
              quant ? MatvecLayout::Split : MatvecLayout::Ggml);
    const int V = probe->config().vocab_size;
    const auto tokens = test_tokens(600, V, 99);
    const auto ref = cpu_logits(path, tokens);
    for (int chunk : {1, 7, 64, 512}) {
        auto model = load_gpu(path, 1024, chunk, f);
        GpuSession s(*model);
        expect_moe_agree(ref, s.prefill_logits(tokens), V, quant ? kTolQuant : kTolBlas,
                         "tiny-moe " + std::string(ggml::type_name(wtype)) + " chunks of " +
                             std::to_string(chunk));
        EXPECT_GT(s.path_counts().moe_grouped + s.path_counts().moe_gemm, 0u)
            << "the grouped expert kernels did not run";
        // Chunks wider than 8 tokens take the grouped tensor-core GEMM for quantized experts.
        EXPECT_EQ(s.path_counts().moe_gemm > 0, gemm && chunk > 8) << "chunks of " << chunk;
    }
    if (gemm) {  // the kill switch: the grouped matvecs in chunks of 64
        auto model = load_gpu(path, 1024, 64, flags({{"GEMMAJIT_MOE_GEMM", "0"}}));
        GpuSession s(*model);
        expect_moe_agree(ref, s.prefill_logits(tokens), V, kTolQuant,
                         "tiny-moe " + std::string(ggml::type_name(wtype)) +
                             " chunks of 64, GEMMAJIT_MOE_GEMM=0");
        EXPECT_EQ(s.path_counts().moe_gemm, 0u);
        EXPECT_GT(s.path_counts().moe_grouped, 0u);
    }
    auto model = load_gpu(path, 1024, 8, f);
    GpuSession s(*model);
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 40);
    const std::vector<float> ref_head(ref.begin(), ref.begin() + size_t(40) * V);
    expect_moe_agree(ref_head, decode_logits(s, head), V, quant ? kTolQuant : 5e-3f,
                     "tiny-moe decode steps");
    EXPECT_EQ(s.graph_launches(), 39u);
}

INSTANTIATE_TEST_SUITE_P(Types, MoeVsCpu,
                         ::testing::Values(ggml::Type::Q8_0, ggml::Type::Q4_0, ggml::Type::Q5_0,
                                           ggml::Type::F16),
                         [](const ::testing::TestParamInfo<ggml::Type>& i) {
                             return std::string(ggml::type_name(i.param));
                         });

// The decode graph of a MoE model (its dense MLPs on a side stream) replays the eager launches
// of one stream bit for bit.
TEST(Moe, GraphReplayIsBitIdenticalToEagerLaunches) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-moe-graph");
    const auto path = synth(dir, "tiny-moe", ggml::Type::Q4_0);
    const auto on = flags(), off = flags({{"GEMMAJIT_GRAPHS", "0"}, {"GEMMAJIT_STREAMS", "0"}});
    auto mg = load_gpu(path, 128, 16, on), me = load_gpu(path, 128, 16, off);
    GpuSession g(*mg), e(*me);
    const auto prompt = test_tokens(5, mg->config().vocab_size);
    int32_t tok = g.prefill(prompt, Readout::Argmax).token;
    ASSERT_EQ(tok, e.prefill(prompt, Readout::Argmax).token);
    for (int i = 0; i < 24; ++i) {
        const auto a = g.decode(tok, Readout::Logits), b = e.decode(tok, Readout::Logits);
        ASSERT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4))
            << "step " << i;
        tok = argmax(a.logits.data(), int(a.logits.size()));
    }
    EXPECT_EQ(g.graph_captures(), 1u);
    EXPECT_GT(g.path_counts().moe_grouped, 0u);
    // The graph's dense MLPs ran beside the router and the experts (a branch of their own), the
    // eager steps' in line: the same logits.
    EXPECT_GT(g.path_counts().moe_dense_beside, 0u) << "the dense MLP stayed in the chain";
    EXPECT_EQ(e.path_counts().moe_dense_beside, 0u);
    EXPECT_GT(g.path_counts().moe_route_group, 0u) << "routing and grouping took two launches";
}

// The real 26B-A4B shapes (d 2816, 128 experts of width 704, top-8, dense MLP 2112, head dims
// 256/512, vocab 262144) cut to two layers, against the CPU reference: Q4_0, and the K-quant
// mixes whose experts' gate|up are Q4_K / Q5_K / Q6_K and down the 32-block fallbacks (F 704 is
// no multiple of 256), all split and on the grouped tensor-core GEMM in prefill.
class Moe26bVsCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(Moe26bVsCpu, ShapesOf26bA4bMatchTheCpuReference) {
    GJ_REQUIRE_GPU();
    const std::string w = GetParam();
    ScratchDir dir("gpu-moe-26b-" + w);
    const auto path =
        w == "q4_0" ? synth(dir, "26b-a4b", ggml::Type::Q4_0, 2) : synth_mix(dir, "26b-a4b", w, 2);
    const auto f = flags();
    auto model = load_gpu(path, 1024, 16, f);
    const auto& cfg = model->config();
    ASSERT_EQ(cfg.n_experts, 128);
    if (w != "q4_0") {  // the mix's expert types, as a llama.cpp file stores them
        const auto& g = model->layers()[0];
        const ggml::Type up = w == "q4_k_m"   ? ggml::Type::Q4_K
                              : w == "q5_k_m" ? ggml::Type::Q5_K
                                              : ggml::Type::Q6_K;
        EXPECT_EQ(g.gate_up.all.type, up);
        EXPECT_EQ(g.gate_up.all.layout, MatvecLayout::Split);
        EXPECT_EQ(g.down_exps.all.layout, MatvecLayout::Split);
        EXPECT_FALSE(g.gate_up.spec_gemm.empty()) << "no grouped GEMM planned for gate|up";
    }
    const auto tokens = test_tokens(24, cfg.vocab_size, 4242);
    const auto ref = cpu_logits(path, tokens);
    GpuSession s(*model);
    expect_moe_agree(ref, s.prefill_logits(tokens), cfg.vocab_size, kTolQuant,
                     "26b-a4b " + w + " prefill");
    EXPECT_GT(s.path_counts().moe_gemm, 0u) << "the grouped expert GEMM did not run";
    s.reset();
    expect_moe_agree(ref, decode_logits(s, tokens), cfg.vocab_size, kTolQuant,
                     "26b-a4b " + w + " decode");
    EXPECT_GT(s.path_counts().moe_grouped, 0u);
}

INSTANTIATE_TEST_SUITE_P(Types, Moe26bVsCpu, ::testing::Values("q4_0", "q4_k_m", "q5_k_m", "q6_k"));
