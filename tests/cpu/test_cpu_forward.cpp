// CPU reference forward: internal consistency (batch prefill == token-by-token decode == chunked
// prefill, bitwise; f32 weight copies == on-demand dequantization) on every tiny preset, over
// sequences several sliding windows long. Agreement with Hugging Face transformers is
// test_cpu_forward_golden.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cpu/cpu_forward.h"
#include "engine/model/synth.h"
#include "tests/support/test_env.h"

using gj::gemma4::Config;
using gj::gemma4::CpuModel;
using gj::gemma4::CpuOptions;
using gj::gemma4::CpuSession;

namespace {

std::vector<int32_t> test_tokens(int n, int vocab) {
    std::vector<int32_t> t = {2};
    uint32_t s = 12345;
    while (int(t.size()) < n) {
        s = s * 1103515245u + 12345u;
        t.push_back(int32_t((s >> 8) % uint32_t(vocab)));
    }
    return t;
}

class TinyModels : public ::testing::TestWithParam<std::string> {
  protected:
    std::filesystem::path synth(gj::ggml::Type wtype = gj::ggml::Type::Q8_0) {
        gj::synth::Options o;
        o.variant = GetParam();
        o.wtype = wtype;
        o.threads = 2;
        const auto path = dir_.path() / (GetParam() + ".gguf");
        gj::synth::write_model(o, path);
        return path;
    }
    static CpuOptions opts() {
        CpuOptions o;
        o.threads = 2;
        return o;
    }
    gj::test::ScratchDir dir_{"cpu-forward"};
};

}  // namespace

TEST_P(TinyModels, PrefillEqualsDecodeAndChunkedPrefill) {
    auto model = CpuModel::load(synth(), opts());
    const Config& c = model->config();
    ASSERT_TRUE(model->weights().uses_f32_copies());
    const int T = 3 * c.sliding_window + 5;  // past several windows
    const auto tokens = test_tokens(T, c.vocab_size);
    const size_t V = c.vocab_size;

    CpuSession batch(*model);
    const std::vector<float> all = batch.prefill(tokens);
    ASSERT_EQ(all.size(), size_t(T) * V);
    EXPECT_EQ(batch.position(), T);

    CpuSession steps(*model);
    for (int t = 0; t < T; ++t) {
        const std::vector<float> one = steps.decode(tokens[t]);
        ASSERT_EQ(one.size(), V);
        for (size_t v = 0; v < V; ++v)
            ASSERT_EQ(one[v], all[t * V + v]) << "position " << t << " token " << v;
    }

    CpuSession chunks(*model);
    const int split = c.sliding_window + 3;
    auto a = chunks.prefill({tokens.data(), size_t(split)});
    auto b = chunks.prefill({tokens.data() + split, size_t(T - split)});
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, all);

    // reset() starts a new sequence.
    chunks.reset();
    EXPECT_EQ(chunks.prefill(tokens), all);
}

TEST_P(TinyModels, OnDemandDequantizationMatchesF32Copies) {
    const auto path = synth(gj::ggml::Type::Q4_0);
    auto copies = CpuModel::load(path, opts());
    CpuOptions o = opts();
    o.weights.f32_copy_limit_bytes = 0;
    auto on_demand = CpuModel::load(path, o);
    ASSERT_TRUE(copies->weights().uses_f32_copies());
    ASSERT_FALSE(on_demand->weights().uses_f32_copies());
    const auto tokens = test_tokens(12, copies->config().vocab_size);
    CpuSession a(*copies), b(*on_demand);
    EXPECT_EQ(a.prefill(tokens), b.prefill(tokens));
}

TEST_P(TinyModels, LogitsAreFiniteSoftcappedAndNotDegenerate) {
    auto model = CpuModel::load(synth(), opts());
    const Config& c = model->config();
    const auto tokens = test_tokens(20, c.vocab_size);
    CpuSession s(*model);
    const auto logits = s.prefill(tokens);
    float max_abs = 0;
    double sum = 0, sum2 = 0;
    for (float v : logits) {
        ASSERT_TRUE(std::isfinite(v));
        max_abs = std::max(max_abs, std::fabs(v));
        sum += v;
        sum2 += double(v) * v;
    }
    const double sd =
        std::sqrt(sum2 / logits.size() - (sum / logits.size()) * (sum / logits.size()));
    EXPECT_LT(max_abs, c.final_softcap);
    // Well-conditioned synthetic weights: logits spread (std ~2), far from the cap of 30.
    EXPECT_GT(sd, 0.5) << GetParam();
    EXPECT_LT(max_abs, 20.0f) << GetParam();
    // Distinct positions give distinct distributions (attention and positions matter).
    const size_t V = c.vocab_size;
    int differing = 0;
    for (size_t v = 0; v < V; ++v) differing += logits[v] != logits[V + v];
    EXPECT_GT(differing, int(V / 2));
}

INSTANTIATE_TEST_SUITE_P(AllTiny, TinyModels,
                         ::testing::Values("tiny", "tiny-e2b", "tiny-keqv", "tiny-moe"),
                         [](const auto& info) {
                             std::string n = info.param;
                             for (char& ch : n)
                                 if (ch == '-') ch = '_';
                             return n;
                         });

TEST(CpuForward, RejectsBadTokens) {
    gj::test::ScratchDir dir("cpu-forward-bad");
    gj::synth::Options o;
    o.threads = 2;
    gj::synth::write_model(o, dir.path() / "m.gguf");
    CpuOptions co;
    co.threads = 2;
    auto model = CpuModel::load(dir.path() / "m.gguf", co);
    CpuSession s(*model);
    EXPECT_THROW(s.prefill({}), std::invalid_argument);
    try {
        s.decode(model->config().vocab_size);
        FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos);
    }
    EXPECT_THROW(s.decode(-1), std::invalid_argument);
    EXPECT_EQ(s.position(), 0);  // nothing ran
}

TEST(CpuForward, MissingFileIsNamed) {
    try {
        CpuModel::load("/nonexistent/model.gguf");
        FAIL() << "no exception";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
    }
}
