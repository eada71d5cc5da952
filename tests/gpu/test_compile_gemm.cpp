// The prompt-batch GEMM families' spec builders (mmq, gemm_wgmma) and their NVRTC compilation on
// the CPU at the real model shapes and every tile the plan or the GPU tests use: each kernel must
// compile, contain the tensor-core instructions it exists for, and spill nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/gemm_wgmma.h"
#include "engine/gpu/kernels/mmq.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"
#include "jit/env_flags.h"
#include "jit/jit.h"
#include "tests/support/kernel_specs.h"

using gj::gemma4::Config;
using gj::gemma4::spec_constant;
using gj::jit::CompiledKernel;
using gj::jit::KernelSpec;
using gj::test::all_specs_of;
using gj::test::compile_and_check;
using gj::test::entry_ptx;
namespace ggml = gj::ggml;

TEST(KernelPlan, MmqSpecNamesTilesAndErrors) {
    using gj::gemma4::mmq_spec;
    using gj::gemma4::MmqTile;
    using gj::gemma4::spec_constant;
    const auto s = mmq_spec(ggml::Type::Q8_0, 2560, 10240);
    EXPECT_EQ(s.family, "mmq");
    EXPECT_EQ(s.name, "mmq.q8_0.k2560.m64n128.w2x4.s3b2.o2p1");
    EXPECT_EQ(s.entries, (std::vector<std::string>{"mmq", "mmq_geglu", "mmq_geglu_q8", "mmq_reduce",
                                                   "mmq_reduce_bf16"}));
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
    EXPECT_EQ(spec_constant(s, "WTYPE"), int64_t(ggml::Type::Q8_0));
    EXPECT_EQ(spec_constant(s, "THREADS"), 256);
    EXPECT_EQ(spec_constant(mmq_spec(ggml::Type::Q4_0, 2560, 10240), "WTYPE"),
              int64_t(ggml::Type::Q4_0));
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

// The grouped expert GEMM of MoE prefill: its specs, and the 26B-A4B plan holding them for
// Q8_0 / Q4_0 experts (gate|up d -> F, down F -> d) and not for float ones; for the K-quant mixes,
// Q4_K / Q5_K / Q6_K gate|up and down (F 704, no whole super-blocks) in the fallback types, all
// split.
TEST(KernelPlan, MmqMoeSpecsAndThePlanOf26bA4b) {
    using gj::gemma4::kMoeGemmSlots;
    using gj::gemma4::mmq_moe_spec;
    using gj::gemma4::MmqTile;
    using gj::gemma4::spec_constant;
    const auto up = mmq_moe_spec(ggml::Type::Q4_0, 2816, 704);
    EXPECT_EQ(up.name, "mmq.q4_0.k2816.m32n64.w2x2.s3b4.o3p1.moe");
    EXPECT_EQ(up.entries,
              (std::vector<std::string>{"mmq_moe", "mmq_moe_geglu", "mmq_moe_geglu_q8"}));
    EXPECT_EQ(spec_constant(up, "MOE"), 1);
    EXPECT_EQ(spec_constant(up, "BM"), kMoeGemmSlots);
    const auto down = mmq_moe_spec(ggml::Type::Q8_0, 704, 2816);
    EXPECT_EQ(spec_constant(down, "BM"), kMoeGemmSlots);
    EXPECT_EQ(spec_constant(down, "BN"), 128);
    EXPECT_EQ(spec_constant(down, "SPLITS"), 1);
    // The same tile's dense spec is another kernel.
    EXPECT_NE(gj::gemma4::mmq_spec(ggml::Type::Q4_0, 2816, MmqTile{32, 64, 2, 2, 4, 4, 3, 1}).name,
              up.name);
    EXPECT_THROW(mmq_moe_spec(ggml::Type::Q8_0, 704, MmqTile{32, 128, 2, 4, 2, 3, 3, 1, 2}),
                 std::invalid_argument);
    EXPECT_THROW(mmq_moe_spec(ggml::Type::F16, 704, 2816), gj::gemma4::ConfigError);
    const Config moe = Config::preset("26b-a4b");
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0, ggml::Type::F16}) {
        std::set<std::string> names;
        for (const auto& k : gj::gemma4::build_kernel_plan(moe, t)) names.insert(k.name);
        const bool quant = t != ggml::Type::F16;
        EXPECT_EQ(names.count(mmq_moe_spec(quant ? t : ggml::Type::Q8_0, 2816, 704).name),
                  quant ? 1u : 0u)
            << ggml::type_name(t);
        EXPECT_EQ(names.count(mmq_moe_spec(quant ? t : ggml::Type::Q8_0, 704, 2816).name),
                  quant ? 1u : 0u)
            << ggml::type_name(t);
    }
    using T = ggml::Type;
    for (auto [mix, up_t, fallback] :
         {std::tuple{"q4_k_m", T::Q4_K, T::Q5_0}, std::tuple{"q5_k_m", T::Q5_K, T::Q5_1},
          std::tuple{"q6_k", T::Q6_K, T::Q8_0}}) {
        std::set<std::string> names;
        for (const auto& k : gj::gemma4::build_kernel_plan(
                 moe, *gj::gemma4::quant_mix_from_name(mix), {T::Q8_0, T::Q8_0, T::Q8_0, T::Q8_0}))
            names.insert(k.name);
        EXPECT_EQ(names.count(mmq_moe_spec(up_t, 2816, 704).name), 1u) << mix;
        EXPECT_EQ(names.count(mmq_moe_spec(fallback, 704, 2816).name), 1u) << mix;
        EXPECT_EQ(names.count(mmq_moe_spec(T::Q8_0, 704, 2816).name), 1u) << mix;  // from Q6_K
    }
    EXPECT_EQ(spec_constant(mmq_moe_spec(T::Q4_K, 2816, 704), "WTYPE"), int64_t(T::Q4_K));
    EXPECT_THROW(mmq_moe_spec(T::Q6_K, 704, 2816), std::invalid_argument);
    EXPECT_THROW(mmq_moe_spec(T::BF16, 2816, 704), gj::gemma4::ConfigError);
    EXPECT_THROW(mmq_moe_spec(T::Q4_K, 704, 2816), std::invalid_argument);            // 704 % 256
    EXPECT_THROW(gj::gemma4::mmq_spec(T::Q4_K, 2816, 704), gj::gemma4::ConfigError);  // layers
    using gj::gemma4::MatvecLayout;
    using gj::gemma4::mmq_moe_reads;
    EXPECT_FALSE(mmq_moe_reads(T::Q4_K, MatvecLayout::Ggml, 2816));  // GEMMAJIT_REPACK=0
    EXPECT_TRUE(mmq_moe_reads(T::Q4_K, MatvecLayout::Split, 2816));
    EXPECT_FALSE(mmq_moe_reads(T::Q5_K, MatvecLayout::Split, 704));
    EXPECT_TRUE(mmq_moe_reads(T::Q5_0, MatvecLayout::Split, 704));
    EXPECT_FALSE(mmq_moe_reads(T::Q5_0, MatvecLayout::Ggml, 704));
    EXPECT_FALSE(mmq_moe_reads(T::Q6_K, MatvecLayout::Ggml, 2816));
    EXPECT_TRUE(mmq_moe_reads(T::Q6_K, MatvecLayout::Split, 2816));
    EXPECT_FALSE(mmq_moe_reads(T::F16, MatvecLayout::Ggml, 2816));
}

TEST(KernelTemplates, MmqSpecsCompileWithTheirInstructionsAndNoSpills) {
    compile_and_check(
        all_specs_of({"mmq"}), [](const CompiledKernel& c, const std::string& /*arch*/) {
            const auto& s = c.spec;
            if (s.family == "mmq") {
                // int8 tensor cores fed by ldmatrix from a cp.async pipeline; the quantized
                // GeGLU output rounds to int8 like quantize_q8_1.
                for (const auto& e : s.entries) {
                    const auto body = entry_ptx(c.ptx, e);
                    if (e.starts_with("mmq_reduce")) {  // the split-K sum: no tensor cores
                        EXPECT_NE(body.find("ld.global"), std::string::npos) << e;
                        EXPECT_EQ(body.find("mma.sync"), std::string::npos) << e;
                        EXPECT_EQ(body.find("cvt.rn.bf16.f32") != std::string::npos,
                                  e.ends_with("_bf16"))
                            << e;
                        continue;
                    }
                    for (const char* want :
                         {"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
                          "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "cp.async.cg.shared.global",
                          "cp.async.wait_group", "bar.sync"})
                        EXPECT_NE(body.find(want), std::string::npos) << e << " lacks " << want;
                    EXPECT_EQ(body.find(".local"), std::string::npos) << e << " uses local memory";
                    EXPECT_EQ(body.find("cvt.rni.sat.s8.f32") != std::string::npos,
                              e.ends_with("geglu_q8"))
                        << e;
                    // The grouped expert entries (".moe" specs) read their group as one 16-byte
                    // load.
                    EXPECT_EQ(e.starts_with("mmq_moe"), s.name.ends_with(".moe")) << e;
                    if (e.starts_with("mmq_moe")) {
                        EXPECT_NE(body.find("ld.global.nc.v4.s32"), std::string::npos) << e;
                    }
                }
            }
        });
}

// The wgmma GEMM (sm_90a only) at every model's layer shapes (Q, K/V, O, FFN) and every tile
// the plan or the GPU test uses: it compiles for sm_90a with warpgroup tensor-core instructions,
// swizzled shared-memory descriptors and the async-proxy fence, no local memory; another target is
// refused by name.
TEST(KernelTemplates, GemmWgmmaCompilesForSm90aOnly) {
    using gj::gemma4::GemmWgmmaTile;
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto add = [&](const KernelSpec& s) {
        if (seen.insert(s.name).second) specs.push_back(s);
    };
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        for (const char* v : {"e2b", "e4b", "12b", "31b", "26b-a4b"}) {
            const Config cfg = Config::preset(v);
            for (int l = 0; l < cfg.n_layers; ++l)
                for (bool p : {true, false}) {
                    add(gj::gemma4::gemm_wgmma_spec(t, cfg.d_model, cfg.q_dim(l), p));
                    add(gj::gemma4::gemm_wgmma_spec(t, cfg.d_model, cfg.kv_dim(l), p));
                    add(gj::gemma4::gemm_wgmma_spec(t, cfg.q_dim(l), cfg.d_model, p));
                    if (cfg.layers[l].ffn_dim == 0) continue;  // no dense FFN
                    add(gj::gemma4::gemm_wgmma_spec(t, cfg.d_model, cfg.layers[l].ffn_dim, p));
                    add(gj::gemma4::gemm_wgmma_spec(t, cfg.layers[l].ffn_dim, cfg.d_model, p));
                }
        }
        for (const GemmWgmmaTile& tile :
             {GemmWgmmaTile{64, 64, 3}, GemmWgmmaTile{256, 128, 4}, GemmWgmmaTile{256, 64, 5},
              GemmWgmmaTile{128, 64, 5}, GemmWgmmaTile{64, 64, 3, 1, true},
              GemmWgmmaTile{256, 64, 5, 1, true}, GemmWgmmaTile{128, 64, 6, 1, true}})
            add(gj::gemma4::gemm_wgmma_spec(t, 96, tile));
    }
    for (const auto& c : gj::test::compile_sm90a_only(specs)) {
        SCOPED_TRACE(c.spec.name);
        for (size_t i = 0; i < c.spec.entries.size(); ++i) {
            const std::string& e = c.spec.entries[i];
            const auto body = entry_ptx(c.ptx, e);
            if (e.starts_with("gemm_wgmma_reduce")) {  // the split-K sum: no tensor cores
                EXPECT_NE(body.find("ld.global"), std::string::npos) << e;
                EXPECT_EQ(body.find("wgmma.mma_async"), std::string::npos) << e;
                EXPECT_EQ(body.find("cvt.rn.bf16.f32") != std::string::npos, e.ends_with("_bf16"))
                    << e;
                continue;
            }
            for (const char* want :
                 {"wgmma.mma_async.sync.aligned.m64n", "wgmma.fence.sync.aligned",
                  "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                  "fence.proxy.async.shared::cta", "cp.async.cg.shared.global",
                  "cvt.rn.bf16x2.f32"})
                EXPECT_NE(body.find(want), std::string::npos) << e << " lacks " << want;
            // The producer form hands steps over through mbarriers and gives its registers to
            // the consumers.
            const bool producer = spec_constant(c.spec, "PRODUCER") == 1;
            EXPECT_EQ(body.find("mbarrier.try_wait.parity") != std::string::npos, producer) << e;
            // The register split: at BM <= 128 (two blocks per SM).
            EXPECT_EQ(body.find("setmaxnreg.inc") != std::string::npos,
                      producer && spec_constant(c.spec, "BM") <= 128)
                << e;
            EXPECT_EQ(body.find(".local"), std::string::npos) << e << " uses local memory";
            EXPECT_EQ(c.resources_per_entry[i].spill_store_bytes, 0) << e;
            EXPECT_EQ(c.resources_per_entry[i].stack_bytes, 0) << e;
            std::printf("[ regs     ] %s %s: %d\n", c.spec.name.c_str(), e.c_str(),
                        c.resources_per_entry[i].registers);
        }
    }
}

// The producer form (GEMMAJIT_WGMMA_PRODUCER) is planned for the tiles of 64 weight rows only,
// where it measured as fast or faster; the 128-row tiles keep every thread copying.
TEST(KernelPlan, GemmWgmmaProducerOnlyForTilesOf64Rows) {
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0})
        for (const auto& [k, n] : std::vector<std::pair<int, int>>{
                 {5376, 8192}, {5376, 21504}, {21504, 5376}, {2560, 2048}, {2560, 10240}}) {
            const auto on = gj::gemma4::gemm_wgmma_tile(t, k, n, true);
            const auto off = gj::gemma4::gemm_wgmma_tile(t, k, n, false);
            EXPECT_EQ(on.producer, on.bn == 64) << k << " x " << n;
            EXPECT_FALSE(off.producer);
            const KernelSpec s = gj::gemma4::gemm_wgmma_spec(t, k, n, true);
            EXPECT_EQ(spec_constant(s, "PRODUCER"), on.producer ? 1 : 0) << s.name;
            EXPECT_EQ(spec_constant(s, "THREADS"), 2 * on.bn + (on.producer ? 128 : 0)) << s.name;
            EXPECT_EQ(s.name.ends_with(".p"), on.producer) << s.name;
        }
    // The form is not built for 128-row tiles: asking for one is refused by name.
    try {
        gj::gemma4::gemm_wgmma_spec(ggml::Type::Q4_0, 5376,
                                    gj::gemma4::GemmWgmmaTile{256, 128, 4, 1, true});
        ADD_FAILURE() << "a producer tile of 128 rows was accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("the producer form with BN 64 only"),
                  std::string::npos)
            << e.what();
    }
}
