// Sampler semantics (llama.cpp order and definitions) and exactness of the fast paths against the
// full-vocabulary reference path on random logits.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>

#include "engine/text/sampler.h"

using gj::sample::Path;
using gj::sample::Sampler;
using gj::sample::SamplerError;
using gj::sample::SamplerParams;

namespace {

SamplerParams params(float temp, int k, float p, float min_p, float rep = 1.0f, uint64_t seed = 1) {
    SamplerParams s;
    s.temperature = temp;
    s.top_k = k;
    s.top_p = p;
    s.min_p = min_p;
    s.repeat_penalty = rep;
    s.seed = seed;
    return s;
}

std::vector<float> logits_of_probs(std::initializer_list<double> probs) {
    std::vector<float> l;
    for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
    return l;
}

std::map<int, int> histogram(Sampler& s, const std::vector<float>& logits, int n) {
    std::map<int, int> h;
    for (int i = 0; i < n; ++i) ++h[s.sample(logits)];
    return h;
}

// Random logits of varied shapes: Gaussian at different scales, heavy ties (quantized), a few
// dominant tokens, masked (-inf) tokens.
std::vector<float> random_logits(std::mt19937_64& rng, size_t n, int shape) {
    std::normal_distribution<float> g(0.0f, shape % 3 == 0 ? 1.0f : shape % 3 == 1 ? 4.0f : 12.0f);
    std::vector<float> l(n);
    for (auto& x : l) x = g(rng);
    if (shape % 4 == 1) {
        for (auto& x : l) x = std::round(x * 2.0f) / 2.0f;  // many exact ties
    }
    if (shape % 5 == 2) {
        for (int i = 0; i < 3; ++i) l[rng() % n] += 25.0f;  // a peaked distribution
    }
    if (shape % 7 == 3) {
        for (size_t i = 0; i < n; i += 3) l[i] = -INFINITY;
    }
    return l;
}

}  // namespace

TEST(Sampler, FastPathsMatchFullVocabularyExactly) {
    struct Setting {
        SamplerParams p;
        Path expect;
    };
    std::vector<Setting> settings;
    for (uint64_t seed : {1ull, 2ull, 3ull}) {
        settings.push_back({params(0.0f, 40, 0.9f, 0.05f, 1.1f, seed), Path::Greedy});
        settings.push_back({params(0.8f, 40, 0.95f, 0.05f, 1.0f, seed), Path::TopK});
        settings.push_back({params(1.0f, 64, 0.95f, 0.0f, 1.3f, seed), Path::TopK});
        settings.push_back({params(1.5f, 1, 1.0f, 0.0f, 1.0f, seed), Path::TopK});
        settings.push_back({params(0.7f, 5000, 1.0f, 0.0f, 1.0f, seed), Path::TopK});
        settings.push_back({params(1.0f, 0, 0.9f, 0.0f, 1.0f, seed), Path::TopP});
        settings.push_back({params(0.5f, 0, 0.999f, 0.02f, 1.2f, seed), Path::TopP});
        settings.push_back({params(2.0f, 0, 0.3f, 0.0f, 0.8f, seed), Path::TopP});
        settings.push_back({params(1.0f, 0, 1.0f, 0.1f, 1.0f, seed), Path::MinP});
        settings.push_back({params(1.0f, 0, 1.0f, 1e-6f, 1.5f, seed), Path::MinP});
    }
    int checked = 0;
    for (size_t si = 0; si < settings.size(); ++si) {
        for (size_t n : {7u, 300u, 3000u}) {
            Sampler fast(settings[si].p), full(settings[si].p);
            std::mt19937_64 rng(si * 1000 + n);
            for (int step = 0; step < 12; ++step) {
                auto l = random_logits(rng, n, step + static_cast<int>(si));
                int32_t a = fast.sample(l);
                int32_t b = full.sample(l, /*force_full=*/true);
                bool fast_applies = !(settings[si].expect == Path::TopK &&
                                      static_cast<size_t>(settings[si].p.top_k) >= n);
                if (fast_applies) {
                    ASSERT_EQ(fast.last_path(), settings[si].expect)
                        << "setting " << si << " took " << path_name(fast.last_path());
                }
                ASSERT_EQ(full.last_path(), Path::Full);
                ASSERT_EQ(a, b) << "setting " << si << " n " << n << " step " << step;
                fast.accept(a);
                full.accept(b);
                ++checked;
            }
        }
    }
    EXPECT_EQ(checked, static_cast<int>(settings.size()) * 3 * 12);
}

TEST(Sampler, FastPathOnRealVocabularySize) {
    const size_t n = 262144;
    std::mt19937_64 rng(5);
    auto l = random_logits(rng, n, 1);
    for (auto p : {params(1.0f, 64, 0.95f, 0.0f), params(1.0f, 0, 0.95f, 0.0f),
                   params(1.0f, 0, 1.0f, 0.05f), params(0.0f, 64, 0.95f, 0.0f)}) {
        Sampler fast(p), full(p);
        auto t0 = std::chrono::steady_clock::now();
        int32_t a = fast.sample(l);
        double fast_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        t0 = std::chrono::steady_clock::now();
        int32_t b = full.sample(l, true);
        double full_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        std::printf("%-7s fast %.2f ms, full sort %.2f ms\n", path_name(fast.last_path()), fast_ms,
                    full_ms);
        EXPECT_NE(fast.last_path(), Path::Full);
        EXPECT_EQ(a, b);
    }
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
    Sampler s(params(0.0f, 0, 1.0f, 0.0f));
    EXPECT_EQ(s.sample(std::vector<float>{1.0f, 3.0f, 3.0f, -2.0f}), 1);
    EXPECT_EQ(s.last_path(), Path::Greedy);
    EXPECT_EQ(s.sample(std::vector<float>{-INFINITY, -5.0f}), 1);
}

TEST(Sampler, TopKTopPMinPKeepTheRightSets) {
    const auto l = logits_of_probs({0.5, 0.3, 0.15, 0.05});
    {
        Sampler s(params(1.0f, 2, 1.0f, 0.0f));
        auto h = histogram(s, l, 4000);
        EXPECT_EQ(h.size(), 2u);
        EXPECT_GT(h[0], 0);
        EXPECT_GT(h[1], 0);
    }
    {
        Sampler s(params(1.0f, 0, 0.75f, 0.0f));  // 0.5 + 0.3 reaches 0.75: keeps two
        auto h = histogram(s, l, 4000);
        EXPECT_EQ(h.size(), 2u);
        EXPECT_EQ(h.count(2), 0u);
    }
    {
        Sampler s(params(1.0f, 0, 0.85f, 0.0f));  // needs the third
        auto h = histogram(s, l, 4000);
        EXPECT_EQ(h.size(), 3u);
    }
    {
        Sampler s(params(1.0f, 0, 1.0f, 0.25f));  // keeps p >= 0.25 * 0.5 = 0.125
        auto h = histogram(s, l, 4000);
        EXPECT_EQ(h.size(), 3u);
        EXPECT_EQ(h.count(3), 0u);
    }
}

TEST(Sampler, TemperatureComesAfterTruncation) {
    // Untempered, top-p 0.55 keeps only token 0. Were temperature 100 applied first, the
    // flattened distribution would need two tokens to reach 0.55.
    Sampler s(params(100.0f, 0, 0.55f, 0.0f));
    auto h = histogram(s, logits_of_probs({0.6, 0.3, 0.1}), 500);
    EXPECT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0], 500);
}

TEST(Sampler, DrawsFollowTheDistribution) {
    Sampler s(params(1.0f, 0, 1.0f, 0.0f, 1.0f, 42));
    const int n = 40000;
    auto h = histogram(s, logits_of_probs({0.5, 0.3, 0.2}), n);
    EXPECT_NEAR(h[0] / double(n), 0.5, 0.015);
    EXPECT_NEAR(h[1] / double(n), 0.3, 0.015);
    EXPECT_NEAR(h[2] / double(n), 0.2, 0.015);
    EXPECT_EQ(s.last_path(), Path::Full);
    // Temperature 0.5 squares the odds: 0.25 : 0.09 : 0.04.
    Sampler cold(params(0.5f, 0, 1.0f, 0.0f, 1.0f, 42));
    auto c = histogram(cold, logits_of_probs({0.5, 0.3, 0.2}), n);
    EXPECT_NEAR(c[0] / double(n), 0.25 / 0.38, 0.015);
}

TEST(Sampler, SameSeedSameTokens) {
    std::mt19937_64 rng(9);
    auto l = random_logits(rng, 1000, 0);
    Sampler a(params(1.0f, 50, 0.9f, 0.0f, 1.0f, 7)), b(params(1.0f, 50, 0.9f, 0.0f, 1.0f, 7)),
        c(params(1.0f, 50, 0.9f, 0.0f, 1.0f, 8));
    int differ = 0;
    for (int i = 0; i < 50; ++i) {
        int32_t x = a.sample(l), y = b.sample(l), z = c.sample(l);
        EXPECT_EQ(x, y);
        differ += x != z;
    }
    EXPECT_GT(differ, 0);
}

TEST(Sampler, RepetitionPenaltyOverRecentWindow) {
    auto p = params(0.0f, 0, 1.0f, 0.0f, 2.0f);
    p.repeat_last_n = 2;
    Sampler s(p);
    const std::vector<float> l = {2.0f, 1.9f, -1.0f, -1.5f};
    EXPECT_EQ(s.sample(l), 0);
    s.accept(0);  // 2.0 -> 1.0: token 1 now wins
    EXPECT_EQ(s.sample(l), 1);
    s.accept(1);  // both penalized: 1.0 vs 0.95
    EXPECT_EQ(s.sample(l), 0);
    s.accept(3);  // window of 2 is {1, 3}: token 0 is free again
    EXPECT_EQ(s.sample(l), 0);
    // Negative logits are multiplied: -1.0 -> -2.0 falls below -1.5.
    Sampler neg(p);
    const std::vector<float> m = {-1.0f, -1.5f};
    neg.accept(0);
    neg.accept(0);  // counted once
    EXPECT_EQ(neg.sample(m), 1);
}

TEST(Sampler, InvalidSettingsAreClearErrors) {
    auto expect_error = [](SamplerParams p, const std::string& needle) {
        try {
            Sampler s(p);
            FAIL() << "no error, expected " << needle;
        } catch (const SamplerError& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error(params(-0.5f, 0, 1.0f, 0.0f), "temperature");
    expect_error(params(NAN, 0, 1.0f, 0.0f), "temperature");
    expect_error(params(1.0f, -1, 1.0f, 0.0f), "top-k");
    expect_error(params(1.0f, 0, 0.0f, 0.0f), "top-p must be in (0, 1] (1 = off), got 0");
    expect_error(params(1.0f, 0, 1.5f, 0.0f), "top-p");
    expect_error(params(1.0f, 0, 1.0f, -0.1f), "min-p");
    expect_error(params(1.0f, 0, 1.0f, 1.1f), "min-p");
    expect_error(params(1.0f, 0, 1.0f, 0.0f, 0.0f), "repeat penalty");
    auto p = params(1.0f, 0, 1.0f, 0.0f);
    p.repeat_last_n = -3;
    expect_error(p, "repeat-last-n");

    Sampler s(params(1.0f, 0, 1.0f, 0.0f));
    EXPECT_THROW(s.sample(std::vector<float>{}), SamplerError);
    EXPECT_THROW(s.sample(std::vector<float>{0.0f, NAN}), SamplerError);
    EXPECT_THROW(s.sample(std::vector<float>{-INFINITY, -INFINITY}), SamplerError);
}
