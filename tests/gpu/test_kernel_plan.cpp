// Kernel plan contents (which specs each model needs, for every weight type and flag), the spec
// builders' errors, and the launch geometry of every spec the compile tests compile
// (test_compile_*.cpp), all on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/dequant_f16.h"
#include "engine/gpu/kernels/embed_rows.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/logits.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/moe.h"
#include "engine/gpu/kernels/ple.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/quant_mix.h"
#include "tests/support/kernel_specs.h"

using gj::gemma4::build_kernel_plan;
using gj::gemma4::Config;
using gj::gemma4::KvType;
using gj::gemma4::MatvecLayout;
using gj::jit::KernelSpec;
using gj::test::all_specs;
using gj::test::names_of;
namespace ggml = gj::ggml;

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
                             "matvec_q8_0.k256.split.ple_proj",   // the PLE projection
                             "matvec_q8_0.k2560.split.ple_gate",  // the PLE gate
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
    // projection), o-proj inputs (2048, 4096), FFN, PLE; for 1 and 8 columns; and the PLE gate's
    // own single-column spec (with the entries that make their input, like the projection's).
    size_t matvecs = std::count_if(plan.begin(), plan.end(),
                                   [](const KernelSpec& k) { return k.family == "matvec_q8_0"; });
    EXPECT_EQ(matvecs, 11u);
    EXPECT_FALSE(names.count("matvec_q8_0.k256.split"))
        << "the projection's spec is the .ple_proj one";
}

TEST(KernelPlan, PerVariantWidths) {
    auto e2b = names_of(build_kernel_plan(Config::preset("e2b"), ggml::Type::Q4_0));
    // FFN down of layers 0-14 and of the double-wide KV-shared layers (1536 rows: Short).
    EXPECT_TRUE(e2b.count("matvec_q4_0.k6144.split.short"));
    EXPECT_TRUE(e2b.count("matvec_q4_0.k12288.split.short"));
    EXPECT_TRUE(e2b.count("matvec_q4_0.k1536.split"));
    EXPECT_TRUE(e2b.count("rmsnorm.n1536.w1.q8"));
    EXPECT_TRUE(e2b.count("embed_rows.q4_0.n8960.v262144"));  // PLE table: 35 * 256

    auto moe = names_of(build_kernel_plan(Config::preset("26b-a4b"), ggml::Type::Q8_0));
    EXPECT_TRUE(moe.count("matvec_q8_0.k2112.split"));  // dense MLP down: not a multiple of 256
    // post_attention_norm with ffn_norm, the router's input and the experts' pre-norm
    EXPECT_TRUE(moe.count("rmsnorm.n2816.w1.add.n2.q8.moe"));
    EXPECT_FALSE(moe.count("rmsnorm.n2816.w0"));       // no weightless norm of the stream
    EXPECT_TRUE(moe.count("moe.e128.k8.d2816"));       // routing, grouping, combine
    EXPECT_TRUE(moe.count("matvec_f.f32.k2816.few"));  // the router (kept f32; 128 rows)
    // The grouped expert matvecs over experts repacked one by one to the split layout: gate|up
    // (input d) and down (input 704), one slot per group for a single token and 8 for batches;
    // and the grouped tensor-core GEMMs of prefill.
    for (const char* want :
         {"matvec_q8_0.k2816.split.moe", "matvec_q8_0.k2816.b8.split.moe",
          "matvec_q8_0.k704.split.moe", "matvec_q8_0.k704.b8.split.moe",
          "mmq.q8_0.k2816.m32n64.w2x2.s4b4.o2p1.moe", "mmq.q8_0.k704.m32n128.w2x4.s3b2.o2p1.moe"})
        EXPECT_TRUE(moe.count(want)) << want;
    // Types without a split layout read the stacked experts in their GGUF blocks.
    auto moe_bf16 = names_of(build_kernel_plan(Config::preset("26b-a4b"), ggml::Type::BF16));
    EXPECT_TRUE(moe_bf16.count("matvec_f.bf16.k2816.b4.moe"));
    EXPECT_FALSE(moe.count("matvec_q8_0.k256.split"));  // no PLE
    EXPECT_FALSE(moe.count("gelu_mul.p256"));

    auto b31 = names_of(build_kernel_plan(Config::preset("31b"), ggml::Type::Q8_0));
    for (const char* want : {"matvec_q8_0.k5376.split", "matvec_q8_0.k8192.split",
                             "matvec_q8_0.k16384.split", "matvec_q8_0.k21504.split"})
        EXPECT_TRUE(b31.count(want)) << want;

    // Float weights: matvec_f everywhere, fp32 norms, no activation quantization.
    auto bf = names_of(build_kernel_plan(Config::preset("e4b"), ggml::Type::BF16));
    for (const char* want :
         {"matvec_f.bf16.k2560", "matvec_f.bf16.k10240",
          "matvec_f.bf16.k256",  // a float projection: no entry of its own
          "matvec_f.bf16.k2560.few.ple_gate", "matvec_f.bf16.k2560.b8", "rmsnorm.n2560.w1",
          "rmsnorm.n2560.w1.add.scale.n2", "embed_rows.bf16.n2560.v262144", "logits.v262144.k64",
          // prefill through cuBLAS: bf16 activations, the GeGLU of two products
          "convert_f32", "gelu_mul.p10240"})
        EXPECT_TRUE(bf.count(want)) << want;
    EXPECT_FALSE(bf.count("quantize_q8_1"));
    EXPECT_FALSE(bf.count("rmsnorm.n2560.w1.q8"));
}

// Single-column shapes that depend on the matrix's rows get their own specialization (".wide",
// ".few") only where the rows change the launch constants; the plans list them for the
// matrices that have them.
TEST(KernelPlan, RowDependentMatvecShapes) {
    using gj::gemma4::matvec_f_spec;
    using gj::gemma4::matvec_spec;
    using gj::gemma4::spec_constant;
    // A vocabulary-sized Q6_K LM head: 4 rows per block; a 512-row Q6_K matrix of the same width
    // keeps the generic spec.
    const auto head = matvec_spec(ggml::Type::Q6_K, 2560, 1, MatvecLayout::Ggml, 262144);
    const auto generic = matvec_spec(ggml::Type::Q6_K, 2560, 1, MatvecLayout::Ggml);
    EXPECT_EQ(head.name, "matvec_q6_k.k2560.wide");
    EXPECT_EQ(spec_constant(head, "ROWS"), 4);
    EXPECT_EQ(spec_constant(generic, "ROWS"), 1);
    EXPECT_EQ(matvec_spec(ggml::Type::Q6_K, 2560, 1, MatvecLayout::Ggml, 512).name, generic.name);
    // Rows change nothing for the other types' LM heads, or for batches.
    EXPECT_EQ(matvec_spec(ggml::Type::Q8_0, 2560, 1, MatvecLayout::Split, 262144).name,
              "matvec_q8_0.k2560.split");
    EXPECT_EQ(matvec_spec(ggml::Type::Q6_K, 2560, 8, MatvecLayout::Ggml, 262144).name,
              "matvec_q6_k.k2560.b8");
    // Float matrices of few rows (the PLE gate: 256 x 2560) split each row over 256 threads;
    // short rows (the PLE projection, k 256) take 4 rows per block whatever their count.
    const auto gate = matvec_f_spec(ggml::Type::F32, 2560, 1, 256);
    EXPECT_EQ(gate.name, "matvec_f.f32.k2560.few");
    EXPECT_EQ(spec_constant(gate, "THREADS"), 256);
    EXPECT_EQ(matvec_f_spec(ggml::Type::F32, 2560, 1, 10240).name, "matvec_f.f32.k2560");
    const auto proj = matvec_f_spec(ggml::Type::F32, 256, 1, 2560);
    EXPECT_EQ(proj.name, "matvec_f.f32.k256");
    EXPECT_EQ(spec_constant(proj, "ROWS"), 4);
    // The plans: E4B's F32 PLE gate and the Q4_K_M file's Q6_K LM head in its GGUF blocks
    // (GEMMAJIT_REPACK=0; split, it takes the split shapes).
    const auto f32 = names_of(build_kernel_plan(Config::preset("e4b"), ggml::Type::F32));
    EXPECT_TRUE(f32.count("matvec_f.f32.k2560.few"));
    gj::gemma4::PlanTypes base{ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0,
                               ggml::Type::Q8_0};
    base.layout = MatvecLayout::Ggml;
    const auto km = names_of(
        build_kernel_plan(Config::preset("e4b"), *gj::gemma4::quant_mix_from_name("q4_k_m"), base));
    EXPECT_TRUE(km.count("matvec_q6_k.k2560.wide"));
}

// Q4_K, Q5_K and Q6_K matrices take the split layout (matvecs, batched matvecs and the prefill
// dequantization all read it; Q4_K 148 bytes per 256 elements, Q5_K 180, Q6_K the file's 210),
// and so does a tied K-quant embedding table with its LM head; the plan keeps the GGUF blocks
// with GEMMAJIT_REPACK=0. The PLE table and routed experts stay in their GGUF blocks.
TEST(KernelPlan, KQuantMatricesTakeTheSplitLayout) {
    using gj::gemma4::matrix_bytes;
    using gj::gemma4::matvec_spec;
    using gj::gemma4::spec_constant;
    gj::gemma4::PlanTypes base{ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0,
                               ggml::Type::Q8_0};
    const auto mix = *gj::gemma4::quant_mix_from_name("q4_k_m");
    const auto split = names_of(build_kernel_plan(Config::preset("e4b"), mix, base));
    for (const char* name :
         {"matvec_q4_k.k2560.split", "matvec_q4_k.k10240.split", "matvec_q4_k.k2048.split",
          "matvec_q4_k.k2560.b8.split", "dequant_f16.q4_k.k2560.split",
          "dequant_f16.q4_k.k10240.split", "matvec_q6_k.k10240.split", "matvec_q6_k.k2560.split",
          "dequant_f16.q6_k.k10240.split", "embed_rows.q6_k.n2560.v262144.split",
          "embed_rows.q6_k.n10752.v262144"})
        EXPECT_TRUE(split.count(name)) << name;
    for (const char* name : {"matvec_q4_k.k2560", "dequant_f16.q4_k.k2560",
                             "matvec_q6_k.k2560.wide", "embed_rows.q6_k.n2560.v262144"})
        EXPECT_FALSE(split.count(name)) << name;
    base.layout = MatvecLayout::Ggml;
    const auto blocks = names_of(build_kernel_plan(Config::preset("e4b"), mix, base));
    for (const char* name : {"matvec_q4_k.k2560", "dequant_f16.q4_k.k2560",
                             "matvec_q6_k.k2560.wide", "embed_rows.q6_k.n2560.v262144"})
        EXPECT_TRUE(blocks.count(name)) << name;
    for (const auto& n : blocks) EXPECT_EQ(n.find(".split"), std::string::npos) << n;
    // Q5_K_M: Q5_K and its Q6_K tensors split; with GEMMAJIT_REPACK=0 in their blocks.
    base.layout = MatvecLayout::Split;
    const auto q5_mix = *gj::gemma4::quant_mix_from_name("q5_k_m");
    const auto q5 = names_of(build_kernel_plan(Config::preset("e4b"), q5_mix, base));
    for (const char* name : {"matvec_q5_k.k2560.split", "matvec_q5_k.k10240.split",
                             "matvec_q5_k.k2048.split", "matvec_q5_k.k2560.b8.split",
                             "dequant_f16.q5_k.k2560.split", "dequant_f16.q5_k.k10240.split",
                             "matvec_q6_k.k10240.split", "embed_rows.q6_k.n2560.v262144.split"})
        EXPECT_TRUE(q5.count(name)) << name;
    for (const char* name : {"matvec_q5_k.k2560", "dequant_f16.q5_k.k2560"})
        EXPECT_FALSE(q5.count(name)) << name;
    base.layout = MatvecLayout::Ggml;
    const auto q5_blocks = names_of(build_kernel_plan(Config::preset("e4b"), q5_mix, base));
    for (const char* name : {"matvec_q5_k.k2560", "matvec_q5_k.k2560.b8", "dequant_f16.q5_k.k2560"})
        EXPECT_TRUE(q5_blocks.count(name)) << name;
    for (const auto& n : q5_blocks) EXPECT_EQ(n.find(".split"), std::string::npos) << n;
    // A pure Q5_K file: its tied Q5_K table split with the LM head it serves.
    base.layout = MatvecLayout::Split;
    const auto q5_pure = names_of(
        build_kernel_plan(Config::preset("e4b"), *gj::gemma4::quant_mix_from_name("q5_k"), base));
    EXPECT_TRUE(q5_pure.count("embed_rows.q5_k.n2560.v262144.split"));
    EXPECT_TRUE(q5_pure.count("matvec_q5_k.k2560.split"));
    EXPECT_FALSE(q5_pure.count("embed_rows.q5_k.n2560.v262144"));
    // A split K-quant spec holds its repack entry and its sweep's shapes (matvec.cpp): below k
    // 8192 split Q4_K takes Q4_0's (64 threads over 4 rows, the GeGLU its own), Q5_K / Q6_K
    // 128 threads over 2 rows; from k 8192 32 threads over 1 row, 2 rows in a Tall matrix.
    const auto q4_0 = matvec_spec(ggml::Type::Q4_0, 2560, 1, MatvecLayout::Split);
    EXPECT_EQ(spec_constant(q4_0, "THREADS"), 64);
    EXPECT_EQ(spec_constant(q4_0, "ROWS"), 4);
    // The GeGLU entry's own shape: 128 threads over 2 rows, 32 over 4 for rows of at most 64
    // units (E2B's d 1536) and split Q8_0's rows of at most 96 (16-element units: d 1536 again),
    // 96 over 2 for the K-quants' rows of 65-96 units (E4B's d 2560: 80).
    for (auto t : {ggml::Type::Q4_0, ggml::Type::Q4_1, ggml::Type::Q4_K, ggml::Type::Q5_K,
                   ggml::Type::Q6_K, ggml::Type::Q8_0}) {
        const auto e2b =
            gj::gemma4::matvec_launch(matvec_spec(t, 1536, 1, MatvecLayout::Split), true);
        EXPECT_EQ(e2b.threads, 32u);
        EXPECT_EQ(e2b.rows, 4u);
        const auto e4b =
            gj::gemma4::matvec_launch(matvec_spec(t, 2560, 1, MatvecLayout::Split), true);
        EXPECT_EQ(e4b.threads, gj::gemma4::spec_util::is_kquant(t) ? 96u : 128u);
        EXPECT_EQ(e4b.rows, 2u);
    }
    // E2B's FFN down projections (1536 rows: Short) take 64 threads over 1 row, 2 units per
    // batch in every split type with such a rule (not the 32-block fallbacks); E4B's (2560 rows)
    // and E2B's global attention output (k 4096) keep theirs.
    for (auto t : {ggml::Type::Q4_0, ggml::Type::Q8_0, ggml::Type::Q4_K, ggml::Type::Q5_K,
                   ggml::Type::Q6_K}) {
        for (const int k : {6144, 12288}) {
            const auto down = matvec_spec(t, k, 1, MatvecLayout::Split, 1536);
            EXPECT_EQ(down.name,
                      "matvec_" + ggml::type_name(t) + ".k" + std::to_string(k) + ".split.short");
            EXPECT_EQ(spec_constant(down, "THREADS"), 64);
            EXPECT_EQ(spec_constant(down, "ROWS"), 1);
            EXPECT_EQ(spec_constant(down, "UNROLL"), 2);
        }
    }
    EXPECT_EQ(matvec_spec(ggml::Type::Q4_1, 6144, 1, MatvecLayout::Split, 1536).name,
              "matvec_q4_1.k6144.split");
    EXPECT_EQ(matvec_spec(ggml::Type::Q4_K, 6144, 1, MatvecLayout::Ggml, 1536).name,
              "matvec_q4_k.k6144");
    const auto e4b_down = matvec_spec(ggml::Type::Q4_0, 10240, 1, MatvecLayout::Split, 2560);
    EXPECT_EQ(e4b_down.name, "matvec_q4_0.k10240.split");
    EXPECT_EQ(spec_constant(e4b_down, "THREADS"), 32);
    EXPECT_EQ(matvec_spec(ggml::Type::Q4_0, 4096, 1, MatvecLayout::Split, 1536).name,
              "matvec_q4_0.k4096.split");
    const auto q4_0_tall = matvec_spec(ggml::Type::Q4_0, 21504, 1, MatvecLayout::Split, 5376);
    EXPECT_EQ(q4_0_tall.name, "matvec_q4_0.k21504.split.tall");
    EXPECT_EQ(spec_constant(q4_0_tall, "ROWS"), 2);
    for (auto t : {ggml::Type::Q4_K, ggml::Type::Q5_K, ggml::Type::Q6_K}) {
        const auto s = matvec_spec(t, 2560, 1, MatvecLayout::Split, 262144);
        EXPECT_EQ(s.name, "matvec_" + ggml::type_name(t) + ".k2560.split");
        EXPECT_EQ(spec_constant(s, "LAYOUT"), 1);
        EXPECT_EQ(s.entries.back(), "repack_" + ggml::type_name(t));
        const bool q4_k = t == ggml::Type::Q4_K;
        EXPECT_EQ(spec_constant(s, "THREADS"), q4_k ? 64 : 128);
        EXPECT_EQ(spec_constant(s, "ROWS"), q4_k ? 4 : 2);
        EXPECT_EQ(spec_constant(s, "UNROLL"), q4_k ? 1 : 2);
        const auto geglu = gj::gemma4::matvec_launch(s, true);  // 80 units: 96 x 2 (above)
        EXPECT_EQ(geglu.threads, 96u);
        EXPECT_EQ(geglu.rows, 2u);
        const auto tall = matvec_spec(t, 21504, 1, MatvecLayout::Split, 5376);
        EXPECT_EQ(tall.name, "matvec_" + ggml::type_name(t) + ".k21504.split.tall");
        EXPECT_EQ(spec_constant(tall, "THREADS"), 32);
        EXPECT_EQ(spec_constant(tall, "ROWS"), 2);
        const auto long_rows = matvec_spec(t, 21504, 1, MatvecLayout::Split, 4096);
        EXPECT_EQ(long_rows.name, "matvec_" + ggml::type_name(t) + ".k21504.split");
        EXPECT_EQ(spec_constant(long_rows, "ROWS"), 1);
    }
    EXPECT_EQ(matrix_bytes(ggml::Type::Q4_K, MatvecLayout::Split, 10240, 2560), 10240u * 10 * 148);
    EXPECT_EQ(matrix_bytes(ggml::Type::Q4_K, MatvecLayout::Ggml, 10240, 2560), 10240u * 10 * 144);
    EXPECT_EQ(matrix_bytes(ggml::Type::Q5_K, MatvecLayout::Split, 10240, 2560), 10240u * 10 * 180);
    EXPECT_EQ(matrix_bytes(ggml::Type::Q5_K, MatvecLayout::Ggml, 10240, 2560), 10240u * 10 * 176);
    EXPECT_EQ(matrix_bytes(ggml::Type::Q6_K, MatvecLayout::Split, 10240, 2560), 10240u * 10 * 210);
    EXPECT_EQ(gj::gemma4::dequant_f16_spec(ggml::Type::Q5_K, 2560, MatvecLayout::Split).name,
              "dequant_f16.q5_k.k2560.split");
    EXPECT_EQ(gj::gemma4::embed_rows_spec(2560, ggml::Type::Q5_K, 100, MatvecLayout::Split).name,
              "embed_rows.q5_k.n2560.v100.split");
    EXPECT_THROW(gj::gemma4::embed_rows_spec(2560, ggml::Type::Q8_0, 100, MatvecLayout::Split),
                 std::invalid_argument);
    // K-quant experts are split too, each expert's matrices repacked on their own.
    for (auto t : {ggml::Type::Q4_K, ggml::Type::Q5_K, ggml::Type::Q6_K}) {
        const auto experts = gj::gemma4::matvec_moe_spec(t, 2816, 1, MatvecLayout::Split);
        EXPECT_EQ(experts.name, "matvec_" + ggml::type_name(t) + ".k2816.split.moe");
        EXPECT_EQ(experts.entries.back(), "repack_" + ggml::type_name(t));
    }
    EXPECT_EQ(gj::gemma4::repack_entry(ggml::Type::Q6_K), "repack_q6_k");
    EXPECT_EQ(gj::gemma4::repack_entry(ggml::Type::Q5_K), "repack_q5_k");
    EXPECT_THROW(gj::gemma4::repack_entry(ggml::Type::F16), std::invalid_argument);
}

// The 32-block fallbacks of K-quant files (Q4_1, Q5_0, Q5_1) have the split layout too, in the
// files' own bytes, with split Q4_0's decode shapes; their experts are split (the 26B-A4B's
// 704-wide expert down of a Q4_K_M file is Q5_0), without the grouped int8 GEMM.
TEST(KernelPlan, FallbackMatricesTakeTheSplitLayout) {
    using gj::gemma4::matrix_bytes;
    using gj::gemma4::matvec_spec;
    const std::pair<ggml::Type, uint64_t> types[] = {
        {ggml::Type::Q4_1, 20}, {ggml::Type::Q5_0, 22}, {ggml::Type::Q5_1, 24}};
    for (auto [t, block_bytes] : types) {
        const std::string tag = ggml::type_name(t);
        const auto s = matvec_spec(t, 2112, 1, MatvecLayout::Split, 2816);
        EXPECT_EQ(s.name, "matvec_" + tag + ".k2112.split");
        EXPECT_EQ(gj::gemma4::spec_constant(s, "LAYOUT"), 1);
        EXPECT_EQ(s.entries.back(), "repack_" + tag);
        const auto q4 = matvec_spec(ggml::Type::Q4_0, 2112, 1, MatvecLayout::Split, 2816);
        for (const char* c : {"THREADS", "ROWS", "UNROLL", "GEGLU_THREADS", "GEGLU_ROWS"})
            EXPECT_EQ(gj::gemma4::spec_constant(s, c), gj::gemma4::spec_constant(q4, c))
                << tag << " " << c;
        EXPECT_EQ(matrix_bytes(t, MatvecLayout::Split, 2816, 2112), 2816u * 66 * block_bytes);
        EXPECT_EQ(gj::gemma4::repack_entry(t), "repack_" + tag);
        EXPECT_EQ(gj::gemma4::dequant_f16_spec(t, 2112, MatvecLayout::Split).name,
                  "dequant_f16." + tag + ".k2112.split");
        const auto down = gj::gemma4::matvec_moe_spec(t, 704, 1, MatvecLayout::Split);
        EXPECT_EQ(down.name, "matvec_" + tag + ".k704.split.moe");
        EXPECT_EQ(down.entries.back(), "repack_" + tag);
        EXPECT_TRUE(gj::gemma4::moe_experts_split(t, 2816, 704));
        EXPECT_FALSE(gj::gemma4::moe_experts_split(t, 3, 32)) << "3 blocks per expert";
        // The embedding gather reads fallback tables in their GGUF blocks only.
        EXPECT_THROW(gj::gemma4::embed_rows_spec(2816, t, 100, MatvecLayout::Split),
                     std::invalid_argument);
    }
    // K-quant experts are split too: whole super-blocks, and (Q4_K / Q5_K, whose planes are not
    // the file's size) 32 units per expert, so every expert's planes stay 16-byte aligned.
    for (auto t : {ggml::Type::Q4_K, ggml::Type::Q5_K, ggml::Type::Q6_K}) {
        EXPECT_TRUE(gj::gemma4::moe_experts_split(t, 1408, 2816)) << ggml::type_name(t);
        EXPECT_FALSE(gj::gemma4::moe_experts_split(t, 2816, 704)) << "704 % 256";
    }
    EXPECT_FALSE(gj::gemma4::moe_experts_split(ggml::Type::Q4_K, 1, 256)) << "8 units";
    EXPECT_TRUE(gj::gemma4::moe_experts_split(ggml::Type::Q4_K, 4, 256)) << "32 units";
    EXPECT_FALSE(gj::gemma4::moe_experts_split(ggml::Type::Q6_K, 4, 256)) << "32 units";
    EXPECT_TRUE(gj::gemma4::moe_experts_split(ggml::Type::Q6_K, 8, 256)) << "64 units";
    // A whole-model Q5_0 MoE plans split experts, and the grouped int8 GEMMs that read them, but
    // no layer GEMM (its layer matrices take F16 copies).
    const auto plan = build_kernel_plan(Config::preset("26b-a4b"), ggml::Type::Q5_0);
    bool split_experts = false;
    int moe_gemms = 0;
    for (const auto& s : plan) {
        if (s.name.rfind("mmq", 0) == 0) {
            EXPECT_TRUE(s.name.starts_with("mmq.q5_0.") && s.name.ends_with(".moe")) << s.name;
            ++moe_gemms;
        }
        split_experts = split_experts || (s.name.find(".split.moe") != std::string::npos &&
                                          s.name.rfind("matvec_q5_0", 0) == 0);
    }
    EXPECT_TRUE(split_experts);
    EXPECT_EQ(moe_gemms, 2) << "gate|up and down";
}

// GEMMAJIT_MMQ_VARIANT=blas (apply_prefill_flags as a load reads it): Q8_0/Q4_0 layer matrices
// take split dequant_f16 copies, one per input width, with the cuBLAS GeGLU joins; no layer
// GEMM or its split-K norms remain; the LM head keeps its int8 GEMM.
TEST(KernelPlan, QuantBlasVariantPlansF16CopiesOfTheLayers) {
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        const std::string tn = ggml::type_name(t);
        SCOPED_TRACE(tn);
        gj::gemma4::PlanTypes types{t, t, t, t};
        gj::gemma4::apply_prefill_flags(
            types, gj::jit::Flags::parse({{"GEMMAJIT_MMQ_VARIANT", "blas"}}), "sm_90");
        ASSERT_TRUE(types.quant_blas && types.mmq && !types.wgmma);
        const auto names = names_of(build_kernel_plan(Config::preset("e4b"), types));
        for (int k : {256, 2048, 2560, 4096, 10240})
            EXPECT_TRUE(names.count(fmt::format("dequant_f16.{}.k{}.split", tn, k))) << k;
        EXPECT_TRUE(names.count("gelu_mul.p10240"));
        // The norms before attention and the FFN writing the f16 input of those products.
        for (const char* n : {"rmsnorm.n2560.w1.h16", "rmsnorm.n2560.w1.add.n2.h16",
                              "rmsnorm.n2560.w1.add.scale.n2.h16"})
            EXPECT_TRUE(names.count(n)) << n;
        int gemms = 0;
        for (const auto& n : names) {
            if (n.starts_with("gemm_wgmma") || n.starts_with("mmq.")) {
                ++gemms;
                EXPECT_TRUE(n.starts_with(fmt::format("mmq.{}.k2560.", tn))) << n;
            }
            EXPECT_EQ(n.find(".p3"), std::string::npos) << n << ": no split-K GEMM feeds a norm";
        }
        EXPECT_EQ(gemms, 1) << "only the LM head's GEMM";
    }
    // auto: the wgmma GEMM and cuBLAS on copies by chunk length on sm_90 (the GEMM alone there
    // without cuBLAS), mma.sync elsewhere;
    // the blas variant without cuBLAS is an error naming the flag.
    using gj::gemma4::quant_prefill_choice;
    using gj::gemma4::QuantPrefill;
    const auto none = gj::jit::Flags::parse({});
    EXPECT_EQ(quant_prefill_choice(none, "sm_90", true), QuantPrefill::WgmmaBlas);
    // auto on sm_90 plans both: the layers' wgmma GEMMs (short chunks, with their split-K
    // norms) and their F16 copies (long chunks, with the f16-writing norms).
    {
        gj::gemma4::PlanTypes types{ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0,
                                    ggml::Type::Q8_0};
        gj::gemma4::apply_prefill_flags(types, none, "sm_90");
        EXPECT_TRUE(types.wgmma && types.quant_blas);
        const auto names = names_of(build_kernel_plan(Config::preset("e4b"), types));
        for (const char* n : {"dequant_f16.q8_0.k10240.split", "rmsnorm.n2560.w1.add.n2.h16",
                              "rmsnorm.n2560.w1.add.q8.p3"})
            EXPECT_TRUE(names.count(n)) << n;
        EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) {
            return n.starts_with("gemm_wgmma.q8_0.k10240.");
        }));
        EXPECT_EQ(gj::gemma4::copy_min_rows(2560), 256);
        EXPECT_EQ(gj::gemma4::copy_min_rows(5376), 512);
    }
    EXPECT_EQ(quant_prefill_choice(none, "sm_90", false), QuantPrefill::Wgmma);
    EXPECT_EQ(quant_prefill_choice(gj::jit::Flags::parse({{"GEMMAJIT_BLAS", "0"}}), "sm_90", true),
              QuantPrefill::Wgmma);
    EXPECT_EQ(quant_prefill_choice(none, "sm_80", true), QuantPrefill::Mma);
    EXPECT_EQ(quant_prefill_choice(gj::jit::Flags::parse({{"GEMMAJIT_MMQ_VARIANT", "none"}}),
                                   "sm_90", true),
              QuantPrefill::Matvec);
    for (const auto& env :
         {gj::jit::EnvMap{{"GEMMAJIT_MMQ_VARIANT", "blas"}, {"GEMMAJIT_BLAS", "0"}},
          gj::jit::EnvMap{{"GEMMAJIT_MMQ_VARIANT", "blas"}}})
        try {
            quant_prefill_choice(gj::jit::Flags::parse(env), "sm_90",
                                 env.size() == 1 ? false : true);
            ADD_FAILURE() << "the blas variant was accepted without cuBLAS";
        } catch (const gj::gemma4::ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find("GEMMAJIT_MMQ_VARIANT=blas"), std::string::npos);
        }
    EXPECT_THROW(quant_prefill_choice(gj::jit::Flags::parse({{"GEMMAJIT_MMQ_VARIANT", "wgmma"}}),
                                      "sm_80", true),
                 gj::gemma4::ConfigError);
}

TEST(KernelPlan, TinyPresetsArePlannableForEveryWeightType) {
    for (const auto& v : Config::preset_names()) {
        const Config cfg = Config::preset(v);
        for (auto t : gj::test::plan_weight_types()) {
            SCOPED_TRACE(v + " " + ggml::type_name(t));
            const auto names = names_of(build_kernel_plan(cfg, t));
            const bool quant = t == ggml::Type::Q8_0 || t == ggml::Type::Q4_0;
            const std::string mv = quant ? "matvec_" + ggml::type_name(t) + ".k"
                                         : "matvec_f." + ggml::type_name(t) + ".k";
            const std::string sfx = quant ? ".split" : "";
            // A decode spec, or its ".tall" / ".short" form for matrices of many / 1024-2048 rows
            // (matvec_spec).
            auto has_decode = [&](int k) {
                const std::string n = mv + std::to_string(k) + sfx;
                return names.count(n) + names.count(n + ".tall") + names.count(n + ".short") > 0;
            };
            EXPECT_TRUE(has_decode(cfg.d_model));
            for (size_t l = 0; l < cfg.layers.size(); ++l) {
                EXPECT_TRUE(has_decode(cfg.q_dim(int(l))));
                EXPECT_TRUE(has_decode(cfg.layers[l].ffn_dim));
            }
            EXPECT_TRUE(names.count(fmt::format("logits.v{}.k64", cfg.vocab_size)));
            EXPECT_TRUE(names.count(fmt::format("embed_rows.{}.n{}.v{}", ggml::type_name(t),
                                                cfg.d_model, cfg.vocab_size)));
            if (cfg.has_ple()) {
                // The PLE projection (K = 32), a quantized one with the entry making its input.
                EXPECT_TRUE(names.count(mv + std::to_string(cfg.ple_dim) + sfx +
                                        (quant ? ".ple_proj" : "")));
                // The gate's own spec, with the entry that makes its input (d wide).
                const std::string gate = mv + std::to_string(cfg.d_model) + sfx;
                EXPECT_TRUE(names.count(gate + ".ple_gate") + names.count(gate + ".few.ple_gate"));
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
    // Q6_K embeddings (as in llama.cpp's Q4_0 and Q4_K_M files) are read in place.
    types.token_embd = ggml::Type::Q6_K;
    const auto q6 = names_of(build_kernel_plan(Config::preset("e4b"), types));
    EXPECT_TRUE(q6.count("embed_rows.q6_k.n2560.v262144"));
    EXPECT_TRUE(q6.count("matvec_q6_k.k2560.wide"));  // the LM head, 4 rows per block
    types.token_embd = ggml::Type::IQ4_NL;
    try {
        build_kernel_plan(Config::preset("e4b"), types);
        FAIL() << "expected ConfigError";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("token_embd stored as iq4_nl"), std::string::npos)
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

TEST(KernelPlan, UnsupportedWeightTypeIsNamed) {
    try {
        build_kernel_plan(Config::preset("e4b"), ggml::Type::IQ4_NL);
        FAIL() << "expected ConfigError";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("iq4_nl"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("q6_k"), std::string::npos)  // the supported list
            << e.what();
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
    EXPECT_THROW(matvec_spec(ggml::Type::IQ4_NL, 2560), gj::gemma4::ConfigError);
    EXPECT_NO_THROW(matvec_spec(ggml::Type::Q5_0, 2112));
    EXPECT_THROW(matvec_spec(ggml::Type::F16, 2560, 1, MatvecLayout::Split), std::invalid_argument);
    EXPECT_THROW(gj::gemma4::dequant_f16_spec(ggml::Type::Q4_1, 100), std::invalid_argument);
    EXPECT_THROW(matvec_spec(ggml::Type::Q4_K, 2112), std::invalid_argument);  // % 256 != 0
    EXPECT_THROW(matvec_spec(ggml::Type::Q5_K, 2112, 1, MatvecLayout::Split),
                 std::invalid_argument);
    EXPECT_NO_THROW(matvec_spec(ggml::Type::Q6_K, 2560));
    EXPECT_THROW(gj::gemma4::dequant_f16_spec(ggml::Type::F16, 2560), gj::gemma4::ConfigError);
    // Q8_0 / Q4_0 copies are made from the split layout only (GEMMAJIT_MMQ_VARIANT=blas).
    EXPECT_THROW(gj::gemma4::dequant_f16_spec(ggml::Type::Q8_0, 2560), std::invalid_argument);
    EXPECT_EQ(gj::gemma4::dequant_f16_spec(ggml::Type::Q4_0, 2560, MatvecLayout::Split).name,
              "dequant_f16.q4_0.k2560.split");
    EXPECT_THROW(gj::gemma4::dequant_f16_spec(ggml::Type::Q4_K, 2112), std::invalid_argument);
    EXPECT_THROW(matvec_spec(ggml::Type::BF16, 2560, 1, MatvecLayout::Split),
                 std::invalid_argument);
    EXPECT_THROW(gj::gemma4::matvec_f_spec(ggml::Type::Q8_0, 2560), gj::gemma4::ConfigError);
    EXPECT_THROW(gj::gemma4::embed_rows_spec(100, ggml::Type::Q8_0, 1000), std::invalid_argument);
    EXPECT_THROW(gj::gemma4::embed_rows_spec(2560, ggml::Type::IQ4_NL, 1000),
                 gj::gemma4::ConfigError);
    EXPECT_THROW(gj::gemma4::embed_rows_spec(2112, ggml::Type::Q6_K, 1000), std::invalid_argument);
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

// GEMMAJIT_MATVEC_PREFETCH (read by apply_prefill_flags as a load reads it): every single-column
// matvec spec of a plan (the decode matvecs, the MoE router's) carries the L2 prefetch, with the
// flag's default when unset; 0 plans none; batched and grouped expert specs never take it; the
// flag's range is checked.
TEST(KernelPlan, DecodeMatvecsCarryTheL2Prefetch) {
    using gj::gemma4::spec_constant;
    auto has = [](const gj::jit::KernelSpec& s) {
        return std::any_of(s.constants.begin(), s.constants.end(),
                           [](const auto& c) { return c.first == "L2_PREFETCH"; });
    };
    const gj::gemma4::PlanTypes defaults{ggml::Type::Q4_0, ggml::Type::Q4_0, ggml::Type::Q4_0,
                                         ggml::Type::Q4_0};
    EXPECT_EQ(
        defaults.decode_prefetch,
        std::stoi(std::string(gj::jit::find_flag("GEMMAJIT_MATVEC_PREFETCH")->default_value)));
    for (const char* value : {"", "5", "0"}) {
        SCOPED_TRACE(value);
        for (const char* preset : {"e4b", "26b-a4b"}) {
            gj::gemma4::PlanTypes types = defaults;
            gj::gemma4::apply_prefill_flags(
                types,
                *value ? gj::jit::Flags::parse({{"GEMMAJIT_MATVEC_PREFETCH", value}})
                       : gj::jit::Flags::parse({}),
                "sm_90");
            const int want = *value ? std::stoi(value) : defaults.decode_prefetch;
            int single = 0;
            for (const auto& s : build_kernel_plan(Config::preset(preset), types)) {
                if (!s.family.starts_with("matvec_")) continue;
                const bool decode = spec_constant(s, "NCOLS") == 1 && !s.name.ends_with(".moe");
                single += decode;
                if (decode && want > 0) {
                    ASSERT_TRUE(has(s)) << s.name;
                    EXPECT_EQ(spec_constant(s, "L2_PREFETCH"), want) << s.name;
                } else {
                    EXPECT_FALSE(has(s)) << s.name;
                }
            }
            EXPECT_GT(single, 4) << preset;
        }
    }
    EXPECT_THROW(gj::jit::Flags::parse({{"GEMMAJIT_MATVEC_PREFETCH", "17"}}),
                 std::invalid_argument);
    EXPECT_THROW(
        gj::gemma4::with_decode_prefetch(gj::gemma4::matvec_spec(ggml::Type::Q4_0, 2560, 1), -1),
        std::invalid_argument);
}

// A wide row's norm takes the threads whole-model runs chose for its width (rmsnorm.cpp), and a
// PLE gate's block plays every one of them in one trip, for the real E2B and E4B plans.
TEST(KernelPlan, WideNormsTakeTheirMeasuredThreads) {
    using gj::gemma4::rmsnorm_threads_per_row;
    EXPECT_EQ(rmsnorm_threads_per_row(1536), 384);  // E2B: 1 float4 per thread
    EXPECT_EQ(rmsnorm_threads_per_row(2560), 640);  // E4B: 1
    EXPECT_EQ(rmsnorm_threads_per_row(2816), 352);  // 26B-A4B: 2
    EXPECT_EQ(rmsnorm_threads_per_row(3840), 256);  // 12B: 4
    EXPECT_EQ(rmsnorm_threads_per_row(5376), 352);  // 31B: 4
    EXPECT_EQ(rmsnorm_threads_per_row(256), 16);    // a narrow row shares a warp
    for (const char* v : {"e2b", "e4b"}) {
        const Config cfg = Config::preset(v);
        int gates = 0;
        for (const auto& s : build_kernel_plan(cfg, ggml::Type::Q4_0))
            if (s.name.ends_with(".ple_gate")) {
                ++gates;
                const auto tpr = gj::gemma4::spec_constant(s, "NORM_TPR");
                EXPECT_EQ(tpr, rmsnorm_threads_per_row(cfg.d_model)) << s.name;
                EXPECT_GE(gj::gemma4::spec_constant(s, "THREADS"), tpr) << s.name;
            }
        EXPECT_GT(gates, 0) << v;
    }
}
