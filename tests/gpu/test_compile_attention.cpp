// The attention families' spec builders (attn_prep, flash_decode, flash_prefill; the KV cache
// types) and their NVRTC compilation on the CPU at the real model shapes: each kernel must
// compile, contain the instructions it exists for, and spill nothing.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kv_type.h"
#include "jit/grid_dependency.h"
#include "tests/support/kernel_specs.h"

using gj::gemma4::build_kernel_plan;
using gj::gemma4::Config;
using gj::gemma4::KvType;
using gj::gemma4::spec_constant;
using gj::jit::CompiledKernel;
using gj::jit::KernelSpec;
using gj::test::all_specs_of;
using gj::test::compile_and_check;
using gj::test::entry_ptx;
using gj::test::names_of;
namespace ggml = gj::ggml;

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

// The wgmma prefill attention: which layers it fits, when GEMMAJIT_FLASH_WGMMA=auto takes it (row
// blocks for about every SM), and the plans that list it (sm_90 targets, unless off).
TEST(KernelPlan, FlashPrefillWgmmaChoice) {
    using gj::gemma4::flash_prefill_wgmma_fits;
    using gj::gemma4::flash_prefill_wgmma_pays;
    using gj::gemma4::flash_prefill_wgmma_spec;
    using gj::gemma4::flash_prefill_wgmma_specs;
    EXPECT_TRUE(flash_prefill_wgmma_fits(256, KvType::F16));
    EXPECT_TRUE(flash_prefill_wgmma_fits(64, KvType::BF16));
    EXPECT_TRUE(flash_prefill_wgmma_fits(512, KvType::F16));
    EXPECT_FALSE(flash_prefill_wgmma_fits(32, KvType::F16));
    EXPECT_FALSE(flash_prefill_wgmma_fits(256, KvType::Q8_0));
    EXPECT_THROW(flash_prefill_wgmma_spec(512, 8, 4, 0, KvType::F16, {1, 2}),
                 std::invalid_argument);  // head dim 512 takes two consumers (dim halves)
    EXPECT_THROW(flash_prefill_wgmma_spec(256, 2, 16, 1024, KvType::Q8_0, {2, 2}),
                 std::invalid_argument);
    EXPECT_THROW(flash_prefill_wgmma_spec(256, 2, 16, 1024, KvType::F16, {3, 2}),
                 std::invalid_argument);
    const Config b31 = Config::preset("31b"), e4b = Config::preset("e4b"),
                 b12 = Config::preset("12b");
    const auto f31 = flash_prefill_wgmma_specs(b31, 0, KvType::F16);
    ASSERT_EQ(f31.size(), 2u);
    const KernelSpec& s31 = f31[0];
    EXPECT_EQ(s31.name, "flash_prefill_wgmma.hd256.g2.kv16.w1024.f16.wg2s2");
    EXPECT_EQ(f31[1].name, "flash_prefill_wgmma.hd256.g2.kv16.w1024.f16.wg1s3");
    EXPECT_EQ(s31.arch_specific, 90);
    EXPECT_EQ(spec_constant(s31, "BLOCK_ROWS"), 128);
    EXPECT_EQ(spec_constant(s31, "THREADS"), 384);  // a producer warpgroup and two consumers
    EXPECT_EQ(spec_constant(f31[1], "THREADS"), 256);
    EXPECT_EQ(spec_constant(s31, "SPLITS"), 1);
    auto choice = [](const std::vector<KernelSpec>& forms, int T, bool always) -> std::string {
        std::vector<const KernelSpec*> p;
        for (const auto& f : forms) p.push_back(&f);
        const KernelSpec* c = gj::gemma4::flash_prefill_wgmma_choice(p, T, always);
        return c ? c->name : "";
    };
    // 31B: 512 tokens x 2 heads per KV head / 128 rows x 16 KV heads = 128 blocks of 2 x 2.
    EXPECT_TRUE(flash_prefill_wgmma_pays(s31, 512));
    EXPECT_EQ(choice(f31, 512, false), s31.name);
    EXPECT_EQ(choice(f31, 64, false), "");  // 16 blocks of 1 x 3
    EXPECT_EQ(choice(f31, 64, true), f31[1].name);
    // E4B: 32 blocks of 2 x 2 at 512 tokens, 64 of 1 x 3: the mma.sync kernel; 2 x 2 at 2048.
    const auto f4 = flash_prefill_wgmma_specs(e4b, 0, KvType::F16);
    EXPECT_EQ(choice(f4, 512, false), "");
    EXPECT_EQ(choice(f4, 2048, false), f4[0].name);
    // 12B: 64 blocks of 2 x 2 at 512 tokens, 128 of 1 x 3.
    const auto f12 = flash_prefill_wgmma_specs(b12, 0, KvType::BF16);
    EXPECT_EQ(choice(f12, 512, false), f12[1].name);
    EXPECT_EQ(choice(f12, 1024, false), f12[0].name);
    // Head dim 512: one form, two consumers on the same 64 rows (halves of the head dims), 32-key
    // tiles; the 31B's global layer (group 8, 4 KV heads) has 256 row blocks at 512 tokens.
    const auto g31 = flash_prefill_wgmma_specs(b31, 5, KvType::F16);
    ASSERT_EQ(g31.size(), 1u);
    EXPECT_EQ(g31[0].name, "flash_prefill_wgmma.hd512.g8.kv4.w0.f16.wg2s2");
    EXPECT_EQ(spec_constant(g31[0], "BLOCK_ROWS"), 64);
    EXPECT_EQ(spec_constant(g31[0], "DSPLIT"), 2);
    EXPECT_EQ(spec_constant(g31[0], "KT"), 32);
    EXPECT_EQ(choice(g31, 512, false), g31[0].name);
    EXPECT_EQ(choice(flash_prefill_wgmma_specs(e4b, 5, KvType::F16), 512, false), "");
    // Plans: on sm_90 beside the mma.sync kernel of each head dim 256 layer; none on sm_80 or off.
    auto plan_for = [&](const std::string& arch, const char* flag) {
        gj::gemma4::PlanTypes types{gj::ggml::Type::Q4_0, gj::ggml::Type::Q4_0,
                                    gj::ggml::Type::Q4_0, gj::ggml::Type::Q4_0};
        gj::gemma4::apply_prefill_flags(
            types, gj::jit::Flags::parse({{"GEMMAJIT_FLASH_WGMMA", flag}}), arch);
        return names_of(build_kernel_plan(b31, types));
    };
    const auto on90 = plan_for("sm_90", "auto");
    EXPECT_TRUE(on90.count(s31.name));
    EXPECT_TRUE(on90.count(f31[1].name));
    EXPECT_TRUE(on90.count(gj::gemma4::flash_prefill_spec(b31, 0).name));
    EXPECT_FALSE(plan_for("sm_80", "auto").count(s31.name));
    EXPECT_FALSE(plan_for("sm_90", "off").count(s31.name));
    // `on` is a request: refused by name on a target without wgmma.
    try {
        plan_for("sm_80", "on");
        ADD_FAILURE() << "GEMMAJIT_FLASH_WGMMA=on planned for sm_80";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("GEMMAJIT_FLASH_WGMMA=on"), std::string::npos)
            << e.what();
    }
    // No form for a layer the kernel does not take (the tiny presets' head dim 32, a q8_0 cache).
    const Config tiny = Config::preset("tiny");
    EXPECT_TRUE(flash_prefill_wgmma_specs(tiny, 0, KvType::F16).empty());
    EXPECT_TRUE(flash_prefill_wgmma_specs(b31, 0, KvType::Q8_0).empty());
}

TEST(KernelPlan, FlashDecodeSplits) {
    using gj::gemma4::flash_decode_spec;
    using gj::gemma4::flash_decode_splits;
    const auto global = flash_decode_spec(512, 4, 2, 0, KvType::F16);
    const auto sliding = flash_decode_spec(256, 4, 2, 512, KvType::F16);
    // About two blocks per SM at T = 1 (132 SMs, 2 KV heads), whatever the context length ...
    EXPECT_EQ(flash_decode_splits(global, 131072, 1, 132), 132);
    EXPECT_EQ(flash_decode_splits(global, 131072, 2, 132), 66);
    // ... but never more than CHUNK-sized pieces of what a query can see (the window).
    EXPECT_EQ(gj::gemma4::spec_constant(global, "CHUNK"), 16);
    EXPECT_EQ(flash_decode_splits(global, 100, 1, 132), 7);  // ceil(100 / 16)
    EXPECT_EQ(flash_decode_splits(sliding, 131072, 1, 132), 512 / 32);
    // A prefill batch fills the GPU with tokens alone.
    EXPECT_EQ(flash_decode_splits(global, 131072, 512, 132), 1);
    EXPECT_EQ(flash_decode_splits(global, 0, 0, 0), 1);
}

TEST(KernelTemplates, AttentionSpecsCompileWithTheirInstructionsAndNoSpills) {
    compile_and_check(
        all_specs_of({"attn_prep", "flash_decode", "flash_prefill"}),
        [](const CompiledKernel& c, const std::string& arch) {
            const auto& s = c.spec;
            if (s.family == "attn_prep") {
                const bool has_kv = spec_constant(s, "HAS_KV") == 1;
                const auto kv = spec_constant(s, "KV_TYPE");
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
                // (The planes' addresses come from the sequence table, so the compiler may
                // store through generic addresses.)
                const bool stores_bytes = body.find("st.global.u8") != std::string::npos ||
                                          body.find("st.u8") != std::string::npos;
                EXPECT_EQ(stores_bytes, has_kv && kv == 2);
                if (has_kv && kv == 2) {
                    EXPECT_NE(body.find("cvt.rn.f16.f32"), std::string::npos);
                    EXPECT_NE(body.find("div.rn.f32"), std::string::npos);
                }
            } else if (s.family == "flash_decode") {
                const bool bf16 = spec_constant(s, "KV_TYPE") == 1;
                const bool q8 = spec_constant(s, "KV_TYPE") == 2;
                const auto hd = spec_constant(s, "HEAD_DIM");
                const auto decode = entry_ptx(c.ptx, "flash_decode");
                for (const char* want :
                     {"cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group",
                      "ex2.approx.ftz.f32", "shfl.sync.bfly", "shfl.sync.idx", "bar.sync"})
                    EXPECT_NE(decode.find(want), std::string::npos)
                        << "flash_decode lacks " << want;
                if (spec_constant(s, "MMA") == 1) {
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
                const bool bf16 = spec_constant(s, "KV_TYPE") == 1;
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
                const bool clusters = spec_constant(s, "SPLITS") > 1 && arch == "sm_90";
                for (const char* want :
                     {".reqnctapercluster", "mapa.shared::cluster", "ld.shared::cluster.v4.f32",
                      "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire"})
                    EXPECT_EQ(body.find(want) != std::string::npos, clusters) << want;
            }
        });
}

// The wgmma prefill attention (sm_90a only) at every model's layer shapes it takes (head dim 256,
// f16 and bf16 caches), the tilings and head dims the GPU test runs: warpgroup tensor-core
// products (S from two shared-memory operands, P V with P in registers and V transposed), the
// async-proxy fence, the producer / consumer register split and mbarriers, no local memory and no
// serialized wgmma; another target is refused by name.
TEST(KernelTemplates, FlashPrefillWgmmaCompilesForSm90aOnly) {
    using gj::gemma4::FlashPrefillWgmmaTiling;
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto add = [&](const KernelSpec& s) {
        if (seen.insert(s.name).second) specs.push_back(s);
    };
    for (const char* v : {"e2b", "e4b", "12b", "26b-a4b", "31b"}) {
        const Config cfg = Config::preset(v);
        for (int l = 0; l < cfg.n_layers; ++l)
            for (KvType kv : {KvType::F16, KvType::BF16}) {
                const bool fits = gj::gemma4::flash_prefill_wgmma_fits(cfg.layers[l].head_dim, kv);
                EXPECT_TRUE(fits) << v << " layer " << l;  // head dims 256 and 512
                if (fits)
                    for (const auto& spec : gj::gemma4::flash_prefill_wgmma_specs(cfg, l, kv))
                        add(spec);
            }
    }
    for (int hd : {64, 128, 256, 512})
        for (KvType kv : {KvType::F16, KvType::BF16})
            for (int wg : {1, 2})
                for (int stages : {2, 3}) {
                    // Head dim 256 with 2 x 3: 257 KiB of shared memory; head dim 512 takes two
                    // consumers and two stages.
                    if ((hd == 256 && wg == 2 && stages == 3) ||
                        (hd == 512 && (wg != 2 || stages != 2))) {
                        EXPECT_THROW(
                            gj::gemma4::flash_prefill_wgmma_spec(hd, 3, 2, 100, kv, {wg, stages}),
                            std::invalid_argument);
                        continue;
                    }
                    add(gj::gemma4::flash_prefill_wgmma_spec(hd, 3, 2, 100, kv, {wg, stages}));
                }
    for (const auto& c : gj::test::compile_sm90a_only(specs)) {
        SCOPED_TRACE(c.spec.name);
        const std::string t = spec_constant(c.spec, "KV_TYPE") == 1 ? "bf16" : "f16";
        // S is m64n<KT>; P V m64n<the consumer's head dims> (half of 512).
        const std::string kt = std::to_string(spec_constant(c.spec, "KT"));
        const std::string hd =
            std::to_string(spec_constant(c.spec, "HEAD_DIM") / spec_constant(c.spec, "DSPLIT"));
        const auto body = entry_ptx(c.ptx, "flash_prefill");
        for (const std::string& want :
             {"wgmma.mma_async.sync.aligned.m64n" + kt + "k16.f32." + t + "." + t,
              "wgmma.mma_async.sync.aligned.m64n" + hd + "k16.f32." + t + "." + t,
              std::string("wgmma.fence.sync.aligned"),
              std::string("wgmma.commit_group.sync.aligned"),
              std::string("wgmma.wait_group.sync.aligned"),
              std::string("fence.proxy.async.shared::cta"),
              std::string("cp.async.cg.shared.global"), std::string("ex2.approx"),
              std::string("setmaxnreg.dec.sync.aligned.u32"),
              std::string("setmaxnreg.inc.sync.aligned.u32"),
              std::string("mbarrier.try_wait.parity"), std::string("mbarrier.arrive")})
            EXPECT_NE(body.find(want), std::string::npos) << "lacks " << want;
        EXPECT_EQ(body.find(".local"), std::string::npos) << "uses local memory";
        EXPECT_EQ(c.resources.spill_store_bytes, 0);
        EXPECT_EQ(c.resources.stack_bytes, 0);
        EXPECT_TRUE(gj::jit::ptx_entry_waits_on_grid(c.ptx, "flash_prefill"));
        std::printf("[ regs     ] %s: %d\n", c.spec.name.c_str(), c.resources.registers);
    }
}
