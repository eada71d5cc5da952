// Batched decode (a server's continuous batching): one forward pass runs one token of each of B
// sequences of a session, each at its own position over its own KV cache. Checked against the
// same tokens decoded one sequence at a time on a second session, for B = 1..16 on the dense
// tiny presets (PLE, KV sharing, k_eq_v, MoE, quantized, float and K-quant weights) past the
// sliding window; graph replay against eager launches; mixed readouts in one batch; the errors.
//
// Tolerance: a batch reads the weights with the batched matvecs (kPrefillCols columns) where a
// single token uses the decode matvec; where their launch shapes differ the per-row sums run in
// another order (fp32 rounding, ~1e-6 relative) and the K/V rows the two paths append can round
// to different fp16 values: 2e-3 of the largest |logit|. Measured on the H200: 0 on these
// presets (their batched and single-column specs sum each row in the same order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/generate/generate_gpu.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/session.h"
#include "engine/model/model_file.h"
#include "engine/serve/scheduler.h"
#include "jit/device.h"
#include "tests/support/gpu_forward_check.h"
#include "tests/support/test_env.h"

using gj::gemma4::BatchToken;
using gj::gemma4::GpuSession;
using gj::gemma4::Readout;
namespace ggml = gj::ggml;
using namespace gj::test;

namespace {

constexpr float kTolBatch = 2e-3f;
constexpr int kSequences = 16;

struct Case {
    std::string variant;
    ggml::Type wtype;
    std::string mix;  // a quant mix (q4_k_m, ...) instead of one weight type
};

void PrintTo(const Case& c, std::ostream* os) {
    *os << c.variant << "_" << (c.mix.empty() ? ggml::type_name(c.wtype) : c.mix);
}

// Token of sequence `seq` at decode step `step` (fixed, so both sessions see the same input).
int32_t step_token(int seq, int step, int vocab) {
    return int32_t(3 + (seq * 7919 + step * 104729) % (vocab - 3));
}

// Sequences 0 .. n-1 of both sessions prefilled with the same prompt each: sequence i gets
// len0 + step * i tokens (seed seed0 + i), so the rows of a batch sit at different positions.
void prefill_both(GpuSession& a, GpuSession& b, int n, int len0, int step, uint32_t seed0) {
    const int V = a.model().config().vocab_size;
    for (int s = 0; s < n; ++s) {
        const auto prompt = test_tokens(len0 + step * s, V, seed0 + uint32_t(s));
        a.prefill(prompt, Readout::Argmax, {}, s);
        b.prefill(prompt, Readout::Argmax, {}, s);
    }
}

// 20 decode steps on both sessions, alternating single-column steps of sequence 0 and batches of
// sequences 0..2, with bit-identical logits (a fatal failure at the first difference).
void expect_same_decode_logits(GpuSession& f, GpuSession& s) {
    const int V = f.model().config().vocab_size;
    for (int step = 0; step < 20; ++step) {
        std::vector<BatchToken> batch;
        const int B = step % 2 ? 3 : 1;  // single-column decode and a batch
        for (int j = 0; j < B; ++j) batch.push_back({j, step_token(j, step, V), Readout::Logits});
        const auto a = f.decode_batch(batch), b = s.decode_batch(batch);
        for (int j = 0; j < B; ++j)
            ASSERT_EQ(0, std::memcmp(a[j].logits.data(), b[j].logits.data(), size_t(V) * 4))
                << "step " << step << " row " << j;
    }
}

class BatchDecodeTest : public ::testing::TestWithParam<Case> {};

TEST_P(BatchDecodeTest, EachRowEqualsItsSequenceDecodedAlone) {
    GJ_REQUIRE_GPU();
    const Case& c = GetParam();
    ScratchDir dir("gpu-batch");
    const auto path =
        c.mix.empty() ? synth(dir, c.variant, c.wtype) : synth_mix(dir, c.variant, c.mix);
    const auto f = flags();
    auto model = load_gpu(path, 128, 16, f, kSequences);
    const int V = model->config().vocab_size;
    GpuSession batched(*model), alone(*model);
    ASSERT_EQ(batched.sequences(), kSequences);
    // Sequence i starts from its own prompt of 3 + 2i tokens: every row sits at another position.
    prefill_both(batched, alone, kSequences, 3, 2, 100);
    int step = 0, launches = 0;
    std::set<int> sizes;
    float worst = 0;
    // Batch sizes across the kPrefillCols boundary; the sequences in a batch rotate, so rows of
    // one batch are at different depths and the rings (window 8, 32 slots) wrap.
    for (int B : {1, 2, 3, 7, 8, 9, 16}) {
        for (int rep = 0; rep < 4; ++rep, ++step) {
            std::vector<BatchToken> batch;
            for (int j = 0; j < B; ++j) {
                const int s = (step * 5 + j) % kSequences;
                batch.push_back({s, step_token(s, step, V), Readout::Logits});
            }
            const auto got = batched.decode_batch(batch);
            ASSERT_EQ(got.size(), size_t(B));
            ++launches;
            sizes.insert(B);
            for (int j = 0; j < B; ++j) {
                const auto want = alone.decode(batch[j].token, Readout::Logits, batch[j].seq);
                const Agreement a = compare(want.logits, got[j].logits, V, kTolBatch);
                worst = std::max(worst, a.max_diff / a.scale);
                EXPECT_LE(a.max_diff, kTolBatch * a.scale)
                    << "B " << B << " row " << j << " (sequence " << batch[j].seq << ")";
                EXPECT_EQ(a.mismatches, 0) << "B " << B << " row " << j;
            }
        }
    }
    std::printf("  %s: %d batched steps, worst max|diff| %.3g of max|logit|\n", c.variant.c_str(),
                step, worst);
    for (int s = 0; s < kSequences; ++s) EXPECT_EQ(batched.position(s), alone.position(s)) << s;
    // One graph per batch size (all rows read logits), replayed for every later step.
    EXPECT_EQ(batched.graph_captures(), sizes.size());
    EXPECT_EQ(batched.graph_launches(), uint64_t(launches));
}

INSTANTIATE_TEST_SUITE_P(Presets, BatchDecodeTest,
                         ::testing::Values(Case{"tiny", ggml::Type::Q8_0, ""},
                                           Case{"tiny-e2b", ggml::Type::Q4_0, ""},
                                           Case{"tiny-keqv", ggml::Type::F16, ""},
                                           Case{"tiny-256", ggml::Type::F32, "q4_k_m"},
                                           Case{"tiny-moe", ggml::Type::Q8_0, ""},
                                           Case{"tiny-256", ggml::Type::F32, "q5_k_m"}));

// The batched graph replays the eager launches bit for bit.
TEST(BatchDecode, GraphReplayIsBitIdenticalToEagerLaunches) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-batch-graph");
    const auto path = synth(dir, "tiny-e2b", ggml::Type::Q8_0);
    const auto on = flags(), off = flags({{"GEMMAJIT_GRAPHS", "0"}, {"GEMMAJIT_STREAMS", "0"}});
    auto mg = load_gpu(path, 128, 16, on, 5);
    auto me = load_gpu(path, 128, 16, off, 5);
    GpuSession g(*mg), e(*me);
    const int V = mg->config().vocab_size;
    prefill_both(g, e, 5, 4, 3, 7);
    for (int step = 0; step < 12; ++step) {
        std::vector<BatchToken> batch;
        for (int s = 0; s < 5; ++s) batch.push_back({s, step_token(s, step, V), Readout::Logits});
        const auto a = g.decode_batch(batch), b = e.decode_batch(batch);
        for (int s = 0; s < 5; ++s)
            ASSERT_EQ(0, std::memcmp(a[s].logits.data(), b[s].logits.data(), size_t(V) * 4))
                << "step " << step << " sequence " << s;
    }
    EXPECT_EQ(g.graph_captures(), 1u);
    EXPECT_EQ(g.graph_launches(), 12u);
    EXPECT_EQ(e.graph_launches(), 0u);
}

// One launch for a layer's Q, K and V matvecs (GEMMAJIT_FUSE_QKV, the default) computes each
// matrix's rows exactly as the separate launches do: decode steps of one sequence and batches of
// several give bit-identical logits either way, and the fused launch really ran (on every layer
// with its own K/V, K/V-sharing layers included: tiny-e2b shares them, tiny-keqv has no V).
TEST(BatchDecode, FusedQkvIsBitIdenticalToSeparateLaunches) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-fused-qkv");
    for (const auto& [variant, wtype] :
         {std::pair{"tiny-e2b", ggml::Type::Q4_0}, std::pair{"tiny", ggml::Type::Q8_0},
          std::pair{"tiny-keqv", ggml::Type::Q8_0}}) {
        SCOPED_TRACE(variant);
        const auto path = synth(dir, variant, wtype);
        auto mf = load_gpu(path, 128, 16, flags(), 3);
        auto ms = load_gpu(path, 128, 16, flags({{"GEMMAJIT_FUSE_QKV", "0"}}), 3);
        GpuSession f(*mf), s(*ms);
        prefill_both(f, s, 3, 5, 4, 11);
        expect_same_decode_logits(f, s);
        if (HasFatalFailure()) return;
        int kv_layers = 0;
        for (const auto& l : mf->config().layers) kv_layers += l.has_kv;
        // Counted when recorded: the two captured graphs (B = 1 and 3), at least.
        EXPECT_GE(f.path_counts().qkv_fused, uint64_t(2 * kv_layers));
        EXPECT_EQ(s.path_counts().qkv_fused, 0u);
    }
}

// A float PLE gate with its GeLU product in one launch (GEMMAJIT_FUSE_PLE, the default) gives
// the values of the two launches: bit-identical logits over single-column decode steps, batches
// and prefill chunks on the batched matvecs (GEMMAJIT_BLAS=0: cuBLAS products keep two passes),
// and the fused launch really ran.
TEST(BatchDecode, FusedPleGateIsBitIdenticalToSeparateLaunches) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-fused-ple");
    for (const auto& [wtype, blas] :
         {std::pair{ggml::Type::Q8_0, "1"}, std::pair{ggml::Type::F32, "1"},
          std::pair{ggml::Type::Q4_0, "0"}}) {
        SCOPED_TRACE(std::string(ggml::type_name(wtype)) + " GEMMAJIT_BLAS=" + blas);
        const auto path = synth(dir, "tiny-e2b", wtype);
        auto mf = load_gpu(path, 128, 16, flags({{"GEMMAJIT_BLAS", blas}}), 3);
        auto ms = load_gpu(path, 128, 16,
                           flags({{"GEMMAJIT_BLAS", blas}, {"GEMMAJIT_FUSE_PLE", "0"}}), 3);
        ASSERT_TRUE(mf->config().has_ple());
        ASSERT_FALSE(mf->layers()[0].inp_gate.quantized()) << "the synthetic PLE gate is float";
        GpuSession f(*mf), s(*ms);
        prefill_both(f, s, 3, 5, 4, 11);
        const uint64_t after_prefill = f.path_counts().ple_gate_fused;
        // Prompts of 5, 9 and 13 rows: 5 on the matvecs (fused) either way; 9 and 13 on the
        // batched matvecs (fused) or through cuBLAS (not).
        if (std::string(blas) == "0") {
            EXPECT_GT(after_prefill, 0u);
        }
        expect_same_decode_logits(f, s);
        if (HasFatalFailure()) return;
        // Counted when recorded: every layer of the two captured graphs (B = 1 and 3), at least.
        EXPECT_GE(f.path_counts().ple_gate_fused - after_prefill,
                  uint64_t(2 * mf->config().n_layers));
        EXPECT_EQ(s.path_counts().ple_gate_fused, 0u);
    }
}

// A decode step's PLE gate makes the post-FFW residual update in each of its blocks, and a
// quantized PLE projection its Q8_1 input (GEMMAJIT_PLE_INPUT, the default), instead of the norm
// and GeLU-product launches (GEMMAJIT_PLE_INPUT=0): a float gate (tiny-e2b Q8_0, with its GeLU
// epilogue) and quantized gates and projections (tiny-256 Q4_K_M). The gate's blocks sum the
// norm's squares in the norm kernel's order, so single-sequence steps past the window and
// batches (which keep the launches) give bit-identical logits; the fused entries ran on every
// layer.
TEST(BatchDecode, PleInputsMadeInTheMatvecsAreBitIdenticalToSeparateLaunches) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-ple-input");
    for (const std::string mix : {"", "q4_k_m"}) {
        SCOPED_TRACE(mix.empty() ? "tiny-e2b q8_0" : "tiny-256 " + mix);
        const auto path = mix.empty() ? synth(dir, "tiny-e2b", ggml::Type::Q8_0)
                                      : synth_mix(dir, "tiny-256", mix);
        auto mf = load_gpu(path, 128, 16, flags(), 3);
        auto ms = load_gpu(path, 128, 16, flags({{"GEMMAJIT_PLE_INPUT", "0"}}), 3);
        ASSERT_TRUE(mf->config().has_ple());
        const bool quantized = mf->layers()[0].inp_gate.quantized();
        EXPECT_EQ(quantized, !mix.empty());
        EXPECT_EQ(mf->layers()[0].proj.quantized(), !mix.empty());
        GpuSession f(*mf), s(*ms);
        prefill_both(f, s, 3, 5, 4, 19);
        const uint64_t before = f.path_counts().ple_input;
        expect_same_decode_logits(f, s);
        if (HasFatalFailure()) return;
        // Counted when recorded: every layer's gate (and quantized projection) of the captured
        // single-column graph, at least; never with the flag off.
        const uint64_t L = uint64_t(mf->config().n_layers);
        EXPECT_GE(f.path_counts().ple_input - before, quantized ? 2 * L : L);
        EXPECT_EQ(s.path_counts().ple_input, 0u);
    }
}

// Each row gets its own readout: the greedy token and the top-k candidates of a row are those of
// its logits, whatever the other rows ask for.
TEST(BatchDecode, MixedReadoutsInOneBatch) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-batch-readout");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const auto f = flags();
    auto model = load_gpu(path, 64, 8, f, 3);
    const int V = model->config().vocab_size;
    GpuSession a(*model), b(*model);
    prefill_both(a, b, 3, 5, 1, 40);
    const std::vector<BatchToken> mixed = {
        {2, 11, Readout::TopK}, {0, 12, Readout::Argmax}, {1, 13, Readout::Logits}};
    const std::vector<BatchToken> logits = {
        {2, 11, Readout::Logits}, {0, 12, Readout::Logits}, {1, 13, Readout::Logits}};
    const auto got = a.decode_batch(mixed), want = b.decode_batch(logits);
    // Same batch size and rows: the same kernels, so the logits agree exactly.
    ASSERT_EQ(got[2].logits.size(), size_t(V));
    EXPECT_EQ(0, std::memcmp(got[2].logits.data(), want[2].logits.data(), size_t(V) * 4));
    EXPECT_EQ(got[1].token, argmax(want[1].logits.data(), V));
    ASSERT_EQ(got[0].ids.size(), size_t(std::min(V, gj::gemma4::kMaxTopK)));
    const int best = argmax(want[0].logits.data(), V);
    EXPECT_NE(std::find(got[0].ids.begin(), got[0].ids.end(), best), got[0].ids.end());
    for (size_t i = 0; i < got[0].ids.size(); ++i)
        EXPECT_EQ(got[0].values[i], want[0].logits[size_t(got[0].ids[i])]);
}

TEST(BatchDecode, BadBatchesFailClearlyAndChangeNothing) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-batch-errors");
    const auto path = synth(dir, "tiny", ggml::Type::Q8_0);
    const auto f = flags();
    auto model = load_gpu(path, 16, 4, f, 2);
    GpuSession s(*model);
    s.prefill(test_tokens(15, model->config().vocab_size), Readout::Argmax, {}, 0);
    s.prefill(test_tokens(3, model->config().vocab_size), Readout::Argmax, {}, 1);
    int pos0 = 15;
    auto expect_refused = [&](std::vector<BatchToken> batch, const std::string& what) {
        try {
            s.decode_batch(batch);
            ADD_FAILURE() << "accepted: " << what;
        } catch (const std::exception& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
        EXPECT_EQ(s.position(0), pos0);
        EXPECT_EQ(s.position(1), 3);
    };
    expect_refused({}, "at least one token");
    expect_refused({{1, 5}, {1, 6}}, "appears twice");
    expect_refused({{1, 5}, {2, 6}}, "sequence 2 does not exist");
    expect_refused({{1, 5}, {0, -3}}, "outside the vocabulary");
    s.decode(5, Readout::Argmax, 0);  // position 15: the last of the context
    pos0 = 16;
    expect_refused({{1, 5}, {0, 6}}, "do not fit the context");
    EXPECT_THROW(s.prefill(test_tokens(2, 100), Readout::Argmax, {}, 5), std::out_of_range);
}

// The server's scheduler over one E4B-shaped session with 8 slots and the batched decoder: 64
// greedy requests of different lengths, each output equal to its prompt decoded alone (no lost,
// duplicated or crossed tokens), none ending in an error (a NaN would), no device memory taken
// by the run (the process's buffers; the driver's free memory moves with other test processes)
// and at most one decode graph per batch size.
TEST(BatchDecode, SchedulerLoadOnAnE4bShapedModel) {
    GJ_REQUIRE_GPU();
    ScratchDir dir("gpu-batch-load");
    const auto path = synth(dir, "e4b", ggml::Type::Q8_0, 4);
    const auto f = flags();
    const int slots = 8, requests = 64;
    auto model = load_gpu(path, 512, 64, f, slots);
    auto file = gj::gemma4::ModelFile::open(path);
    const auto& tokenizer = file->tokenizer();
    const int V = model->config().vocab_size;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < requests; ++i)
        prompts.push_back(test_tokens(4 + (i * 37) % 90, V, 500 + i));
    auto max_tokens = [](int i) { return 6 + (i * 13) % 20; };

    // Alone: each prompt on sequence 0 of a second session, greedy on the device.
    std::vector<std::string> want;
    {
        GpuSession ref(*model);
        for (int i = 0; i < requests; ++i) {
            ref.reset(0);
            gj::tok::StreamDecoder text(tokenizer);
            std::string out;
            int32_t tok = ref.prefill(prompts[i], Readout::Argmax, {}, 0).token;
            for (int n = 0; n < max_tokens(i); ++n) {
                if (gj::tok::Tokenizer::is_stop_token(tok)) break;
                out += text.push(tok);
                if (n + 1 < max_tokens(i)) tok = ref.decode(tok, Readout::Argmax, 0).token;
            }
            want.push_back(out + text.finish());
        }
    }

    GpuSession session(*model);
    std::vector<std::unique_ptr<gj::gen::Forward>> seqs;
    for (int s = 0; s < slots; ++s)
        seqs.push_back(std::make_unique<gj::gen::GpuForward>(session, s));
    gj::gen::GpuBatchDecoder batch(session);
    gj::serve::SchedulerOptions so;
    so.prefill_chunk = 64;
    gj::serve::Scheduler sched(tokenizer, std::move(seqs), so, &batch);
    auto run = [&](int first, int count) {
        std::vector<std::shared_ptr<gj::serve::Job>> jobs;
        for (int i = first; i < first + count; ++i) {
            gj::serve::GenJob g;
            g.prompt = prompts[i];
            g.sampling.temperature = 0;
            g.max_tokens = max_tokens(i);
            jobs.push_back(sched.submit(g));
        }
        for (int i = first; i < first + count; ++i) {
            std::string text;
            for (bool done = false; !done;)
                for (auto& e : jobs[i - first]->wait(std::chrono::milliseconds(200))) {
                    text += e.delta.content;
                    if (!e.done) continue;
                    done = true;
                    EXPECT_TRUE(e.finish == gj::serve::Finish::Length ||
                                e.finish == gj::serve::Finish::Stop)
                        << "request " << i << ": " << e.error;
                }
            EXPECT_EQ(text, want[i]) << "request " << i;
        }
    };
    run(0, slots);  // warm-up
    const uint64_t held_before = gj::jit::DeviceBuffer::live_bytes();
    run(slots, requests - slots);
    const uint64_t held_after = gj::jit::DeviceBuffer::live_bytes();
    const auto st = sched.stats();
    std::printf(
        "  %d requests over %d slots: %llu tokens generated, device buffers %llu -> %llu "
        "bytes, %llu graphs captured, %llu launched\n",
        requests, slots, (unsigned long long)st.generated_tokens, (unsigned long long)held_before,
        (unsigned long long)held_after, (unsigned long long)session.graph_captures(),
        (unsigned long long)session.graph_launches());
    EXPECT_EQ(held_after, held_before) << "device memory grew during the run";
    EXPECT_LE(session.graph_captures(), uint64_t(slots));
    EXPECT_GT(session.graph_launches(), 0u);
}

}  // namespace
