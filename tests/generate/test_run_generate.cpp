// The generation loop over a scripted Forward: stop tokens, token limits, the end of the context,
// streaming text, and the checks made before any work; the CPU forward adapter's chunked prefill.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "engine/generate/generate.h"
#include "engine/generate/generate_cpu.h"
#include "engine/model/synth.h"
#include "tests/support/test_env.h"

using gj::gen::Forward;
using gj::gen::GenerateError;
using gj::gen::GenerateOptions;
using gj::gen::StopReason;

namespace {

// A "model" whose next token is a fixed function of the last one (greedy picks it), and which
// records how it was driven.
class ScriptedForward : public Forward {
  public:
    ScriptedForward(int vocab, int context, std::function<int32_t(int32_t)> next)
        : vocab_(vocab), context_(context), next_(std::move(next)) {}
    int vocab_size() const override { return vocab_; }
    int context_length() const override { return context_; }
    std::vector<float> prefill(std::span<const int32_t> tokens) override {
        ++prefills;
        pos += static_cast<int>(tokens.size());
        EXPECT_LE(pos, context_);
        return logits_after(tokens.back());
    }
    std::vector<float> decode(int32_t token) override {
        ++decodes;
        ++pos;
        EXPECT_LE(pos, context_) << "decoded past the context";
        return logits_after(token);
    }
    int position() const override { return pos; }
    int prefills = 0, decodes = 0, pos = 0;

  private:
    std::vector<float> logits_after(int32_t t) const {
        std::vector<float> l(static_cast<size_t>(vocab_), 0.0f);
        l[static_cast<size_t>(next_(t))] = 10.0f;
        return l;
    }
    int vocab_, context_;
    std::function<int32_t(int32_t)> next_;
};

const gj::tok::Tokenizer& tokenizer() {
    static gj::tok::Tokenizer t(gj::tok::make_synthetic_vocab(1024, 0));
    return t;
}

gj::sample::Sampler greedy() {
    gj::sample::SamplerParams p;
    p.temperature = 0.0f;
    return gj::sample::Sampler(p);
}

}  // namespace

TEST(Generate, StreamsUntilAStopToken) {
    const auto& tok = tokenizer();
    const int32_t the = tok.find("\xE2\x96\x81the"), and_ = tok.find(
                                                         "\xE2\x96\x81"
                                                         "and");
    ASSERT_GE(the, 0);
    ASSERT_GE(and_, 0);
    // prompt -> " the" -> " and" -> " the" -> <turn|>
    int step = 0;
    ScriptedForward f(1024, 100, [&](int32_t) {
        const int32_t script[] = {the, and_, the, 106, 7};
        return script[std::min(step++, 4)];
    });
    auto s = greedy();
    std::string streamed;
    auto prompt = tok.encode("Hello", true);
    auto r = gj::gen::generate(f, tok, s, prompt, {}, [&](std::string_view t) { streamed += t; });
    EXPECT_EQ(r.reason, StopReason::StopToken);
    EXPECT_EQ(r.stop_token, 106);
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{the, and_, the}));
    EXPECT_EQ(streamed, " the and the");
    EXPECT_EQ(r.prompt_tokens, static_cast<int>(prompt.size()));
    EXPECT_EQ(f.prefills, 1);
    EXPECT_EQ(f.decodes, 3);  // the stop token is never decoded
}

TEST(Generate, EveryGemmaStopTokenStops) {
    for (int32_t stop : {1, 106, 50}) {
        ScriptedForward f(1024, 100, [&](int32_t) { return stop; });
        auto s = greedy();
        auto r = gj::gen::generate(f, tokenizer(), s, std::vector<int32_t>{2, 600}, {}, nullptr);
        EXPECT_EQ(r.reason, StopReason::StopToken);
        EXPECT_EQ(r.stop_token, stop);
        EXPECT_TRUE(r.tokens.empty());
    }
    // <|turn> (105) opens a turn and must not stop generation.
    ScriptedForward f(1024, 100, [](int32_t) { return 105; });
    auto s = greedy();
    GenerateOptions o;
    o.max_tokens = 3;
    auto r = gj::gen::generate(f, tokenizer(), s, std::vector<int32_t>{2}, o, nullptr);
    EXPECT_EQ(r.reason, StopReason::MaxTokens);
    EXPECT_EQ(r.tokens.size(), 3u);
}

TEST(Generate, TokenLimitAndContextEnd) {
    auto s = greedy();
    ScriptedForward f(1024, 100, [](int32_t t) { return (t * 7 + 3) % 1000 + 10; });
    GenerateOptions o;
    o.max_tokens = 0;
    auto r = gj::gen::generate(f, tokenizer(), s, std::vector<int32_t>{2, 700}, o, nullptr);
    EXPECT_TRUE(r.tokens.empty());
    EXPECT_EQ(r.reason, StopReason::MaxTokens);

    // Context 10, prompt 4: positions 4..9 take six decoded tokens, and the logits of position 9
    // give a seventh that is never decoded.
    ScriptedForward g(1024, 10, [](int32_t t) { return (t * 7 + 3) % 1000 + 10; });
    auto r2 =
        gj::gen::generate(g, tokenizer(), s, std::vector<int32_t>{2, 600, 601, 602}, {}, nullptr);
    EXPECT_EQ(r2.reason, StopReason::ContextFull);
    EXPECT_EQ(r2.tokens.size(), 7u);
    EXPECT_EQ(g.pos, 10);
}

TEST(Generate, StreamedTextHoldsBackSplitCharacters) {
    const auto& tok = tokenizer();
    auto bytes = tok.encode("\xF0\x9F\x99\x82", false);  // 🙂: four byte tokens
    ASSERT_EQ(bytes.size(), 4u);
    int step = 0;
    ScriptedForward f(1024, 100,
                      [&](int32_t) { return step < 4 ? bytes[static_cast<size_t>(step++)] : 1; });
    auto s = greedy();
    std::vector<std::string> pieces;
    gj::gen::generate(f, tok, s, std::vector<int32_t>{2}, {},
                      [&](std::string_view t) { pieces.emplace_back(t); });
    ASSERT_EQ(pieces.size(), 5u);  // one call per token plus the final flush
    EXPECT_EQ(pieces[0] + pieces[1] + pieces[2], "");
    EXPECT_EQ(pieces[3], "\xF0\x9F\x99\x82");
    EXPECT_EQ(pieces[4], "");
}

TEST(Generate, ChecksBeforeAnyWork) {
    auto s = greedy();
    ScriptedForward f(1024, 8, [](int32_t) { return 5; });
    auto expect_error = [&](Forward& fw, std::vector<int32_t> prompt, const std::string& needle) {
        try {
            gj::gen::generate(fw, tokenizer(), s, prompt, {}, nullptr);
            FAIL() << "no error, expected " << needle;
        } catch (const GenerateError& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error(f, {}, "empty");
    expect_error(f, std::vector<int32_t>(8, 600),
                 "prompt has 8 tokens but the model's context holds 8");
    expect_error(f, {2, 5000}, "outside the vocabulary");
    ScriptedForward wrong_vocab(2048, 100, [](int32_t) { return 5; });
    expect_error(wrong_vocab, {2}, "2048 output logits but its tokenizer 1024");
    EXPECT_EQ(f.prefills, 0);
    EXPECT_EQ(wrong_vocab.prefills, 0);
}

TEST(GenerateCpu, ChunkedPrefillGivesTheWholePrefillsLogits) {
    gj::test::ScratchDir dir("generate-cpu");
    const auto path = dir.path() / "tiny.gguf";
    gj::synth::Options o;
    o.variant = "tiny";
    o.seed = 3;
    gj::synth::write_model(o, path);
    auto model = gj::gemma4::CpuModel::load(path);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 150; ++i) prompt.push_back(2 + (i * 37) % 1000);  // three chunks
    ASSERT_GT(prompt.size(), 2 * gj::gen::CpuForward::kPrefillChunk);
    gj::gen::CpuForward chunked(*model);
    std::vector<float> last = chunked.prefill(prompt);
    gj::gemma4::CpuSession whole(*model);
    std::vector<float> all = whole.prefill(prompt);
    ASSERT_EQ(last.size(), 1024u);
    EXPECT_TRUE(std::equal(last.begin(), last.end(), all.end() - 1024));
    EXPECT_EQ(chunked.decode(5), whole.decode(5));
}

// --ctx on the CPU (run, chat and serve's slots): a sequence holds that many positions, as the
// GPU's KV cache would; more than the model's context is refused.
TEST(GenerateCpu, ContextLimitHoldsTheSequenceToIt) {
    gj::test::ScratchDir dir("generate-cpu-ctx");
    const auto path = dir.path() / "tiny.gguf";
    gj::synth::Options o;
    o.variant = "tiny";
    gj::synth::write_model(o, path);
    auto model = gj::gemma4::CpuModel::load(path);
    EXPECT_EQ(gj::gen::CpuForward(*model).context_length(), 4096);
    EXPECT_EQ(gj::gen::CpuForward(*model, 64).context_length(), 64);
    try {
        gj::gen::CpuForward too_long(*model, 4097);
        FAIL() << "a context past the model's was taken";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("4097 positions exceeds the 4096"), std::string::npos)
            << e.what();
    }
}
