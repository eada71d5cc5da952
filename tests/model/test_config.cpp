// gemma4::Config: presets carry the released models' per-layer structure; tiny presets keep each
// feature; from_gguf reads synthetic files back and rejects bad files with a ConfigError naming
// the key or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/gemma4_tensors.h"
#include "engine/model/synth.h"
#include "tests/support/test_env.h"

using gj::gemma4::Config;
using gj::gemma4::ConfigError;

namespace {

std::vector<int> global_layers(const Config& c) {
    std::vector<int> g;
    for (int l = 0; l < c.n_layers; ++l)
        if (!c.layers[l].sliding) g.push_back(l);
    return g;
}

void expect_donors(const Config& c, int sliding_donor, int global_donor) {
    for (int l = 0; l < c.n_layers; ++l) {
        const auto& lc = c.layers[l];
        if (l < c.first_shared_layer()) {
            EXPECT_TRUE(lc.has_kv) << l;
            EXPECT_EQ(lc.kv_source, l) << l;
        } else {
            EXPECT_FALSE(lc.has_kv) << l;
            EXPECT_EQ(lc.kv_source, lc.sliding ? sliding_donor : global_donor) << "layer " << l;
        }
    }
}

}  // namespace

TEST(ConfigPresets, E4B) {
    Config c = Config::preset("e4b");
    EXPECT_EQ(c.n_layers, 42);
    EXPECT_EQ(c.d_model, 2560);
    EXPECT_EQ(global_layers(c), (std::vector<int>{5, 11, 17, 23, 29, 35, 41}));
    EXPECT_EQ(c.first_shared_layer(), 24);
    expect_donors(c, 22, 23);
    EXPECT_EQ(c.ple_dim, 256);
    for (const auto& l : c.layers) {
        EXPECT_EQ(l.n_kv_heads, 2);
        EXPECT_EQ(l.ffn_dim, 10240);
        EXPECT_EQ(l.head_dim, l.sliding ? 256 : 512);
        EXPECT_EQ(l.rope_pairs, l.sliding ? 128 : 64);
        EXPECT_FLOAT_EQ(l.rope_base, l.sliding ? 1e4f : 1e6f);
    }
    EXPECT_EQ(c.q_dim(5), 4096);
    EXPECT_EQ(c.kv_dim(0), 512);
    EXPECT_EQ(c.kv_dim(5), 1024);
    EXPECT_FLOAT_EQ(c.embed_scale(), std::sqrt(2560.0f));
}

TEST(ConfigPresets, E2BDoubleWideMlpOnSharedLayers) {
    Config c = Config::preset("e2b");
    EXPECT_EQ(c.n_layers, 35);
    EXPECT_EQ(global_layers(c), (std::vector<int>{4, 9, 14, 19, 24, 29, 34}));
    EXPECT_EQ(c.first_shared_layer(), 15);
    expect_donors(c, 13, 14);
    for (int l = 0; l < 35; ++l) {
        EXPECT_EQ(c.layers[l].ffn_dim, l < 15 ? 6144 : 12288) << l;
        EXPECT_EQ(c.layers[l].n_kv_heads, 1);
    }
}

TEST(ConfigPresets, KeqvModelsHaveArrayKvHeadsAndNoVOnGlobals) {
    struct Want {
        const char* name;
        int layers, kv_swa, kv_global;
    };
    for (Want w : {Want{"12b", 48, 8, 1}, Want{"26b-a4b", 30, 8, 2}, Want{"31b", 60, 16, 4}}) {
        Config c = Config::preset(w.name);
        EXPECT_EQ(c.n_layers, w.layers) << w.name;
        EXPECT_EQ(c.n_kv_shared_layers, 0);
        EXPECT_EQ(c.ple_dim, 0);
        for (int l = 0; l < c.n_layers; ++l) {
            const auto& lc = c.layers[l];
            EXPECT_EQ(lc.sliding, (l + 1) % 6 != 0) << w.name << " layer " << l;
            EXPECT_EQ(lc.n_kv_heads, lc.sliding ? w.kv_swa : w.kv_global) << w.name << " " << l;
            EXPECT_EQ(lc.has_v_proj, lc.sliding) << w.name << " " << l;
        }
    }
    Config moe = Config::preset("26b-a4b");
    EXPECT_TRUE(moe.is_moe());
    EXPECT_EQ(moe.n_experts, 128);
    EXPECT_EQ(moe.n_experts_used, 8);
    EXPECT_EQ(moe.expert_ffn_dim, 704);
    EXPECT_EQ(moe.layers[0].ffn_dim, 2112);
    EXPECT_EQ(Config::preset("31b").q_dim(5), 16384);
}

TEST(ConfigPresets, TinyDonorsAreTypeMatchedNotLlamaCppOffsets) {
    Config c = Config::preset("tiny");
    // s s g s s g s g, first shared layer 5.
    EXPECT_EQ(global_layers(c), (std::vector<int>{2, 5, 7}));
    EXPECT_EQ(c.first_shared_layer(), 5);
    expect_donors(c, 4, 2);
    // llama.cpp's fixed offsets (first_shared - 2 / - 1) would pick 3 and 4: both wrong here.
    EXPECT_NE(c.layers[6].kv_source, c.first_shared_layer() - 2);
    EXPECT_NE(c.layers[5].kv_source, c.first_shared_layer() - 1);
    EXPECT_GT(c.ple_dim, 0);
    EXPECT_EQ(c.layers[2].rope_pairs, 8);  // int(0.25 * 64 / 2)
    EXPECT_EQ(c.layers[0].rope_pairs, 16);
}

TEST(ConfigPresets, TinyVariantsKeepTheirFeature) {
    Config e2b = Config::preset("tiny-e2b");
    expect_donors(e2b, 2, 3);
    for (int l = 0; l < e2b.n_layers; ++l)
        EXPECT_EQ(e2b.layers[l].ffn_dim, l < e2b.first_shared_layer() ? 128 : 256) << l;

    Config keqv = Config::preset("tiny-keqv");
    bool saw_global = false;
    for (const auto& l : keqv.layers) {
        EXPECT_EQ(l.n_kv_heads, l.sliding ? 4 : 1);
        EXPECT_EQ(l.has_v_proj, l.sliding);
        saw_global |= !l.sliding;
    }
    EXPECT_TRUE(saw_global);
    EXPECT_EQ(keqv.vocab_size % 1024, 256);

    Config moe = Config::preset("tiny-moe");
    EXPECT_TRUE(moe.is_moe());
    EXPECT_EQ(moe.n_experts, 16);
    EXPECT_EQ(moe.n_experts_used, 4);
    EXPECT_NE(moe.layers[0].ffn_dim % 256, 0);  // like the 26B's 2112
}

TEST(ConfigPresets, EveryPresetValidatesAndSummarizes) {
    for (const auto& name : Config::preset_names()) {
        Config c = Config::preset(name);
        EXPECT_NO_THROW(c.validate()) << name;
        EXPECT_NE(c.summary().find(name), std::string::npos);
        EXPECT_FALSE(c.layers.back().sliding) << name << ": the last layer must be global (HF)";
    }
}

TEST(ConfigPresets, UnknownPresetNamesTheKnownOnes) {
    try {
        Config::preset("e3b");
        FAIL() << "no exception";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("e3b"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("e4b"), std::string::npos);
    }
}

TEST(ConfigPresets, FirstLayersKeepsDonorsAndShrinksSharedTail) {
    Config c = Config::preset("e4b").first_layers(30);
    EXPECT_EQ(c.n_layers, 30);
    EXPECT_EQ(c.first_shared_layer(), 24);
    expect_donors(c, 22, 23);
    Config d = Config::preset("e4b").first_layers(4);
    EXPECT_EQ(d.n_kv_shared_layers, 0);
    EXPECT_THROW(Config::preset("e4b").first_layers(43), ConfigError);
    EXPECT_THROW(Config::preset("e4b").first_layers(0), ConfigError);
}

// ---------------------------------------------------------------------------------------------
// from_gguf on synthetic files and on corrupted copies of them.

namespace {

// Copies `src` to `dst`, letting `edit_meta` change metadata and `edit_tensor` change tensor
// declarations (name, type, dims); tensors whose declaration changed get zero payloads.
struct TensorDecl {
    std::string name;
    gj::ggml::Type type;
    std::vector<uint64_t> dims;
    bool keep = true;
};

void rewrite(
    const std::filesystem::path& src, const std::filesystem::path& dst,
    const std::function<void(std::map<std::string, gj::gguf::Value, std::less<>>&)>& edit_meta,
    const std::function<void(TensorDecl&)>& edit_tensor) {
    auto f = gj::gguf::File::open(src);
    auto meta = f->metadata();
    if (edit_meta) edit_meta(meta);
    gj::gguf::Writer w;
    for (auto& [k, v] : meta) w.set(k, v);
    std::vector<std::pair<TensorDecl, const gj::gguf::TensorInfo*>> decls;
    for (const auto& t : f->tensors()) {
        TensorDecl d{t.name, t.type, t.dims};
        if (edit_tensor) edit_tensor(d);
        if (!d.keep) continue;
        w.add_tensor(d.name, d.type, d.dims);
        decls.push_back({d, &t});
    }
    w.begin(dst);
    for (const auto& [d, t] : decls) {
        if (d.type == t->type && d.dims == t->dims) {
            w.write_tensor_data(d.name, {t->data, t->n_bytes});
        } else {
            uint64_t n = 1;
            for (auto x : d.dims) n *= x;
            std::vector<uint8_t> zeros(*gj::ggml::row_bytes(d.type, d.dims[0]) * (n / d.dims[0]));
            w.write_tensor_data(d.name, zeros);
        }
    }
    w.finish();
}

std::string config_error(const std::filesystem::path& p) {
    auto f = gj::gguf::File::open(p);
    try {
        Config::from_gguf(*f);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "(no ConfigError)";
}

class FromGguf : public ::testing::Test {
  protected:
    void SetUp() override {
        gj::synth::Options o;
        o.variant = "tiny-keqv";
        o.wtype = gj::ggml::Type::F32;
        o.threads = 2;
        gj::synth::write_model(o, model());
    }
    std::filesystem::path model() const { return dir_.path() / "tiny-keqv.gguf"; }
    std::filesystem::path bad() const { return dir_.path() / "bad.gguf"; }
    gj::test::ScratchDir dir_{"config"};
};

}  // namespace

TEST(ConfigFromGguf, EveryTinyPresetRoundTrips) {
    gj::test::ScratchDir dir("config-rt");
    for (const auto& name : Config::preset_names()) {
        if (!name.starts_with("tiny")) continue;
        gj::synth::Options o;
        o.variant = name;
        o.threads = 2;
        const auto path = dir.path() / (name + ".gguf");
        gj::synth::write_model(o, path);
        auto f = gj::gguf::File::open(path);
        Config got = Config::from_gguf(*f);
        Config want = Config::preset(name);
        EXPECT_EQ(got.n_layers, want.n_layers) << name;
        EXPECT_EQ(got.d_model, want.d_model);
        EXPECT_EQ(got.n_heads, want.n_heads);
        EXPECT_EQ(got.vocab_size, want.vocab_size);
        EXPECT_EQ(got.sliding_window, want.sliding_window);
        EXPECT_EQ(got.ple_dim, want.ple_dim);
        EXPECT_EQ(got.n_kv_shared_layers, want.n_kv_shared_layers);
        EXPECT_EQ(got.n_experts, want.n_experts);
        EXPECT_EQ(got.n_experts_used, want.n_experts_used);
        EXPECT_EQ(got.expert_ffn_dim, want.expert_ffn_dim);
        EXPECT_FLOAT_EQ(got.final_softcap, 30.0f);
        for (int l = 0; l < want.n_layers; ++l) {
            const auto &a = got.layers[l], &b = want.layers[l];
            EXPECT_EQ(a.sliding, b.sliding) << name << " layer " << l;
            EXPECT_EQ(a.head_dim, b.head_dim) << name << " layer " << l;
            EXPECT_EQ(a.n_kv_heads, b.n_kv_heads) << name << " layer " << l;
            EXPECT_EQ(a.ffn_dim, b.ffn_dim) << name << " layer " << l;
            EXPECT_EQ(a.has_kv, b.has_kv) << name << " layer " << l;
            EXPECT_EQ(a.kv_source, b.kv_source) << name << " layer " << l;
            EXPECT_EQ(a.has_v_proj, b.has_v_proj) << name << " layer " << l;
            EXPECT_EQ(a.rope_pairs, b.rope_pairs) << name << " layer " << l;
            EXPECT_FLOAT_EQ(a.rope_base, b.rope_base) << name << " layer " << l;
        }
    }
}

TEST_F(FromGguf, MissingKeyIsNamed) {
    rewrite(
        model(), bad(), [](auto& m) { m.erase("gemma4.attention.sliding_window"); }, nullptr);
    EXPECT_NE(config_error(bad()).find("missing metadata key gemma4.attention.sliding_window"),
              std::string::npos)
        << config_error(bad());
}

TEST_F(FromGguf, WrongArchitectureIsNamed) {
    rewrite(
        model(), bad(),
        [](auto& m) { m["general.architecture"] = gj::gguf::Value::make_string("llama"); },
        nullptr);
    const std::string e = config_error(bad());
    EXPECT_NE(e.find("general.architecture is 'llama'"), std::string::npos) << e;
}

TEST_F(FromGguf, WrongTensorShapeIsNamed) {
    rewrite(model(), bad(), nullptr, [](TensorDecl& d) {
        if (d.name == "blk.0.attn_k.weight") d.dims[1] = 64;
    });
    const std::string e = config_error(bad());
    EXPECT_NE(e.find("tensor blk.0.attn_k.weight has shape {128, 64}, expected {128, 128}"),
              std::string::npos)
        << e;
}

TEST_F(FromGguf, MissingTensorIsNamed) {
    rewrite(model(), bad(), nullptr, [](TensorDecl& d) {
        if (d.name == "blk.2.ffn_down.weight") d.keep = false;
    });
    const std::string e = config_error(bad());
    EXPECT_NE(e.find("missing tensor blk.2.ffn_down.weight"), std::string::npos) << e;
}

TEST_F(FromGguf, UnsupportedTensorTypeIsNamed) {
    rewrite(model(), bad(), nullptr, [](TensorDecl& d) {
        if (d.name == "blk.1.ffn_up.weight") d.type = gj::ggml::Type::Q8_1;
    });
    const std::string e = config_error(bad());
    EXPECT_NE(e.find("tensor blk.1.ffn_up.weight has type q8_1"), std::string::npos) << e;
}

TEST_F(FromGguf, PerLayerArrayOfWrongLengthIsNamed) {
    rewrite(
        model(), bad(),
        [](auto& m) {
            using gj::gguf::Value;
            m["gemma4.attention.head_count_kv"] = Value::make_array(
                gj::gguf::ValueType::UINT32, {Value::make_u32(4), Value::make_u32(1)});
        },
        nullptr);
    const std::string e = config_error(bad());
    EXPECT_NE(e.find("gemma4.attention.head_count_kv has 2 entries"), std::string::npos) << e;
}

TEST_F(FromGguf, KeqvFollowsTheMissingVProjection) {
    // Adding nothing but dropping layer 1's attn_v turns that sliding layer into a k_eq_v layer.
    rewrite(model(), bad(), nullptr, [](TensorDecl& d) {
        if (d.name == "blk.1.attn_v.weight") d.keep = false;
    });
    auto f = gj::gguf::File::open(bad());
    Config c = Config::from_gguf(*f);
    EXPECT_FALSE(c.layers[1].has_v_proj);
    EXPECT_TRUE(c.layers[0].has_v_proj);
}

// Settings that only enter arithmetic are checked too: NaN, an infinity or a non-positive value
// would otherwise load silently and make every logit NaN. The error names the GGUF key.
TEST_F(FromGguf, NonFiniteOrNonPositiveSettingsAreNamed) {
    using gj::gguf::Value;
    struct Case {
        std::string key;
        Value value;
    };
    const float nan = std::nanf("");
    const std::vector<Case> cases = {
        {"gemma4.attention.layer_norm_rms_epsilon", Value::make_f32(nan)},
        {"gemma4.attention.layer_norm_rms_epsilon", Value::make_f32(-1.0f)},
        {"gemma4.attention.layer_norm_rms_epsilon", Value::make_f32(0.0f)},
        {"gemma4.rope.freq_base", Value::make_f32(nan)},
        {"gemma4.rope.freq_base", Value::make_f32(0.0f)},
        {"gemma4.rope.freq_base", Value::make_f32(INFINITY)},
        {"gemma4.rope.freq_base_swa", Value::make_f32(-10000.0f)},
        {"gemma4.context_length", Value::make_u32(0)},
        {"gemma4.final_logit_softcapping", Value::make_f32(INFINITY)},
        {"gemma4.final_logit_softcapping", Value::make_f32(nan)},
    };
    for (const auto& c : cases) {
        rewrite(
            model(), bad(), [&](auto& m) { m[c.key] = c.value; }, nullptr);
        const std::string e = config_error(bad());
        EXPECT_NE(e.find(c.key), std::string::npos) << e;
        EXPECT_NE(e.find("bad.gguf"), std::string::npos) << e;
    }
    // A softcap of 0 is a valid "no softcap".
    rewrite(
        model(), bad(),
        [](auto& m) { m["gemma4.final_logit_softcapping"] = gj::gguf::Value::make_f32(0.0f); },
        nullptr);
    EXPECT_EQ(config_error(bad()), "(no ConfigError)");
}
