#include "tests/support/gpu_forward_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/cpu/cpu_forward.h"
#include "engine/model/synth.h"
#include "jit/device.h"

namespace gj::test {

using gemma4::CpuModel;
using gemma4::CpuSession;
using gemma4::GpuModel;
using gemma4::GpuModelOptions;
using gemma4::GpuSession;
using gemma4::Readout;

std::vector<int32_t> test_tokens(int n, int vocab, uint32_t seed) {
    std::vector<int32_t> t = {2};
    uint32_t s = seed;
    while (int(t.size()) < n) {
        s = s * 1103515245u + 12345u;
        t.push_back(int32_t((s >> 8) % uint32_t(vocab)));
    }
    return t;
}

std::filesystem::path synth(const ScratchDir& dir, const std::string& variant, ggml::Type wtype,
                            int layers) {
    gj::synth::Options o;
    o.variant = variant;
    o.wtype = wtype;
    o.layers = layers;
    const auto path = dir.path() / (variant + "-" + ggml::type_name(wtype) + "-" +
                                    std::to_string(layers) + ".gguf");
    if (!std::filesystem::exists(path)) gj::synth::write_model(o, path);
    return path;
}

std::filesystem::path synth_mix(const ScratchDir& dir, const std::string& variant,
                                const std::string& mix, int layers) {
    gj::synth::Options o;
    o.variant = variant;
    o.mix = mix;
    o.layers = layers;
    const auto path = dir.path() / (variant + "-" + mix + "-" + std::to_string(layers) + ".gguf");
    if (!std::filesystem::exists(path)) gj::synth::write_model(o, path);
    return path;
}

jit::Flags flags(jit::EnvMap env) {
    return jit::Flags::parse(env);
}

std::unique_ptr<GpuModel> load_gpu(const std::filesystem::path& path, int context, int chunk,
                                   const jit::Flags& f, int sequences) {
    GpuModelOptions o;
    o.context = context;
    o.prefill_chunk = chunk;
    o.flags = &f;
    o.sequences = sequences;
    return GpuModel::load(path, o);
}

std::vector<float> cpu_logits(const std::filesystem::path& path,
                              const std::vector<int32_t>& tokens) {
    auto model = CpuModel::load(path);
    CpuSession s(*model);
    return s.prefill(tokens);
}

bool sm90() {
    return jit::Device::get().arch() == "sm_90";
}

int argmax(const float* row, int n) {
    return int(std::max_element(row, row + n) - row);
}

Agreement compare(const std::vector<float>& ref, const std::vector<float>& got, int V, float tol) {
    Agreement a;
    EXPECT_EQ(ref.size(), got.size());
    for (float v : ref) a.scale = std::max(a.scale, std::fabs(v));
    const int T = int(ref.size() / V);
    for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i) {
        if (!std::isfinite(got[i])) {
            ADD_FAILURE() << "non-finite logit at flat index " << i;
            return a;
        }
        a.max_diff = std::max(a.max_diff, std::fabs(ref[i] - got[i]));
    }
    for (int t = 0; t < T; ++t) {
        const float* r = ref.data() + size_t(t) * V;
        const int x = argmax(r, V), y = argmax(got.data() + size_t(t) * V, V);
        if (x == y) continue;
        if (r[x] - r[y] <= 2 * tol * a.scale)
            ++a.near_ties;
        else
            ++a.mismatches;
    }
    return a;
}

void expect_agree(const std::vector<float>& ref, const std::vector<float>& got, int V, float tol,
                  const std::string& what) {
    const Agreement a = compare(ref, got, V, tol);
    std::printf(
        "  %-48s max|diff| %.3g = %.3g of max|logit| %.3g; argmax: %d near ties, %d "
        "mismatches over %zu positions\n",
        what.c_str(), a.max_diff, a.scale > 0 ? a.max_diff / a.scale : 0.0, a.scale, a.near_ties,
        a.mismatches, ref.size() / V);
    EXPECT_LE(a.max_diff, tol * a.scale) << what;
    EXPECT_EQ(a.mismatches, 0) << what;
}

std::vector<float> decode_logits(GpuSession& s, const std::vector<int32_t>& tokens) {
    std::vector<float> out;
    auto first = s.prefill({tokens.data(), 1}, Readout::Logits);
    out.insert(out.end(), first.logits.begin(), first.logits.end());
    for (size_t i = 1; i < tokens.size(); ++i) {
        auto r = s.decode(tokens[i], Readout::Logits);
        out.insert(out.end(), r.logits.begin(), r.logits.end());
    }
    return out;
}

}  // namespace gj::test
