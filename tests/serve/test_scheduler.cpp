// The slot scheduler over a deterministic fake forward: streams interleave, queued requests run
// when a slot frees, each output equals the same request run alone, a prompt that extends a slot's
// cached tokens reuses them, cancellation frees the slot, and limits end with the right reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/serve/api_error.h"
#include "engine/serve/scheduler.h"
#include "engine/text/tokenizer_data.h"

namespace {

using gj::serve::Finish;
using gj::serve::GenJob;
using gj::serve::Job;
using gj::serve::Scheduler;

constexpr int kVocab = 1024;

// The next token is a function of the whole sequence so far (a running hash), so a slot that ran
// anything else, or lost a token, produces different output. Token ids 300..399 (plain text in the
// synthetic vocabulary): never a stop token, never a marker.
class FakeForward : public gj::gen::Forward {
  public:
    // gate: when given, every decode waits until it is open.
    explicit FakeForward(std::atomic<int>* prefilled = nullptr,
                         const std::atomic<bool>* gate = nullptr)
        : prefilled_(prefilled), gate_(gate) {}
    int vocab_size() const override { return kVocab; }
    int context_length() const override { return 64; }
    int position() const override { return static_cast<int>(seq_.size()); }
    std::vector<float> prefill(std::span<const int32_t> tokens) override {
        if (prefilled_) *prefilled_ += static_cast<int>(tokens.size());
        for (int32_t t : tokens) seq_.push_back(t);
        return logits();
    }
    std::vector<float> decode(int32_t token) override {
        while (gate_ && !gate_->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (fails_next())
            throw std::runtime_error("fake forward failed at position " +
                                     std::to_string(position()));
        seq_.push_back(token);
        return logits();
    }
    // Whether the next decode throws: a sequence holding the poison token breaks at position 5.
    bool fails_next() const {
        return position() >= 5 && std::find(seq_.begin(), seq_.end(), kPoison) != seq_.end();
    }
    static constexpr int32_t kPoison = 999;
    bool rewind(int keep) override {
        seq_.resize(static_cast<size_t>(keep));
        return true;
    }

  private:
    std::vector<float> logits() const {
        uint64_t h = 1469598103934665603ull;
        for (int32_t t : seq_) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
        std::vector<float> l(kVocab, 0.0f);
        l[300 + h % 100] = 10.0f;
        return l;
    }
    std::vector<int32_t> seq_;
    std::atomic<int>* prefilled_;
    const std::atomic<bool>* gate_;
};

// A batch decoder like the GPU's: all entries in one call or, when one of them would fail,
// none of them (the call throws first). Records the size of every batch.
class RecordingBatchDecoder : public gj::gen::BatchDecoder {
  public:
    std::vector<gj::gen::StepResult> decode_batch(
        std::span<const gj::gen::BatchEntry> batch) override {
        sizes.push_back(static_cast<int>(batch.size()));
        for (const auto& e : batch)  // alone, the entry fails with its own error
            if (batch.size() > 1 && static_cast<FakeForward*>(e.forward)->fails_next())
                throw std::runtime_error("a sequence of the batch failed");
        std::vector<gj::gen::StepResult> out;
        for (const auto& e : batch) out.push_back(e.forward->decode_step(e.token, e.readout));
        return out;
    }
    std::vector<int> sizes;
};

const gj::tok::Tokenizer& tokenizer() {
    static const gj::tok::Tokenizer t(gj::tok::make_synthetic_vocab(kVocab, 1));
    return t;
}

std::vector<std::unique_ptr<gj::gen::Forward>> fakes(int n, std::atomic<int>* prefilled = nullptr,
                                                     const std::atomic<bool>* gate = nullptr) {
    std::vector<std::unique_ptr<gj::gen::Forward>> v;
    for (int i = 0; i < n; ++i) v.push_back(std::make_unique<FakeForward>(prefilled, gate));
    return v;
}

GenJob greedy(std::vector<int32_t> prompt, int max_tokens) {
    GenJob g;
    g.prompt = std::move(prompt);
    g.sampling.temperature = 0;
    g.max_tokens = max_tokens;
    return g;
}

struct Outcome {
    std::string text;
    gj::serve::JobEvent done;
};

Outcome drain(Job& job) {
    Outcome o;
    for (;;) {
        for (auto& e : job.wait(std::chrono::milliseconds(100))) {
            o.text += e.delta.content;
            if (e.done) {
                o.done = e;
                return o;
            }
        }
    }
}

}  // namespace

TEST(Scheduler, ConcurrentJobsEachEqualTheJobRunAlone) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 8; ++i) prompts.push_back({2, 10 + i, 20 + i, 30});
    std::vector<std::string> alone;
    {
        Scheduler s(tokenizer(), fakes(1));
        for (auto& p : prompts) alone.push_back(drain(*s.submit(greedy(p, 6))).text);
    }
    Scheduler s(tokenizer(), fakes(3), {0, 2});  // 3 slots for 8 jobs: 5 queue
    std::vector<std::shared_ptr<Job>> jobs;
    for (auto& p : prompts) jobs.push_back(s.submit(greedy(p, 6)));
    for (size_t i = 0; i < jobs.size(); ++i) {
        Outcome o = drain(*jobs[i]);
        EXPECT_EQ(o.text, alone[i]) << "job " << i;
        EXPECT_EQ(o.done.finish, Finish::Length);
        EXPECT_EQ(o.done.usage.completion_tokens, 6);
        EXPECT_EQ(o.done.usage.prompt_tokens, 4);
    }
    EXPECT_NE(alone[0], alone[1]);
    auto st = s.stats();
    EXPECT_EQ(st.generated_tokens, 48u);
    EXPECT_EQ(st.slots, 3);
}

TEST(Scheduler, APromptThatExtendsTheCachedTokensReusesThem) {
    std::atomic<int> prefilled{0};
    Scheduler s(tokenizer(), fakes(1, &prefilled));
    std::vector<int32_t> first = {2, 5, 6, 7, 8, 9};
    Outcome a = drain(*s.submit(greedy(first, 3)));
    EXPECT_EQ(prefilled.load(), 6);
    std::vector<int32_t> second = first;
    second.insert(second.end(), {11, 12});
    Outcome b = drain(*s.submit(greedy(second, 3)));
    EXPECT_EQ(b.done.usage.cached_tokens, 6);
    EXPECT_EQ(prefilled.load(), 6 + 2);
    // The same as the second prompt on a fresh sequence.
    Scheduler fresh(tokenizer(), fakes(1));
    EXPECT_EQ(drain(*fresh.submit(greedy(second, 3))).text, b.text);
}

TEST(Scheduler, CancelFreesTheSlotForTheNextJob) {
    Scheduler s(tokenizer(), fakes(1));
    auto long_job = s.submit(greedy({2, 3, 4}, -1));  // runs to the end of the 64-token context
    auto next = s.submit(greedy({2, 9}, 2));
    s.cancel(long_job);
    Outcome o = drain(*next);
    EXPECT_EQ(o.done.finish, Finish::Length);
    // Cancelled, unless the fast fake already ran it to the end of its context.
    const Finish f = drain(*long_job).done.finish;
    EXPECT_TRUE(f == Finish::Cancelled || f == Finish::Length);
}

TEST(Scheduler, ContextLimitsAndStopStrings) {
    Scheduler s(tokenizer(), fakes(1), {16, 4});
    EXPECT_EQ(s.context(), 16);
    try {
        s.submit(greedy(std::vector<int32_t>(16, 5), 1));
        FAIL();
    } catch (const gj::serve::ApiError& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find("16 tokens"), std::string::npos);
    }
    EXPECT_THROW(s.submit(greedy({2, kVocab + 5}, 1)), gj::serve::ApiError);
    Outcome full = drain(*s.submit(greedy({2, 3}, -1)));
    EXPECT_EQ(full.done.finish, Finish::Length);
    // Positions 2..15 decode; the token sampled from the last one is still output.
    EXPECT_EQ(full.done.usage.completion_tokens, 16 - 2 + 1);
    // A stop string taken from the unlimited run's own text ends the next one right before it.
    ASSERT_GT(full.text.size(), 4u);
    GenJob g = greedy({2, 3}, -1);
    g.stop = {full.text.substr(2, 2)};
    Outcome stopped = drain(*s.submit(g));
    EXPECT_EQ(stopped.done.finish, Finish::Stop);
    EXPECT_EQ(stopped.text, full.text.substr(0, full.text.find(g.stop[0])));
}

// Decoding waits behind a gate that opens only once stop() has begun (new work is then refused),
// so both jobs are still running or queued when it arrives, however fast the fake forward is
// (ungated, a slow test thread could see them finish by length first).
TEST(Scheduler, StopCancelsEverything) {
    std::atomic<bool> open{false};
    auto s = std::make_unique<Scheduler>(tokenizer(), fakes(1, nullptr, &open));
    std::vector<std::shared_ptr<Job>> jobs = {s->submit(greedy({2, 3}, -1)),
                                              s->submit(greedy({2, 4}, -1))};
    std::thread stopper([&] { s->stop(); });
    for (;;) {  // until stop() refuses work; what got in before must be cancelled as well
        try {
            jobs.push_back(s->submit(greedy({2, 5}, -1)));
        } catch (const gj::serve::ApiError&) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    open = true;
    stopper.join();
    for (auto& j : jobs) EXPECT_EQ(drain(*j).done.finish, Finish::Cancelled);
    EXPECT_THROW(s->submit(greedy({2, 3}, 1)), gj::serve::ApiError);
}

TEST(Scheduler, DecodingSlotsRunAsOneBatchPerRound) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 6; ++i) prompts.push_back({2, 40 + i, 50 + i});
    std::vector<std::string> alone;
    {
        Scheduler s(tokenizer(), fakes(1));
        for (auto& p : prompts) alone.push_back(drain(*s.submit(greedy(p, 9))).text);
    }
    RecordingBatchDecoder batch;
    std::vector<std::string> together;
    {
        Scheduler s(tokenizer(), fakes(4), {0, 8}, &batch);  // 4 slots, 6 jobs: 2 queue
        std::vector<std::shared_ptr<Job>> jobs;
        for (auto& p : prompts) jobs.push_back(s.submit(greedy(p, 9)));
        for (auto& j : jobs) together.push_back(drain(*j).text);
    }
    EXPECT_EQ(together, alone);
    // 6 jobs x 8 decode steps (the first token comes from the prefill, and a job ends as soon
    // as its last token is out): every decoding slot of a round in one call, so the calls are
    // fewer than the steps and some hold several slots.
    int steps = 0, widest = 0;
    for (int n : batch.sizes) steps += n, widest = std::max(widest, n);
    EXPECT_EQ(steps, 6 * 8);
    EXPECT_LT(batch.sizes.size(), size_t(steps));
    EXPECT_GE(widest, 2);
    EXPECT_LE(widest, 4);
}

TEST(Scheduler, AFailingBatchEndsOnlyTheRequestThatBreaks) {
    RecordingBatchDecoder batch;
    // The second prompt holds the poison token: its sequence breaks on its 3rd decode step.
    std::vector<std::vector<int32_t>> prompts = {
        {2, 60, 61}, {2, 62, FakeForward::kPoison}, {2, 64, 65}};
    std::vector<std::string> alone;
    {
        Scheduler s(tokenizer(), fakes(1));
        for (int i : {0, 2}) alone.push_back(drain(*s.submit(greedy(prompts[i], 8))).text);
    }
    Scheduler s(tokenizer(), fakes(3), {0, 8}, &batch);
    std::vector<std::shared_ptr<Job>> jobs;
    for (auto& p : prompts) jobs.push_back(s.submit(greedy(p, 8)));
    std::vector<Outcome> out;
    for (auto& j : jobs) out.push_back(drain(*j));
    EXPECT_EQ(out[1].done.finish, Finish::Error);
    EXPECT_NE(out[1].done.error.find("position 5"), std::string::npos) << out[1].done.error;
    EXPECT_EQ(out[0].done.finish, Finish::Length);
    EXPECT_EQ(out[0].text, alone[0]);
    EXPECT_EQ(out[2].done.finish, Finish::Length);
    EXPECT_EQ(out[2].text, alone[1]);
}

// A forced reply beginning (tool_choice): the parser reads it before the first generated token.
// The fake model never closes the call it was made to open, so at the end the call comes out as
// content, as written: the prefix, then the generated text.
TEST(Scheduler, AReplyPrefixIsReadBeforeTheFirstToken) {
    Scheduler sched(tokenizer(), fakes(1));
    GenJob forced = greedy({2, 10, 20}, 4);
    forced.parse_chat = forced.tools = true;
    forced.reply_prefix = "<|tool_call>call:f{";
    GenJob plain = greedy({2, 10, 20}, 4);
    plain.parse_chat = plain.tools = true;
    const Outcome a = drain(*sched.submit(forced));
    const Outcome b = drain(*sched.submit(plain));
    EXPECT_EQ(a.text, "<|tool_call>call:f{" + b.text);
    EXPECT_FALSE(b.text.empty());
    EXPECT_EQ(a.done.finish, Finish::Length);
}
