// The GPU forward pass end to end: logits against the CPU reference on every dense tiny preset
// (several weight types, sequences past the sliding window with the KV rings wrapping) and on a
// synthetic E4B at its real shapes with few layers (K-quant files: gpu_test_forward_kquant.cpp);
// graph replay against eager launches (bitwise,
// and the graph really ran); every kill switch against its exact path; chunked against whole
// prefill; rewinding; and the errors for models and inputs the GPU path cannot take.
//
// Tolerances, relative to the largest |logit| of the reference:
//   quantized weights: the activations are quantized to int8 per 32 values (Q8_1) before every
//     matvec, and K/V are stored as fp16: 3e-2 (measured on the H200: 1.7-2.1% on the tiny
//     presets, whose 128-wide rows average the rounding least; 0.7% at the E4B shapes);
//   float weights: fp32 activations, only the fp16 KV cache differs: 5e-3 (measured 0.03%);
//   bf16 KV cache (8 mantissa bits instead of 11): 4e-2 (measured 0.3%);
//   q8_0 KV cache (int8 per 32-block: errors up to half a step of amax / 127, about 4x bf16's in
//     rms for normed rows), with float or quantized weights: 6e-2 (measured on the H200: 0.7-1.0%
//     with float weights, 2.5% with Q8_0 weights).
// The argmax must agree at every position, except where the reference's top two logits are within
// twice the tolerance of each other (a near tie rounding may flip; counted and printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/cpu/cpu_forward.h"
#include "engine/generate/generate.h"
#include "engine/generate/generate_gpu.h"
#include "engine/gguf/reader.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/session.h"
#include "engine/model/synth.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_data.h"
#include "jit/env_flags.h"
#include "tests/support/gpu_forward_check.h"
#include "tests/support/test_env.h"

using gj::gemma4::Config;
using gj::gemma4::CpuModel;
using gj::gemma4::CpuSession;
using gj::gemma4::GpuModel;
using gj::gemma4::GpuModelError;
using gj::gemma4::GpuModelOptions;
using gj::gemma4::GpuSession;
using gj::gemma4::MatvecLayout;
using gj::gemma4::Readout;
namespace ggml = gj::ggml;
using namespace gj::test;  // synth, load_gpu, cpu_logits, expect_agree, ...

namespace {

constexpr float kTolQuant = 3e-2f;
constexpr float kTolFloat = 5e-3f;
constexpr float kTolBf16Kv = 4e-2f;
// cuBLAS products of F16/BF16 weights take activations rounded to the weight type (bf16: 8
// significant bits), so float-weight models agree less tightly than with fp32 activations.
constexpr float kTolBlas = 2e-2f;
// q8_0 KV cache: K and V rounded to 8 bits per 32-block (measured 0.7-2.5% of max|logit|).
constexpr float kTolQ8Kv = 6e-2f;

struct Case {
    std::string variant;
    ggml::Type wtype;
};
std::string case_name(const Case& c) {
    std::string n = c.variant + "_" + ggml::type_name(c.wtype);
    std::replace(n.begin(), n.end(), '-', '_');
    return n;
}
// gtest prints parameters (and ctest shows them in test names) through PrintTo.
void PrintTo(const Case& c, std::ostream* os) {
    *os << case_name(c);
}

class GpuVsCpu : public ::testing::TestWithParam<Case> {
  protected:
    gj::test::ScratchDir dir_{"gpu-forward"};
};

}  // namespace

// Chunks of 4 make every sliding ring 16 slots (window 8 + 3, rounded up): 40 tokens wrap each ring
// twice, and the prefill sees several chunks.
TEST_P(GpuVsCpu, LogitsMatchTheCpuReferencePastTheWindow) {
    GJ_REQUIRE_GPU();
    const Case& c = GetParam();
    const auto path = synth(dir_, c.variant, c.wtype);
    const auto f = flags();
    auto model = load_gpu(path, 256, 4, f);
    const Config& cfg = model->config();
    const int T = 5 * cfg.sliding_window;
    const auto tokens = test_tokens(T, cfg.vocab_size);
    const auto ref = cpu_logits(path, tokens);
    const bool quant = c.wtype == ggml::Type::Q8_0 || c.wtype == ggml::Type::Q4_0;
    const float tol = quant ? kTolQuant : kTolFloat;

    GpuSession s(*model);
    expect_agree(ref, s.prefill_logits(tokens), cfg.vocab_size, tol, "chunked prefill vs CPU");
    s.reset();
    expect_agree(ref, decode_logits(s, tokens), cfg.vocab_size, tol, "decode steps vs CPU");
    EXPECT_EQ(s.graph_launches(), uint64_t(T - 1));
    // Decode attention hands the int8 output projection its Q8_1 input from flash_combine.
    EXPECT_EQ(s.path_counts().attn_q8 > 0, quant);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, GpuVsCpu,
    ::testing::Values(Case{"tiny", ggml::Type::Q8_0}, Case{"tiny-e2b", ggml::Type::Q8_0},
                      Case{"tiny-keqv", ggml::Type::Q8_0}, Case{"tiny", ggml::Type::Q4_0},
                      Case{"tiny-keqv", ggml::Type::Q4_0}, Case{"tiny", ggml::Type::F32},
                      Case{"tiny-e2b", ggml::Type::BF16}, Case{"tiny-keqv", ggml::Type::F16}),
    [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

// Prompt chunks of 32 tokens take the prefill fast paths (the int8 tensor-core GEMM, cuBLAS for
// float weights, tensor-core attention), which chunks of at most kPrefillCols tokens never reach;
// 40 tokens run one chunk of 32 and one of 8, past the window. Each fast path that applies to the
// model must have run.
TEST_P(GpuVsCpu, LargeChunkPrefillMatchesTheCpuReference) {
    GJ_REQUIRE_GPU();
    const Case& c = GetParam();
    const auto path = synth(dir_, c.variant, c.wtype);
    const auto f = flags();
    auto model = load_gpu(path, 256, 32, f);
    const Config& cfg = model->config();
    const auto tokens = test_tokens(5 * cfg.sliding_window, cfg.vocab_size);
    const bool quant = c.wtype == ggml::Type::Q8_0 || c.wtype == ggml::Type::Q4_0;
    GpuSession s(*model);
    expect_agree(cpu_logits(path, tokens), s.prefill_logits(tokens), cfg.vocab_size,
                 quant ? kTolQuant : kTolBlas, "32-token chunks vs CPU");
    if (!quant) {
        EXPECT_GT(s.path_counts().blas, 0u) << "cuBLAS products did not run";
    } else if (sm90()) {  // GEMMAJIT_MMQ_VARIANT=auto on sm_90: 32-token chunks take wgmma
        EXPECT_GT(s.path_counts().wgmma, 0u) << "the wgmma GEMM did not run";
        EXPECT_EQ(s.path_counts().dequant, 0u) << "copies made for a short chunk";
        EXPECT_EQ(s.path_counts().mmq, 0u);
    } else {
        EXPECT_GT(s.path_counts().mmq, 0u) << "the int8 tensor-core GEMM did not run";
        EXPECT_EQ(s.path_counts().wgmma, 0u);
    }
    EXPECT_EQ(s.path_counts().flash_prefill, uint64_t(2 * cfg.n_layers))
        << "tensor-core prefill attention did not run on every layer of both chunks";
}

// Loads `path` as is and with the kill switch `off` (32-token chunks, so prefill takes the fast
// paths), checks that the exact path agrees with the fast one on 40 tokens within `tol`, and
// returns the two sessions' fast-path counts (fast, exact).
std::pair<GpuSession::PathCounts, GpuSession::PathCounts> kill_switch_agrees(
    const std::filesystem::path& path, gj::jit::EnvMap off, float tol, const std::string& what,
    const std::function<void(const GpuModel& fast, const GpuModel& exact)>& check_models) {
    const auto on_flags = flags(), off_flags = flags(std::move(off));
    auto fast = load_gpu(path, 128, 32, on_flags);
    auto exact = load_gpu(path, 128, 32, off_flags);
    check_models(*fast, *exact);
    const int V = fast->config().vocab_size;
    const auto tokens = test_tokens(40, V);
    GpuSession a(*fast), b(*exact);
    expect_agree(b.prefill_logits(tokens), a.prefill_logits(tokens), V, tol, what);
    return {a.path_counts(), b.path_counts()};
}

// GEMMAJIT_FLASH_PREFILL=0 attends one query at a time on the split-K decode kernel (fp32, the
// exact path); the tensor-core kernel rounds q and P to the KV type.
TEST(GpuForward, FlashPrefillKillSwitchAgrees) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-flash-prefill");
    for (const char* variant : {"tiny", "tiny-keqv"}) {
        const auto [fast, exact] = kill_switch_agrees(
            synth(dir, variant, ggml::Type::Q8_0), {{"GEMMAJIT_FLASH_PREFILL", "0"}}, kTolQuant,
            std::string("flash_prefill vs flash_decode ") + variant,
            [](const GpuModel& f, const GpuModel& e) {
                EXPECT_FALSE(f.layers()[0].flash_prefill_spec.empty());
                EXPECT_TRUE(e.layers()[0].flash_prefill_spec.empty());
            });
        EXPECT_GT(fast.flash_prefill, 0u);
        EXPECT_EQ(exact.flash_prefill, 0u);
    }
}

// GEMMAJIT_FLASH_WGMMA=on takes the warpgroup attention kernel on every layer it fits (sm_90;
// the tiny presets' head dim 64 global layers, not their head dim 32 sliding ones) for every
// chunk; =off never. Both round q and P to the KV type, so they agree within the quantized
// tolerance; auto leaves these small chunks on the mma.sync kernel (too few row blocks).
TEST(GpuForward, FlashWgmmaAgreesWithMmaSync) {
    GJ_REQUIRE_GPU();
    if (!sm90()) GTEST_SKIP() << "the wgmma attention needs an sm_90 GPU";
    gj::test::ScratchDir dir("gpu-flash-wgmma");
    for (const char* variant : {"tiny", "tiny-keqv"}) {
        const auto path = synth(dir, variant, ggml::Type::Q8_0);
        auto on = load_gpu(path, 128, 32, flags({{"GEMMAJIT_FLASH_WGMMA", "on"}}));
        auto off = load_gpu(path, 128, 32, flags({{"GEMMAJIT_FLASH_WGMMA", "off"}}));
        auto automatic = load_gpu(path, 128, 32, flags());
        const Config& cfg = on->config();
        int fitting = 0;
        for (int l = 0; l < cfg.n_layers; ++l) {
            const bool fits = cfg.layers[l].head_dim == 64;
            fitting += fits;
            EXPECT_EQ(on->layers()[l].flash_prefill_wgmma_specs.size(), fits ? 2u : 0u)
                << "layer " << l;
            EXPECT_TRUE(off->layers()[l].flash_prefill_wgmma_specs.empty());
        }
        ASSERT_GT(fitting, 0);
        const auto tokens = test_tokens(40, cfg.vocab_size);
        GpuSession a(*on), b(*off), c(*automatic);
        const auto want = b.prefill_logits(tokens);
        expect_agree(want, a.prefill_logits(tokens), cfg.vocab_size, kTolQuant,
                     std::string("flash wgmma vs mma.sync ") + variant);
        expect_agree(want, c.prefill_logits(tokens), cfg.vocab_size, kTolQuant,
                     std::string("flash auto vs mma.sync ") + variant);
        // 40 tokens: chunks of 32 and 8.
        EXPECT_EQ(a.path_counts().flash_wgmma, uint64_t(2 * fitting)) << variant;
        EXPECT_EQ(a.path_counts().flash_prefill, uint64_t(2 * cfg.n_layers)) << variant;
        EXPECT_EQ(b.path_counts().flash_wgmma, 0u);
        EXPECT_EQ(c.path_counts().flash_wgmma, 0u);
    }
}

// GEMMAJIT_MMQ_VARIANT=none keeps quantized prefill products on the batched dp4a matvecs (the
// exact path). The int8 GEMM takes the same Q8_1 activations and exact integer block dots, so they
// differ only in the fp32 summation order (and the GeGLU's Q8_1 output rounding); cuBLAS (auto on
// sm_90) multiplies f16 activations by the f16-rounded weights.
TEST(GpuForward, MmqKillSwitchAgrees) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-mmq");
    for (auto wtype : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        const auto [fast, exact] =
            kill_switch_agrees(synth(dir, "tiny-e2b", wtype), {{"GEMMAJIT_MMQ_VARIANT", "none"}},
                               kTolQuant, "int8 GEMM vs matvecs " + ggml::type_name(wtype),
                               [](const GpuModel& f, const GpuModel& e) {
                                   // auto: a GEMM (and on sm_90 F16 copies for long chunks)
                                   EXPECT_FALSE(f.layers()[0].q.spec_gemm.empty());
                                   EXPECT_TRUE(e.layers()[0].q.spec_gemm.empty());
                                   EXPECT_TRUE(e.layers()[0].q.spec_dequant.empty());
                               });
        EXPECT_GT(fast.mmq + fast.wgmma + fast.dequant, 0u);
        EXPECT_EQ(exact.mmq + exact.wgmma + exact.dequant, 0u);
    }
}

// GEMMAJIT_BLAS=0 keeps float-weight prefill products on the batched fp32 matvecs (the exact path).
TEST(GpuForward, BlasKillSwitchAgrees) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-blas");
    for (auto wtype : {ggml::Type::F32, ggml::Type::BF16, ggml::Type::F16}) {
        const auto [fast, exact] =
            kill_switch_agrees(synth(dir, "tiny-e2b", wtype), {{"GEMMAJIT_BLAS", "0"}}, kTolBlas,
                               "cuBLAS vs matvecs " + ggml::type_name(wtype),
                               [](const GpuModel& f, const GpuModel& e) {
                                   ASSERT_NE(f.blas(), nullptr) << "cuBLAS could not be loaded";
                                   EXPECT_EQ(e.blas(), nullptr);
                               });
        EXPECT_GT(fast.blas, 0u);
        EXPECT_EQ(exact.blas, 0u);
    }
}

// The real E4B shapes (d 2560, head dims 256/512, vocab 262144, PLE 42 x 256 wide table cut to 6
// layers, layer 5 global) against the CPU reference over a short sequence.
TEST(GpuForward, E4bShapedModelMatchesTheCpuReference) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-e4b");
    const auto path = synth(dir, "e4b", ggml::Type::Q8_0, 6);
    const auto f = flags();
    auto model = load_gpu(path, 1024, 8, f);
    const Config& cfg = model->config();
    ASSERT_EQ(cfg.d_model, 2560);
    const auto tokens = test_tokens(20, cfg.vocab_size, 777);
    const auto ref = cpu_logits(path, tokens);
    GpuSession s(*model);
    expect_agree(ref, s.prefill_logits(tokens), cfg.vocab_size, kTolQuant, "e4b prefill vs CPU");
    s.reset();
    expect_agree(ref, decode_logits(s, tokens), cfg.vocab_size, kTolQuant, "e4b decode vs CPU");
    // One 20-token chunk: the prefill fast paths at the real shapes.
    auto big = load_gpu(path, 1024, 64, f);
    GpuSession b(*big);
    expect_agree(ref, b.prefill_logits(tokens), cfg.vocab_size, kTolQuant,
                 "e4b one-chunk prefill vs CPU");
    EXPECT_EQ(b.path_counts().flash_prefill, uint64_t(cfg.n_layers));
    EXPECT_GT(b.path_counts().blas, 0u);  // the BF16 / F32 PLE projections
    EXPECT_GT(sm90() ? b.path_counts().wgmma : b.path_counts().mmq, 0u);
}

// The decode graph (with the K/V projections on parallel branches) replays the exact path, eager
// launches on one stream, bitwise: equal logits over 32 steps, with the graph captured once per
// readout and launched every step.
TEST(GpuForward, GraphReplayIsBitIdenticalToEagerLaunches) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-graph");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const auto on = flags(), off = flags({{"GEMMAJIT_GRAPHS", "0"}, {"GEMMAJIT_STREAMS", "0"}});
    auto mg = load_gpu(path, 128, 16, on);
    auto me = load_gpu(path, 128, 16, off);
    GpuSession g(*mg), e(*me);
    ASSERT_TRUE(g.graphs_enabled());
    ASSERT_FALSE(e.graphs_enabled());
    const auto prompt = test_tokens(5, mg->config().vocab_size);
    auto pg = g.prefill(prompt, Readout::Argmax), pe = e.prefill(prompt, Readout::Argmax);
    ASSERT_EQ(pg.token, pe.token);
    int32_t tok = pg.token;
    for (int i = 0; i < 32; ++i) {
        auto a = g.decode(tok, Readout::Logits), b = e.decode(tok, Readout::Logits);
        ASSERT_EQ(a.logits.size(), b.logits.size());
        ASSERT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4))
            << "graph and eager logits differ at step " << i;
        tok = argmax(a.logits.data(), int(a.logits.size()));
    }
    EXPECT_EQ(g.graph_captures(), 1u);
    EXPECT_EQ(g.graph_launches(), 32u);
    EXPECT_EQ(e.graph_launches(), 0u);
    // A second readout gets its own graph; the argmax agrees with the logits.
    auto a = g.decode(tok, Readout::Argmax);
    auto b = e.decode(tok, Readout::Logits);
    EXPECT_EQ(a.token, argmax(b.logits.data(), int(b.logits.size())));
    EXPECT_EQ(g.graph_captures(), 2u);
}

// Programmatic dependent launches (GEMMAJIT_PDL, the default) change when kernels start, never
// what they compute: prefill in 32-token chunks (the tensor-core GEMMs and attention) and 48
// decode steps past the window, with graphs and eagerly, give logits bitwise equal to serial
// launches. On sm_90 every launch of the engine's own kernels must have been a dependent one.
TEST(GpuForward, DependentLaunchesAreBitIdenticalToSerialLaunches) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-pdl");
    for (const char* graphs : {"1", "0"}) {
        SCOPED_TRACE(std::string("GEMMAJIT_GRAPHS=") + graphs);
        const auto path = synth(dir, "tiny-e2b", ggml::Type::Q4_0);
        auto mp = load_gpu(path, 256, 32, flags({{"GEMMAJIT_GRAPHS", graphs}}));
        auto ms =
            load_gpu(path, 256, 32, flags({{"GEMMAJIT_GRAPHS", graphs}, {"GEMMAJIT_PDL", "0"}}));
        GpuSession p(*mp), s(*ms);
        const auto prompt = test_tokens(40, mp->config().vocab_size);
        const auto lp = p.prefill_logits(prompt), ls = s.prefill_logits(prompt);
        ASSERT_EQ(lp.size(), ls.size());
        ASSERT_EQ(0, std::memcmp(lp.data(), ls.data(), lp.size() * 4)) << "prefill logits differ";
        int32_t tok =
            argmax(lp.data() + lp.size() - mp->config().vocab_size, mp->config().vocab_size);
        for (int i = 0; i < 48; ++i) {
            auto a = p.decode(tok, Readout::Logits), b = s.decode(tok, Readout::Logits);
            ASSERT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4))
                << "decode logits differ at step " << i;
            tok = argmax(a.logits.data(), int(a.logits.size()));
        }
        EXPECT_EQ(s.path_counts().dependent, 0u);
        if (sm90()) {
            EXPECT_GT(p.path_counts().launches, 0u);
            EXPECT_EQ(p.path_counts().dependent, p.path_counts().launches)
                << "a kernel was launched without waiting on its grid dependency";
        } else {
            EXPECT_EQ(p.path_counts().dependent, 0u);  // griddepcontrol needs sm_90
        }
    }
}

// GEMMAJIT_REPACK=0 keeps the GGUF block layout (the split layout must really be used by default),
// with logits within the int8 tolerance of each other (the summation order differs).
TEST(GpuForward, RepackKillSwitchAgrees) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-repack");
    for (auto wtype : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        const auto path = synth(dir, "tiny", wtype);
        const auto on = flags(), off = flags({{"GEMMAJIT_REPACK", "0"}});
        auto split = load_gpu(path, 128, 8, on);
        auto plain = load_gpu(path, 128, 8, off);
        EXPECT_EQ(split->layers()[0].q.layout, MatvecLayout::Split);
        EXPECT_EQ(split->lm_head().layout, MatvecLayout::Split);
        EXPECT_EQ(plain->layers()[0].q.layout, MatvecLayout::Ggml);
        const auto tokens = test_tokens(24, split->config().vocab_size);
        GpuSession a(*split), b(*plain);
        expect_agree(b.prefill_logits(tokens), a.prefill_logits(tokens), split->config().vocab_size,
                     kTolQuant, "split vs GGUF layout " + ggml::type_name(wtype));
    }
}

// The PLE table read from pinned host memory gives bitwise the same logits as on the GPU.
TEST(GpuForward, PleTableInHostMemoryIsBitIdentical) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-ple");
    const auto path = synth(dir, "tiny-e2b", ggml::Type::Q8_0);
    const auto gpu = flags({{"GEMMAJIT_PLE_TABLE", "gpu"}}),
               host = flags({{"GEMMAJIT_PLE_TABLE", "host"}});
    auto a = load_gpu(path, 128, 8, gpu);
    auto b = load_gpu(path, 128, 8, host);
    EXPECT_TRUE(a->ple_table().on_gpu);
    EXPECT_FALSE(b->ple_table().on_gpu);
    const auto tokens = test_tokens(30, a->config().vocab_size);
    GpuSession sa(*a), sb(*b);
    const auto la = sa.prefill_logits(tokens), lb = sb.prefill_logits(tokens);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
    sa.reset();
    sb.reset();
    const auto da = decode_logits(sa, tokens), db = decode_logits(sb, tokens);
    EXPECT_EQ(0, std::memcmp(da.data(), db.data(), da.size() * 4));
}

// A long run (issue 13): 4097 decode steps past the sliding window (8 on the tiny presets), each
// step's logits against the CPU reference's at that position (the tokens are given, so every
// step is checked on its own), through the decode graphs: the sliding layers' rings wrap about
// 500 times, the global layers attend to over 4000 keys (many splits per head), and neither the
// logits nor the argmax may drift or turn NaN. The files state a context of 8192 so that the run
// fits.
TEST(GpuForward, LongDecodePastTheWindowStaysOnTheCpuReference) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-long-decode");
    for (const auto& [variant, wtype] :
         {std::pair{"tiny", ggml::Type::Q8_0}, std::pair{"tiny-keqv", ggml::Type::Q4_0}}) {
        gj::synth::Options o;
        o.variant = variant;
        o.wtype = wtype;
        o.context = 8192;
        const auto path = dir.path() / (std::string(variant) + "-long.gguf");
        gj::synth::write_model(o, path);
        auto model = load_gpu(path, 4352, 64, flags());
        const Config& cfg = model->config();
        ASSERT_EQ(cfg.sliding_window, 8);
        const auto tokens = test_tokens(cfg.sliding_window + 4097 + 1, cfg.vocab_size);
        GpuSession s(*model);
        const auto got = decode_logits(s, tokens);
        EXPECT_EQ(s.graph_launches(), uint64_t(tokens.size() - 1));
        ASSERT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return std::isfinite(v); }))
            << variant << ": a non-finite logit";
        expect_agree(cpu_logits(path, tokens), got, cfg.vocab_size, kTolQuant,
                     std::string(variant) + ": 4105 positions, decode vs CPU");
    }
}

TEST(GpuForward, Bf16KvCacheMatchesTheCpuReference) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-bf16kv");
    const auto path = synth(dir, "tiny", ggml::Type::F32);
    const auto f = flags({{"GEMMAJIT_KV_TYPE", "bf16"}});
    auto model = load_gpu(path, 128, 4, f);
    const auto tokens = test_tokens(40, model->config().vocab_size);
    GpuSession s(*model);
    expect_agree(cpu_logits(path, tokens), s.prefill_logits(tokens), model->config().vocab_size,
                 kTolBf16Kv, "bf16 KV vs CPU");
}

// GEMMAJIT_KV_TYPE=q8_0 on the tiny presets (float weights, where the cache dominates the error,
// and int8 weights), past the sliding window with the rings wrapping: chunked prefill (chunks of 4
// on the split-K attention, chunks of 32 on the tensor-core one) and decode steps against the CPU
// reference (which keeps K/V in fp32).
TEST(GpuForward, Q8KvCacheMatchesTheCpuReferencePastTheWindow) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-q8kv");
    const auto f = flags({{"GEMMAJIT_KV_TYPE", "q8_0"}});
    for (const Case& c : {Case{"tiny", ggml::Type::F32}, Case{"tiny-e2b", ggml::Type::BF16},
                          Case{"tiny-keqv", ggml::Type::F16}, Case{"tiny", ggml::Type::Q8_0}}) {
        SCOPED_TRACE(case_name(c));
        const auto path = synth(dir, c.variant, c.wtype);
        auto model = load_gpu(path, 256, 4, f);
        const Config& cfg = model->config();
        // The q8_0 kernels are the ones loaded.
        for (int l = 0; l < cfg.n_layers; ++l) {
            EXPECT_TRUE(model->layers()[l].flash_spec.ends_with(".q8_0")) << l;
            if (cfg.layers[l].has_kv) {
                EXPECT_TRUE(model->layers()[l].attn_prep_spec.ends_with(".q8_0")) << l;
            }
        }
        const int T = 5 * cfg.sliding_window;
        const auto tokens = test_tokens(T, cfg.vocab_size);
        const auto ref = cpu_logits(path, tokens);
        GpuSession s(*model);
        expect_agree(ref, s.prefill_logits(tokens), cfg.vocab_size, kTolQ8Kv,
                     case_name(c) + " q8_0 KV: chunked prefill vs CPU");
        s.reset();
        expect_agree(ref, decode_logits(s, tokens), cfg.vocab_size, kTolQ8Kv,
                     case_name(c) + " q8_0 KV: decode steps vs CPU");
        EXPECT_EQ(s.graph_launches(), uint64_t(T - 1));
        // Chunks of 32 tokens: the tensor-core prefill attention dequantizing the q8_0 cache.
        auto big = load_gpu(path, 256, 32, f);
        EXPECT_TRUE(big->layers()[0].flash_prefill_spec.ends_with(".q8_0"))
            << big->layers()[0].flash_prefill_spec;
        GpuSession b(*big);
        expect_agree(ref, b.prefill_logits(tokens), cfg.vocab_size, kTolQ8Kv,
                     case_name(c) + " q8_0 KV: 32-token chunks vs CPU");
        EXPECT_EQ(b.path_counts().flash_prefill, uint64_t((T + 31) / 32 * cfg.n_layers));
    }
}

// The tensor-core attention has no q8_0 form: asking for both fails at load, naming both flags.
TEST(GpuForward, Q8KvCacheWithFlashMmaIsRefused) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-q8kv-mma");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const auto f = flags({{"GEMMAJIT_KV_TYPE", "q8_0"}, {"GEMMAJIT_FLASH_MMA", "1"}});
    try {
        load_gpu(path, 128, 4, f);
        FAIL() << "expected an error";
    } catch (const std::exception& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("q8_0"), std::string::npos) << what;
        EXPECT_NE(what.find("GEMMAJIT_FLASH_MMA"), std::string::npos) << what;
    }
}

// Prompt in chunks of 4 (the batched dp4a matvecs) vs at once (one chunk: each prefill GEMM
// variant the GPU has), each against the CPU reference over every position and the decode step
// after the prefill, and against each other (the attention split count follows the chunk's end,
// so the combine order may differ too). Two int8-level approximations, so within twice the int8
// tolerance: measured on the H100 against the CPU, chunks of 4 2.5% of max|logit|, one chunk
// 3.1% (mma: int8 activations and a different summation order), 1.0% (wgmma: bf16), 0.55%
// (blas: f16); pairwise up to 3.4% (chunks of 4 vs blas, the decode step after the prefill).
constexpr float kTolTwoInt8Paths = 2 * kTolQuant;
TEST(GpuForward, ChunkedPrefillAgreesWithWholePrefill) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-chunks");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const auto f = flags();
    auto small = load_gpu(path, 256, 4, f);
    const int V = small->config().vocab_size;
    const auto tokens = test_tokens(50, V);
    auto with_next = tokens;
    with_next.push_back(7);
    const auto ref_all = cpu_logits(path, with_next);
    const std::vector<float> ref(ref_all.begin(), ref_all.end() - V),
        ref_next(ref_all.end() - V, ref_all.end());
    GpuSession a(*small);
    const auto chunked = a.prefill_logits(tokens);
    expect_agree(ref, chunked, V, kTolQuant, "chunks of 4 vs CPU");
    a.reset();
    const auto ra = a.prefill(tokens, Readout::Logits);
    const auto da = a.decode(7, Readout::Logits);
    expect_agree(ref_next, da.logits, V, kTolQuant, "chunks of 4, decode after vs CPU");
    std::vector<std::string> variants = {"mma", "blas"};
    if (sm90()) variants.push_back("wgmma");
    for (const auto& v : variants) {
        SCOPED_TRACE(v);
        const auto fv = flags({{"GEMMAJIT_MMQ_VARIANT", v}});
        auto whole = load_gpu(path, 256, 64, fv);
        GpuSession b(*whole);
        // Against the CPU: the int8 GEMM within the two-path bound, the f16 / bf16 ones within
        // the int8 tolerance.
        const float tol_cpu = v == "mma" ? kTolTwoInt8Paths : kTolQuant;
        const auto one = b.prefill_logits(tokens);
        expect_agree(ref, one, V, tol_cpu, "one chunk of 50 (" + v + ") vs CPU");
        expect_agree(one, chunked, V, kTolTwoInt8Paths,
                     "chunks of 4 vs one chunk of 50 (" + v + ")");
        b.reset();
        const auto rb = b.prefill(tokens, Readout::Logits);
        expect_agree(rb.logits, ra.logits, V, kTolTwoInt8Paths, "last-token readout (" + v + ")");
        const auto db = b.decode(7, Readout::Logits);
        expect_agree(ref_next, db.logits, V, tol_cpu, "decode after one chunk (" + v + ") vs CPU");
        expect_agree(db.logits, da.logits, V, kTolTwoInt8Paths,
                     "decode after either prefill (" + v + ")");
    }
}

// Greedy and top-k sampling pick the same tokens from the device readout as from the whole logits
// row on the host (GEMMAJIT_GPU_SAMPLING=0).
TEST(GpuForward, DeviceSamplingPicksWhatHostSamplingPicks) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-sampling");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    gj::tok::Tokenizer tokenizer(gj::tok::read_vocab(*gj::gguf::File::open(path)));
    const auto on = flags(), off = flags({{"GEMMAJIT_GPU_SAMPLING", "0"}});
    auto mon = load_gpu(path, 256, 16, on);
    auto moff = load_gpu(path, 256, 16, off);
    const auto prompt = test_tokens(12, mon->config().vocab_size);
    for (float temp : {0.0f, 1.0f}) {
        gj::sample::SamplerParams p;
        p.temperature = temp;
        p.top_k = 40;
        p.top_p = 0.9f;
        p.seed = 5;
        std::vector<int32_t> got[2];
        for (int i = 0; i < 2; ++i) {
            GpuSession s(i == 0 ? *mon : *moff);
            gj::gen::GpuForward fwd(s);
            EXPECT_EQ(fwd.reduces_on_device(), i == 0);
            gj::sample::Sampler sampler(p);
            gj::gen::GenerateOptions go;
            go.max_tokens = 40;
            got[i] = gj::gen::generate(fwd, tokenizer, sampler, prompt, go, {}).tokens;
        }
        EXPECT_EQ(got[0], got[1]) << "temperature " << temp;
        EXPECT_FALSE(got[0].empty());
    }
    EXPECT_EQ(gj::gen::readout_for(gj::sample::SamplerParams{}).kind,
              gj::gen::Readout::Kind::TopK);  // Gemma defaults: top-k 64 on the device
}

// Rewinding keeps the cache: recomputing the dropped tokens reproduces their logits exactly, and a
// rewind past what a sliding ring still holds is refused.
TEST(GpuForward, RewindRecomputesDroppedPositions) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-rewind");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const auto f = flags();
    auto model = load_gpu(path, 256, 4, f);  // rings of 16 slots, window 8
    const auto tokens = test_tokens(30, model->config().vocab_size);
    GpuSession s(*model);
    s.prefill({tokens.data(), 25}, Readout::Argmax);
    const auto want = s.decode(tokens[25], Readout::Logits);
    ASSERT_TRUE(s.rewind(22));
    s.prefill({tokens.data() + 22, 3}, Readout::Argmax);
    const auto got = s.decode(tokens[25], Readout::Logits);
    // Positions 22..24 were first computed in chunks [20, 24) and [24, 25), now as one chunk: the
    // tensor-core prefill attention tiles the rows differently (another summation order, q and P
    // rounded to f16), so the int8 tolerance rather than bit equality.
    expect_agree(want.logits, got.logits, model->config().vocab_size, kTolQuant,
                 "decode after rewind and re-prefill");
    EXPECT_EQ(s.position(), 26);
    EXPECT_FALSE(s.rewind(10)) << "positions 10..25 overwrote ring slots position 10 still needs";
    EXPECT_EQ(s.position(), 26);
}

TEST(GpuForward, ImpossibleRequestsFailClearly) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-errors");
    const auto path = synth(dir, "tiny-e2b", ggml::Type::Q8_0);
    auto message = [](auto&& fn) {
        try {
            fn();
        } catch (const std::exception& e) {
            return std::string(e.what());
        }
        return std::string("(no exception)");
    };
    // Too little memory: the message says how much is needed and how much is free.
    {
        const auto f = flags({{"GEMMAJIT_GPU_MEMORY_LIMIT", "1M"}});
        const std::string m = message([&] { load_gpu(path, 128, 8, f); });
        EXPECT_NE(m.find("needs"), std::string::npos) << m;
        EXPECT_NE(m.find("free"), std::string::npos) << m;
        EXPECT_NE(m.find("weights"), std::string::npos) << m;
    }
    // Just enough memory without the PLE table: it moves to pinned host memory by itself.
    {
        const auto f = flags();
        auto full = load_gpu(path, 128, 8, f);
        const auto& mem = full->memory();
        ASSERT_TRUE(mem.ple_on_gpu);
        const uint64_t limit = mem.needed() - mem.ple_table / 2;
        const auto lf = flags({{"GEMMAJIT_GPU_MEMORY_LIMIT", std::to_string(limit)}});
        auto squeezed = load_gpu(path, 128, 8, lf);
        EXPECT_FALSE(squeezed->memory().ple_on_gpu);
        EXPECT_FALSE(squeezed->ple_table().on_gpu);
    }
    // A sequence longer than the context, a token outside the vocabulary.
    {
        const auto f = flags();
        auto model = load_gpu(path, 64, 8, f);
        GpuSession s(*model);
        const std::string m = message([&] { s.prefill(test_tokens(65, 1000), Readout::Argmax); });
        EXPECT_NE(m.find("context of 64"), std::string::npos) << m;
        EXPECT_EQ(s.position(), 0);
        const std::string v = message([&] { s.decode(1 << 20, Readout::Argmax); });
        EXPECT_NE(v.find("outside the vocabulary"), std::string::npos) << v;
        const std::string c = message([&] { load_gpu(path, 1 << 20, 8, f); });
        EXPECT_NE(c.find("exceeds"), std::string::npos) << c;
    }
}

// The default chunk (GEMMAJIT_PREFILL_CHUNK unset: 2048 tokens) prefills a long prompt in fewer,
// longer chunks with the logits of 64-token chunks (sliding-window rings of window + 2047 slots,
// products over 2048 rows); a load whose memory does not fit it halves it, with a notice, down to
// 512 before touching the context or moving a PLE table to host memory, and an explicit chunk
// never shrinks.
TEST(GpuForward, DefaultChunkIsLongAndShrinksToFit) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-long-chunk");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const auto f = flags();
    auto load = [&](const std::filesystem::path& p, const gj::jit::Flags& fl,
                    std::vector<std::string>* lines = nullptr) {
        GpuModelOptions o;
        o.context = 4096;
        o.flags = &fl;
        if (lines) o.progress = [lines](const std::string& l) { lines->push_back(l); };
        return GpuModel::load(p, o);
    };
    auto long_chunks = load(path, f);
    ASSERT_EQ(long_chunks->prefill_chunk(), 2048);
    auto short_chunks = load_gpu(path, 4096, 64, f);
    const int V = long_chunks->config().vocab_size;
    const auto tokens = test_tokens(2500, V);
    GpuSession a(*long_chunks), b(*short_chunks);
    expect_agree(b.prefill_logits(tokens), a.prefill_logits(tokens), V, kTolQuant,
                 "chunks of 2048 vs chunks of 64 over 2500 tokens");

    auto noticed = [](const std::vector<std::string>& lines) {
        return std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
            return l.find("prefill chunk reduced from 2048 to 512") != std::string::npos;
        });
    };
    for (const char* preset : {"tiny", "tiny-e2b"}) {  // tiny-e2b: a PLE table that fits at 512
        SCOPED_TRACE(preset);
        const auto p = synth(dir, preset, ggml::Type::Q8_0);
        auto at512 = load_gpu(p, 4096, 512, f);
        const uint64_t needed512 = at512->memory().needed();
        ASSERT_LT(needed512, load(p, f)->memory().needed());
        const auto tight = flags({{"GEMMAJIT_GPU_MEMORY_LIMIT", std::to_string(needed512)}});
        std::vector<std::string> lines;
        auto squeezed = load(p, tight, &lines);
        EXPECT_EQ(squeezed->prefill_chunk(), 512);
        EXPECT_EQ(squeezed->kv_geometry().context, 4096);
        EXPECT_EQ(squeezed->memory().ple_on_gpu, at512->memory().ple_on_gpu)
            << "the PLE table left the GPU although a shorter chunk fits it";
        EXPECT_TRUE(noticed(lines)) << "no notice of the smaller chunk";
        const auto explicit_chunk = flags({{"GEMMAJIT_GPU_MEMORY_LIMIT", std::to_string(needed512)},
                                           {"GEMMAJIT_PREFILL_CHUNK", "2048"},
                                           {"GEMMAJIT_PLE_TABLE", "gpu"}});
        EXPECT_THROW(load(p, explicit_chunk), GpuModelError) << "an explicit chunk was shrunk";
    }
}

// The commands on the GPU: run streams text, chat keeps the conversation, bench prints its table,
// logits agrees with the CPU reference's argmax.
TEST(GpuForward, CommandsRunOnTheGpu) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-cli");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0).string();
    const std::string exe = gj::test::gemmajit_exe();
    auto run =
        gj::test::run_command(exe + " run --model " + path + " -p 'Hello there' -n 12 --temp 0");
    EXPECT_EQ(run.exit_code, 0) << run.out;
    EXPECT_NE(run.out.find("generation:"), std::string::npos) << run.out;
    EXPECT_EQ(run.out.find("CPU reference"), std::string::npos) << run.out;

    auto chat = gj::test::run_command("printf 'Hi\\nAnd again\\n/quit\\n' | " + exe +
                                      " chat --model " + path + " -n 6 --temp 0");
    EXPECT_EQ(chat.exit_code, 0) << chat.out;

    auto bench = gj::test::run_command(exe + " bench --model " + path +
                                       " -p 16 -n 8 -d 0,32 -r 2 --profile");
    EXPECT_EQ(bench.exit_code, 0) << bench.out;
    for (const char* want : {"pp16", "tg8", "tg8 @ d32", "copy bandwidth", "kernel time"})
        EXPECT_NE(bench.out.find(want), std::string::npos) << want << "\n" << bench.out;

    auto gpu = gj::test::run_command(exe + " logits --model " + path + " --tokens 2,10,20,30");
    auto cpu =
        gj::test::run_command(exe + " logits --cpu --model " + path + " --tokens 2,10,20,30");
    EXPECT_EQ(gpu.exit_code, 0) << gpu.out;
    EXPECT_EQ(cpu.exit_code, 0) << cpu.out;

    // The MoE model runs on the GPU too.
    auto moe = gj::test::run_command(exe + " run --model " +
                                     synth(dir, "tiny-moe", ggml::Type::Q8_0).string() +
                                     " -p hi -n 8 --temp 0");
    EXPECT_EQ(moe.exit_code, 0) << moe.out;
    EXPECT_NE(moe.out.find("generation:"), std::string::npos) << moe.out;
    EXPECT_EQ(moe.out.find("CPU reference"), std::string::npos) << moe.out;
}

// `precompile --model` warms exactly the kernel set a GPU load compiles: after it, a load with
// GEMMAJIT_REQUIRE_CACHED=1 (any miss is an error) succeeds and runs NVRTC zero times.
TEST(GpuForward, PrecompiledModelLoadsWithoutCompiling) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-precompile");
    const auto cache = dir.path() / "cache";
    for (auto wtype : {ggml::Type::Q8_0, ggml::Type::BF16}) {
        const auto path = synth(dir, "tiny-e2b", wtype).string();
        auto pre = gj::test::run_command("GEMMAJIT_CACHE_DIR=" + cache.string() + " " +
                                         gj::test::gemmajit_exe() + " precompile --model " + path);
        ASSERT_EQ(pre.exit_code, 0) << pre.out;
        const auto f =
            flags({{"GEMMAJIT_CACHE_DIR", cache.string()}, {"GEMMAJIT_REQUIRE_CACHED", "1"}});
        auto model = load_gpu(path, 256, 16, f);
        EXPECT_EQ(model->kernels().compiled_now(), 0u) << path;
        EXPECT_EQ(model->kernels().size(), GpuModel::kernel_specs(path, {}).size()) << path;
    }
}
