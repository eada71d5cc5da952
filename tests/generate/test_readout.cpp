// The generation loop's device readouts (no GPU needed): which readout a sampler allows, and
// picking the token from each kind of step result.
#include <gtest/gtest.h>

#include "engine/generate/generate.h"
#include "engine/text/sampler.h"

using gj::gen::Readout;
using gj::gen::StepResult;
using gj::sample::Sampler;
using gj::sample::SamplerParams;

TEST(Readout, SmallestReadoutThatKeepsTheSamplersChoice) {
    SamplerParams p;  // Gemma defaults: temperature 1, top-k 64
    EXPECT_EQ(gj::gen::readout_for(p).kind, Readout::Kind::TopK);
    EXPECT_EQ(gj::gen::readout_for(p).k, 64);
    p.temperature = 0;
    EXPECT_EQ(gj::gen::readout_for(p).kind, Readout::Kind::Argmax);
    p.repeat_penalty = 1.1f;  // needs logits outside any candidate list
    EXPECT_EQ(gj::gen::readout_for(p).kind, Readout::Kind::Logits);
    p = SamplerParams{};
    p.top_k = 0;  // the whole vocabulary
    EXPECT_EQ(gj::gen::readout_for(p).kind, Readout::Kind::Logits);
    p.top_k = 65;
    EXPECT_EQ(gj::gen::readout_for(p).kind, Readout::Kind::Logits);
}

TEST(Readout, CandidatesPickWhatTheWholeRowPicks) {
    // A row whose top 8 are known; the candidates (ascending ids) must give the same draws.
    std::vector<float> row(1000, -5.0f);
    const std::vector<int32_t> ids = {3, 17, 250, 251, 600, 700, 701, 999};
    std::vector<float> values;
    for (size_t i = 0; i < ids.size(); ++i) {
        row[size_t(ids[i])] = 1.0f + 0.25f * float(i % 3);
        values.push_back(row[size_t(ids[i])]);
    }
    SamplerParams p;
    p.top_k = 8;
    p.top_p = 0.9f;
    p.seed = 3;
    Sampler full(p), cands(p);
    for (int i = 0; i < 50; ++i) {
        StepResult a, b;
        a.logits = row;
        b.ids = ids;
        b.values = values;
        EXPECT_EQ(gj::gen::sample_step(full, a), gj::gen::sample_step(cands, b)) << "draw " << i;
    }
    StepResult t;
    t.token = 42;
    EXPECT_EQ(gj::gen::sample_step(full, t), 42);
    EXPECT_THROW(gj::gen::sample_step(full, StepResult{}), gj::gen::GenerateError);
}
