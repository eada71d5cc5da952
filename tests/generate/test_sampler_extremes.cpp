// Sampling at extreme temperatures. A temperature so small that logit / T overflows (1e-39, a
// float denormal) used to make every weight exp(inf - inf) = NaN: no partial sum exceeded the
// target and the draw fell through to the LAST, lowest-ranked candidate. The weights are now
// exp((logit - max) / T): the best candidate's is 1, the others' underflow to 0, so such a
// temperature is greedy on every path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/text/sampler.h"

using gj::sample::Sampler;
using gj::sample::SamplerParams;

namespace {

SamplerParams params(float temp, int k, float p, float min_p, uint64_t seed) {
    SamplerParams s;
    s.temperature = temp;
    s.top_k = k;
    s.top_p = p;
    s.min_p = min_p;
    s.seed = seed;
    return s;
}

}  // namespace

TEST(SamplerExtremes, TinyTemperatureIsGreedyOnEveryPath) {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> g(0.0f, 3.0f);
    const float tiny[] = {1e-39f, std::numeric_limits<float>::denorm_min(), 1e-30f, 1e-12f};
    int checked = 0;
    for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> logits(3000);
        for (auto& x : logits) x = g(rng);
        if (trial % 3 == 1)
            for (size_t i = 0; i < logits.size(); i += 4) logits[i] = -INFINITY;  // masked
        size_t best = 0;
        for (size_t i = 1; i < logits.size(); ++i)
            if (logits[i] > logits[best]) best = i;
        for (float t : tiny) {
            // top-k, top-p, min-p and the full sort: each path ends in the same draw.
            for (const SamplerParams& p :
                 {params(t, 40, 1.0f, 0.0f, trial), params(t, 0, 0.9f, 0.0f, trial),
                  params(t, 0, 1.0f, 0.01f, trial), params(t, 0, 1.0f, 0.0f, trial)}) {
                Sampler s(p);
                for (int draw = 0; draw < 5; ++draw) {
                    EXPECT_EQ(s.sample(logits), int32_t(best)) << "T " << t << " trial " << trial;
                    EXPECT_EQ(s.sample(logits, /*force_full=*/true), int32_t(best));
                    ++checked;
                }
            }
        }
    }
    EXPECT_EQ(checked, 20 * 4 * 4 * 5);
}

TEST(SamplerExtremes, TinyTemperatureSplitsOnlyBetweenTiedBestLogits) {
    // Two tokens share the maximum: both keep weight 1, the rest 0; the draw never leaves them.
    std::vector<float> logits = {1.0f, 7.5f, -3.0f, 7.5f, 7.4999995f, 0.0f};
    Sampler s(params(1e-39f, 0, 1.0f, 0.0f, 9));
    int seen[6] = {};
    for (int i = 0; i < 2000; ++i) ++seen[s.sample(logits)];
    EXPECT_EQ(seen[1] + seen[3], 2000);
    EXPECT_GT(seen[1], 800);
    EXPECT_GT(seen[3], 800);
}

TEST(SamplerExtremes, HugeTemperatureIsUniformOverTheCandidates) {
    // logit / T underflows toward 0 for every candidate: every weight is ~1, none is NaN.
    std::vector<float> logits = {3.0f, -2.0f, 0.5f, 10.0f};
    Sampler s(params(std::numeric_limits<float>::max(), 0, 1.0f, 0.0f, 4));
    int seen[4] = {};
    for (int i = 0; i < 4000; ++i) ++seen[s.sample(logits)];
    for (int n : seen) EXPECT_GT(n, 800);
}
