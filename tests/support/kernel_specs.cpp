#include "tests/support/kernel_specs.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/embed_rows.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/mmq.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/shard_plan.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/quant_mix.h"
#include "jit/env_flags.h"
#include "jit/grid_dependency.h"
#include "tests/support/test_env.h"

namespace gj::test {

namespace {

using gemma4::build_kernel_plan;
using gemma4::Config;
using gemma4::KvType;
using gemma4::MatvecLayout;
using jit::KernelSpec;

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

}  // namespace

jit::KernelSpec chain_probe_spec() {
    KernelSpec s;
    s.family = "chain_probe";
    s.name = "chain_probe.t256";
    s.constants = {{"THREADS", 256}};
    s.entries = {"probe_step", "probe_persistent"};
    return s;
}

jit::KernelSpec stream_probe_spec(int k, int threads, int stages) {
    KernelSpec s;
    s.family = "stream_probe";
    s.name = fmt::format("stream_probe.k{}.t{}.s{}", k, threads, stages);
    // The stages, h's Q8_1 form and the two reductions' partials (stream_probe.cu); the loader
    // opts into more than 48 KiB for the entries from SMEM.
    const int warps = threads / 32;
    const int smem = stages * 2 * warps * (k / 2 + k / 16) + k + k / 32 * 8 + 2 * warps * 4;
    s.constants = {{"K", k}, {"THREADS", threads}, {"STAGES", stages}, {"SMEM", smem}};
    s.entries = {"stream_geglu_q8", "stream_geglu_norm", "geglu_rows32_q8"};
    return s;
}

jit::KernelSpec ple_cluster_probe_spec(int d, int cluster) {
    KernelSpec s;
    s.family = "ple_cluster_probe";
    s.name = fmt::format("ple_cluster_probe.d{}.c{}", d, cluster);
    constexpr int p = 256;
    // A block's rows of the split Q4_0 projection in shared memory.
    s.constants = {{"D", d},
                   {"P", p},
                   {"CLUSTER", cluster},
                   {"THREADS", 256},
                   {"SMEM", d / cluster * (p / 2 + p / 16)}};
    s.entries = {"ple_proj_norm"};
    return s;
}

jit::KernelSpec ffn_probe_spec(int k, int c, int depth, bool gu_smem, int cluster) {
    KernelSpec s;
    s.family = "ffn_probe";
    s.name = (gu_smem ? fmt::format("ffn_probe.k{}.c{}.smem", k, c)
                      : fmt::format("ffn_probe.k{}.c{}.d{}", k, c, depth)) +
             (cluster > 1 ? fmt::format(".x{}", cluster) : "");
    // The block's down slice (and with GU_SMEM its gate|up rows, with a cluster its partial
    // product) in shared memory.
    const int smem = c / 32 * k * 18 + (gu_smem ? c * k / 8 * 9 : 0) + (cluster > 1 ? k * 4 : 0);
    s.constants = {{"K", k},
                   {"C", c},
                   {"THREADS", 256},
                   {"DEPTH", gu_smem ? 1 : depth},
                   {"GU_SMEM", gu_smem ? 1 : 0},
                   {"CLUSTER", cluster},
                   {"SMEM", smem}};
    s.entries = {"ffn_geglu_down", "ffn_geglu_down_noadd"};
    return s;
}

jit::KernelSpec attn_fused_probe_spec(int k, int group, int n_kv_heads, int window, int cluster,
                                      bool raw_in) {
    KernelSpec s;
    s.family = "attn_fused_probe";
    s.name = fmt::format("attn_fused_probe.k{}.g{}.kv{}.w{}.c{}{}", k, group, n_kv_heads, window,
                         cluster, raw_in ? ".raw" : "");
    constexpr int hd = 256, threads = 512;
    // The pieces of attn_fused_probe.cu's shared memory, in its order: the block's weight rows,
    // its K and V tile, h's Q8_1 form, its raw rows, head sums and scales, the normalized heads,
    // the partial output, (max, sum) per query, the RoPE table, the scores, warp partials. The
    // RAW_IN form holds no weights.
    const int rpb = (group + 2) * hd / cluster, chunk = window / cluster;
    const int w_rows = raw_in ? 0 : rpb;
    const int smem = w_rows * (k / 2) + w_rows * (k / 16) + 2 * chunk * hd * 2 + k + k / 32 * 8 +
                     rpb * 4 + 128 + (group + 2) * hd * 4 + group * hd * 4 + group * 8 +
                     hd / 2 * 8 + group * 32 * 4 + threads / 32 * 8;
    s.constants = {
        {"K", k},           {"HEAD_DIM", hd}, {"GROUP", group},     {"N_KV_HEADS", n_kv_heads},
        {"WINDOW", window}, {"CL", cluster},  {"THREADS", threads}, {"RAW_IN", raw_in ? 1 : 0},
        {"SMEM", smem}};
    s.entries = {"attn_fused"};
    return s;
}

namespace {

// The mmq (int8 tensor-core GEMM) specs of a model's dense matrices: (k, n_rows) of the Q, K, V,
// O, gate/up and down projections of every layer, deduplicated by name.
std::vector<KernelSpec> mmq_specs(const Config& cfg, ggml::Type t) {
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto add = [&](int k, int n) {
        auto s = gemma4::mmq_spec(t, k, n);
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

}  // namespace

const std::vector<ggml::Type>& plan_weight_types() {
    static const std::vector<ggml::Type> types = {
        ggml::Type::F32, ggml::Type::F16, ggml::Type::BF16, ggml::Type::Q8_0, ggml::Type::Q4_0};
    return types;
}

std::set<std::string> names_of(const std::vector<KernelSpec>& plan) {
    std::set<std::string> s;
    for (const auto& k : plan) s.insert(k.name);
    return s;
}

std::vector<KernelSpec> all_specs() {
    std::vector<KernelSpec> specs;
    std::set<std::string> seen;
    auto add = [&](const KernelSpec& s) {
        if (seen.insert(s.name).second) specs.push_back(s);
    };
    for (const auto& v : Config::preset_names())
        for (auto t : plan_weight_types())
            for (const auto& s : build_kernel_plan(Config::preset(v), t)) add(s);
    // Tensor parallelism: the post-norms reading a prefill chunk's bf16 all-reduce (any split
    // of a model has its whole width; MoE models are not split).
    for (const auto& v : Config::preset_names()) {
        const Config cfg = Config::preset(v);
        if (cfg.is_moe()) continue;
        for (const auto& s : gemma4::rmsnorm_bf16_input_specs(cfg.d_model, cfg.has_ple()).all())
            add(s);
    }
    add(ptx_selftest_spec());
    add(chain_probe_spec());
    for (int k : {1536, 2560, 3840, 5376}) add(stream_probe_spec(k, 128, 4));
    for (int d : {1536, 2560}) add(ple_cluster_probe_spec(d, 8));
    for (int k : {1536, 2560, 3840, 5376})
        for (int c : {32, 64}) {
            add(ffn_probe_spec(k, c, 2, false, 1));
            add(ffn_probe_spec(k, c, 2, false, 8));
            // The shared-memory form where a block may hold it (an H100/H200's 227 KiB).
            const KernelSpec smem = ffn_probe_spec(k, c, 1, true, 1);
            if (gemma4::spec_constant(smem, "SMEM") <= 227 * 1024) add(smem);
        }
    for (const bool raw_in : {false, true}) {
        add(attn_fused_probe_spec(1536, 8, 1, 512, 16, raw_in));  // E2B's sliding layers
        add(attn_fused_probe_spec(2560, 4, 2, 512, 16, raw_in));  // E4B's
    }
    for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
        add(gemma4::matvec_spec(t, 2560, 1, MatvecLayout::Ggml));
        add(gemma4::matvec_spec(t, 2112, 2, MatvecLayout::Ggml));
        add(gemma4::matvec_spec(t, 96, 1, MatvecLayout::Ggml));
    }
    add(gemma4::matvec_f_spec(ggml::Type::BF16, 2560, 4));
    // K-quant files as llama.cpp's quantizer mixes them (Q4_K_M: Q4_K with Q6_K for some V / FFN
    // down and the embeddings; Q5_K_M), for the models whose widths are whole super-blocks and
    // the tiny preset the GPU tests run (also in pure Q5_K there: a tied Q5_K table); 2 and 4
    // columns of the K-quant matvecs.
    for (const char* v : {"e2b", "e4b", "12b", "31b", "tiny-256"})
        for (const char* mix : {"q4_k_m", "q5_k_m", "q5_k"}) {
            if (std::string(mix) == "q5_k_m" && std::string(v) != "e4b" &&
                std::string(v) != "tiny-256")
                continue;
            if (std::string(mix) == "q5_k" && std::string(v) != "tiny-256") continue;
            gemma4::PlanTypes base{ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0,
                                   ggml::Type::Q8_0};
            for (const auto& s :
                 build_kernel_plan(Config::preset(v), *gemma4::quant_mix_from_name(mix), base))
                add(s);
            // GEMMAJIT_REPACK=0: the K-quant matrices in their GGUF blocks.
            base.layout = MatvecLayout::Ggml;
            for (const auto& s :
                 build_kernel_plan(Config::preset(v), *gemma4::quant_mix_from_name(mix), base))
                add(s);
        }
    for (auto t : {ggml::Type::Q4_K, ggml::Type::Q5_K, ggml::Type::Q6_K}) {
        add(gemma4::matvec_spec(t, 2560, 2));
        add(gemma4::matvec_spec(t, 5376, 4));
    }
    // Split Q5_K at the 31B's widths (its Q5_K_M plan is not in the set above), decode and
    // 2 / 4 / 8-column batches, and its tied table's gather at the E4B and 31B widths.
    for (int k : {5376, 21504})
        for (int ncols : {1, 2, 4, 8})
            add(gemma4::matvec_spec(ggml::Type::Q5_K, k, ncols, MatvecLayout::Split));
    for (int n : {2560, 5376})
        add(gemma4::embed_rows_spec(n, ggml::Type::Q5_K, 262144, MatvecLayout::Split));
    // The 32-block fallbacks: the 26B's K-quant mixes (ffn_down 2112 wide: Q5_0 / Q5_1 / Q8_0)
    // and whole tiny models in Q4_1 / Q5_0 / Q5_1, as the GPU tests run them.
    for (const char* mix : {"q4_k_m", "q5_k_m", "q6_k"})
        for (const auto& s : build_kernel_plan(
                 Config::preset("26b-a4b"), *gemma4::quant_mix_from_name(mix),
                 {ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0}))
            add(s);
    for (const char* mix : {"q4_1", "q5_0", "q5_1"})
        for (const auto& s : build_kernel_plan(
                 Config::preset("tiny-e2b"), *gemma4::quant_mix_from_name(mix),
                 {ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0, ggml::Type::Q8_0}))
            add(s);
    // Tensor-parallel shard plans (`kernels --tp 2`): the 31B in Q4_0 and the 12B in Q8_0 over 2
    // GPUs (half the heads, FFN and vocabulary per rank; the 12B's single global KV head
    // replicated).
    for (auto [v, t] : {std::pair{"31b", ggml::Type::Q4_0}, std::pair{"12b", ggml::Type::Q8_0}})
        for (const auto& s : build_kernel_plan(gemma4::plan_shards(Config::preset(v), 2),
                                               std::vector<gemma4::PlanTypes>{{t, t, t, t}}))
            add(s);
    // The F16 copies of Q8_0 / Q4_0 layer matrices (split layout; GEMMAJIT_MMQ_VARIANT=blas, and
    // auto on sm_90 for long chunks) at every preset's widths, the MoE's dense ones too.
    for (const char* v : {"e2b", "e4b", "12b", "31b", "26b-a4b"})
        for (auto t : {ggml::Type::Q8_0, ggml::Type::Q4_0}) {
            gemma4::PlanTypes types{t, t, t, t};
            types.quant_blas = true;
            for (const auto& s : build_kernel_plan(Config::preset(v), types)) add(s);
        }
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
    add(gemma4::mmq_spec(ggml::Type::Q4_0, 96, gemma4::MmqTile{32, 64, 2, 1, 4, 3}));
    // The grouped expert GEMMs gpu_test_mmq runs beyond the 26B-A4B plans: the tiny widths in
    // every type it reads, K-quant down products (their plain entry) and 128-row K-quant tiles.
    {
        using T = ggml::Type;
        for (auto [up, down, d, F] :
             {std::tuple{T::Q5_0, T::Q8_0, 128, 64}, std::tuple{T::Q4_1, T::Q5_1, 128, 64},
              std::tuple{T::Q4_K, T::Q5_0, 256, 64}, std::tuple{T::Q5_K, T::Q5_1, 256, 64},
              std::tuple{T::Q5_0, T::Q4_K, 256, 256}, std::tuple{T::Q4_K, T::Q5_K, 2048, 512},
              std::tuple{T::Q6_K, T::Q8_0, 256, 64}, std::tuple{T::Q5_1, T::Q6_K, 256, 256},
              std::tuple{T::Q6_K, T::Q6_K, 2048, 512}}) {
            add(gemma4::mmq_moe_spec(up, d, F));
            add(gemma4::mmq_moe_spec(down, F, d));
        }
    }
    add(gemma4::mmq_spec(ggml::Type::Q8_0, 96, gemma4::MmqTile{128, 128, 4, 2, 1, 2}));
    add(gemma4::mmq_spec(ggml::Type::Q8_0, 2560, gemma4::MmqTile{64, 128, 2, 4, 8, 2, 1, 2}));
    const Config tiny = Config::preset("tiny-keqv");
    for (int l = 0; l < tiny.n_layers; ++l)
        for (KvType kv : {KvType::F16, KvType::Q8_0}) {
            add(gemma4::attn_prep_spec(tiny, l, kv));
            add(gemma4::flash_decode_spec(tiny, l, kv));
        }
    // Head dim 128 (4 dims per lane), which no preset has, in q8_0.
    add(gemma4::flash_decode_spec(128, 4, 2, 0, KvType::Q8_0));
    add(gemma4::attn_prep_spec(128, 8, 2, 64, true, true, KvType::Q8_0));
    // Tensor-core prefill attention at the real layer shapes (E4B, 12B, 31B; f16 and bf16 caches),
    // a tiny preset's head dim 32, and the non-default tilings the GPU test runs.
    for (const char* v : {"e4b", "12b", "31b"}) {
        const Config cfg = Config::preset(v);
        for (int l = 0; l < cfg.n_layers; ++l)
            for (KvType kv : {KvType::F16, KvType::BF16, KvType::Q8_0})
                add(gemma4::flash_prefill_spec(cfg, l, kv));
    }
    add(gemma4::flash_prefill_spec(tiny, 0));
    add(gemma4::flash_prefill_spec(tiny, 0, KvType::Q8_0));
    using Tiling = gemma4::FlashPrefillTiling;
    // q8_0 tilings the GPU test runs: scores split by dims with key splits, shared P, key sets.
    add(gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::Q8_0, Tiling{4, 2, 1, 16, 2, 2, true}));
    add(gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::Q8_0, Tiling{2, 2, 1, 32, 3}));
    add(gemma4::flash_prefill_spec(64, 2, 2, 8, KvType::Q8_0, Tiling{2, 1, 2, 16, 2, 4}));
    add(gemma4::flash_prefill_spec(64, 4, 2, 8, KvType::F16, Tiling{2, 1, 1, 16, 2}));
    add(gemma4::flash_prefill_spec(128, 4, 2, 0, KvType::F16, Tiling{1, 1, 4, 16, 2}));
    add(gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::BF16, Tiling{2, 2, 1, 32, 3}));
    add(gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::F16, Tiling{2, 4, 1, 32, 2}));
    add(gemma4::flash_prefill_spec(512, 8, 4, 0, KvType::BF16, Tiling{1, 2, 2, 16, 2}));
    add(gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::F16, Tiling{4, 1, 2, 32, 2}));
    add(gemma4::flash_prefill_spec(256, 2, 8, 1024, KvType::F16, Tiling{2, 2, 1, 64, 2}));
    // Key splits (clusters) with key sets and with shared scores, and the widest cluster.
    add(gemma4::flash_prefill_spec(64, 2, 2, 8, KvType::BF16, Tiling{2, 1, 2, 16, 2, 4}));
    add(gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::F16, Tiling{2, 2, 2, 16, 2, 2}));
    add(gemma4::flash_prefill_spec(128, 1, 4, 0, KvType::F16, Tiling{1, 1, 1, 16, 2, 8}));
    // Scores split by head dims.
    add(gemma4::flash_prefill_spec(512, 4, 2, 0, KvType::F16, Tiling{4, 2, 1, 16, 2, 2, true}));
    add(gemma4::flash_prefill_spec(256, 4, 2, 512, KvType::BF16, Tiling{4, 2, 1, 32, 2, 1, true}));
    add(gemma4::flash_prefill_spec(128, 2, 2, 0, KvType::F16, Tiling{2, 2, 2, 16, 2, 2, true}));
    add(gemma4::flash_prefill_spec(512, 8, 4, 0, KvType::BF16, Tiling{3, 2, 1, 16, 3, 4, true}));
    return specs;
}

std::vector<KernelSpec> all_specs_of(const std::set<std::string>& families) {
    std::vector<KernelSpec> specs;
    for (auto& s : all_specs())
        if (families.count(s.family)) specs.push_back(std::move(s));
    return specs;
}

std::string entry_ptx(const std::string& ptx, const std::string& entry) {
    const auto start = ptx.find(".entry " + entry + "(");
    if (start == std::string::npos) return {};
    const auto end = ptx.find(".entry ", start + 1);
    return ptx.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

size_t occurrences(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
}

std::vector<KernelSpec> compile_sample(const std::vector<KernelSpec>& specs) {
    const size_t every = size_t(env_positive_int("GJ_COMPILE_SAMPLE", 1));
    if (every == 1) return specs;
    std::vector<KernelSpec> out;
    for (size_t i = 0; i < specs.size(); ++i)
        if (i % every == 0 || i + 1 == specs.size()) out.push_back(specs[i]);
    std::printf("[ sample   ] %zu of %zu specs (GJ_COMPILE_SAMPLE=%zu)\n", out.size(), specs.size(),
                every);
    return out;
}

// Bounded by deduplication across presets and weight types, and run on 2 threads.
void compile_and_check(
    const std::vector<KernelSpec>& grid,
    const std::function<void(const jit::CompiledKernel&, const std::string& arch)>& check) {
    const std::vector<KernelSpec> specs = compile_sample(grid);
    jit::Jit jit(jit::Flags::parse({{"GEMMAJIT_CACHE", "0"}}), [](const std::string&) {});
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
            // attn_prep (and the fused attention probe, which makes the same RoPE table) may
            // keep a stack frame: sincosf's cold path for huge angles (Payne-Hanek) uses a local
            // array; it must not spill.
            const bool rope_table = s.family == "attn_prep" || s.family == "attn_fused_probe";
            if (rope_table)
                for (const auto& r : c.resources_per_entry) {
                    EXPECT_EQ(r.spill_store_bytes, 0);
                    EXPECT_EQ(r.spill_load_bytes, 0);
                }
            // Every other model kernel is hot: no spills, no stack.
            if (s.family != "ptx_selftest" && !rope_table) {
                ASSERT_EQ(c.resources_per_entry.size(), s.entries.size());
                for (size_t i = 0; i < s.entries.size(); ++i) {
                    EXPECT_EQ(c.resources_per_entry[i].spill_store_bytes, 0) << s.entries[i];
                    EXPECT_EQ(c.resources_per_entry[i].spill_load_bytes, 0) << s.entries[i];
                    EXPECT_EQ(c.resources_per_entry[i].stack_bytes, 0) << s.entries[i];
                }
            }
            // Every model kernel may be launched as a programmatic dependent on sm_90 (it waits
            // on its grid dependency first); on sm_80 the wait compiles to nothing.
            if (s.family != "ptx_selftest" && s.family != "jit_selftest") {
                for (const auto& e : s.entries)
                    EXPECT_EQ(jit::ptx_entry_waits_on_grid(c.ptx, e), arch == "sm_90")
                        << "entry " << e;
            }
            check(c, arch);
        }
    }
}

std::vector<jit::CompiledKernel> compile_sm90a_only(const std::vector<KernelSpec>& grid) {
    const std::vector<KernelSpec> specs = compile_sample(grid);
    jit::Jit jit(jit::Flags::parse({{"GEMMAJIT_CACHE", "0"}}), [](const std::string&) {});
    const auto compiled = jit.compile_plan(specs, "sm_90", 2);
    EXPECT_EQ(compiled.size(), specs.size());
    for (const auto& c : compiled) {
        SCOPED_TRACE(c.spec.name);
        EXPECT_EQ(c.arch, "sm_90a");
        EXPECT_EQ(c.log.find("wgmma.mma_async instructions are serialized"), std::string::npos)
            << c.log;
    }
    try {
        jit.compile(specs.front(), "sm_80");
        ADD_FAILURE() << "compiled an sm_90a kernel for sm_80";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(specs.front().name), std::string::npos) << e.what();
    }
    return compiled;
}

}  // namespace gj::test
