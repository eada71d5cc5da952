// Kernel plan contents, and NVRTC compilation of every kernel template specialization the five
// released models need (q8_0 and q4_0, sm_80 and sm_90), on the CPU: each kernel must compile,
// contain the instructions it exists for, and (hot kernels) spill nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include <fmt/format.h>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/embed_rows.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/gemm_wgmma.h"
#include "engine/gpu/kernels/logits.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/mmq.h"
#include "engine/gpu/kernels/ple.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kv_type.h"
#include "jit/env_flags.h"
#include "jit/jit.h"

using gj::gemma4::build_kernel_plan;
using gj::gemma4::Config;
using gj::gemma4::KvType;
using gj::gemma4::MatvecLayout;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

const std::vector<std::string> kVariants = {"e2b", "e4b", "12b", "26b-a4b", "31b"};

std::set<std::string> names_of(const std::vector<KernelSpec>& plan) {
    std::set<std::string> s;
    for (const auto& k : plan) s.insert(k.name);
    return s;
}

// The PTX text of one entry: from its ".entry name(" to the next ".entry" (or the end).
std::string entry_ptx(const std::string& ptx, const std::string& entry) {
    const auto start = ptx.find(".entry " + entry + "(");
    if (start == std::string::npos) return {};
    const auto end = ptx.find(".entry ", start + 1);
    return ptx.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

KernelSpec ptx_selftest_spec() {
    KernelSpec s;
    s.family = "ptx_selftest";
    s.name = "ptx_selftest";
    s.entries = {"selftest_convert",   "selftest_pack",     "selftest_dp4a",
                 "selftest_mma_s8",    "selftest_mma_f16",  "selftest_mma_bf16",
                 "selftest_ldmatrix",  "selftest_cp_async", "selftest_warp_reduce",
                 "selftest_fast_math", "selftest_loads",    "selftest_q8_scale",
                 "selftest_rsqrt"};
    return s;
}

const std::vector<ggml::Type> kWeightTypes = {ggml::Type::F32, ggml::Type::F16, ggml::Type::BF16,
                                              ggml::Type::Q8_0, ggml::Type::Q4_0};

// The mmq (int8 tensor-core GEMM) specs of a model's dense matrices: (k, n_rows) of the Q, K, V,
// O, gate/up and down projections of every layer, deduplicated by name.
std::vector<KernelSpec> mmq_specs(const Config& cfg, ggml::Type t) {
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto add = [&](int k, int n) {
        auto s = gj::gemma4::mmq_spec(t, k, n);
        if (seen.insert(s.name).second) specs.push_back(s);
    };
    for (int l = 0; l < cfg.n_layers; ++l) {
        add(cfg.d_model, cfg.q_dim(l));
        if (cfg.layers[l].has_kv) add(cfg.d_model, cfg.kv_dim(l));
        add(cfg.q_dim(l), cfg.d_model);
        add(cfg.d_model, cfg.layers[l].ffn_dim);
        add(cfg.layers[l].ffn_dim, cfg.d_model);
    }
    return specs;
}

// Every distinct spec of every preset's plan (the five released models and the tiny test presets)
// for every weight type, plus the selftest and the matvec forms no plan uses by default (ggml
// layout, odd column counts).
std::vector<KernelSpec> all_specs() {
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto add = [&](const KernelSpec& s) {
        if (seen.insert(s.name).second) specs.push_back(s);
    };
    for (const auto& v : Config::preset_names())
        for (auto t : kWeightTypes)
            for (const auto& s : build_kernel_plan(Config::preset(v), t)) add(s);
    add(ptx_selftest_spec());
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        add(gj::gemma4::matvec_spec(t, 2560, 1, MatvecLayout::Ggml));
        add(gj::gemma4::matvec_spec(t, 2112, 2, MatvecLayout::Ggml));
        add(gj::gemma4::matvec_spec(t, 96, 1, MatvecLayout::Ggml));
    }
    add(gj::gemma4::matvec_f_spec(ggml::Type::BF16, 2560, 4));
    // The bf16 KV cache (GEMMAJIT_KV_TYPE=bf16), and the attention kernels of a tiny preset
    // (head dims 32 and 64, k_eq_v, group 8 over one KV head) as the GPU tests run them.
    for (const auto& s : build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0, KvType::BF16))
        add(s);
    // GEMMAJIT_FLASH_MMA=1: the tensor-core decode attention of a model with and one without
    // k_eq_v, and with the bf16 cache.
    for (const char* v : {"e4b", "31b"})
        for (const auto& s :
             build_kernel_plan(Config::preset(v), ggml::Type::Q8_0, KvType::F16, true))
            add(s);
    for (const auto& s :
         build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0, KvType::BF16, true))
        add(s);
    // The q8_0 KV cache (GEMMAJIT_KV_TYPE=q8_0) of E4B and 31B (head dims 256 and 512, k_eq_v).
    for (const char* v : {"e4b", "31b"})
        for (const auto& s : build_kernel_plan(Config::preset(v), ggml::Type::Q8_0, KvType::Q8_0))
            add(s);
    // The prefill GEMMs of E4B and 31B (q8_0 and q4_0), and tiles the plan does not pick for them.
    for (const char* v : {"e4b", "31b"})
        for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0})
            for (const auto& s : mmq_specs(Config::preset(v), t)) add(s);
    add(gj::gemma4::mmq_spec(ggml::Type::Q4_0, 96, gj::gemma4::MmqTile{32, 64, 2, 1, 4, 3}));
    add(gj::gemma4::mmq_spec(ggml::Type::Q8_0, 96, gj::gemma4::MmqTile{128, 128, 4, 2, 1, 2}));
    add(gj::gemma4::mmq_spec(ggml::Type::Q8_0, 2560,
                             gj::gemma4::MmqTile{64, 128, 2, 4, 8, 2, 1, 2}));
    const Config tiny = Config::preset("tiny-keqv");
    for (int l = 0; l < tiny.n_layers; ++l)
        for (KvType kv : {KvType::F16, KvType::Q8_0}) {
            add(gj::gemma4::attn_prep_spec(tiny, l, kv));
            add(gj::gemma4::flash_decode_spec(tiny, l, kv));
        }
    // Head dim 128 (4 dims per lane), which no preset has, in q8_0.
    add(gj::gemma4::flash_decode_spec(128, 4, 2, 0, KvType::Q8_0));
    add(gj::gemma4::attn_prep_spec(128, 8, 2, 64, true, true, KvType::Q8_0));
    // Tensor-core prefill attention at the real layer shapes (E4B, 12B, 31B; f16 and bf16 caches),
    // a tiny preset's head dim 32, and the non-default tilings the GPU test runs.
    for (const char* v : {"e4b", "12b", "31b"}) {
        const Config cfg = Config::preset(v);
        for (int l = 0; l < cfg.n_layers; ++l)
            for (KvType kv : {KvType::F16, KvType::BF16, KvType::Q8_0})
                add(gj::gemma4::flash_prefill_spec(cfg, l, kv));
    }
    add(gj::gemma4::flash_prefill_spec(tiny, 0));
    add(gj::gemma4::flash_prefill_spec(tiny, 0, KvType::Q8_0));
    using Tiling = gj::gemma4::FlashPrefillTiling;
    // q8_0 tilings the GPU test runs: scores split by dims with key splits, shared P, key sets.
    add(gj::gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::Q8_0,
                                       Tiling{4, 2, 1, 16, 2, 2, true}));
    add(gj::gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::Q8_0, Tiling{2, 2, 1, 32, 3}));
    add(gj::gemma4::flash_prefill_spec(64, 2, 2, 8, KvType::Q8_0, Tiling{2, 1, 2, 16, 2, 4}));
    add(gj::gemma4::flash_prefill_spec(64, 4, 2, 8, KvType::F16, Tiling{2, 1, 1, 16, 2}));
    add(gj::gemma4::flash_prefill_spec(128, 4, 2, 0, KvType::F16, Tiling{1, 1, 4, 16, 2}));
    add(gj::gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::BF16, Tiling{2, 2, 1, 32, 3}));
    add(gj::gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::F16, Tiling{2, 4, 1, 32, 2}));
    add(gj::gemma4::flash_prefill_spec(512, 8, 4, 0, KvType::BF16, Tiling{1, 2, 2, 16, 2}));
    add(gj::gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::F16, Tiling{4, 1, 2, 32, 2}));
    add(gj::gemma4::flash_prefill_spec(256, 2, 8, 1024, KvType::F16, Tiling{2, 2, 1, 64, 2}));
    // Key splits (clusters) with key sets and with shared scores, and the widest cluster.
    add(gj::gemma4::flash_prefill_spec(64, 2, 2, 8, KvType::BF16, Tiling{2, 1, 2, 16, 2, 4}));
    add(gj::gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::F16, Tiling{2, 2, 2, 16, 2, 2}));
    add(gj::gemma4::flash_prefill_spec(128, 1, 4, 0, KvType::F16, Tiling{1, 1, 1, 16, 2, 8}));
    // Scores split by head dims.
    add(gj::gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::F16, Tiling{4, 2, 1, 16, 2, 2, true}));
    add(gj::gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::BF16,
                                       Tiling{4, 2, 1, 32, 2, 1, true}));
    add(gj::gemma4::flash_prefill_spec(128, 2, 2, 0, KvType::F16, Tiling{2, 2, 2, 16, 2, 2, true}));
    add(gj::gemma4::flash_prefill_spec(512, 8, 4, 0, KvType::BF16,
                                       Tiling{3, 2, 1, 16, 3, 4, true}));
    return specs;
}

size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
}

}  // namespace

TEST(KernelPlan, E4bQ8HasEveryDecodeSpecializationOnce) {
    const auto plan = build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0);
    const auto names = names_of(plan);
    EXPECT_EQ(names.size(), plan.size()) << "duplicate spec names";
    for (const char* want : {"rmsnorm.n2560.w1.q8",
                             "rmsnorm.n2560.w1.add",
                             "rmsnorm.n2560.w1.add.scale",
                             "rmsnorm.n2560.w1.add.n2.q8",
                             "rmsnorm.n2560.w1.add.scale.n2.q8",
                             "rmsnorm.n2560.w1.add.q8",
                             "rmsnorm.n256.w1",
                             "rmsnorm.n512.w1",
                             "rmsnorm.n256.w0",
                             "rmsnorm.n512.w0",
                             "quantize_q8_1",
                             "matvec_q8_0.k2560.split",
                             "matvec_q8_0.k2048.split",
                             "matvec_q8_0.k4096.split",
                             "matvec_q8_0.k10240.split",
                             "matvec_q8_0.k256.split",
                             "matvec_q8_0.k2560.b8.split",
                             "embed_rows.q8_0.n2560.v262144",
                             "embed_rows.q8_0.n10752.v262144",
                             "ple_finish.l42.p256",
                             "gelu_mul.p256",
                             "logits.v262144.k64"})
        EXPECT_TRUE(names.count(want)) << want;
    // Dense model: no MoE-only norms.
    EXPECT_FALSE(names.count("rmsnorm.n2560.w0"));
    // Decode kernels compile first; the prefill-only ones (int8 GEMM, tensor-core attention)
    // after them.
    for (const auto& k : plan) {
        const bool prefill_only = k.family == "mmq" || k.family == "flash_prefill";
        EXPECT_EQ(k.priority, prefill_only ? 1 : 0) << k.name;
        EXPECT_FALSE(k.entries.empty()) << k.name;
    }
    for (const char* want :
         {"mmq.q8_0.k2560.m64n128.w2x4.s3b2.o2p1", "mmq.q8_0.k10240.m128n128.w2x4.s3b4.o1p2.k3",
          "flash_prefill.hd512.g4.kv2.w0.f16"})
        EXPECT_TRUE(names.count(want)) << want;
    // Exactly the matvec widths the model has: d (also the LM head and the PLE context
    // projection), o-proj inputs (2048, 4096), FFN, PLE; for 1 and 8 columns.
    size_t matvecs = std::count_if(plan.begin(), plan.end(),
                                   [](const KernelSpec& k) { return k.family == "matvec_q8_0"; });
    EXPECT_EQ(matvecs, 10u);
}

TEST(KernelPlan, PerVariantWidths) {
    auto e2b = names_of(build_kernel_plan(Config::preset("e2b"), ggml::Type::Q4_0));
    EXPECT_TRUE(e2b.count("matvec_q4_0.k6144.split"));   // layers 0-14
    EXPECT_TRUE(e2b.count("matvec_q4_0.k12288.split"));  // double-wide KV-shared layers
    EXPECT_TRUE(e2b.count("matvec_q4_0.k1536.split"));
    EXPECT_TRUE(e2b.count("rmsnorm.n1536.w1.q8"));
    EXPECT_TRUE(e2b.count("embed_rows.q4_0.n8960.v262144"));  // PLE table: 35 * 256

    auto moe = names_of(build_kernel_plan(Config::preset("26b-a4b"), ggml::Type::Q8_0));
    EXPECT_TRUE(moe.count("matvec_q8_0.k2112.split"));  // dense MLP down: not a multiple of 256
    EXPECT_TRUE(moe.count("rmsnorm.n2816.w0"));         // router norm
    EXPECT_TRUE(moe.count("rmsnorm.n2816.w1"));         // post_ffw_norm_1/2
    EXPECT_FALSE(moe.count("matvec_q8_0.k256.split"));  // no PLE
    EXPECT_FALSE(moe.count("gelu_mul.p256"));

    auto b31 = names_of(build_kernel_plan(Config::preset("31b"), ggml::Type::Q8_0));
    for (const char* want : {"matvec_q8_0.k5376.split", "matvec_q8_0.k8192.split",
                             "matvec_q8_0.k16384.split", "matvec_q8_0.k21504.split"})
        EXPECT_TRUE(b31.count(want)) << want;

    // Float weights: matvec_f everywhere, fp32 norms, no activation quantization.
    auto bf = names_of(build_kernel_plan(Config::preset("e4b"), ggml::Type::BF16));
    for (const char* want :
         {"matvec_f.bf16.k2560", "matvec_f.bf16.k10240", "matvec_f.bf16.k256",
          "matvec_f.bf16.k2560.b8", "rmsnorm.n2560.w1", "rmsnorm.n2560.w1.add.scale.n2",
          "embed_rows.bf16.n2560.v262144", "logits.v262144.k64",
          // prefill through cuBLAS: bf16 activations, the GeGLU of two products
          "convert_f32", "gelu_mul.p10240"})
        EXPECT_TRUE(bf.count(want)) << want;
    EXPECT_FALSE(bf.count("quantize_q8_1"));
    EXPECT_FALSE(bf.count("rmsnorm.n2560.w1.q8"));
}

TEST(KernelPlan, TinyPresetsArePlannableForEveryWeightType) {
    for (const auto& v : Config::preset_names()) {
        const Config cfg = Config::preset(v);
        for (auto t : kWeightTypes) {
            SCOPED_TRACE(v + " " + ggml::type_name(t));
            const auto names = names_of(build_kernel_plan(cfg, t));
            const bool quant = t == ggml::Type::Q8_0 || t == ggml::Type::Q4_0;
            const std::string mv = quant ? "matvec_" + ggml::type_name(t) + ".k"
                                         : "matvec_f." + ggml::type_name(t) + ".k";
            const std::string sfx = quant ? ".split" : "";
            EXPECT_TRUE(names.count(mv + std::to_string(cfg.d_model) + sfx));
            for (size_t l = 0; l < cfg.layers.size(); ++l) {
                EXPECT_TRUE(names.count(mv + std::to_string(cfg.q_dim(int(l))) + sfx));
                EXPECT_TRUE(names.count(mv + std::to_string(cfg.layers[l].ffn_dim) + sfx));
            }
            EXPECT_TRUE(names.count(fmt::format("logits.v{}.k64", cfg.vocab_size)));
            EXPECT_TRUE(names.count(fmt::format("embed_rows.{}.n{}.v{}", ggml::type_name(t),
                                                cfg.d_model, cfg.vocab_size)));
            if (cfg.has_ple()) {
                EXPECT_TRUE(names.count(mv + std::to_string(cfg.ple_dim) + sfx));  // K = 32
                EXPECT_TRUE(
                    names.count(fmt::format("ple_finish.l{}.p{}", cfg.n_layers, cfg.ple_dim)));
            }
        }
    }
}

TEST(KernelPlan, MixedWeightTypes) {
    // A Q4_0 file whose embeddings were dequantized to F16 and whose PLE projection is BF16.
    gj::gemma4::PlanTypes types{ggml::Type::Q4_0, ggml::Type::F16, ggml::Type::F16,
                                ggml::Type::BF16};
    types.layout = MatvecLayout::Ggml;
    types.max_cols = 1;
    const auto names = names_of(build_kernel_plan(Config::preset("e4b"), types));
    for (const char* want : {"matvec_q4_0.k2560", "matvec_f.f16.k2560", "matvec_f.bf16.k2560",
                             "embed_rows.f16.n2560.v262144", "embed_rows.f16.n10752.v262144"})
        EXPECT_TRUE(names.count(want)) << want;
    EXPECT_FALSE(names.count("matvec_q4_0.k2560.b8"));
    types.token_embd = ggml::Type::Q6_K;
    try {
        build_kernel_plan(Config::preset("e4b"), types);
        FAIL() << "expected ConfigError";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("token_embd stored as q6_k"), std::string::npos)
            << e.what();
    }
}

TEST(KernelPlan, AttentionSpecsPerLayerType) {
    // E4B: sliding hd 256 (full RoPE, window 512), global hd 512 (64 of 256 pairs rotate),
    // group 4; layers 24.. share KV (Q-only prep, attention over the donor's cache).
    auto e4b = names_of(build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0));
    for (const char* want :
         {"attn_prep.hd256.h8.kv2.rp128.f16", "attn_prep.hd512.h8.kv2.rp64.f16",
          "attn_prep.hd256.h8.kv2.rp128.shared", "attn_prep.hd512.h8.kv2.rp64.shared",
          "flash_decode.hd256.g4.kv2.w512.f16", "flash_decode.hd512.g4.kv2.w0.f16"})
        EXPECT_TRUE(e4b.count(want)) << want;
    EXPECT_EQ(std::count_if(e4b.begin(), e4b.end(),
                            [](const std::string& n) { return n.starts_with("flash_decode."); }),
              2);
    // 31B: k_eq_v globals (V from the raw K projection), group 8 global / 2 sliding, window 1024.
    auto b31 = names_of(build_kernel_plan(Config::preset("31b"), ggml::Type::Q4_0));
    for (const char* want :
         {"attn_prep.hd512.h32.kv4.rp64.keqv.f16", "attn_prep.hd256.h32.kv16.rp128.f16",
          "flash_decode.hd512.g8.kv4.w0.f16", "flash_decode.hd256.g2.kv16.w1024.f16"})
        EXPECT_TRUE(b31.count(want)) << want;
    auto b12 = names_of(build_kernel_plan(Config::preset("12b"), ggml::Type::Q8_0));
    EXPECT_TRUE(b12.count("flash_decode.hd512.g16.kv1.w0.f16"));  // MQA global layers
    auto e2b = names_of(build_kernel_plan(Config::preset("e2b"), ggml::Type::Q8_0));
    EXPECT_TRUE(e2b.count("flash_decode.hd256.g8.kv1.w512.f16"));
    // The KV type is part of every spec that touches the cache, and only of those.
    auto bf = names_of(build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0, KvType::BF16));
    EXPECT_TRUE(bf.count("flash_decode.hd512.g4.kv2.w0.bf16"));
    EXPECT_TRUE(bf.count("attn_prep.hd256.h8.kv2.rp128.bf16"));
    EXPECT_TRUE(bf.count("attn_prep.hd256.h8.kv2.rp128.shared"));
    EXPECT_FALSE(bf.count("flash_decode.hd512.g4.kv2.w0.f16"));
    // GEMMAJIT_FLASH_MMA=1 selects the tensor-core attention; the default is fp32.
    auto mma =
        names_of(build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0, KvType::F16, true));
    EXPECT_TRUE(mma.count("flash_decode.hd512.g4.kv2.w0.f16.mma"));
    EXPECT_TRUE(mma.count("flash_decode.hd256.g4.kv2.w512.f16.mma"));
    EXPECT_EQ(gj::gemma4::spec_constant(
                  gj::gemma4::flash_decode_spec(Config::preset("e4b"), 5, KvType::F16), "MMA"),
              0);
    // Head dims that are not multiples of 64 have no tensor-core form.
    EXPECT_EQ(gj::gemma4::spec_constant(
                  gj::gemma4::flash_decode_spec(32, 2, 2, 8, KvType::F16, true), "MMA"),
              0);
    EXPECT_EQ(gj::gemma4::spec_constant(
                  gj::gemma4::flash_decode_spec(Config::preset("e4b"), 5, KvType::BF16), "KV_TYPE"),
              1);
}

TEST(KernelPlan, KvTypeNamesAndQ8Specs) {
    using gj::gemma4::kv_type_from_name;
    EXPECT_EQ(kv_type_from_name("f16"), KvType::F16);
    EXPECT_EQ(kv_type_from_name("bf16"), KvType::BF16);
    EXPECT_EQ(kv_type_from_name("q8_0"), KvType::Q8_0);
    EXPECT_STREQ(gj::gemma4::kv_type_name(KvType::BF16), "bf16");
    try {
        kv_type_from_name("fp8");
        FAIL() << "expected ConfigError";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos) << e.what();
    }
    EXPECT_STREQ(gj::gemma4::kv_type_name(KvType::Q8_0), "q8_0");
    // q8_0 has attention kernels on the fp32 path; the tensor-core path rejects it by name.
    auto q8 =
        names_of(build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0, KvType::Q8_0, false));
    for (const char* want :
         {"attn_prep.hd256.h8.kv2.rp128.q8_0", "attn_prep.hd512.h8.kv2.rp64.q8_0",
          "attn_prep.hd256.h8.kv2.rp128.shared", "flash_decode.hd256.g4.kv2.w512.q8_0",
          "flash_decode.hd512.g4.kv2.w0.q8_0"})
        EXPECT_TRUE(q8.count(want)) << want;
    EXPECT_FALSE(q8.count("flash_decode.hd512.g4.kv2.w0.f16"));
    const auto q8_prep = gj::gemma4::attn_prep_spec(Config::preset("31b"), 5, KvType::Q8_0);
    EXPECT_EQ(q8_prep.name, "attn_prep.hd512.h32.kv4.rp64.keqv.q8_0");
    EXPECT_EQ(gj::gemma4::spec_constant(q8_prep, "KV_TYPE"), 2);
    // A q8_0 stage holds int8 rows plus an fp16 scale per 32: E4B global, tile 16, 3 stages.
    const auto q8_global = gj::gemma4::flash_decode_spec(512, 4, 2, 0, KvType::Q8_0);
    EXPECT_EQ(gj::gemma4::spec_constant(q8_global, "KV_TYPE"), 2);
    EXPECT_EQ(gj::gemma4::spec_constant(q8_global, "TILE"), 16);
    EXPECT_EQ(gj::gemma4::spec_constant(q8_global, "SMEM"), 3 * 2 * 16 * (512 + 32));
    for (bool plan : {true, false}) try {
            if (plan)
                build_kernel_plan(Config::preset("e4b"), ggml::Type::Q8_0, KvType::Q8_0, true);
            else
                gj::gemma4::flash_decode_spec(512, 4, 2, 0, KvType::Q8_0, true);
            FAIL() << "expected ConfigError";
        } catch (const gj::gemma4::ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("GEMMAJIT_FLASH_MMA"), std::string::npos)
                << e.what();
        }
    // The q8_0 blocks need head dims that are multiples of 32 (a Q-only layer has no cache).
    EXPECT_THROW(gj::gemma4::attn_prep_spec(48, 4, 2, 24, true, true, KvType::Q8_0),
                 std::invalid_argument);
    EXPECT_NO_THROW(gj::gemma4::attn_prep_spec(48, 4, 2, 24, false, false, KvType::Q8_0));
}

TEST(KernelPlan, FlashPrefillBuilders) {
    using gj::gemma4::flash_prefill_spec;
    using gj::gemma4::FlashPrefillTiling;
    using gj::gemma4::spec_constant;
    const Config e4b = Config::preset("e4b");
    // Layer 5 is E4B's first global layer (hd 512), layer 0 a sliding one (hd 256, window 512).
    const auto global = flash_prefill_spec(e4b, 5);
    EXPECT_EQ(global.name, "flash_prefill.hd512.g4.kv2.w0.f16");
    EXPECT_EQ(global.family, "flash_prefill");
    EXPECT_EQ(global.entries, std::vector<std::string>{"flash_prefill"});
    EXPECT_EQ(spec_constant(global, "DS"), 2);  // O split over two warps: 128 registers each
    EXPECT_EQ(spec_constant(global, "DIM_SCORES"), 1);
    EXPECT_EQ(flash_prefill_spec(e4b, 0, KvType::BF16).name,
              "flash_prefill.hd256.g4.kv2.w512.bf16");
    EXPECT_EQ(spec_constant(flash_prefill_spec(e4b, 0, KvType::BF16), "KV_TYPE"), 1);
    EXPECT_EQ(flash_prefill_spec(Config::preset("31b"), 5).name,
              "flash_prefill.hd512.g8.kv4.w0.f16");
    EXPECT_EQ(flash_prefill_spec(Config::preset("12b"), 5).name,
              "flash_prefill.hd512.g16.kv1.w0.f16");
    // An explicit tiling other than the default is part of the name; the default one is not.
    EXPECT_EQ(
        flash_prefill_spec(512, 4, 2, 0, KvType::F16, FlashPrefillTiling{2, 4, 1, 32, 2}).name,
        "flash_prefill.hd512.g4.kv2.w0.f16.m2d4k1w32s2x1");
    EXPECT_EQ(
        flash_prefill_spec(512, 4, 2, 0, KvType::F16, gj::gemma4::flash_prefill_tiling(512, 4, 2)),
        global);
    // Key splits bring a 512-token chunk to about one block per SM: E4B's 2 KV heads need them,
    // 31B's 4 KV heads x group 8 fill the GPU without; a shorter expected chunk splits more and
    // is named by its tiling.
    const auto blocks_at = [&](const KernelSpec& s, int chunk) {
        return (chunk * spec_constant(s, "GROUP") + spec_constant(s, "BLOCK_ROWS") - 1) /
               spec_constant(s, "BLOCK_ROWS") * spec_constant(s, "N_KV_HEADS") *
               spec_constant(s, "SPLITS");
    };
    for (const auto& [s, chunk] :
         {std::pair{global, 512}, std::pair{flash_prefill_spec(e4b, 0), 512},
          std::pair{flash_prefill_spec(Config::preset("31b"), 5), 512},
          std::pair{flash_prefill_spec(e4b, 5, KvType::F16, 128), 128}}) {
        const auto blocks = blocks_at(s, chunk);
        EXPECT_GE(blocks, gj::gemma4::kFlashPrefillTargetBlocks) << s.name;
        if (spec_constant(s, "SPLITS") > 1) {
            EXPECT_LT(blocks / 2, gj::gemma4::kFlashPrefillTargetBlocks)
                << s.name << ": one split fewer would fill the GPU";
        }
    }
    EXPECT_GT(spec_constant(global, "SPLITS"), 1);
    EXPECT_GT(spec_constant(flash_prefill_spec(e4b, 5, KvType::F16, 128), "SPLITS"),
              spec_constant(global, "SPLITS"));
    EXPECT_NE(flash_prefill_spec(e4b, 5, KvType::F16, 128).name, global.name);
    // Launch constants consistent with the template's checks.
    for (const auto& s :
         {global, flash_prefill_spec(e4b, 0), flash_prefill_spec(32, 2, 2, 8, KvType::F16)}) {
        auto c = [&](const char* n) { return spec_constant(s, n); };
        EXPECT_EQ(c("THREADS"), 32 * c("WM") * c("DS") * c("KS")) << s.name;
        EXPECT_EQ(c("BLOCK_ROWS"), 16 * c("WM")) << s.name;
        EXPECT_EQ(c("KT") % (16 * c("KS")), 0) << s.name;
        EXPECT_LE(c("HEAD_DIM") / c("DS") / 2, 128) << s.name << ": O registers per thread";
    }
    // A q8_0 cache: the same tiling, int8 stages plus one fp16 tile.
    const auto q8 = flash_prefill_spec(e4b, 5, KvType::Q8_0);
    EXPECT_EQ(q8.name, "flash_prefill.hd512.g4.kv2.w0.q8_0");
    EXPECT_EQ(spec_constant(q8, "KV_TYPE"), 2);
    // Errors name the problem.
    EXPECT_THROW(flash_prefill_spec(96, 4, 2, 0, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(1024, 4, 2, 0, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(256, 0, 2, 0, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(256, 4, 0, 0, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(256, 4, 2, -1, KvType::F16), std::invalid_argument);
    // Impossible tilings: keys per warp not a multiple of 16, a 32-dim slice, slices of fewer
    // than 8 keys' scores, too much shared memory, too many threads.
    EXPECT_THROW(flash_prefill_spec(256, 4, 2, 0, KvType::F16, FlashPrefillTiling{4, 1, 2, 24, 2}),
                 std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(128, 4, 2, 0, KvType::F16, FlashPrefillTiling{1, 4, 1, 32, 2}),
                 std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(512, 4, 2, 0, KvType::F16, FlashPrefillTiling{2, 4, 1, 16, 2}),
                 std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(512, 4, 2, 0, KvType::F16, FlashPrefillTiling{4, 2, 2, 32, 3}),
                 std::invalid_argument);
    EXPECT_THROW(flash_prefill_spec(64, 4, 2, 0, KvType::F16, FlashPrefillTiling{8, 1, 8, 16, 2}),
                 std::invalid_argument);
    // Scores split by head dims need dim slices; a tiling naming it is spelled with "h".
    EXPECT_THROW(
        flash_prefill_spec(256, 4, 2, 0, KvType::F16, FlashPrefillTiling{4, 1, 1, 32, 2, 1, true}),
        std::invalid_argument);
    EXPECT_EQ(
        flash_prefill_spec(512, 4, 2, 0, KvType::F16, FlashPrefillTiling{4, 2, 1, 16, 2, 4, true})
            .name,
        "flash_prefill.hd512.g4.kv2.w0.f16.m4d2hk1w16s2x4");
    // Key splits: a power of two up to a portable cluster of 8.
    for (int splits : {0, 3, 16})
        EXPECT_THROW(flash_prefill_spec(64, 4, 2, 0, KvType::F16,
                                        FlashPrefillTiling{2, 1, 1, 16, 2, splits}),
                     std::invalid_argument)
            << splits;
    Config odd = Config::preset("tiny");
    odd.n_heads = 3;
    EXPECT_THROW(flash_prefill_spec(odd, 0), gj::gemma4::ConfigError);
}

TEST(KernelPlan, FlashDecodeSplits) {
    using gj::gemma4::flash_decode_spec;
    using gj::gemma4::flash_decode_splits;
    const auto global = flash_decode_spec(512, 4, 2, 0, KvType::F16);
    const auto sliding = flash_decode_spec(256, 4, 2, 512, KvType::F16);
    // About one block per SM at T = 1 (132 SMs, 2 KV heads), whatever the context length ...
    EXPECT_EQ(flash_decode_splits(global, 131072, 1, 132), 66);
    // ... but never more than CHUNK-sized pieces of what a query can see (the window).
    EXPECT_EQ(gj::gemma4::spec_constant(global, "CHUNK"), 16);
    EXPECT_EQ(flash_decode_splits(global, 100, 1, 132), 7);  // ceil(100 / 16)
    EXPECT_EQ(flash_decode_splits(sliding, 131072, 1, 132), 512 / 32);
    // A prefill batch fills the GPU with tokens alone.
    EXPECT_EQ(flash_decode_splits(global, 131072, 512, 132), 1);
    EXPECT_EQ(flash_decode_splits(global, 0, 0, 0), 1);
}

TEST(KernelPlan, UnsupportedWeightTypeIsNamed) {
    try {
        build_kernel_plan(Config::preset("e4b"), ggml::Type::Q6_K);
        FAIL() << "expected ConfigError";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("q6_k"), std::string::npos) << e.what();
    }
    EXPECT_THROW(build_kernel_plan(Config{}, ggml::Type::Q8_0), gj::gemma4::ConfigError);
}

TEST(KernelPlan, SpecBuildersRejectImpossibleShapes) {
    using gj::gemma4::matvec_spec;
    using gj::gemma4::rmsnorm_spec;
    EXPECT_THROW(rmsnorm_spec(100, true, true, false), std::invalid_argument);  // q8 needs %32
    EXPECT_THROW(rmsnorm_spec(256, true, false, false, true), std::invalid_argument);  // no add
    EXPECT_THROW(rmsnorm_spec(256, true, false, false, false, true), std::invalid_argument);
    EXPECT_THROW(rmsnorm_spec(6, true), std::invalid_argument);
    EXPECT_THROW(matvec_spec(ggml::Type::Q8_0, 2080 + 16), std::invalid_argument);  // % 32 != 0
    EXPECT_THROW(matvec_spec(ggml::Type::Q8_0, 2560, 9), std::invalid_argument);
    EXPECT_THROW(matvec_spec(ggml::Type::Q6_K, 2560), gj::gemma4::ConfigError);
    EXPECT_THROW(matvec_spec(ggml::Type::BF16, 2560, 1, MatvecLayout::Split),
                 std::invalid_argument);
    EXPECT_THROW(gj::gemma4::matvec_f_spec(ggml::Type::Q8_0, 2560), gj::gemma4::ConfigError);
    EXPECT_THROW(gj::gemma4::embed_rows_spec(100, ggml::Type::Q8_0, 1000), std::invalid_argument);
    EXPECT_THROW(gj::gemma4::embed_rows_spec(2560, ggml::Type::Q6_K, 1000),
                 gj::gemma4::ConfigError);
    EXPECT_THROW(gj::gemma4::ple_finish_spec(42, 100), std::invalid_argument);
    EXPECT_THROW(gj::gemma4::logits_spec(1000, 65), std::invalid_argument);
    EXPECT_THROW(gj::gemma4::logits_spec(1001, 64), std::invalid_argument);
    EXPECT_THROW(gj::gemma4::spec_constant(rmsnorm_spec(256, true), "NOPE"), std::out_of_range);
    // The 2080-wide (65 blocks) quantized matvec is fine now: odd block counts per row work.
    EXPECT_NO_THROW(matvec_spec(ggml::Type::Q8_0, 2080));
    using gj::gemma4::attn_prep_spec;
    using gj::gemma4::flash_decode_spec;
    EXPECT_THROW(attn_prep_spec(100, 8, 2, 16, true, true, KvType::F16), std::invalid_argument);
    EXPECT_THROW(attn_prep_spec(256, 8, 2, 129, true, true, KvType::F16), std::invalid_argument);
    EXPECT_THROW(attn_prep_spec(256, 0, 2, 128, true, true, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_decode_spec(96, 4, 2, 0, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_decode_spec(384, 4, 2, 0, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_decode_spec(256, 0, 2, 0, KvType::F16), std::invalid_argument);
    EXPECT_THROW(flash_decode_spec(256, 4, 2, -1, KvType::F16), std::invalid_argument);
    // A layer whose heads do not divide over its KV heads.
    Config odd = Config::preset("tiny");
    odd.layers[0].n_kv_heads = 3;
    EXPECT_THROW(flash_decode_spec(odd, 0), gj::gemma4::ConfigError);
}

TEST(KernelPlan, MmqSpecNamesTilesAndErrors) {
    using gj::gemma4::mmq_spec;
    using gj::gemma4::MmqTile;
    using gj::gemma4::spec_constant;
    const auto s = mmq_spec(ggml::Type::Q8_0, 2560, 10240);
    EXPECT_EQ(s.family, "mmq");
    EXPECT_EQ(s.name, "mmq.q8_0.k2560.m64n128.w2x4.s3b2.o2p1");
    EXPECT_EQ(s.entries,
              (std::vector<std::string>{"mmq", "mmq_geglu", "mmq_geglu_q8", "mmq_reduce"}));
    EXPECT_EQ(spec_constant(s, "SPLITS"), 1);
    // The deep n 2560 products (80 tiles of 128 x 128 at T = 512) split K in three; shallow ones
    // and wide ones do not.
    const auto down = mmq_spec(ggml::Type::Q8_0, 10240, 2560);
    EXPECT_EQ(down.name, "mmq.q8_0.k10240.m128n128.w2x4.s3b4.o1p2.k3");
    EXPECT_EQ(spec_constant(down, "SPLITS"), 3);
    EXPECT_EQ(spec_constant(mmq_spec(ggml::Type::Q8_0, 2048, 2560), "SPLITS"), 3);
    EXPECT_EQ(spec_constant(mmq_spec(ggml::Type::Q8_0, 1024, 2560), "SPLITS"), 1);
    EXPECT_EQ(spec_constant(mmq_spec(ggml::Type::Q8_0, 5376, 4096), "SPLITS"), 1);
    EXPECT_THROW(mmq_spec(ggml::Type::Q8_0, 2560, MmqTile{64, 64, 2, 2, 4, 4, 2, 1, 9}),
                 std::invalid_argument);
    EXPECT_EQ(spec_constant(s, "K"), 2560);
    EXPECT_EQ(spec_constant(s, "WTYPE"), 0);
    EXPECT_EQ(spec_constant(s, "THREADS"), 256);
    EXPECT_EQ(spec_constant(mmq_spec(ggml::Type::Q4_0, 2560, 10240), "WTYPE"), 1);
    // Few rows get smaller tiles, so a 512-token chunk still spreads over the SMs.
    const auto narrow = mmq_spec(ggml::Type::Q8_0, 2560, 512);
    EXPECT_LT(spec_constant(narrow, "BN") * spec_constant(narrow, "BM"),
              spec_constant(s, "BN") * spec_constant(s, "BM"));
    // Shared memory: STAGES stages of activations, weights, {d, s} and fp16 scales; here the
    // GeGLU layout (16 tokens per pass, two matrices) is the larger one.
    const auto t = mmq_spec(ggml::Type::Q4_0, 64, MmqTile{32, 64, 1, 2, 4, 3, 1, 2});
    EXPECT_EQ(t.name, "mmq.q4_0.k64.m32n64.w1x2.s3b4.o1p2");
    EXPECT_EQ(spec_constant(t, "SMEM"), 3 * (16 * 128 + 2 * 64 * 64 + 4 * 16 * 8 + 2 * 64 * 8));
    EXPECT_EQ(spec_constant(t, "THREADS"), 64);
    EXPECT_EQ(spec_constant(t, "GEGLU_PASSES"), 2);
    // One pass: the plain layout (32 tokens, one matrix) against the GeGLU one (32, two).
    const auto u = mmq_spec(ggml::Type::Q8_0, 64, MmqTile{32, 64, 1, 2, 2, 4, 2, 1});
    EXPECT_EQ(spec_constant(u, "SMEM"), 4 * (32 * 64 + 2 * 64 * 64 + 2 * 32 * 8 + 2 * 64 * 4));
    EXPECT_EQ(spec_constant(u, "MIN_BLOCKS"), 2);
    try {
        mmq_spec(ggml::Type::BF16, 2560, 512);
        FAIL() << "expected ConfigError";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    }
    EXPECT_THROW(mmq_spec(ggml::Type::Q6_K, 2560, 512), gj::gemma4::ConfigError);
    EXPECT_THROW(mmq_spec(ggml::Type::Q8_0, 2560 + 16, 512), std::invalid_argument);
    EXPECT_THROW(mmq_spec(ggml::Type::Q8_0, 0, 512), std::invalid_argument);
    EXPECT_THROW(mmq_spec(ggml::Type::Q8_0, 2560, 0), std::invalid_argument);
    for (const MmqTile& bad : {MmqTile{48, 128, 2, 4, 2, 4},         // BM not whole warp m16 tiles
                               MmqTile{64, 96, 2, 4, 2, 4},          // BN not whole 32-row groups
                               MmqTile{64, 128, 2, 4, 3, 4},         // KBS
                               MmqTile{64, 128, 2, 4, 2, 1},         // one stage
                               MmqTile{64, 128, 8, 4, 2, 4},         // 32 warps
                               MmqTile{256, 256, 4, 4, 4, 8},        // shared memory
                               MmqTile{128, 128, 2, 4, 4, 3, 2, 2},  // ... for two blocks
                               MmqTile{64, 128, 2, 4, 2, 4, 0, 1},   // no block per SM
                               MmqTile{64, 128, 2, 4, 2, 4, 1, 3},   // three GeGLU passes
                               MmqTile{32, 64, 2, 1, 2, 4, 1, 2}})   // half an m16 tile per pass
        EXPECT_THROW(mmq_spec(ggml::Type::Q8_0, 2560, bad), std::invalid_argument);
}

TEST(KernelPlan, LaunchGeometryIsConsistent) {
    for (const auto& k : all_specs()) {
        if (k.family == "rmsnorm") {
            const auto tpr = gj::gemma4::spec_constant(k, "TPR");
            const auto rpb = gj::gemma4::spec_constant(k, "RPB");
            const auto n = gj::gemma4::spec_constant(k, "N");
            EXPECT_LE(tpr * rpb, 1024) << k.name;
            EXPECT_TRUE(tpr <= 32 ? 32 % tpr == 0 : tpr % 32 == 0) << k.name;
            EXPECT_LE((n / 4 + tpr - 1) / tpr, 8) << k.name << ": too many float4 per thread";
        } else if (k.family.starts_with("matvec_")) {
            const auto threads = gj::gemma4::spec_constant(k, "THREADS");
            EXPECT_EQ(threads % 32, 0) << k.name;
            EXPECT_EQ(gj::gemma4::spec_constant(k, "K") % 32, 0) << k.name;
        } else if (k.family == "logits") {
            const auto v = gj::gemma4::spec_constant(k, "V");
            const auto blocks = gj::gemma4::spec_constant(k, "TOPK_BLOCKS");
            const auto topk = gj::gemma4::spec_constant(k, "TOPK");
            EXPECT_LE(blocks * topk, 4096) << k.name << ": top-k merge too large";
            EXPECT_LE((v + blocks - 1) / blocks, 4096 + 4 * 256) << k.name;
        } else if (k.family == "attn_prep") {
            EXPECT_LE(32 * gj::gemma4::spec_constant(k, "WARPS"), 1024) << k.name;
        } else if (k.family == "flash_prefill") {
            auto c = [&](const char* n) { return gj::gemma4::spec_constant(k, n); };
            EXPECT_EQ(c("THREADS"), 32 * c("WM") * c("DS") * c("KS")) << k.name;
            EXPECT_LE(c("THREADS"), 1024) << k.name;
            EXPECT_EQ(c("BLOCK_ROWS"), 16 * c("WM")) << k.name;
            EXPECT_EQ(c("KT") % (16 * c("KS")), 0) << k.name;
            EXPECT_EQ(c("KT") / c("KS") % (8 * c("DS")), 0) << k.name;
            EXPECT_LE(c("SMEM"), gj::gemma4::kFlashPrefillMaxSmem) << k.name;
            // Registers: O of 16 rows x HEAD_DIM / DS fp32 per warp.
            EXPECT_LE(c("HEAD_DIM") / c("DS") / 2, 128) << k.name;
        } else if (k.family == "mmq" && k.name.find(".k96.") == std::string::npos) {
            // The plan's GEMM tiles fit sm_80's opt-in shared memory (163 KiB) as well as sm_90's.
            EXPECT_LE(gj::gemma4::spec_constant(k, "SMEM"), 160 * 1024) << k.name;
        } else if (k.family == "flash_decode") {
            auto c = [&](const char* n) { return gj::gemma4::spec_constant(k, n); };
            const auto qsets = (c("GROUP") + c("QW") - 1) / c("QW");
            const auto ksets = c("THREADS") / 32 / qsets;
            EXPECT_EQ(c("THREADS"), 32 * qsets * ksets) << k.name;
            EXPECT_LE(c("THREADS"), 1024) << k.name;
            EXPECT_EQ(c("TILE") % (ksets * c("KB")), 0) << k.name;
            EXPECT_EQ(c("CHUNK") % c("TILE"), 0) << k.name;
            // Fits sm_80's opt-in limit (163 KiB) as well as sm_90's.
            EXPECT_LE(c("SMEM"), 160 * 1024) << k.name;
            if (c("MMA") == 1) {
                // One m16n8k16 per 8 queries and 16 rows; 16-dim steps, 8-chunk swizzle.
                EXPECT_EQ(c("QW"), 8) << k.name;
                EXPECT_EQ(c("KB"), 16) << k.name;
                EXPECT_EQ(c("HEAD_DIM") % 64, 0) << k.name;
                EXPECT_TRUE(k.name.ends_with(".mma")) << k.name;
            } else {
                EXPECT_FALSE(k.name.ends_with(".mma")) << k.name;
                EXPECT_LE(c("QW") * c("KB"), 32) << k.name;
                // Registers: QW queries and outputs of HEAD_DIM / 32 floats each per lane.
                EXPECT_LE(c("QW") * c("HEAD_DIM") / 32, 64) << k.name;
            }
        }
    }
}

// The one expensive test: NVRTC for every spec, both archs. Bounded by deduplication across
// presets and weight types, and run on 2 threads.
TEST(KernelTemplates, EverySpecCompilesWithItsInstructionsAndNoSpills) {
    const auto specs = all_specs();
    gj::jit::Jit jit(gj::jit::Flags::parse({{"GEMMAJIT_CACHE", "0"}}), [](const std::string&) {});
    for (const std::string arch : {"sm_80", "sm_90"}) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto compiled = jit.compile_plan(specs, arch, 2);
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("[ timing   ] %zu specs for %s compiled in %.1f s\n", specs.size(),
                    arch.c_str(), secs);
        ASSERT_EQ(compiled.size(), specs.size());
        for (const auto& c : compiled) {
            const auto& s = c.spec;
            SCOPED_TRACE(s.name + " " + arch);
            ASSERT_FALSE(c.cubin.empty());
            for (const auto& e : s.entries)
                EXPECT_FALSE(entry_ptx(c.ptx, e).empty()) << "entry " << e << " missing from PTX";
            // attn_prep may keep a stack frame: sincosf's cold path for huge angles
            // (Payne-Hanek) uses a local array; it must not spill.
            if (s.family == "attn_prep")
                for (const auto& r : c.resources_per_entry) {
                    EXPECT_EQ(r.spill_store_bytes, 0);
                    EXPECT_EQ(r.spill_load_bytes, 0);
                }
            // Every other model kernel is hot: no spills, no stack.
            if (s.family != "ptx_selftest" && s.family != "attn_prep") {
                ASSERT_EQ(c.resources_per_entry.size(), s.entries.size());
                for (size_t i = 0; i < s.entries.size(); ++i) {
                    EXPECT_EQ(c.resources_per_entry[i].spill_store_bytes, 0) << s.entries[i];
                    EXPECT_EQ(c.resources_per_entry[i].spill_load_bytes, 0) << s.entries[i];
                    EXPECT_EQ(c.resources_per_entry[i].stack_bytes, 0) << s.entries[i];
                }
            }
            if (s.family == "matvec_f") {
                const auto wtype = gj::gemma4::spec_constant(s, "WTYPE");
                for (const auto& e : s.entries) {
                    const auto body = entry_ptx(c.ptx, e);
                    EXPECT_NE(body.find("ld.global.nc.L1::no_allocate.v4.u32"), std::string::npos)
                        << e << ": weights must stream in 16-byte loads";
                    EXPECT_NE(body.find("fma.rn.f32"), std::string::npos) << e;
                    EXPECT_NE(body.find("shfl.sync.bfly"), std::string::npos) << e;
                    EXPECT_EQ(body.find("dp4a"), std::string::npos) << e;
                    if (wtype == 1) {
                        EXPECT_NE(body.find("cvt.f32.f16"), std::string::npos) << e;
                    }
                }
                const std::string ld = "ld.global.nc.L1::no_allocate.v4.u32";
                EXPECT_EQ(count(entry_ptx(c.ptx, "matvec_f_geglu"), ld),
                          2 * count(entry_ptx(c.ptx, "matvec_f"), ld));
            } else if (s.family.starts_with("matvec_")) {
                for (const auto& e : s.entries) {
                    if (e.starts_with("repack_")) continue;
                    const auto body = entry_ptx(c.ptx, e);
                    EXPECT_NE(body.find("dp4a.s32.s32"), std::string::npos) << e;
                    EXPECT_NE(body.find("shfl.sync.bfly"), std::string::npos) << e;
                    if (gj::gemma4::spec_constant(s, "LAYOUT") == 1)
                        EXPECT_NE(body.find("ld.global.nc.L1::no_allocate.v4.u32"),
                                  std::string::npos)
                            << e << ": split layout must use 16-byte streaming loads";
                    else
                        EXPECT_NE(body.find("shf.r."), std::string::npos)
                            << e << ": ggml layout joins unaligned words with funnel shifts";
                }
                // The GeGLU entry reads two matrices per unit: twice the dp4a of the plain one.
                EXPECT_EQ(count(entry_ptx(c.ptx, s.entries[2]), "dp4a"),
                          2 * count(entry_ptx(c.ptx, s.entries[0]), "dp4a"));
            } else if (s.family == "rmsnorm") {
                const bool quant = gj::gemma4::spec_constant(s, "QUANT") == 1;
                const bool norm2 = gj::gemma4::spec_constant(s, "NORM2") == 1;
                EXPECT_EQ(c.ptx.find("cvt.rni.sat.s8.f32") != std::string::npos, quant);
                // One refined reciprocal square root per norm, and no IEEE sqrt / division (their
                // slow-path calls cost stack and spills).
                EXPECT_EQ(count(c.ptx, "rsqrt.approx.f32"), norm2 ? 2u : 1u);
                EXPECT_EQ(c.ptx.find("sqrt.rn.f32"), std::string::npos);
                EXPECT_EQ(c.ptx.find("div.rn.f32"), std::string::npos);
                EXPECT_EQ(c.ptx.find("rcp.rn.f32"), std::string::npos);
                if (gj::gemma4::spec_constant(s, "SCALE") == 1) {  // the scale is a device load
                    EXPECT_NE(entry_ptx(c.ptx, "rmsnorm_ext").find("ld.global.nc.f32"),
                              std::string::npos);
                }
            } else if (s.family == "embed") {
                const auto body = entry_ptx(c.ptx, "embed_rows");
                EXPECT_NE(body.find("st.global.v4.f32"), std::string::npos);
                const auto wtype = gj::gemma4::spec_constant(s, "WTYPE");
                if (wtype == 0) {
                    EXPECT_NE(body.find("ld.global.nc.v4.f32"), std::string::npos);
                }
                if (wtype == 1 || wtype == 2 || wtype == 8) {  // f16 values or block scales
                    EXPECT_NE(body.find("cvt.f32.f16"), std::string::npos);
                }
            } else if (s.family == "ple") {
                if (s.name.starts_with("ple_finish")) {
                    const auto body = entry_ptx(c.ptx, "ple_finish");
                    EXPECT_NE(body.find("rsqrt.approx.f32"), std::string::npos);
                    EXPECT_NE(body.find("shfl.sync.bfly"), std::string::npos);
                } else {
                    EXPECT_NE(entry_ptx(c.ptx, "gelu_mul_q8").find("cvt.rni.sat.s8.f32"),
                              std::string::npos);
                    EXPECT_EQ(entry_ptx(c.ptx, "gelu_mul").find("cvt.rni.sat.s8.f32"),
                              std::string::npos);
                }
            } else if (s.family == "logits") {
                // One launch each: partials, a fence, the arrival counter, the last block's merge.
                for (const char* e : {"softcap_argmax", "softcap_topk"}) {
                    const auto body = entry_ptx(c.ptx, e);
                    EXPECT_NE(body.find("membar.gl"), std::string::npos) << e;
                    EXPECT_NE(body.find("atom.global.add.u32"), std::string::npos) << e;
                    EXPECT_NE(body.find("ld.global.cg"), std::string::npos) << e;
                    EXPECT_NE(body.find("div.rn.f32"), std::string::npos) << e << ": IEEE z / cap";
                }
                const auto topk = entry_ptx(c.ptx, "softcap_topk");
                EXPECT_NE(topk.find("match.any.sync.b32"), std::string::npos);
                EXPECT_NE(topk.find("atom.shared.add.u32"), std::string::npos);
            } else if (s.family == "attn_prep") {
                const bool has_kv = gj::gemma4::spec_constant(s, "HAS_KV") == 1;
                const auto kv = gj::gemma4::spec_constant(s, "KV_TYPE");
                const auto body = entry_ptx(c.ptx, "attn_prep");
                EXPECT_NE(body.find("sqrt.rn.f32"), std::string::npos);
                EXPECT_NE(body.find("shfl.sync.bfly"), std::string::npos);
                EXPECT_NE(body.find("ld.global.nc.v4.f32"), std::string::npos)
                    << "rows are read as float4";
                // The cache append converts to the KV type; a KV-shared layer writes no cache.
                // q8_0 stores int8 payload bytes and fp16 scales d = amax / 127 (an IEEE
                // division, as ggml's quantizer).
                EXPECT_EQ(body.find("cvt.rn.f16x2.f32") != std::string::npos, has_kv && kv == 0);
                EXPECT_EQ(body.find("cvt.rn.bf16.f32") != std::string::npos, has_kv && kv == 1);
                EXPECT_EQ(body.find("st.global.u8") != std::string::npos, has_kv && kv == 2);
                if (has_kv && kv == 2) {
                    EXPECT_NE(body.find("cvt.rn.f16.f32"), std::string::npos);
                    EXPECT_NE(body.find("div.rn.f32"), std::string::npos);
                }
            } else if (s.family == "flash_decode") {
                const bool bf16 = gj::gemma4::spec_constant(s, "KV_TYPE") == 1;
                const bool q8 = gj::gemma4::spec_constant(s, "KV_TYPE") == 2;
                const auto hd = gj::gemma4::spec_constant(s, "HEAD_DIM");
                const auto decode = entry_ptx(c.ptx, "flash_decode");
                for (const char* want :
                     {"cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group",
                      "ex2.approx.ftz.f32", "shfl.sync.bfly", "shfl.sync.idx", "bar.sync"})
                    EXPECT_NE(decode.find(want), std::string::npos)
                        << "flash_decode lacks " << want;
                if (gj::gemma4::spec_constant(s, "MMA") == 1) {
                    // Q K^T and P V on tensor cores in the cache's type, rows via ldmatrix.
                    const std::string op =
                        bf16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                             : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
                    for (const std::string& want :
                         {op, std::string("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
                          std::string("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"),
                          std::string("ldmatrix.sync.aligned.m8n8.x2.shared.b16")})
                        EXPECT_NE(decode.find(want), std::string::npos) << "lacks " << want;
                    EXPECT_EQ(decode.find("cvt.f32.f16"), std::string::npos)
                        << "the tensor-core path converts no cache element";
                } else {
                    EXPECT_EQ(decode.find("mma.sync"), std::string::npos);
                    // 16-byte shared-memory row reads where a lane holds 8 dims of a stripe
                    // (q8_0: 8 bytes of int8).
                    if (hd >= 256) {
                        EXPECT_NE(decode.find(q8 ? "ld.shared.v2.u32" : "ld.shared.v4.u32"),
                                  std::string::npos);
                    }
                    // f16 elements, or q8_0's fp16 scales.
                    EXPECT_EQ(decode.find("cvt.f32.f16") != std::string::npos, !bf16);
                    // q8_0 scale rows of 4..32 bytes are staged by cp.async too (L1-cached
                    // pieces of up to 16 bytes); a 32-dim head's 2 bytes by plain copies.
                    EXPECT_EQ(decode.find("cp.async.ca.shared.global") != std::string::npos,
                              q8 && hd >= 64);
                }
                EXPECT_EQ(decode.find(".local"), std::string::npos)
                    << "flash_decode uses local memory";
                const auto combine = entry_ptx(c.ptx, "flash_combine");
                EXPECT_NE(combine.find("ld.global.nc.v4.f32"), std::string::npos);
                EXPECT_NE(combine.find("ex2.approx.ftz.f32"), std::string::npos);
            } else if (s.family == "flash_prefill") {
                // Both products on tensor cores in the cache's type, operands through ldmatrix
                // (V transposed), K/V rows through the cp.async pipeline, no local memory.
                const bool bf16 = gj::gemma4::spec_constant(s, "KV_TYPE") == 1;
                const auto body = entry_ptx(c.ptx, "flash_prefill");
                for (const std::string& want :
                     {std::string(bf16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                                       : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
                      std::string("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
                      std::string("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"),
                      std::string("cp.async.cg.shared.global"), std::string("cp.async.wait_group"),
                      std::string("ex2.approx.ftz.f32")})
                    EXPECT_NE(body.find(want), std::string::npos) << "flash_prefill lacks " << want;
                EXPECT_EQ(body.find(".local"), std::string::npos)
                    << "flash_prefill uses local memory";
                // Key splits run as clusters combining through distributed shared memory on
                // sm_90; before it split 0 runs alone and no cluster instruction is emitted.
                const bool clusters = gj::gemma4::spec_constant(s, "SPLITS") > 1 && arch == "sm_90";
                for (const char* want :
                     {".reqnctapercluster", "mapa.shared::cluster", "ld.shared::cluster.v4.f32",
                      "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire"})
                    EXPECT_EQ(body.find(want) != std::string::npos, clusters) << want;
            } else if (s.family == "mmq") {
                // int8 tensor cores fed by ldmatrix from a cp.async pipeline; the quantized
                // GeGLU output rounds to int8 like quantize_q8_1.
                for (const auto& e : s.entries) {
                    const auto body = entry_ptx(c.ptx, e);
                    if (e == "mmq_reduce") {  // the split-K sum: plain loads, no tensor cores
                        EXPECT_NE(body.find("ld.global"), std::string::npos) << e;
                        EXPECT_EQ(body.find("mma.sync"), std::string::npos) << e;
                        continue;
                    }
                    for (const char* want :
                         {"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
                          "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global",
                          "cp.async.wait_group", "bar.sync"})
                        EXPECT_NE(body.find(want), std::string::npos) << e << " lacks " << want;
                    EXPECT_EQ(body.find(".local"), std::string::npos) << e << " uses local memory";
                    EXPECT_EQ(body.find("cvt.rni.sat.s8.f32") != std::string::npos,
                              e == "mmq_geglu_q8")
                        << e;
                }
            } else if (s.family == "quantize_q8_1") {
                EXPECT_NE(c.ptx.find("cvt.rni.sat.s8.f32"), std::string::npos);
                EXPECT_NE(c.ptx.find("shfl.sync.bfly"), std::string::npos);
            } else if (s.family == "ptx_selftest") {
                const std::map<std::string, std::vector<std::string>> want = {
                    {"selftest_convert",
                     {"cvt.rn.f16.f32", "cvt.f32.f16", "cvt.rn.bf16.f32", "cvt.rni.sat.s8.f32"}},
                    {"selftest_pack", {"cvt.rn.f16x2.f32", "fma.rn.f16x2", "prmt.b32"}},
                    {"selftest_dp4a", {"dp4a.s32.s32"}},
                    {"selftest_mma_s8", {"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"}},
                    {"selftest_mma_f16", {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"}},
                    {"selftest_mma_bf16", {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}},
                    {"selftest_ldmatrix",
                     {"ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cvta.to.shared"}},
                    {"selftest_cp_async",
                     {"cp.async.ca.shared.global", "cp.async.cg.shared.global",
                      "cp.async.commit_group", "cp.async.wait_group 0"}},
                    {"selftest_warp_reduce", {"shfl.sync.bfly.b32"}},
                    {"selftest_fast_math", {"ex2.approx.ftz.f32", "tanh.approx.f32", "rcp.approx"}},
                    {"selftest_loads",
                     {"ld.global.nc.L1::no_allocate.v4.u32", "ld.global.nc.L1::no_allocate.u32",
                      "ld.global.nc.u16", "shf.r."}},
                    {"selftest_q8_scale", {"rcp.approx.ftz.f32", "mul.f64"}},
                    {"selftest_rsqrt", {"rsqrt.approx.f32"}},
                };
                ASSERT_EQ(want.size(), s.entries.size());
                for (const auto& [entry, instrs] : want) {
                    const auto body = entry_ptx(c.ptx, entry);
                    for (const auto& i : instrs)
                        EXPECT_NE(body.find(i), std::string::npos) << entry << " lacks " << i;
                }
            }
        }
    }
}

// The wgmma GEMM (sm_90a only) at the E4B and 31B shapes and every tile the plan or the GPU test
// uses: it compiles for sm_90a with warpgroup tensor-core instructions, swizzled shared-memory
// descriptors and the async-proxy fence, no local memory; another target is refused by name.
TEST(KernelTemplates, GemmWgmmaCompilesForSm90aOnly) {
    using gj::gemma4::GemmWgmmaTile;
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto add = [&](const KernelSpec& s) {
        if (seen.insert(s.name).second) specs.push_back(s);
    };
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        for (const char* v : {"e4b", "31b"}) {
            const Config cfg = Config::preset(v);
            for (int l = 0; l < cfg.n_layers; ++l) {
                add(gj::gemma4::gemm_wgmma_spec(t, cfg.d_model, cfg.q_dim(l)));
                add(gj::gemma4::gemm_wgmma_spec(t, cfg.q_dim(l), cfg.d_model));
                add(gj::gemma4::gemm_wgmma_spec(t, cfg.d_model, cfg.layers[l].ffn_dim));
                add(gj::gemma4::gemm_wgmma_spec(t, cfg.layers[l].ffn_dim, cfg.d_model));
            }
        }
        for (const GemmWgmmaTile& tile : {GemmWgmmaTile{64, 64, 3}, GemmWgmmaTile{128, 256, 4},
                                          GemmWgmmaTile{64, 256, 6}, GemmWgmmaTile{128, 64, 5}})
            add(gj::gemma4::gemm_wgmma_spec(t, 96, tile));
    }
    gj::jit::Jit jit(gj::jit::Flags::parse({{"GEMMAJIT_CACHE", "0"}}), [](const std::string&) {});
    const auto compiled = jit.compile_plan(specs, "sm_90", 2);
    ASSERT_EQ(compiled.size(), specs.size());
    for (const auto& c : compiled) {
        SCOPED_TRACE(c.spec.name);
        EXPECT_EQ(c.arch, "sm_90a");
        // ptxas serializes wgmmas it cannot prove independent of the surrounding code (a
        // "Potential Performance Loss" note): that would make the conversion overlap vanish.
        EXPECT_EQ(c.log.find("wgmma.mma_async instructions are serialized"), std::string::npos)
            << c.log;
        for (size_t i = 0; i < c.spec.entries.size(); ++i) {
            const std::string& e = c.spec.entries[i];
            const auto body = entry_ptx(c.ptx, e);
            if (e == "gemm_wgmma_reduce") {  // the split-K sum: plain loads, no tensor cores
                EXPECT_NE(body.find("ld.global"), std::string::npos) << e;
                EXPECT_EQ(body.find("wgmma.mma_async"), std::string::npos) << e;
                continue;
            }
            for (const char* want :
                 {"wgmma.mma_async.sync.aligned.m64n", "wgmma.fence.sync.aligned",
                  "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                  "fence.proxy.async.shared::cta", "cp.async.cg.shared.global",
                  "cvt.rn.bf16x2.f32"})
                EXPECT_NE(body.find(want), std::string::npos) << e << " lacks " << want;
            EXPECT_EQ(body.find(".local"), std::string::npos) << e << " uses local memory";
            EXPECT_EQ(c.resources_per_entry[i].spill_store_bytes, 0) << e;
            EXPECT_EQ(c.resources_per_entry[i].stack_bytes, 0) << e;
            std::printf("[ regs     ] %s %s: %d\n", c.spec.name.c_str(), e.c_str(),
                        c.resources_per_entry[i].registers);
        }
    }
    try {
        jit.compile(specs.front(), "sm_80");
        ADD_FAILURE() << "compiled an sm_90a kernel for sm_80";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(specs.front().name), std::string::npos) << e.what();
    }
}
