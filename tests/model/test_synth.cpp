// Synthetic-model writer: deterministic per seed (and independent of the thread count), llama.cpp
// tensor conventions (names, dims, F32 norms, BF16 per_layer_model_proj, no attn_v on k_eq_v
// layers, no K/V on shared layers), well-conditioned value scales, every weight type.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/gguf/dequant.h"
#include "engine/gguf/reader.h"
#include "engine/model/gemma4_tensors.h"
#include "engine/model/synth.h"
#include "engine/text/tokenizer_data.h"
#include "tests/support/test_env.h"

using gj::ggml::Type;

namespace {

std::vector<char> read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

std::filesystem::path write(const gj::test::ScratchDir& dir, const std::string& file,
                            const std::string& variant, Type wtype, uint64_t seed, int threads) {
    gj::synth::Options o;
    o.variant = variant;
    o.wtype = wtype;
    o.seed = seed;
    o.threads = threads;
    const auto path = dir.path() / file;
    gj::synth::write_model(o, path);
    return path;
}

struct Stats {
    double mean = 0, sd = 0;
};
Stats stats(const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    Stats r;
    r.mean = s / v.size();
    r.sd = std::sqrt(std::max(0.0, s2 / v.size() - r.mean * r.mean));
    return r;
}

}  // namespace

TEST(Synth, DeterministicPerSeedAndIndependentOfThreads) {
    gj::test::ScratchDir dir("synth-det");
    const auto a = write(dir, "a.gguf", "tiny-moe", Type::Q8_0, 7, 1);
    const auto b = write(dir, "b.gguf", "tiny-moe", Type::Q8_0, 7, 3);
    const auto c = write(dir, "c.gguf", "tiny-moe", Type::Q8_0, 8, 2);
    EXPECT_EQ(read_all(a), read_all(b));
    EXPECT_NE(read_all(a), read_all(c));
    // A different seed changes every weight tensor, not just a few bytes.
    auto fa = gj::gguf::File::open(a), fc = gj::gguf::File::open(c);
    const auto& ta = fa->tensor("blk.0.ffn_gate.weight");
    const auto& tc = fc->tensor("blk.0.ffn_gate.weight");
    EXPECT_NE(std::vector<uint8_t>(ta.data, ta.data + ta.n_bytes),
              std::vector<uint8_t>(tc.data, tc.data + tc.n_bytes));
}

TEST(Synth, TensorTableFollowsLlamaCppConventions) {
    gj::test::ScratchDir dir("synth-table");
    for (const std::string variant : {"tiny", "tiny-keqv", "tiny-moe"}) {
        const auto path = write(dir, variant + ".gguf", variant, Type::Q8_0, 1, 2);
        auto f = gj::gguf::File::open(path);
        gj::synth::Options opts;
        opts.variant = variant;
        const auto cfg = gj::synth::config_for(opts);
        const auto specs = gj::gemma4::expected_tensors(cfg);
        EXPECT_EQ(f->tensors().size(), specs.size()) << variant;
        for (const auto& spec : specs) {
            const auto* t = f->find_tensor(spec.name);
            ASSERT_NE(t, nullptr) << spec.name;
            EXPECT_EQ(t->dims, spec.dims) << spec.name;
            EXPECT_EQ(t->type, gj::synth::tensor_type(spec.role, Type::Q8_0)) << spec.name;
            if (spec.dims.size() == 1) {
                EXPECT_EQ(t->type, Type::F32) << spec.name;
            }
        }
        for (int l = 0; l < cfg.n_layers; ++l) {
            const auto& lc = cfg.layers[l];
            const bool has_v = f->find_tensor(gj::gemma4::layer_tensor_name(l, "attn_v.weight"));
            const bool has_k = f->find_tensor(gj::gemma4::layer_tensor_name(l, "attn_k.weight"));
            EXPECT_EQ(has_k, lc.has_kv) << variant << " layer " << l;
            EXPECT_EQ(has_v, lc.has_kv && lc.has_v_proj) << variant << " layer " << l;
        }
        EXPECT_EQ(f->get_string("general.architecture"), "gemma4");
        EXPECT_EQ(f->get_u64("general.file_type"), 7u);  // MOSTLY_Q8_0
        EXPECT_EQ(gj::tok::read_vocab(*f).tokens.size(), size_t(cfg.vocab_size));
    }
    // PLE: the model projection stays BF16, the per-layer projections F32 (real E4B Q8_0 file).
    auto f = gj::gguf::File::open(dir.path() / "tiny.gguf");
    EXPECT_EQ(f->tensor("per_layer_model_proj.weight").type, Type::BF16);
    EXPECT_EQ(f->tensor("blk.0.inp_gate.weight").type, Type::F32);
    EXPECT_EQ(f->tensor("per_layer_token_embd.weight").type, Type::Q8_0);
    // MoE router stays F32; fused experts {d, 2F, E}.
    auto m = gj::gguf::File::open(dir.path() / "tiny-moe.gguf");
    EXPECT_EQ(m->tensor("blk.0.ffn_gate_inp.weight").type, Type::F32);
    EXPECT_EQ(m->tensor("blk.0.ffn_gate_up_exps.weight").dims,
              (std::vector<uint64_t>{128, 128, 16}));
}

TEST(Synth, ValuesAreWellConditioned) {
    gj::test::ScratchDir dir("synth-values");
    const auto path = write(dir, "tiny.gguf", "tiny", Type::F32, 1, 2);
    auto f = gj::gguf::File::open(path);
    auto vals = [&](const std::string& name) {
        return gj::ggml::dequantize_tensor(f->tensor(name));
    };

    const Stats q = stats(vals("blk.0.attn_q.weight"));  // fan_in 128
    EXPECT_NEAR(q.mean, 0.0, 0.01);
    EXPECT_NEAR(q.sd, 1.0 / std::sqrt(128.0), 0.01);
    const Stats down = stats(vals("blk.0.ffn_down.weight"));  // fan_in 256
    EXPECT_NEAR(down.sd, 1.0 / 16.0, 0.005);
    const Stats emb = stats(vals("token_embd.weight"));
    EXPECT_NEAR(emb.sd, 2.0 / std::sqrt(128.0), 0.01);
    const Stats qn = stats(vals("blk.0.attn_q_norm.weight"));
    EXPECT_NEAR(qn.mean, 0.25, 0.02);
    const Stats n = stats(vals("blk.0.attn_norm.weight"));
    EXPECT_NEAR(n.mean, 1.0, 0.05);
    EXPECT_NEAR(n.sd, 0.1, 0.03);
    const float s = vals("blk.0.layer_output_scale.weight").at(0);
    EXPECT_GE(s, 0.6f);
    EXPECT_LE(s, 1.0f);
    // rope_freqs: the 8 rotated pairs of the 64-wide global head, then identity.
    const auto rf = vals("rope_freqs.weight");
    ASSERT_EQ(rf.size(), 32u);
    for (size_t j = 0; j < rf.size(); ++j) EXPECT_EQ(rf[j], j < 8 ? 1.0f : 1e30f) << j;
}

TEST(Synth, EveryWeightTypeLoads) {
    gj::test::ScratchDir dir("synth-types");
    for (Type t : {Type::Q8_0, Type::Q4_0, Type::BF16, Type::F16, Type::F32}) {
        const auto path = write(dir, gj::ggml::type_name(t) + ".gguf", "tiny-e2b", t, 1, 2);
        auto f = gj::gguf::File::open(path);
        EXPECT_EQ(f->tensor("blk.0.attn_q.weight").type, t);
        EXPECT_NO_THROW(gj::gemma4::Config::from_gguf(*f)) << gj::ggml::type_name(t);
    }
}

TEST(Synth, RejectsUnknownVariantAndUnsupportedType) {
    gj::test::ScratchDir dir("synth-bad");
    gj::synth::Options o;
    o.variant = "tiny-xl";
    EXPECT_THROW(gj::synth::write_model(o, dir.path() / "x.gguf"), gj::gemma4::ConfigError);
    o.variant = "tiny";
    o.wtype = Type::Q2_K;
    try {
        gj::synth::write_model(o, dir.path() / "x.gguf");
        FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos) << e.what();
    }
    o.mix = "q3_k_m";
    EXPECT_THROW(gj::synth::write_model(o, dir.path() / "x.gguf"), std::invalid_argument);
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "x.gguf"));
}

// A file may state a longer context than its preset (the GPU tests' long runs need more than the
// tiny presets' 4096); the loaded config reads it back.
TEST(Synth, StatesTheContextAskedFor) {
    gj::test::ScratchDir dir("synth-context");
    gj::synth::Options o;
    o.variant = "tiny";
    EXPECT_EQ(gj::synth::config_for(o).context_length, 4096);
    o.context = 8192;
    EXPECT_EQ(gj::synth::config_for(o).context_length, 8192);
    gj::synth::write_model(o, dir.path() / "long.gguf");
    auto f = gj::gguf::File::open(dir.path() / "long.gguf");
    EXPECT_EQ(gj::gemma4::Config::from_gguf(*f).context_length, 8192);
}

TEST(Synth, FirstLayersOfARealShape) {
    // Real E2B widths, two layers only (the PLE table and embeddings still have V = 262144
    // rows, so keep the type small): checks real-shape metadata without a multi-GB file.
    gj::synth::Options o;
    o.variant = "e2b";
    o.layers = 2;
    const auto cfg = gj::synth::config_for(o);
    EXPECT_EQ(cfg.n_layers, 2);
    EXPECT_EQ(cfg.d_model, 1536);
    EXPECT_EQ(cfg.n_kv_shared_layers, 0);
    const auto specs = gj::gemma4::expected_tensors(cfg);
    bool found = false;
    for (const auto& s : specs)
        if (s.name == "per_layer_token_embd.weight") {
            found = true;
            EXPECT_EQ(s.dims, (std::vector<uint64_t>{2 * 256, 262144}));
        }
    EXPECT_TRUE(found);
}
