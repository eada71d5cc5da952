#include "engine/text/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace gj::sample {

namespace {

std::string num(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
}

}  // namespace

void SamplerParams::validate() const {
    if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
        throw SamplerError("temperature must be a finite value >= 0 (0 = greedy), got " +
                           num(temperature));
    }
    if (top_k < 0) {
        throw SamplerError("top-k must be >= 0 (0 = off), got " + std::to_string(top_k));
    }
    if (!(top_p > 0.0f && top_p <= 1.0f)) {
        throw SamplerError("top-p must be in (0, 1] (1 = off), got " + num(top_p));
    }
    if (!(min_p >= 0.0f && min_p <= 1.0f)) {
        throw SamplerError("min-p must be in [0, 1] (0 = off), got " + num(min_p));
    }
    if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty)) {
        throw SamplerError("repeat penalty must be a finite value > 0 (1 = off), got " +
                           num(repeat_penalty));
    }
    if (repeat_last_n < 0) {
        throw SamplerError("repeat-last-n must be >= 0, got " + std::to_string(repeat_last_n));
    }
}

const char* path_name(Path p) {
    switch (p) {
        case Path::Greedy:
            return "greedy";
        case Path::TopK:
            return "top-k";
        case Path::TopP:
            return "top-p";
        case Path::MinP:
            return "min-p";
        case Path::Full:
            return "full";
    }
    return "?";
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {
    params_.validate();
}

void Sampler::accept(int32_t token) {
    if (params_.repeat_last_n == 0) return;
    history_.push_back(token);
    while (history_.size() > static_cast<size_t>(params_.repeat_last_n)) history_.pop_front();
}

void Sampler::apply_penalties(std::span<const float> logits) {
    if (logits.empty()) throw SamplerError("cannot sample from an empty row of logits");
    work_.assign(logits.begin(), logits.end());
    bool any_finite = false;
    for (size_t i = 0; i < work_.size(); ++i) {
        const float l = work_[i];
        if (std::isnan(l) || l == INFINITY) {
            throw SamplerError("logit of token " + std::to_string(i) + " is " + num(l));
        }
        any_finite |= l != -INFINITY;
    }
    if (!any_finite) throw SamplerError("every logit is -inf: no token can be sampled");
    if (params_.repeat_penalty == 1.0f) return;
    // llama.cpp: each distinct token of the window once; shrink positive logits, push negative
    // ones further down.
    std::unordered_set<int32_t> seen;
    for (int32_t t : history_) {
        if (t < 0 || static_cast<size_t>(t) >= work_.size() || !seen.insert(t).second) continue;
        float& l = work_[static_cast<size_t>(t)];
        l = l <= 0.0f ? l * params_.repeat_penalty : l / params_.repeat_penalty;
    }
}

namespace {

// Candidate order: higher logit first, lower id first on ties. A strict total order, so any
// selection algorithm yields the same set and the same sequence.
template <class C>
bool before(const C& a, const C& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
}

}  // namespace

double Sampler::normalizer(const std::vector<Cand>& cands) const {
    std::vector<Cand> by_id = cands;
    std::sort(by_id.begin(), by_id.end(), [](const Cand& a, const Cand& b) { return a.id < b.id; });
    double max = -INFINITY;
    for (const Cand& c : by_id) max = std::max(max, static_cast<double>(c.logit));
    double z = 0.0;
    for (const Cand& c : by_id) z += std::exp(static_cast<double>(c.logit) - max);
    return z;
}

size_t Sampler::top_p_cut(const std::vector<Cand>& sorted, double z) const {
    const double max = sorted.front().logit;
    double cum = 0.0;
    for (size_t i = 0; i < sorted.size(); ++i) {
        cum += std::exp(static_cast<double>(sorted[i].logit) - max) / z;
        if (cum >= params_.top_p) return i + 1;
    }
    return sorted.size();
}

// Steps after the candidate list is sorted: whatever of top-k / top-p is not done yet, then min-p,
// temperature and the draw.
int32_t Sampler::finish(std::vector<Cand>& c, bool top_k_done, bool top_p_done) {
    if (!top_k_done && params_.top_k > 0 && static_cast<size_t>(params_.top_k) < c.size()) {
        c.resize(static_cast<size_t>(params_.top_k));
    }
    if (!top_p_done && params_.top_p < 1.0f) c.resize(top_p_cut(c, normalizer(c)));
    if (params_.min_p > 0.0f) {
        const float cut = c.front().logit + std::log(params_.min_p);
        size_t keep = 1;
        while (keep < c.size() && c[keep].logit >= cut) ++keep;
        c.resize(keep);
    }
    if (params_.temperature == 0.0f) return c.front().id;
    // Weights exp((logit - max) / T) in double, the maximum subtracted before the division: the
    // exponent is then <= 0 for every candidate and exactly 0 for the best, so each weight is in
    // [0, 1], the best one's is 1 and the total is finite and >= 1 for any T > 0. (Dividing first
    // overflows for a tiny T, e.g. 1e-39: inf - inf is NaN, no partial sum ever exceeds the
    // target and the draw fell through to the worst candidate.) A T so small that every other
    // weight underflows to 0 is greedy, as it should be.
    // Each weight is computed once: the draw walks the same values the total summed.
    const double max = c.front().logit;
    const double temp = params_.temperature;
    weights_.resize(c.size());
    double total = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
        weights_[i] = std::exp((static_cast<double>(c[i].logit) - max) / temp);
        total += weights_[i];
    }
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // [0, 1)
    const double target = u * total;
    double cum = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
        cum += weights_[i];
        if (cum > target) return c[i].id;
    }
    // The same sums in the same order reach `total` > target, so this is unreachable; the best
    // candidate (weight 1) rather than one that may weigh 0.
    return c.front().id;
}

int32_t Sampler::sample_full() {
    cands_.resize(work_.size());
    for (size_t i = 0; i < work_.size(); ++i) cands_[i] = {work_[i], static_cast<int32_t>(i)};
    std::sort(cands_.begin(), cands_.end(), before<Cand>);
    return finish(cands_, false, false);
}

// Top-p with no top-k: the normalizer needs every token (summed in id order, exactly as the full
// path does), but the nucleus itself is found from ever larger partial selections: the sorted
// top m candidates are exactly the first m of the full sort.
int32_t Sampler::sample_top_p_proven() {
    const size_t n = work_.size();
    const float max = *std::max_element(work_.begin(), work_.end());
    double z = 0.0;
    for (float l : work_) z += std::exp(static_cast<double>(l) - static_cast<double>(max));
    std::vector<Cand> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = {work_[i], static_cast<int32_t>(i)};
    for (size_t m = std::min<size_t>(256, n);; m = std::min(n, m * 4)) {
        std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(m - 1), all.end(),
                         before<Cand>);
        cands_.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(m));
        std::sort(cands_.begin(), cands_.end(), before<Cand>);
        const size_t cut = top_p_cut(cands_, z);
        if (cut < m || m == n) {  // reached p inside the selection, or it is everything
            cands_.resize(cut);
            return finish(cands_, true, true);
        }
    }
}

// Min-p alone: the kept set is every token within log(min_p) of the maximum.
int32_t Sampler::sample_min_p_scan() {
    const float max = *std::max_element(work_.begin(), work_.end());
    const float cut = max + std::log(params_.min_p);
    cands_.clear();
    for (size_t i = 0; i < work_.size(); ++i) {
        if (work_[i] >= cut) cands_.push_back({work_[i], static_cast<int32_t>(i)});
    }
    std::sort(cands_.begin(), cands_.end(), before<Cand>);
    return finish(cands_, true, true);
}

int32_t Sampler::sample(std::span<const float> logits, bool force_full) {
    apply_penalties(logits);
    const size_t n = work_.size();
    if (force_full) {
        last_path_ = Path::Full;
        return sample_full();
    }
    if (params_.temperature == 0.0f) {
        // Top-k/top-p/min-p always keep the best candidate, so greedy is the argmax.
        last_path_ = Path::Greedy;
        size_t best = 0;
        for (size_t i = 1; i < n; ++i) {
            if (work_[i] > work_[best]) best = i;
        }
        return static_cast<int32_t>(best);
    }
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
        last_path_ = Path::TopK;
        // One pass keeping the best k in a heap whose top is the worst kept candidate; most
        // tokens lose a single comparison against it.
        const auto k = static_cast<size_t>(params_.top_k);
        cands_.clear();
        for (size_t i = 0; i < k; ++i) cands_.push_back({work_[i], static_cast<int32_t>(i)});
        std::make_heap(cands_.begin(), cands_.end(), before<Cand>);
        for (size_t i = k; i < n; ++i) {
            const Cand c{work_[i], static_cast<int32_t>(i)};
            if (before(c, cands_.front())) {
                std::pop_heap(cands_.begin(), cands_.end(), before<Cand>);
                cands_.back() = c;
                std::push_heap(cands_.begin(), cands_.end(), before<Cand>);
            }
        }
        std::sort(cands_.begin(), cands_.end(), before<Cand>);
        return finish(cands_, true, false);
    }
    if (params_.top_p < 1.0f) {
        last_path_ = Path::TopP;
        return sample_top_p_proven();
    }
    if (params_.min_p > 0.0f) {
        last_path_ = Path::MinP;
        return sample_min_p_scan();
    }
    last_path_ = Path::Full;
    return sample_full();
}

}  // namespace gj::sample
