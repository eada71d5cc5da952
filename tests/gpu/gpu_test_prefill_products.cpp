// The prefill products of quantized matrices: each GEMM variant (GEMMAJIT_MMQ_VARIANT) against
// the CPU reference with its launches counted, `auto`'s choice between the wgmma GEMM for short
// chunks and cuBLAS on F16 copies for long ones (the copies made ahead beside the products, which
// leave them SMs: GEMMAJIT_COPY_SMS), and the errors for variants or settings this GPU cannot take.
// Tolerance: quantized weights, 3e-2 of the largest |logit| (gpu_test_forward.cpp says why).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/gpu/gpu_model.h"
#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/session.h"
#include "jit/blas.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "tests/support/gpu_forward_check.h"
#include "tests/support/test_env.h"

using gj::gemma4::Config;
using gj::gemma4::GpuSession;
namespace ggml = gj::ggml;
using namespace gj::test;  // synth, load_gpu, cpu_logits, expect_agree, ...

namespace {

constexpr float kTolQuant = 3e-2f;

}  // namespace

// Each prefill GEMM variant the GPU has (mma and blas everywhere, wgmma on sm_90), forced, against
// the CPU reference on 32-token chunks, with its launches counted and the other variants' not
// (blas: the layer matrices through F16 copies and cuBLAS; the LM head keeps the int8 GEMM).
TEST(GpuForward, GemmVariantsMatchTheCpuReference) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-gemm-variants");
    std::vector<std::string> variants = {"mma", "blas"};
    if (sm90()) variants.push_back("wgmma");
    for (const char* preset : {"tiny-e2b", "tiny-keqv"})
        for (auto wtype : {ggml::Type::Q8_0, ggml::Type::Q4_0})
            for (const auto& v : variants) {
                const std::string what =
                    std::string(preset) + " " + ggml::type_name(wtype) + " " + v;
                SCOPED_TRACE(what);
                const auto path = synth(dir, preset, wtype);
                const auto f = flags({{"GEMMAJIT_MMQ_VARIANT", v}});
                auto model = load_gpu(path, 256, 32, f);
                const Config& cfg = model->config();
                EXPECT_EQ(model->layers()[0].q.gemm_bf16, v == "wgmma");
                EXPECT_EQ(model->layers()[0].q.spec_gemm.empty(), v == "blas");
                EXPECT_EQ(model->layers()[0].down.spec_dequant.empty(), v != "blas");
                const auto tokens = test_tokens(5 * cfg.sliding_window, cfg.vocab_size);
                GpuSession s(*model);
                expect_agree(cpu_logits(path, tokens), s.prefill_logits(tokens), cfg.vocab_size,
                             kTolQuant, what + " vs CPU");
                const auto& p = s.path_counts();
                if (v == "blas") {
                    EXPECT_GT(p.dequant, 0u) << "no layer was dequantized";
                    EXPECT_GT(p.blas, 0u) << "no cuBLAS product ran";
                    EXPECT_GT(p.geglu_f16, 0u) << "the GeGLU was not written in f16";
                    EXPECT_GT(p.norm_f16, 0u) << "no norm wrote the f16 input of cuBLAS";
                    // One per layer of the 32-token chunk (the 8-token one runs the matvecs).
                    EXPECT_EQ(p.attn_f16, uint64_t(cfg.n_layers))
                        << "a prefill attention output was converted for its F16 projection";
                    EXPECT_EQ(p.wgmma, 0u);
                } else {
                    EXPECT_GT(v == "wgmma" ? p.wgmma : p.mmq, 0u);
                    EXPECT_EQ(v == "wgmma" ? p.mmq : p.wgmma, 0u);
                    EXPECT_EQ(p.dequant, 0u);
                }
            }
}

// GEMMAJIT_MMQ_VARIANT=auto on sm_90: a chunk shorter than copy_min_rows multiplies the quantized
// weights on the wgmma GEMM, a longer one their per-layer F16 copies with cuBLAS (each against
// the CPU reference; Q, K and V as one product, also on k_eq_v layers).
TEST(GpuForward, AutoTakesTheGemmForShortChunksAndCopiesForLongOnes) {
    GJ_REQUIRE_GPU();
    if (!sm90()) GTEST_SKIP() << "the wgmma / copies choice is made on sm_90 only";
    gj::test::ScratchDir dir("gpu-auto-prefill");
    // tiny-keqv: global layers whose V is K's raw row (one product over Q and K only).
    for (const char* preset : {"tiny", "tiny-keqv"}) {
        SCOPED_TRACE(preset);
        const auto path = synth(dir, preset, ggml::Type::Q4_0);
        const auto f = flags();
        auto model = load_gpu(path, 1024, 512, f);
        const Config& cfg = model->config();
        const int min_rows = model->copy_min_rows();
        ASSERT_EQ(min_rows, gj::gemma4::copy_min_rows(cfg.d_model));
        ASSERT_FALSE(model->layers()[0].q.spec_gemm.empty());
        ASSERT_FALSE(model->layers()[0].q.spec_dequant.empty());
        // A session whose chunks never reach copy_min_rows holds no scratch for these copies.
        EXPECT_GT(model->dequant_slot_bytes(), 0u);
        EXPECT_EQ(load_gpu(path, 1024, 64, f)->dequant_slot_bytes(), 0u);
        for (const int T : {min_rows - 1, min_rows + 20}) {
            SCOPED_TRACE(T);
            const auto tokens = test_tokens(T, cfg.vocab_size, 31);
            GpuSession s(*model);
            expect_agree(cpu_logits(path, tokens), s.prefill_logits(tokens), cfg.vocab_size,
                         kTolQuant, "one chunk of " + std::to_string(T) + " vs CPU");
            const auto& p = s.path_counts();
            if (T < min_rows) {
                EXPECT_GT(p.wgmma, 0u);
                EXPECT_EQ(p.dequant, 0u) << "copies made for a chunk shorter than " << min_rows;
                EXPECT_EQ(p.qkv_merged, 0u);
            } else {
                EXPECT_EQ(p.dequant_ahead, uint64_t(cfg.n_layers));
                EXPECT_GT(p.blas, 0u);
                // Q, K and V of every layer with K and V as one product over their adjacent copies.
                uint64_t merged = 0, merged_keqv = 0;
                for (const auto& g : model->layers()) {
                    merged += g.qkv_one_product;
                    merged_keqv += g.qkv_one_product && !g.v.present();
                }
                EXPECT_GT(merged, 0u);
                if (std::string(preset) == "tiny-keqv") {
                    EXPECT_GT(merged_keqv, 0u) << "no k_eq_v layer took one Q|K product";
                }
                EXPECT_EQ(p.qkv_merged, merged);
                // Under 1024 rows the products beside the next layer's copies leave SMs to them.
                if (model->blas()->sm_target_supported()) {
                    EXPECT_GT(p.blas_beside_copies, 0u);
                }
                // A profile times the products as a timed run plans them (SMs left to the copies,
                // though it makes them in order), and lists the merged Q|K|V product.
                GpuSession prof(*model);
                const auto times = prof.profile_prefill(tokens);
                EXPECT_EQ(prof.path_counts().blas_beside_copies, p.blas_beside_copies);
                EXPECT_EQ(prof.path_counts().dequant_ahead, 0u);
                EXPECT_GT(prof.path_counts().dequant, 0u);
                EXPECT_TRUE(std::any_of(times.begin(), times.end(), [](const auto& k) {
                    return k.label.find("attn_q|k|v") != std::string::npos;
                })) << "no merged Q|K|V product in the profile";
                // Only the LM head's GEMM (every row's logits) is left on wgmma.
                EXPECT_EQ(p.wgmma, 1u);
            }
        }
    }
}

// GEMMAJIT_MMQ_VARIANT=wgmma on a GPU that is not sm_90 ends in an error naming the flag.
TEST(GpuForward, WgmmaVariantNeedsSm90) {
    GJ_REQUIRE_GPU();
    if (sm90()) GTEST_SKIP() << "this GPU is sm_90: the wgmma variant is available";
    gj::test::ScratchDir dir("gpu-wgmma-refused");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    try {
        load_gpu(path, 256, 32, flags({{"GEMMAJIT_MMQ_VARIANT", "wgmma"}}));
        ADD_FAILURE() << "loaded a wgmma plan on " << gj::jit::Device::get().arch();
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("GEMMAJIT_MMQ_VARIANT=wgmma"), std::string::npos)
            << e.what();
    }
}

// GEMMAJIT_COPY_SMS at or above the GPU's SM count would leave cuBLAS nothing: a session refuses
// it with an error naming the flag and the count.
TEST(GpuForward, CopySmsAtTheSmCountIsRefused) {
    GJ_REQUIRE_GPU();
    gj::test::ScratchDir dir("gpu-copy-sms");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const int sms = gj::jit::Device::get().sm_count();
    auto model = load_gpu(path, 256, 32, flags({{"GEMMAJIT_COPY_SMS", std::to_string(sms)}}));
    try {
        GpuSession s(*model);
        ADD_FAILURE() << "a session left all " << sms << " SMs to the copies";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("GEMMAJIT_COPY_SMS=" + std::to_string(sms)),
                  std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find(std::to_string(sms) + " SMs"), std::string::npos)
            << e.what();
    }
}
