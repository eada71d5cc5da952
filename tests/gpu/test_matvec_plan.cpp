// The decode matvec specs' launch forms beyond the shape rules, on the CPU: the mixed Q|K|V
// multi of the _M mixes' layers that keep V in Q6_K (matvec_multi_v_spec), and the shapes set by
// hand (GEMMAJIT_MATVEC_SHAPE: parse_matvec_shapes, with_matvec_shapes).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/quant_mix.h"
#include "jit/env_flags.h"
#include "tests/support/kernel_specs.h"

using gj::gemma4::build_kernel_plan;
using gj::gemma4::Config;
using gj::gemma4::MatvecLayout;
using gj::test::names_of;
namespace ggml = gj::ggml;

// An _M mix's layers that keep V in Q6_K while Q and K are Q4_K / Q5_K run their decode Q, K and V
// in one launch: the plan of the mix holds Q's decode spec in its mixed multi form, the multi
// entry alone in Q's launch shape; a pure file, whose V is Q and K's type, does not.
TEST(KernelPlan, MixedLayersPlanTheirQkvMultiWithAQ6KV) {
    using gj::gemma4::matvec_multi_v_spec;
    using gj::gemma4::matvec_spec;
    using gj::gemma4::spec_constant;
    gj::gemma4::PlanTypes base{ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0,
                               ggml::Type::Q8_0};
    struct Want {
        const char *variant, *mix, *spec, *plain;
    };
    for (const Want& w :
         {Want{"e4b", "q4_k_m", "matvec_q4_k.k2560.split.v_q6_k", "matvec_q4_k.k2560.split"},
          Want{"12b", "q4_k_m", "matvec_q4_k.k3840.split.v_q6_k", "matvec_q4_k.k3840.split"},
          Want{"31b", "q5_k_m", "matvec_q5_k.k5376.split.v_q6_k", "matvec_q5_k.k5376.split"},
          Want{"e2b", "q5_k_m", "matvec_q5_k.k1536.split.v_q6_k", "matvec_q5_k.k1536.split"}}) {
        SCOPED_TRACE(std::string(w.variant) + " " + w.mix);
        const auto mix = *gj::gemma4::quant_mix_from_name(w.mix);
        const auto types = gj::gemma4::mix_plan_types(Config::preset(w.variant), mix, base);
        int with_v = 0;
        for (const auto& t : types) {
            const bool qk = t.matmul == ggml::Type::Q4_K || t.matmul == ggml::Type::Q5_K;
            EXPECT_EQ(t.other_v.has_value(), qk) << ggml::type_name(t.matmul);
            with_v += t.other_v == ggml::Type::Q6_K;
        }
        EXPECT_EQ(with_v, 1);
        const auto plan = build_kernel_plan(Config::preset(w.variant), mix, base);
        const auto multi =
            std::find_if(plan.begin(), plan.end(), [&](const auto& s) { return s.name == w.spec; });
        const auto plain = std::find_if(plan.begin(), plan.end(),
                                        [&](const auto& s) { return s.name == w.plain; });
        ASSERT_NE(multi, plan.end());
        ASSERT_NE(plain, plan.end());
        EXPECT_EQ(multi->entries, std::vector<std::string>{plain->family + "_multi"});
        EXPECT_EQ(spec_constant(*multi, "MULTI_V"), 1);
        for (const char* c : {"THREADS", "ROWS", "UNROLL", "LAYOUT", "L2_PREFETCH"})
            EXPECT_EQ(spec_constant(*multi, c), spec_constant(*plain, c)) << c;
        int mixed = 0;
        for (const auto& s : plan) mixed += s.name.find(".v_") != std::string::npos;
        EXPECT_EQ(mixed, 1);
        // Pure files: one type for Q, K and V.
        const std::string pure = std::string(w.mix).substr(0, 4);
        for (const auto& s : build_kernel_plan(Config::preset(w.variant),
                                               *gj::gemma4::quant_mix_from_name(pure), base))
            EXPECT_EQ(s.name.find(".v_"), std::string::npos) << pure << ": " << s.name;
    }
    // Only a single-column Q4_K / Q5_K spec with a multi entry, only a Q6_K V.
    const auto q4_k = matvec_spec(ggml::Type::Q4_K, 2560, 1, MatvecLayout::Split);
    EXPECT_EQ(matvec_multi_v_spec(q4_k, ggml::Type::Q6_K).name, "matvec_q4_k.k2560.split.v_q6_k");
    EXPECT_THROW(matvec_multi_v_spec(q4_k, ggml::Type::Q4_K), std::invalid_argument);
    EXPECT_THROW(matvec_multi_v_spec(matvec_spec(ggml::Type::Q4_0, 2560, 1, MatvecLayout::Split),
                                     ggml::Type::Q6_K),
                 std::invalid_argument);
    EXPECT_THROW(matvec_multi_v_spec(matvec_spec(ggml::Type::Q4_K, 2560, 8, MatvecLayout::Split),
                                     ggml::Type::Q6_K),
                 std::invalid_argument);
    EXPECT_TRUE(gj::gemma4::has_multi_v(ggml::Type::Q5_K, ggml::Type::Q6_K));
    EXPECT_FALSE(gj::gemma4::has_multi_v(ggml::Type::Q6_K, ggml::Type::Q6_K));
    EXPECT_FALSE(gj::gemma4::has_multi_v(ggml::Type::Q4_0, ggml::Type::Q8_0));
}

// GEMMAJIT_MATVEC_SHAPE (read by apply_prefill_flags as a load reads it): the single-column
// matvecs of the named type and width take the shapes given, their names say so, the GeGLU entry
// its own where given; batched specs, other widths and other types keep the plan's; a bad entry
// is refused with its text and the reason.
TEST(KernelPlan, MatvecShapesSetByHand) {
    using gj::gemma4::spec_constant;
    gj::gemma4::PlanTypes types{ggml::Type::Q4_0, ggml::Type::Q4_0, ggml::Type::Q4_0,
                                ggml::Type::F32};
    gj::gemma4::apply_prefill_flags(
        types,
        gj::jit::Flags::parse({{"GEMMAJIT_MATVEC_SHAPE",
                                "q4_0.k2560=96x2x1,q4_0.k2560.geglu=32x4x1,f32.k2560=64x1x2"}}),
        "sm_90");
    ASSERT_EQ(types.matvec_shapes.size(), 3u);
    std::map<std::string, gj::jit::KernelSpec> plan;
    for (auto& s : build_kernel_plan(Config::preset("e4b"), types)) plan[s.name] = s;
    ASSERT_TRUE(plan.count("matvec_q4_0.k2560.split.t96x2x1.g32x4x1"));
    const auto& s = plan["matvec_q4_0.k2560.split.t96x2x1.g32x4x1"];
    const auto mv = gj::gemma4::matvec_launch(s, false), gl = gj::gemma4::matvec_launch(s, true);
    EXPECT_EQ(mv.threads, 96u);
    EXPECT_EQ(mv.rows, 2u);
    EXPECT_EQ(spec_constant(s, "UNROLL"), 1);
    EXPECT_EQ(gl.threads, 32u);
    EXPECT_EQ(gl.rows, 4u);
    EXPECT_EQ(spec_constant(s, "GEGLU_UNROLL"), 1);
    // The PLE gate's input norm plays 128 threads at d 2560: its spec keeps them (below).
    EXPECT_TRUE(plan.count("matvec_q4_0.k2560.split.ple_gate.g32x4x1"));
    int f32_decode = 0;  // the PLE context projection (F32 here)
    for (const auto& [name, spec] : plan) {
        if (!name.starts_with("matvec_f.f32.k2560") || spec_constant(spec, "NCOLS") != 1) continue;
        ++f32_decode;
        EXPECT_TRUE(name.ends_with(".t64x1x2")) << name;
        EXPECT_EQ(spec_constant(spec, "THREADS"), 64) << name;
    }
    EXPECT_EQ(f32_decode, 1);
    // The batched specs and the other widths keep the plan's shapes.
    EXPECT_TRUE(plan.count("matvec_q4_0.k2560.b8.split"));
    EXPECT_TRUE(plan.count("matvec_q4_0.k10240.split"));
    EXPECT_EQ(
        spec_constant(plan["matvec_q4_0.k10240.split"], "THREADS"),
        spec_constant(gj::gemma4::matvec_spec(ggml::Type::Q4_0, 10240, 1, MatvecLayout::Split),
                      "THREADS"));
    for (const auto& [name, spec] : plan) {
        if (name.find(".t96x2x1") != std::string::npos) {
            EXPECT_NE(name.find("k2560"), std::string::npos) << name;
        }
    }

    // A PLE gate's input norm needs its threads: fewer leave that spec as the plan made it.
    gj::gemma4::PlanTypes few = types;
    few.matvec_shapes = gj::gemma4::parse_matvec_shapes("q4_0.k2560=32x4x1");
    const auto few_names = names_of(build_kernel_plan(Config::preset("e4b"), few));
    EXPECT_TRUE(few_names.count("matvec_q4_0.k2560.split.t32x4x1"));
    EXPECT_TRUE(few_names.count("matvec_q4_0.k2560.split.ple_gate"));

    auto refused = [](const char* text, const char* why) {
        try {
            gj::gemma4::parse_matvec_shapes(text);
            ADD_FAILURE() << text << " was accepted";
        } catch (const gj::gemma4::ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
        }
    };
    refused("q4_k.k2560=48x2x1", "threads must be a multiple of 32");
    refused("q4_k.k2560=2048x2x1", "threads must be a multiple of 32");
    refused("q4_k.k2500=64x1x1", "positive multiple of 32");
    refused("iq4_nl.k2560=64x1x1", "no matvec reads that type");
    refused("q4_k.k2560=64x0x1", "rows must be 1 to 8");
    refused("q4_k.k2560.geglu=64x9x1", "rows must be 1 to 8");
    refused("q4_k.k2560=64x1x9", "unroll must be 1 to 8");
    refused("f32.k2560.geglu=64x1x1", "float matvecs");
    refused("q4_k.k2560=64x1x1,q4_k.k2560=32x1x1", "given twice");
    refused("q4_k.k2560=64x1", "the shape is not");
    EXPECT_TRUE(gj::gemma4::parse_matvec_shapes("").empty());
    EXPECT_THROW(gj::jit::Flags::parse({{"GEMMAJIT_MATVEC_SHAPE", "q4_k.k2560"}}),
                 std::invalid_argument);
}
