// The CPU reference forward against golden logits from Hugging Face transformers' gemma4
// implementation (tools/golden_logits.py, fp32, eager attention), for every tiny preset.
// Each golden records how its model was synthesized; the test synthesizes the same file,
// checks its weights are byte-identical (FNV-1a of the tensor data) and requires at every position
// the same argmax and max |delta logit| <= 1e-3 * max |logit| (fp32 vs fp32 in different summation
// orders: ~1e-5 relative is expected).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/cpu/cpu_forward.h"
#include "engine/gguf/reader.h"
#include "engine/model/synth.h"
#include "tests/support/test_env.h"

namespace {

// FNV-1a 64 of the tensor data section (weights only: tokenizer metadata may evolve).
uint64_t fnv1a_tensor_data(const std::filesystem::path& p) {
    const uint64_t start = gj::gguf::File::open(p)->data_offset();
    std::ifstream in(p, std::ios::binary);
    in.seekg(std::streamoff(start));
    uint64_t h = 0xcbf29ce484222325ull;
    std::vector<char> buf(1 << 16);
    while (in) {
        in.read(buf.data(), std::streamsize(buf.size()));
        for (std::streamsize i = 0; i < in.gcount(); ++i)
            h = (h ^ uint8_t(buf[size_t(i)])) * 0x100000001b3ull;
    }
    return h;
}

std::vector<float> read_f32(const std::filesystem::path& p, size_t n) {
    std::ifstream in(p, std::ios::binary);
    std::vector<float> v(n);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(float)));
    if (size_t(in.gcount()) != n * sizeof(float))
        throw std::runtime_error("short golden logits file " + p.string());
    return v;
}

class Golden : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Golden, CpuForwardMatchesTransformers) {
    const auto dir = gj::test::data_dir() / "golden";
    const auto json_path = dir / (GetParam() + ".json");
    std::ifstream jf(json_path);
    ASSERT_TRUE(jf) << "missing " << json_path
                    << ": generate it with tools/golden_logits.py (see its header)";
    const nlohmann::json g = nlohmann::json::parse(jf);

    gj::synth::Options o;
    o.variant = g.at("variant").get<std::string>();
    o.wtype = *gj::ggml::type_from_name(g.at("wtype").get<std::string>());
    o.seed = g.at("seed").get<uint64_t>();
    o.threads = 2;
    gj::test::ScratchDir scratch("golden");
    const auto model_path = scratch.path() / "model.gguf";
    gj::synth::write_model(o, model_path);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a_tensor_data(model_path));
    ASSERT_EQ(std::string(hash), g.at("tensor_data_fnv1a64").get<std::string>())
        << "the synthetic model differs from the one the golden logits were computed on "
           "(synth or the GGUF writer changed): regenerate tests/data/golden with "
           "tools/golden_logits.py";

    gj::gemma4::CpuOptions co;
    co.threads = 2;
    auto model = gj::gemma4::CpuModel::load(model_path, co);
    const auto tokens = g.at("tokens").get<std::vector<int32_t>>();
    const size_t V = g.at("vocab_size").get<size_t>();
    const size_t T = tokens.size();
    ASSERT_EQ(size_t(model->config().vocab_size), V);
    ASSERT_GT(T, size_t(2 * model->config().sliding_window)) << "goldens must span the window";
    const std::vector<float> want = read_f32(dir / g.at("logits_file").get<std::string>(), T * V);

    gj::gemma4::CpuSession session(*model);
    const std::vector<float> got = session.prefill(tokens);
    ASSERT_EQ(got.size(), T * V);

    double worst_rel = 0;
    for (size_t t = 0; t < T; ++t) {
        const float* a = &got[t * V];
        const float* b = &want[t * V];
        size_t arg_a = 0, arg_b = 0;
        float max_abs = 0, max_diff = 0;
        for (size_t v = 0; v < V; ++v) {
            if (a[v] > a[arg_a]) arg_a = v;
            if (b[v] > b[arg_b]) arg_b = v;
            max_abs = std::max(max_abs, std::fabs(b[v]));
            max_diff = std::max(max_diff, std::fabs(a[v] - b[v]));
        }
        EXPECT_EQ(arg_a, arg_b) << GetParam() << " position " << t;
        EXPECT_LE(max_diff, 1e-3f * max_abs) << GetParam() << " position " << t << ": max |delta| "
                                             << max_diff << " vs max |logit| " << max_abs;
        worst_rel = std::max(worst_rel, double(max_diff) / max_abs);
    }
    RecordProperty("worst_relative_delta", std::to_string(worst_rel));
    std::printf("%s: %zu positions, worst max|delta|/max|logit| = %.3g\n", GetParam().c_str(), T,
                worst_rel);
}

INSTANTIATE_TEST_SUITE_P(AllTiny, Golden,
                         ::testing::Values("tiny", "tiny-e2b", "tiny-keqv", "tiny-moe"),
                         [](const auto& info) {
                             std::string n = info.param;
                             for (char& ch : n)
                                 if (ch == '-') ch = '_';
                             return n;
                         });
