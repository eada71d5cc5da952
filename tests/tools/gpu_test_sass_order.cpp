// The SASS of the decode matvecs on sm_90 (through `gemmajit sass`, which needs the CUDA toolkit's
// cuobjdump or nvdisasm: present on the GPU machines, not in CI, hence the gpu label): every
// single-column matvec entry issues its first weight load before its grid dependency wait
// (ACQBULK), so a block launched as a programmatic dependent streams weights while the kernel
// before it finishes. ptxas is free to schedule the wait first, and did for every entry until the
// L2 prefetch (GEMMAJIT_MATVEC_PREFETCH) came between them (docs/PERFORMANCE.md, 2026-11-27).
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_env.h"

namespace {

using gj::test::run_command;

std::string cli(const gj::test::ScratchDir& cache, const std::string& args,
                const std::string& env = "") {
    return "env -u XDG_CACHE_HOME GEMMAJIT_CACHE_DIR='" + cache.path().string() + "' " + env + " " +
           gj::test::gemmajit_exe() + " " + args;
}

bool have_disassembler() {
    return run_command(
               "command -v cuobjdump || command -v nvdisasm || "
               "test -x /usr/local/cuda/bin/cuobjdump")
               .exit_code == 0;
}

// The spec names `gemmajit kernels` lists for a preset that `keep` accepts.
template <class Keep>
std::vector<std::string> plan_specs(const gj::test::ScratchDir& cache, const std::string& model,
                                    const std::string& env, Keep&& keep) {
    const auto r = run_command(cli(cache, "kernels " + model + " --arch sm_90", env));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    std::vector<std::string> specs;
    std::istringstream in(r.out);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream cols(line);
        std::string prio, name;
        cols >> prio >> name;
        if (keep(name)) specs.push_back(name);
    }
    return specs;
}

// The single-column (decode) matvec specs of a preset.
std::vector<std::string> decode_matvec_specs(const gj::test::ScratchDir& cache,
                                             const std::string& model, const std::string& env) {
    static const std::regex batched(R"(\.b[0-9])");
    return plan_specs(cache, model, env, [](const std::string& name) {
        return name.starts_with("matvec_") && !std::regex_search(name, batched) &&
               !name.ends_with(".moe");  // not the batched (".b8") or the grouped expert forms
    });
}

// Per function of a spec's SASS, before and after the grid dependency wait (ACQBULK; wait_line 0
// when there is none): its global loads of any width, its 16-byte ones (LDG.E.128: the float4
// rows of the norms and attn_prep) and its double-precision instructions.
struct WaitSplit {
    std::string fn;
    size_t wait_line = 0;
    int any_loads_before = 0, any_loads_after = 0;
    int loads_before = 0, loads_after = 0, doubles_before = 0;
};
std::vector<WaitSplit> split_at_wait(const std::string& sass) {
    std::vector<WaitSplit> out;
    std::istringstream in(sass);
    std::string line;
    size_t n = 0;
    while (std::getline(in, line)) {
        ++n;
        if (const size_t f = line.find("Function : "); f != std::string::npos) {
            out.push_back({line.substr(f + 11)});
        } else if (!out.empty()) {
            WaitSplit& w = out.back();
            static const std::regex fp64(R"( D(FMA|MUL|ADD))");
            if (!w.wait_line && line.find("ACQBULK") != std::string::npos) w.wait_line = n;
            const bool load = line.find(" LDG.") != std::string::npos;
            const bool load128 = line.find(" LDG.E.128") != std::string::npos;
            (w.wait_line ? w.any_loads_after : w.any_loads_before) += load;
            (w.wait_line ? w.loads_after : w.loads_before) += load128;
            w.doubles_before += !w.wait_line && std::regex_search(line, fp64);
        }
    }
    return out;
}

}  // namespace

TEST(SassOrder, DecodeMatvecsLoadWeightsBeforeTheirGridWait) {
    if (!have_disassembler()) GTEST_SKIP() << "no cuobjdump or nvdisasm (CUDA toolkit) here";
    gj::test::ScratchDir cache("sass-order");
    struct Case {
        const char* model;
        const char* env;
    };
    // Split Q4_0 (with its PLE entries), the K-quant split planes and Q6_K of a Q4_K_M mix, GGUF
    // Q8_0 blocks, float weights.
    const Case cases[] = {{"--variant e4b --wtype q4_0", ""},
                          {"--variant e4b --wtype q4_k_m", ""},
                          {"--variant e2b --wtype q8_0", "GEMMAJIT_REPACK=0"},
                          {"--variant e2b --wtype bf16", ""}};
    int checked = 0;
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(c.model) + " " + c.env);
        const auto specs = decode_matvec_specs(cache, c.model, c.env);
        EXPECT_GE(specs.size(), 3u);
        for (const auto& spec : specs) {
            const auto r = run_command(
                cli(cache, "sass " + std::string(c.model) + " --arch sm_90 " + spec, c.env));
            ASSERT_EQ(r.exit_code, 0) << spec << "\n" << r.out;
            for (const WaitSplit& w : split_at_wait(r.out)) {
                if (w.fn.starts_with("repack_")) continue;
                EXPECT_GT(w.wait_line, 0u) << spec << " " << w.fn << ": no grid wait";
                EXPECT_GT(w.any_loads_before + w.any_loads_after, 0)
                    << spec << " " << w.fn << ": no global load";
                EXPECT_GT(w.any_loads_before, 0)
                    << spec << " " << w.fn << ": the grid wait comes before the first weight load";
                ++checked;
            }
        }
    }
    EXPECT_GT(checked, 20) << "entries checked";
}

// What the chain's small kernels can do before their grid wait is done there
// (docs/PERFORMANCE.md, 2026-11-28): attn_prep makes its RoPE table (a double pow per pair) and
// loads its norm weights (as many float4 as the row it reads after the wait); a residual norm
// loads its weights and the residual stream (VPT float4 each), leaving only the product just made
// (x: VPT float4 per plane) for after the wait. Without the bulk prefetch between them, ptxas put
// the wait first in attn_prep and in the 2560-wide norms.
TEST(SassOrder, AttnPrepAndNormsDoTheirIndependentWorkBeforeTheirGridWait) {
    if (!have_disassembler()) GTEST_SKIP() << "no cuobjdump or nvdisasm (CUDA toolkit) here";
    gj::test::ScratchDir cache("sass-order-chain");
    int checked = 0;
    for (const char* model : {"--variant 31b --wtype q4_0", "--variant e4b --wtype q8_0"}) {
        SCOPED_TRACE(model);
        const auto specs = plan_specs(cache, model, "", [](const std::string& name) {
            return name.starts_with("attn_prep.") ||
                   (name.starts_with("rmsnorm.") && name.find(".add") != std::string::npos);
        });
        EXPECT_GE(specs.size(), 3u);
        for (const auto& spec : specs) {
            const auto r =
                run_command(cli(cache, "sass " + std::string(model) + " --arch sm_90 " + spec));
            ASSERT_EQ(r.exit_code, 0) << spec << "\n" << r.out;
            for (const WaitSplit& w : split_at_wait(r.out)) {
                SCOPED_TRACE(spec + " " + w.fn);
                ASSERT_GT(w.wait_line, 0u) << "no grid wait";
                EXPECT_GT(w.loads_after, 0);
                if (spec.starts_with("attn_prep.")) {
                    EXPECT_GT(w.doubles_before, 0) << "the RoPE frequencies come after the wait";
                    EXPECT_GE(w.loads_before, w.loads_after)
                        << "the norm weights come after the wait: " << w.loads_before
                        << " float4 loads before it, " << w.loads_after << " after";
                } else {
                    // w (and w2 for .n2) and the residual before, x's planes (.p<parts>) after.
                    // (".n2" as a whole component: "rmsnorm.n2560" is a width, not a second
                    // weight.)
                    static const std::regex two_weights(R"(\.n2(\.|$))");
                    const int inputs_before = std::regex_search(spec, two_weights) ? 3 : 2;
                    std::smatch m;
                    const int parts = std::regex_search(spec, m, std::regex(R"(\.p([0-9]))"))
                                          ? std::stoi(m[1])
                                          : 1;
                    EXPECT_GE(w.loads_before * parts, inputs_before * w.loads_after)
                        << w.loads_before << " float4 loads before the wait, " << w.loads_after
                        << " after";
                }
                ++checked;
            }
        }
    }
    EXPECT_GE(checked, 6) << "functions checked";
}
