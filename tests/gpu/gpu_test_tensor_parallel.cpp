// Tensor parallelism end to end (issue 15): a model split over two GPUs (and four where the
// machine has them), one process per GPU with NCCL between them, against the same model whole on
// one GPU. Per preset: the logits of a chunked prefill, of prefill chunks long enough for the
// tensor-core GEMMs and cuBLAS, and of decode steps (graphs with the collectives captured inside),
// the greedy tokens and the top-k readout; graph replay against eager launches (bitwise: the same
// kernels and collectives in the same order); and a 31B-shaped model (its real widths, 6 layers:
// five sliding, one global with 4 KV heads of 512) and an E4B-shaped Q4_K_M (K-quant slices in
// whole 256-element super-blocks), 2 layers. Also the failures: NCCL missing and more ranks than
// GPUs end in errors that name the problem.
//
// The GPU driver does not survive fork(), so this test process never touches the GPU: every run
// is a child (which forks its own tensor-parallel worker), and results come back through files.
// Skipped with the reason on a machine with fewer than two GPUs.
//
// Tolerances, relative to the largest |logit|: the split changes the order of fp32 sums (each
// rank's partial products, then NCCL's sum; attention splits its keys by its own head count), and
// every Q8_1 block of an activation lies within one rank's slice (heads and FFN slices are whole
// 32-blocks). With float weights that is rounding: 2e-3 (measured on 2 H200s: 6e-4 at most). With
// int8 activations a last-bit difference may move a value across a rounding step of its block,
// and the random tiny models amplify such steps: the single-GPU tests' GPU-vs-CPU tolerances
// (3e-2 quantized, measured 1.1-1.5% on the tiny presets and 0.6% at the 31B widths; 2e-2 for
// cuBLAS's bf16 activations, measured 0.4%). The greedy tokens must be equal, the top-k sets all
// but a few candidates at their low end. Prefill chunks whose all-reduces move bf16 (the default
// from 64 rows) round each rank's partial products to bf16: the bf16 tolerance.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/gpu/gpu_model.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/session.h"
#include "engine/gpu/tensor_parallel.h"
#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "tests/support/gpu_forward_check.h"
#include "tests/support/test_env.h"

using gj::gemma4::GpuModel;
using gj::gemma4::GpuModelOptions;
using gj::gemma4::GpuSession;
using gj::gemma4::RankGroup;
using gj::gemma4::Readout;
namespace ggml = gj::ggml;
using namespace gj::test;

namespace {

constexpr float kTolFloat = 2e-3f;
constexpr float kTolQuant = 3e-2f;
constexpr float kTolBf16 = 2e-2f;

// GPUs on this machine, asked in a child (0 without a driver).
int gpu_count() {
    return run_in_child([] {
        int n = 0;
        if (gj::jit::device_available())
            gj::jit::check_driver(gj::jit::driver().cuDeviceGetCount(&n), "cuDeviceGetCount");
        return n;
    });
}

void save(const std::filesystem::path& p, const std::vector<float>& v) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
}
std::vector<float> load(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary | std::ios::ate);
    if (!f) return {};
    std::vector<float> v(size_t(f.tellg()) / sizeof(float));
    f.seekg(0);
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    return v;
}

// What one run (TP=1 or TP=2) of a model computes; each list saved as floats under `out`.
// counts: all-reduces, all-gathers and decode graph launches of the graph run, its all-reduces in
// NCCL symmetric memory, whether the library has symmetric memory, the symmetric all-reduces
// behind a barrier, whether this NCCL needs one (jit::Nccl::symmetric_kernels_skip_grid_wait),
// the decode post-norms that summed the ranks' products themselves, and whether the model
// planned them (GpuModel::tp_fused_norm).
void forward_runs(const std::filesystem::path& model, int ranks, int tokens_n,
                  const std::filesystem::path& out) {
    RankGroup group(ranks);
    const gj::jit::Flags graphs = flags(), eager = flags({{"GEMMAJIT_GRAPHS", "0"}});
    GpuModelOptions o;
    o.context = 256;
    o.prefill_chunk = 4;
    o.flags = &graphs;
    o.tp = group.connect(graphs);
    auto m = GpuModel::load(model, o);
    const int V = m->config().vocab_size;
    const auto tokens = test_tokens(tokens_n, V);
    std::vector<float> counts;
    {
        GpuSession s(*m);
        const auto prefill = s.prefill_logits(tokens);
        s.reset();
        const auto decode = decode_logits(s, tokens);
        // Greedy tokens (Argmax) and the top-k readout, from the same start.
        s.reset();
        std::vector<float> greedy, topk;
        int32_t t = s.prefill({tokens.data(), 8}, Readout::Argmax).token;
        for (int i = 0; i < 12; ++i) {
            greedy.push_back(float(t));
            const auto k = s.decode(t, Readout::TopK);
            topk.insert(topk.end(), k.ids.begin(), k.ids.end());
            t = s.decode(t, Readout::Argmax).token;
        }
        const auto& pc = s.path_counts();
        const bool windows = o.tp.nccl && o.tp.nccl->has_windows();
        const bool barrier = o.tp.nccl && o.tp.nccl->symmetric_kernels_skip_grid_wait() &&
                             gj::jit::Device::get().compute_capability() >= 90;
        counts = {float(pc.all_reduce),
                  float(pc.all_gather),
                  float(s.graph_launches()),
                  float(pc.all_reduce_symmetric),
                  float(windows),
                  float(pc.symmetric_barrier),
                  float(barrier),
                  float(pc.norm_lsa),
                  float(m->tp_fused_norm())};
        if (group.leader() && o.tp.active() && !m->tp_fused_norm())
            std::printf("[ note     ] %s\n", m->tp_fused_norm_note().c_str());
        if (group.leader()) {
            save(out / "prefill", prefill);
            save(out / "decode", decode);
            save(out / "greedy", greedy);
            save(out / "topk", topk);
            save(out / "counts", counts);
        }
    }
    // The decode steps again under other flags, saved as `name`; returns their path counts and
    // whether the model planned the fused post-norms.
    auto decode_with = [&](const gj::jit::Flags& f, const char* name) {
        GpuModelOptions of = o;
        of.flags = &f;
        auto mf = GpuModel::load(model, of);
        GpuSession s(*mf);
        const auto decode = decode_logits(s, tokens);
        if (group.leader()) save(out / name, decode);
        return std::pair{s.path_counts(), mf->tp_fused_norm()};
    };
    decode_with(eager, "decode_eager");
    // With ordinary buffers for their all-reduces (and so without the fused post-norms).
    const auto plain = decode_with(flags({{"GEMMAJIT_TP_SYMMETRIC", "0"}}), "decode_plain").first;
    // The post-norms summing the ranks' products themselves, and NCCL all-reduces before them.
    // (Reading the peers' windows, GEMMAJIT_TP_PUSH=0; then the products pushed by the matvecs.)
    const auto [fused, planned] = decode_with(
        flags({{"GEMMAJIT_TP_FUSED_NORM", "1"}, {"GEMMAJIT_TP_PUSH", "0"}}), "decode_fused");
    const auto pushed =
        decode_with(flags({{"GEMMAJIT_TP_FUSED_NORM", "1"}, {"GEMMAJIT_TP_PUSH", "1"}}),
                    "decode_push")
            .first;
    const auto unfused =
        decode_with(flags({{"GEMMAJIT_TP_FUSED_NORM", "0"}}), "decode_unfused").first;
    if (group.leader()) {
        save(out / "plain_symmetric", {float(plain.all_reduce_symmetric), float(plain.norm_lsa)});
        save(out / "fused_counts",
             {float(fused.norm_lsa), float(planned), float(unfused.norm_lsa), float(fused.push),
              float(pushed.push), float(pushed.norm_lsa), float(unfused.push)});
    }
    // Chunks of 32: the tensor-core GEMMs / cuBLAS with their all-reduces over whole chunks; then
    // the same with bf16 products (GEMMAJIT_TP_BF16_ROWS; by default only chunks of 64 rows and
    // more take them), all-reduced by NCCL, then pushed into every rank's window and summed by
    // the post-norms (GEMMAJIT_TP_PREFILL_PUSH: by default on 2 GPUs where the fused norms are
    // planned; here on 4 too).
    const gj::jit::Flags bf16 =
        flags({{"GEMMAJIT_TP_BF16_ROWS", "1"}, {"GEMMAJIT_TP_PREFILL_PUSH", "0"}});
    const gj::jit::Flags bf16_push =
        flags({{"GEMMAJIT_TP_BF16_ROWS", "1"}, {"GEMMAJIT_TP_PREFILL_PUSH", "8"}});
    for (const auto& [f, name] :
         {std::pair{&graphs, "prefill32"}, std::pair{&bf16, "prefill32_bf16"},
          std::pair{&bf16_push, "prefill32_push"}}) {
        GpuModelOptions ol = o;
        ol.flags = f;
        ol.prefill_chunk = 32;
        auto ml = GpuModel::load(model, ol);
        GpuSession s(*ml);
        const auto prefill = s.prefill_logits(tokens);
        // Then a few decode steps in the same session: after pushed chunks, the decode post-norms
        // take over the LSA barriers the push used (the first of them).
        std::vector<float> then;
        for (int i = 0; i < 4; ++i) {
            const auto r = s.decode(tokens[size_t(i)], Readout::Logits);
            then.insert(then.end(), r.logits.begin(), r.logits.end());
        }
        if (group.leader()) {
            save(out / name, prefill);
            save(out / (std::string(name) + "_then"), then);
        }
        // Whether a layer's row-parallel products (output projection, FFN down) are split-K
        // GEMMs at this chunk length: then their planes are summed straight into bf16.
        bool split_k = false;
        for (const auto& g : ml->layers())
            for (const auto* mat : {&g.o, &g.down})
                split_k = split_k || (!mat->spec_gemm.empty() &&
                                      gj::gemma4::spec_constant(ml->kernels().spec(mat->spec_gemm),
                                                                "SPLITS") > 1);
        const auto& pc = s.path_counts();
        if (group.leader() && f == &bf16)
            save(out / "bf16_count",
                 {float(pc.all_reduce_bf16), float(pc.all_reduce_symmetric), float(pc.norm_bf16_in),
                  float(pc.product_bf16), float(split_k), float(pc.prefill_push)});
        if (group.leader() && f == &bf16_push)
            save(out / "push_count",
                 {float(pc.prefill_push), float(pc.norm_bf16_planes), float(pc.all_reduce_bf16),
                  float(pc.norm_bf16_in), float(pc.product_bf16), float(ml->tp_prefill_push()),
                  float(s.tp_prefill_push())});
    }
    group.finish();
}

struct Case {
    std::string variant;
    ggml::Type wtype;
    int layers = 0;
    std::string mix;  // a quant mix (q4_k_m, ...) instead of one type for every tensor
};
std::string case_name(const Case& c) {
    std::string n = c.variant + "_" + (c.mix.empty() ? ggml::type_name(c.wtype) : c.mix);
    for (char& ch : n)
        if (ch == '-') ch = '_';
    return n;
}
void PrintTo(const Case& c, std::ostream* os) {
    *os << case_name(c);
}

class TensorParallelGpus : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override {
        const int n = gpu_count();
        if (n < 2) GTEST_SKIP() << "tensor parallelism needs 2 GPUs; this machine has " << n;
    }
    ScratchDir dir_{"gpu-tp"};
};

}  // namespace

// Two GPUs, and four where the machine has them (then the KV heads are replicated on every
// preset but the 31B-shaped one), against one.
TEST_P(TensorParallelGpus, SplitRunsAgreeWithOne) {
    const Case& c = GetParam();
    const auto path = c.mix.empty() ? synth(dir_, c.variant, c.wtype, c.layers)
                                    : synth_mix(dir_, c.variant, c.mix, c.layers);
    const int T = 40;  // past the sliding window of every preset (rings wrap)
    auto run = [&](int ranks) {
        const std::filesystem::path out = dir_.path() / ("tp" + std::to_string(ranks));
        std::filesystem::create_directories(out);
        const int rc = run_in_child([&] {
            forward_runs(path, ranks, T, out);
            return 0;
        });
        return std::pair{rc, out};
    };
    const auto [rc1, one] = run(1);
    ASSERT_EQ(rc1, 0) << "the one-GPU run failed";
    EXPECT_EQ(load(one / "counts")[0], 0) << "a one-GPU run made collectives";
    const int V = int(load(one / "prefill").size() / T);
    ASSERT_GT(V, 0);
    const float kTolSplit = c.wtype == ggml::Type::F32    ? kTolFloat
                            : c.wtype == ggml::Type::BF16 ? kTolBf16
                                                          : kTolQuant;
    for (const int ranks : {2, 4}) {
        if (ranks > gpu_count()) break;
        SCOPED_TRACE("TP=" + std::to_string(ranks));
        const auto [rc, split] = run(ranks);
        ASSERT_EQ(rc, 0) << "the " << ranks << "-GPU run failed";
        const auto counts = load(split / "counts");
        ASSERT_EQ(counts.size(), 9u);
        EXPECT_GT(counts[0] + counts[7], 0) << "no all-reduce ran";
        EXPECT_GT(counts[1], 0) << "no readout all-gather ran";
        EXPECT_GT(counts[2], 0) << "no decode graph ran";
        const std::string tp = "TP=" + std::to_string(ranks) + " vs TP=1 ";
        expect_agree(load(one / "prefill"), load(split / "prefill"), V, kTolSplit,
                     tp + "chunked prefill");
        expect_agree(load(one / "prefill32"), load(split / "prefill32"), V, kTolSplit,
                     tp + "prefill in chunks of 32");
        expect_agree(load(one / "decode"), load(split / "decode"), V, kTolSplit,
                     tp + "decode steps");
        // bf16 partial products: rounding of 2^-9 relative per all-reduce; the bf16 tolerance.
        EXPECT_GT(load(split / "bf16_count").at(0), 0) << "no bf16 all-reduce ran";
        // Each bf16 sum is read as such by the post-norm after it (no conversion back).
        EXPECT_EQ(load(split / "bf16_count").at(2), load(split / "bf16_count").at(0))
            << "post-norms reading the bf16 all-reduce sums";
        EXPECT_EQ(load(one / "bf16_count").at(0), 0);
        // Where the products are split-K GEMMs (the 31B-shaped preset's), their sums reach the
        // bf16 all-reduces already rounded, with no conversion launch.
        EXPECT_EQ(load(split / "bf16_count").at(3) > 0, load(split / "bf16_count").at(4) > 0)
            << "bf16 all-reduce inputs rounded by the split-K sums";
        EXPECT_LE(load(split / "bf16_count").at(3), load(split / "bf16_count").at(0));
        EXPECT_EQ(load(split / "bf16_count").at(5), 0) << "GEMMAJIT_TP_PREFILL_PUSH=0 still pushed";
        expect_agree(load(one / "prefill32"), load(split / "prefill32_bf16"), V,
                     std::max(kTolSplit, kTolBf16),
                     tp + "prefill in chunks of 32, bf16 all-reduces");
        // The bf16 products pushed into every rank's window (tp_push.cu), where the model planned
        // it (the fused norms' NCCL headers) and the session has the windows: every all-reduce of
        // the chunk replaced, each push read by one post-norm summing the ranks' products in fp32
        // (no split-K sum rounds them first). No worse than NCCL's bf16 sum: the same tolerance.
        const auto pc = load(split / "push_count");
        ASSERT_EQ(pc.size(), 7u);
        if (load(split / "fused_counts").at(1) > 0) {
            EXPECT_GT(pc[5], 0) << "the fused norms planned, the prefill push not";
            EXPECT_GT(pc[6], 0) << "the model planned the push, the session made no windows";
        }
        if (pc[6] == 0)
            std::printf(
                "[ note     ] %s: the prefill push was not planned (no NCCL device API "
                "here); its checks are left out\n",
                tp.c_str());
        if (pc[6] > 0) {
            EXPECT_GT(pc[0], 0) << "no prefill product was pushed";
            EXPECT_EQ(pc[1], pc[0]) << "post-norms summing the pushed products";
            EXPECT_EQ(pc[2], 0) << "bf16 all-reduces beside the push";
            EXPECT_EQ(pc[3], 0) << "post-norms reading a bf16 all-reduce sum";
            EXPECT_EQ(pc[4], 0) << "split-K sums rounded to bf16 before the push";
            expect_agree(load(one / "prefill32"), load(split / "prefill32_push"), V,
                         std::max(kTolSplit, kTolBf16),
                         tp + "prefill in chunks of 32, bf16 products pushed");
            expect_agree(load(one / "prefill32_then"), load(split / "prefill32_push_then"), V,
                         std::max(kTolSplit, kTolBf16),
                         tp + "decode steps after pushed prefill chunks");
        }
        // Graph replay with NCCL inside vs the same launches eagerly: identical.
        const auto graph = load(split / "decode"), eager = load(split / "decode_eager");
        ASSERT_EQ(graph.size(), eager.size());
        EXPECT_EQ(std::memcmp(graph.data(), eager.data(), graph.size() * sizeof(float)), 0)
            << "the decode graph and eager launches differ";
        // One-token steps all-reduce in NCCL symmetric memory where the library has it (NCCL
        // 2.27+; a machine whose GPUs have no peer access would register no window and fail
        // here). Two ranks sum two values whatever the kernel: bitwise the ordinary buffers'
        // result, which a kernel reading its input before the product is written would not give
        // (NCCL 2.28-2.30.5, jit/nccl.h).
        if (counts[4] > 0) {
            EXPECT_GT(counts[3] + counts[7], 0) << "no symmetric all-reduce ran";
            EXPECT_GT(load(split / "bf16_count").at(1), 0) << "no symmetric bf16 all-reduce ran";
            // Behind the memset barrier exactly where this NCCL's kernels need it.
            EXPECT_EQ(counts[5], counts[6] > 0 ? counts[3] : 0)
                << "symmetric all-reduces behind a barrier";
            EXPECT_EQ(load(split / "plain_symmetric").at(0), 0)
                << "GEMMAJIT_TP_SYMMETRIC=0 still all-reduced in symmetric memory";
            EXPECT_EQ(load(split / "plain_symmetric").at(1), 0)
                << "GEMMAJIT_TP_SYMMETRIC=0 still summed in the post-norms";
            const auto plain = load(split / "decode_plain");
            ASSERT_EQ(plain.size(), graph.size());
            if (ranks == 2)
                EXPECT_EQ(std::memcmp(graph.data(), plain.data(), graph.size() * sizeof(float)), 0)
                    << "symmetric and ordinary all-reduces differ";
            else
                expect_agree(plain, graph, V, kTolSplit, tp + "decode, ordinary all-reduces");
        }
        // The decode post-norms that sum the ranks' products themselves (NCCL's device API),
        // where this machine's NCCL and headers allow them: both post-norms of every layer on a
        // model without PLE, the attention one with it, each decode step. Every rank adds the
        // products in rank order; two ranks' a + b is NCCL's sum bit for bit.
        const auto fc = load(split / "fused_counts");
        ASSERT_EQ(fc.size(), 7u);
        EXPECT_EQ(fc[2], 0) << "GEMMAJIT_TP_FUSED_NORM=0 still summed in the post-norms";
        EXPECT_EQ(fc[3] + fc[6], 0) << "GEMMAJIT_TP_PUSH=0 / GEMMAJIT_TP_FUSED_NORM=0 pushed";
        if (fc[1] > 0) {
            EXPECT_GT(fc[0], 0) << "no post-norm summed the ranks' products";
            const auto f = load(split / "decode_fused"), u = load(split / "decode_unfused");
            ASSERT_EQ(f.size(), u.size());
            if (ranks == 2)
                EXPECT_EQ(std::memcmp(f.data(), u.data(), f.size() * sizeof(float)), 0)
                    << "the fused post-norms' sums differ from NCCL's all-reduce";
            else
                expect_agree(u, f, V, kTolSplit, tp + "decode, fused post-norms");
            // The products pushed into every rank's window by the matvecs (GEMMAJIT_TP_PUSH):
            // every post-norm of a one-token step sums the slots, in the same rank order as the
            // pull form, so the two agree bit for bit at any rank count.
            EXPECT_GT(fc[4], 0) << "no post-norm read pushed products";
            EXPECT_EQ(fc[4], fc[5]) << "post-norms of one-token steps that did not take the push";
            const auto p = load(split / "decode_push");
            ASSERT_EQ(p.size(), f.size());
            EXPECT_EQ(std::memcmp(p.data(), f.data(), f.size() * sizeof(float)), 0)
                << "the pushed products' sums differ from the pulled ones";
        }
        EXPECT_EQ(load(one / "greedy"), load(split / "greedy")) << "greedy tokens differ";
        // Each step's 64 candidates (ascending ids): at least 60 shared.
        const auto k1 = load(one / "topk"), k2 = load(split / "topk");
        ASSERT_EQ(k1.size(), k2.size());
        for (size_t s = 0; s + 64 <= k1.size(); s += 64) {
            std::vector<float> common;
            std::set_intersection(k1.begin() + s, k1.begin() + s + 64, k2.begin() + s,
                                  k2.begin() + s + 64, std::back_inserter(common));
            EXPECT_GE(common.size(), 60u) << "top-k candidates of step " << s / 64;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Presets, TensorParallelGpus,
                         ::testing::Values(Case{"tiny", ggml::Type::Q8_0, 0, ""},
                                           Case{"tiny-e2b", ggml::Type::Q4_0, 0, ""},
                                           Case{"tiny-keqv", ggml::Type::Q8_0, 0, ""},
                                           Case{"tiny", ggml::Type::F32, 0, ""},
                                           Case{"tiny-keqv", ggml::Type::BF16, 0, ""},
                                           Case{"31b", ggml::Type::Q4_0, 6, ""},
                                           Case{"e4b", ggml::Type::Q4_K, 2, "q4_k_m"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                             return case_name(i.param);
                         });

// The failures a user meets: no NCCL, and more ranks than GPUs. Each ends the run with an error
// that names what is missing (no hang: rank 0 stops the workers).
TEST(TensorParallelCli, MissingNcclAndTooFewGpusAreNamedErrors) {
    const int n = gpu_count();
    if (n < 2) GTEST_SKIP() << "tensor parallelism needs 2 GPUs; this machine has " << n;
    ScratchDir dir("gpu-tp-cli");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const std::string bench = gemmajit_exe() + " bench -p 8 -n 4 -r 1 -m " + path.string();
    auto r = run_command("GEMMAJIT_NCCL_LIB=/nonexistent/libnccl.so.2 " + bench + " --tp 2 2>&1");
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("/nonexistent/libnccl.so.2"), std::string::npos) << r.out;
    r = run_command(bench + " --tp " + std::to_string(n + 1) + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find(fmt::format("this machine has {} GPUs", n)), std::string::npos) << r.out;
    // And it runs: two GPUs, the run's table from rank 0 only.
    r = run_command(bench + " --tp 2 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("tensor parallel over 2 GPUs"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tg4"), std::string::npos) << r.out;
}

// `precompile --tp 2` compiles every kernel the split's ranks load, the forms built against
// NCCL's device headers (the decode post-norms that sum the ranks' products, the pushed
// products) included: a run on a cache filled by it alone compiles nothing
// (GEMMAJIT_REQUIRE_CACHED=1 makes a miss an error) and takes those forms.
TEST(TensorParallelCli, PrecompiledSplitRunsFromTheCacheAlone) {
    const int n = gpu_count();
    if (n < 2) GTEST_SKIP() << "tensor parallelism needs 2 GPUs; this machine has " << n;
    ScratchDir dir("gpu-tp-precompile");
    const auto path = synth(dir, "tiny-keqv", ggml::Type::Q4_0);
    const std::string cache = "GEMMAJIT_CACHE_DIR=" + (dir.path() / "cache").string() + " ";
    auto r = run_command(cache + gemmajit_exe() + " precompile --tp 2 --model " + path.string() +
                         " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    if (r.out.find("fused all-reduce norms off") != std::string::npos)
        GTEST_SKIP() << "this machine's NCCL takes no fused post-norms: " << r.out;
    EXPECT_NE(r.out.find(".lsa2.push"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(".push2"), std::string::npos) << r.out;
    r = run_command(cache + "GEMMAJIT_REQUIRE_CACHED=1 " + gemmajit_exe() +
                    " bench -p 8 -n 4 -r 1 --tp 2 -m " + path.string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("summed by the post-norms from products the matvecs pushed"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("tg4"), std::string::npos) << r.out;
}

// `serve --tp 2`: rank 0 serves HTTP and mirrors every session call to the worker. Two greedy
// completions at once (two slots: batched decode steps, prefills between them) answer the same
// text as a one-GPU server, and SIGTERM stops both processes cleanly.
TEST(TensorParallelCli, ServerOverTwoGpusAnswersLikeOne) {
    const int n = gpu_count();
    if (n < 2) GTEST_SKIP() << "tensor parallelism needs 2 GPUs; this machine has " << n;
    if (run_command("command -v curl").exit_code != 0) GTEST_SKIP() << "curl is not installed";
    ScratchDir dir("gpu-tp-serve");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    auto serve = [&](int tp, int port) {
        const std::string url = fmt::format("http://127.0.0.1:{}", port);
        const auto log = dir.path() / fmt::format("serve{}.log", tp);
        auto ask = [&](const std::string& prompt, const std::string& out) {
            return fmt::format(
                "curl -sf {}/v1/completions -H 'Content-Type: application/json' -d "
                "'{{\"prompt\":\"{}\",\"max_tokens\":16,\"temperature\":0}}' > {} &",
                url, prompt, (dir.path() / out).string());
        };
        const std::string script = fmt::format(
            "{} serve -m {} --port {} --parallel 2 --ctx 256 --tp {} > {} 2>&1 & S=$!; "
            "for i in $(seq 1 240); do curl -sf {}/health > /dev/null && break; sleep 0.25; done; "
            "{} A=$!; {} B=$!; wait $A $B; kill -TERM $S; wait $S; echo server exit $?",
            gemmajit_exe(), path.string(), port, tp, log.string(), url,
            ask("Once upon a time", fmt::format("a{}.json", tp)),
            ask("The quick brown fox", fmt::format("b{}.json", tp)));
        const auto file = dir.path() / fmt::format("serve{}.sh", tp);
        std::ofstream(file) << script << "\n";
        auto r = run_command("bash " + file.string());
        std::ifstream f(log);
        return r.out + std::string(std::istreambuf_iterator<char>(f), {});
    };
    const std::string one = serve(1, 18431), two = serve(2, 18432);
    EXPECT_NE(one.find("server exit 0"), std::string::npos) << one;
    EXPECT_NE(two.find("server exit 0"), std::string::npos) << two;
    EXPECT_NE(two.find("2 GPUs (tensor parallel)"), std::string::npos) << two;
    for (const char* req : {"a", "b"}) {
        auto text = [&](int tp) {
            std::ifstream f(dir.path() / fmt::format("{}{}.json", req, tp));
            const auto j = nlohmann::json::parse(f, nullptr, false);
            return j.is_discarded() ? std::string("(no answer)")
                                    : j["choices"][0]["text"].get<std::string>();
        };
        EXPECT_NE(text(1), "(no answer)");
        EXPECT_EQ(text(1), text(2)) << "request " << req;
    }
}
