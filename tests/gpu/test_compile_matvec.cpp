// NVRTC compilation, on the CPU, of the matvec specs (matvec_q8_0, matvec_q4_0, the fallback
// matvec_q4_1 / _q5_0 / _q5_1, the K-quant matvec_q4_k / _q5_k / _q6_k, matvec_f) of every preset's
// plan and the forms no plan uses by default, and of the K-quant dequant_f16 specs: each must
// compile, stream its weights with the loads it exists for, and spill nothing.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_specs.h"

using gj::gemma4::matvec_push_spec;
using gj::gemma4::spec_constant;
using gj::jit::CompiledKernel;
using gj::test::all_specs_of;
using gj::test::compile_and_check;
using gj::test::entry_ptx;
using gj::test::occurrences;

TEST(KernelTemplates, MatvecSpecsCompileWithTheirInstructionsAndNoSpills) {
    compile_and_check(
        all_specs_of({"matvec_q8_0", "matvec_q4_0", "matvec_q4_1", "matvec_q5_0", "matvec_q5_1",
                      "matvec_q4_k", "matvec_q5_k", "matvec_q6_k", "matvec_f"}),
        [](const CompiledKernel& c, const std::string& arch) {
            const auto& s = c.spec;
            // The decode L2 prefetch (a plan's single-column specs, L2_PREFETCH): on sm_90 every
            // entry but the repack asks L2 after its first weight load and before its grid wait,
            // the place that keeps ptxas from scheduling the wait ahead of the loads; sm_80 has
            // no bulk prefetch (and no grid wait to order against).
            const bool prefetch =
                std::any_of(s.constants.begin(), s.constants.end(),
                            [](const auto& kv) { return kv.first == "L2_PREFETCH"; });
            for (const auto& e : s.entries) {
                if (e.starts_with("repack_")) continue;
                const auto body = entry_ptx(c.ptx, e);
                const size_t pf = body.find("cp.async.bulk.prefetch.L2.global");
                if (!prefetch || arch == "sm_80") {
                    EXPECT_EQ(pf, std::string::npos) << e;
                    continue;
                }
                const size_t load = body.find("ld.global"), wait = body.find("griddepcontrol.wait");
                ASSERT_NE(pf, std::string::npos) << e;
                EXPECT_LT(load, pf) << e << ": the prefetch follows the first weight load";
                EXPECT_LT(pf, wait) << e << ": and comes before the grid wait";
            }
            // The plain and the GeGLU entry (the grouped expert forms of a ".moe" spec read each
            // group's expert and columns first).
            const bool moe = s.name.ends_with(".moe");
            // A mixed multi form (MULTI_V: an _M mix's Q|K|V with a Q6_K V) holds its multi
            // entry alone, checked with every entry above and below.
            const bool multi_only = s.entries.size() == 1 && spec_constant(s, "MULTI_V") == 1;
            const std::string plain = s.entries.at(0),
                              geglu = multi_only ? plain : s.entries.at(moe ? 1 : 2);
            if (moe) {
                ASSERT_EQ(spec_constant(s, "MOE"), 1) << s.name;
                for (const auto& e : s.entries) {
                    if (e.starts_with("repack_")) continue;  // the split layout's load-time repack
                    const auto body = entry_ptx(c.ptx, e);
                    EXPECT_NE(body.find("ld.global.nc.v4.s32"), std::string::npos)
                        << e << ": the group {expert, first, count} is one 16-byte load";
                    EXPECT_EQ(body.find(".local"), std::string::npos) << e << " uses local memory";
                }
            }
            if (s.family == "matvec_f") {
                const auto wtype = spec_constant(s, "WTYPE");
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
                EXPECT_EQ(occurrences(entry_ptx(c.ptx, geglu), ld),
                          2 * occurrences(entry_ptx(c.ptx, plain), ld));
            } else if (s.family.starts_with("matvec_")) {
                for (const auto& e : s.entries) {
                    if (e.starts_with("repack_")) continue;
                    const auto body = entry_ptx(c.ptx, e);
                    EXPECT_NE(body.find("dp4a.s32.s32"), std::string::npos) << e;
                    EXPECT_NE(body.find("shfl.sync.bfly"), std::string::npos) << e;
                    // Q4_K / Q5_K super-blocks are 16-byte multiples: their nibbles stream in
                    // 16-byte loads like the split layout; Q6_K's 210-byte blocks join words.
                    const bool streams = spec_constant(s, "LAYOUT") == 1 ||
                                         s.family == "matvec_q4_k" || s.family == "matvec_q5_k";
                    if (streams) {
                        EXPECT_NE(body.find("ld.global.nc.L1::no_allocate.v4.u32"),
                                  std::string::npos)
                            << e << ": the weights must stream in 16-byte loads";
                    } else if (s.family == "matvec_q8_0" || s.family == "matvec_q4_0" ||
                               s.family == "matvec_q6_k") {
                        EXPECT_NE(body.find("shf.r."), std::string::npos)
                            << e << ": ggml layout joins unaligned words with funnel shifts";
                    }
                }
                // The GeGLU entry reads two matrices per unit: twice the dp4a of the plain one,
                // per row and unit of a batch where it takes its own launch shape (GEGLU_*:
                // split Q4_0 and Q8_0, units of 32 and 16 weights).
                int64_t num = 2, den = 1;
                const bool own =
                    std::any_of(s.constants.begin(), s.constants.end(),
                                [](const auto& kv) { return kv.first == "GEGLU_ROWS"; });
                if (own) {
                    const int64_t units =
                        spec_constant(s, "K") / (s.family == "matvec_q8_0" ? 16 : 32);
                    auto dots = [&](const char* t, const char* r, const char* u) {
                        const int64_t iters =
                            (units + spec_constant(s, t) - 1) / spec_constant(s, t);
                        return spec_constant(s, r) * std::min(spec_constant(s, u), iters);
                    };
                    num *= dots("GEGLU_THREADS", "GEGLU_ROWS", "GEGLU_UNROLL");
                    den = dots("THREADS", "ROWS", "UNROLL");
                }
                if (!multi_only) {
                    EXPECT_EQ(occurrences(entry_ptx(c.ptx, geglu), "dp4a") * den,
                              num * occurrences(entry_ptx(c.ptx, plain), "dp4a"));
                }
            }
        });
}

TEST(KernelTemplates, DequantF16SpecsCompile) {
    const auto specs = all_specs_of({"dequant_f16"});
    ASSERT_GE(specs.size(), 10u) << "the K-quant plans' dequant_f16 specs";
    compile_and_check(specs, [](const CompiledKernel& c, const std::string& /*arch*/) {
        const auto body = entry_ptx(c.ptx, "dequant_f16");
        EXPECT_NE(body.find("cvt.rn.f16x2.f32"), std::string::npos);
        // The CPU's products and difference, unfused, for bit-equal values.
        EXPECT_EQ(body.find("fma.rn.f32"), std::string::npos);
    });
}

// The push forms of the row-parallel decode products (matvec_push_spec, GEMMAJIT_TP_PUSH): one
// single-column dense spec of every family, layout and float type the plans hold (a tall one where
// there is one, as the FFN down of a split 31B is), over 2 ranks and over 8. The entry stores the
// product once per rank and is free of spills like its plain form.
TEST(KernelTemplates, MatvecPushSpecsCompileAndStoreOncePerRank) {
    std::map<std::string, gj::jit::KernelSpec> one;  // family|layout|wtype -> spec
    for (const auto& s :
         all_specs_of({"matvec_q8_0", "matvec_q4_0", "matvec_q4_1", "matvec_q5_0", "matvec_q5_1",
                       "matvec_q4_k", "matvec_q5_k", "matvec_q6_k", "matvec_f"})) {
        const bool other = std::any_of(s.constants.begin(), s.constants.end(), [](const auto& kv) {
            return kv.first == "MOE" || kv.first == "PLE_IN";
        });
        if (other || spec_constant(s, "NCOLS") != 1) continue;
        const bool split = s.family != "matvec_f" && spec_constant(s, "LAYOUT") == 1;
        const auto wtype = s.family == "matvec_f" ? spec_constant(s, "WTYPE") : 0;
        const std::string key = fmt::format("{}|{}|{}", s.family, split, wtype);
        auto [it, fresh] = one.try_emplace(key, s);
        if (!fresh && s.name.ends_with(".tall") && !it->second.name.ends_with(".tall"))
            it->second = s;
    }
    ASSERT_GE(one.size(), 12u);
    std::vector<gj::jit::KernelSpec> specs;
    for (const auto& [key, s] : one) {
        specs.push_back(matvec_push_spec(s, 2));
        if (s.family == "matvec_q4_0" || s.family == "matvec_f")
            specs.push_back(matvec_push_spec(s, 8));
    }
    compile_and_check(specs, [](const CompiledKernel& c, const std::string& /*arch*/) {
        const auto& s = c.spec;
        ASSERT_EQ(s.entries, std::vector<std::string>{s.family + "_push"});
        const auto body = entry_ptx(c.ptx, s.entries[0]);
        ASSERT_FALSE(body.empty()) << s.name;
        const size_t ranks = size_t(spec_constant(s, "PUSH"));
        // Each row stored once per rank; no fence, no atomics (the post-norms' barrier orders).
        EXPECT_EQ(occurrences(body, "st.global.f32"), ranks) << s.name;
        EXPECT_EQ(body.find("membar"), std::string::npos) << s.name;
        EXPECT_EQ(body.find("atom."), std::string::npos) << s.name;
        EXPECT_EQ(c.ptx.find(".entry " + s.family + "_add"), std::string::npos)
            << s.name << ": the push module holds the push entry alone";
    });
    // Not for a MoE, PLE or several-column spec, nor one rank.
    const auto& any = one.begin()->second;
    EXPECT_THROW(matvec_push_spec(any, 1), std::invalid_argument);
    auto batched = any;
    for (auto& [n, v] : batched.constants)
        if (n == "NCOLS") v = 8;
    EXPECT_THROW(matvec_push_spec(batched, 2), std::invalid_argument);
}
