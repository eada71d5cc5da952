#include "engine/model/gemma4_config.h"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "engine/gguf/reader.h"
#include "engine/model/gemma4_tensors.h"

namespace gj::gemma4 {

namespace {

// ---------------------------------------------------------------------------------------------
// Per-layer derivations shared by presets and GGUF loading.

// Proportional RoPE (HF `_compute_proportional_rope_parameters`): int(factor * head_dim // 2)
// frequency pairs rotate; the exponent's denominator stays the full head dim.
int proportional_rope_pairs(int head_dim, float factor) {
    return int(std::floor(double(factor) * head_dim / 2.0));
}

// KV-shared layer l reads the cache of the last layer before first_shared whose attention type
// (sliding or global) is the same as l's. This is HF's rule (`store_full_length_kv`); llama.cpp's
// fixed offset (first_shared - 2 for sliding, - 1 for global) only coincides with it for the
// released E2B/E4B layouts.
void assign_kv_donors(Config& c) {
    const int first_shared = c.first_shared_layer();
    for (int l = 0; l < c.n_layers; ++l) {
        LayerConfig& lc = c.layers[l];
        lc.has_kv = l < first_shared;
        if (lc.has_kv) {
            lc.kv_source = l;
            continue;
        }
        lc.has_v_proj = false;
        lc.kv_source = -1;
        for (int j = first_shared - 1; j >= 0; --j) {
            if (c.layers[j].sliding == lc.sliding) {
                lc.kv_source = j;
                break;
            }
        }
        if (lc.kv_source < 0)
            throw ConfigError(fmt::format(
                "layer {} is KV-shared ({} trailing shared layers) but no earlier {} layer owns a "
                "KV cache it could read",
                l, c.n_kv_shared_layers, lc.sliding ? "sliding" : "global"));
    }
}

// ---------------------------------------------------------------------------------------------
// Presets.

struct PresetSpec {
    const char* name;
    int n_layers, d_model, n_heads;
    int kv_heads_swa, kv_heads_global;
    int head_dim_swa, head_dim_global;
    int ffn_dim;
    bool double_wide_shared_ffn;  // E2B: shared layers use 2 * ffn_dim
    int ple_dim, n_kv_shared;
    int window, global_period;  // layer i is global when (i + 1) % period == 0; last layer global
    int context_length, vocab_size;
    bool k_eq_v;  // global layers have no V projection
    int n_experts, n_experts_used, expert_ffn_dim;
};

// Real shapes of the released checkpoints (reference/gemma4-spec.md, section 1), then small
// presets that keep every structural feature at test size: sliding head dim 32 / global 64
// (4 rotated pairs of 32 ... 8 of 32 on globals by the same 0.25 rule), window 8.
constexpr PresetSpec kPresets[] = {
    // name     L   d     H  kvS kvG hdS  hdG  ffn    2x    P   shr W     per ctx     V       keqv E
    // k  Fe
    {"e2b", 35, 1536, 8, 1,      1,      256,   512, 6144, true,
     256,   20, 512,  5, 131072, 262144, false, 0,   0,    0},
    {"e4b", 42, 2560, 8, 2,      2,      256,   512, 10240, false,
     256,   18, 512,  6, 131072, 262144, false, 0,   0,     0},
    {"12b", 48, 3840, 16, 8,      1,      256,  512, 15360, false,
     0,     0,  1024, 6,  262144, 262144, true, 0,   0,     0},
    {"26b-a4b", 30, 2816, 16, 8,      2,      256,  512, 2112, false,
     0,         0,  1024, 6,  262144, 262144, true, 128, 8,    704},
    {"31b", 60, 5376, 32, 16,     4,      256,  512, 21504, false,
     0,     0,  1024, 6,  262144, 262144, true, 0,   0,     0},
    // tiny: PLE + KV sharing whose donors differ from llama.cpp's fixed offset (pattern
    // s s g s s | g s g, first shared layer 5: global donor 2, sliding donor 4), proportional RoPE.
    {"tiny", 8, 128, 4, 2, 2, 32, 64, 256, false, 32, 3, 8, 3, 4096, 1024, false, 0, 0, 0},
    // tiny-e2b: E2B structure: MQA, PLE, KV sharing (donors 2 and 3), double-wide MLP on the
    // shared layers.
    {"tiny-e2b", 8, 128, 4, 1, 1, 32, 64, 128, true, 32, 4, 8, 4, 4096, 1024, false, 0, 0, 0},
    // tiny-keqv: 12B/31B structure: array head_count_kv (4 sliding, 1 global), globals without
    // V projection, no PLE, vocab not a power of two.
    {"tiny-keqv", 8, 128, 8, 4, 1, 32, 64, 256, false, 0, 0, 8, 4, 4096, 1280, true, 0, 0, 0},
    // tiny-256: E4B structure (PLE, KV sharing, GQA) with every matrix width a multiple of 256,
    // so K-quant files (Q4_K_M, ...) keep their K-quants instead of the 32-block fallbacks.
    {"tiny-256", 6, 256, 8, 2, 1, 32, 64, 512, false, 256, 2, 8, 3, 4096, 1024, false, 0, 0, 0},
    // tiny-moe: 26B-A4B structure: k_eq_v, dense MLP 96 wide (not a multiple of 256, like 2112)
    // plus 16 routed experts of width 64, top-4.
    {"tiny-moe", 6, 128, 8, 4, 1, 32, 64, 96, false, 0, 0, 8, 3, 4096, 1024, true, 16, 4, 64},
};

Config build_preset(const PresetSpec& p) {
    Config c;
    c.name = p.name;
    c.n_layers = p.n_layers;
    c.d_model = p.d_model;
    c.n_heads = p.n_heads;
    c.vocab_size = p.vocab_size;
    c.context_length = p.context_length;
    c.sliding_window = p.window;
    c.ple_dim = p.ple_dim;
    c.n_kv_shared_layers = p.n_kv_shared;
    c.head_dim_global = p.head_dim_global;
    c.head_dim_swa = p.head_dim_swa;
    c.n_experts = p.n_experts;
    c.n_experts_used = p.n_experts_used;
    c.expert_ffn_dim = p.expert_ffn_dim;
    c.layers.resize(p.n_layers);
    const int first_shared = p.n_layers - p.n_kv_shared;
    for (int l = 0; l < p.n_layers; ++l) {
        LayerConfig& lc = c.layers[l];
        lc.sliding = (l + 1) % p.global_period != 0 && l != p.n_layers - 1;
        lc.head_dim = lc.sliding ? p.head_dim_swa : p.head_dim_global;
        lc.n_kv_heads = lc.sliding ? p.kv_heads_swa : p.kv_heads_global;
        lc.ffn_dim = p.ffn_dim * (p.double_wide_shared_ffn && l >= first_shared ? 2 : 1);
        lc.has_v_proj = !(p.k_eq_v && !lc.sliding);
        lc.rope_base = lc.sliding ? c.rope_base_swa : c.rope_base_global;
        lc.rope_pairs = lc.sliding ? lc.head_dim / 2
                                   : proportional_rope_pairs(lc.head_dim, c.rope_partial_factor);
    }
    assign_kv_donors(c);
    c.validate();
    return c;
}

// ---------------------------------------------------------------------------------------------
// GGUF metadata access with errors that name the file and key.

class MetaReader {
  public:
    explicit MetaReader(const gguf::File& f) : f_(f) {}

    [[noreturn]] void fail(const std::string& msg) const {
        throw ConfigError(fmt::format("{}: {}", f_.path().string(), msg));
    }

    const gguf::Value* find(const std::string& key) const { return f_.find(key); }

    const gguf::Value& require(const std::string& key) const {
        const gguf::Value* v = f_.find(key);
        if (!v) fail("missing metadata key " + key);
        return *v;
    }

    // Converts type errors (gguf::FormatError) into ConfigError naming the key.
    template <typename Fn>
    auto convert(const std::string& key, Fn fn) const {
        try {
            return fn();
        } catch (const gguf::FormatError& e) {
            fail(fmt::format("metadata key {}: {}", key, e.what()));
        }
    }

    int u32(const std::string& key) const {
        const gguf::Value& v = require(key);
        return checked_int(key, convert(key, [&] { return v.as_u64(key); }));
    }

    int u32_or(const std::string& key, int fallback) const {
        return find(key) ? u32(key) : fallback;
    }

    float f32_or(const std::string& key, float fallback) const {
        const gguf::Value* v = find(key);
        if (!v) return fallback;
        return float(convert(key, [&] { return v->as_f64(key); }));
    }

    // A u32 key that may instead hold one value per layer (head_count_kv, feed_forward_length).
    std::vector<int> u32_per_layer(const std::string& key, int n_layers) const {
        const gguf::Value& v = require(key);
        if (v.type != gguf::ValueType::ARRAY) {
            int x = checked_int(key, convert(key, [&] { return v.as_u64(key); }));
            return std::vector<int>(n_layers, x);
        }
        const auto& arr =
            convert(key, [&]() -> const std::vector<gguf::Value>& { return v.as_array(key); });
        if (int(arr.size()) != n_layers)
            fail(fmt::format("metadata key {} has {} entries, expected one per layer ({})", key,
                             arr.size(), n_layers));
        std::vector<int> out;
        for (const auto& e : arr)
            out.push_back(checked_int(key, convert(key, [&] { return e.as_u64(key); })));
        return out;
    }

    std::vector<bool> bool_per_layer(const std::string& key, int n_layers) const {
        const gguf::Value& v = require(key);
        if (v.type != gguf::ValueType::ARRAY)
            fail(
                fmt::format("metadata key {} must be a bool array (one entry per layer, true = "
                            "sliding), found {}",
                            key, gguf::value_type_name(v.type)));
        const auto& arr =
            convert(key, [&]() -> const std::vector<gguf::Value>& { return v.as_array(key); });
        if (int(arr.size()) != n_layers)
            fail(fmt::format("metadata key {} has {} entries, expected one per layer ({})", key,
                             arr.size(), n_layers));
        std::vector<bool> out;
        for (const auto& e : arr) out.push_back(convert(key, [&] { return e.as_bool(key); }));
        return out;
    }

  private:
    int checked_int(const std::string& key, uint64_t x) const {
        if (x > uint64_t(1) << 30)
            fail(fmt::format("metadata key {} = {} is out of range", key, x));
        return int(x);
    }
    const gguf::File& f_;
};

std::string dims_str(const std::vector<uint64_t>& dims) {
    std::string s = "{";
    for (size_t i = 0; i < dims.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", dims[i]);
    return s + "}";
}

bool is_float_type(ggml::Type t) {
    return t == ggml::Type::F32 || t == ggml::Type::F16 || t == ggml::Type::BF16;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

float Config::embed_scale() const {
    return std::sqrt(float(d_model));
}

std::vector<std::string> Config::preset_names() {
    std::vector<std::string> names;
    for (const auto& p : kPresets) names.push_back(p.name);
    return names;
}

Config Config::preset(std::string_view name) {
    for (const auto& p : kPresets)
        if (name == p.name) return build_preset(p);
    std::string known;
    for (const auto& n : preset_names()) known += fmt::format("{}{}", known.empty() ? "" : ", ", n);
    throw ConfigError(fmt::format("unknown model variant '{}' (known: {})", name, known));
}

Config Config::first_layers(int n) const {
    if (n < 1 || n > n_layers)
        throw ConfigError(
            fmt::format("cannot keep {} layers of {} ({} layers)", n, name, n_layers));
    if (n == n_layers) return *this;
    Config c = *this;
    c.name = fmt::format("{}-{}l", name, n);
    c.layers.resize(n);
    c.n_layers = n;
    c.n_kv_shared_layers = std::max(0, n - first_shared_layer());
    c.validate();
    return c;
}

void Config::validate() const {
    auto fail = [&](const std::string& msg) {
        throw ConfigError(fmt::format("model config {}: {}", name, msg));
    };
    if (n_layers < 1 || int(layers.size()) != n_layers)
        fail(fmt::format("{} layers declared, {} described", n_layers, layers.size()));
    if (d_model < 1 || n_heads < 1 || vocab_size < 1)
        fail("d_model, n_heads and vocab_size must be positive");
    if (n_kv_shared_layers < 0 || n_kv_shared_layers >= n_layers)
        fail(fmt::format("shared_kv_layers = {} must be in [0, {})", n_kv_shared_layers, n_layers));
    if (sliding_window < 1) fail("sliding window must be positive");
    // Settings that only ever enter arithmetic: a NaN, an infinity or a non-positive value here
    // would not fail anywhere, the forward pass would just produce NaN logits. The messages name
    // the GGUF keys the values are read from.
    if (context_length < 1)
        fail(fmt::format("context length (gemma4.context_length) {} must be positive",
                         context_length));
    auto require_positive = [&](float v, const char* what, const char* key) {
        if (!std::isfinite(v) || v <= 0.0f)
            fail(fmt::format("{} ({}) is {}; it must be a finite number > 0", what, key, v));
    };
    require_positive(rms_eps, "RMS norm epsilon", "gemma4.attention.layer_norm_rms_epsilon");
    require_positive(rope_base_global, "global RoPE base", "gemma4.rope.freq_base");
    require_positive(rope_base_swa, "sliding RoPE base", "gemma4.rope.freq_base_swa");
    if (!std::isfinite(final_softcap))  // <= 0 turns the cap off; infinity would give inf * 0
        fail(fmt::format(
            "final logit softcap (gemma4.final_logit_softcapping) is {}; it must be finite (0: "
            "no softcap)",
            final_softcap));
    if (ple_dim < 0) fail("PLE width must not be negative");
    if (is_moe() && (n_experts_used < 1 || n_experts_used > n_experts || expert_ffn_dim < 1))
        fail(
            fmt::format("MoE needs 1 <= experts used ({}) <= experts ({}) and an expert width ({})",
                        n_experts_used, n_experts, expert_ffn_dim));
    for (int l = 0; l < n_layers; ++l) {
        const LayerConfig& lc = layers[l];
        auto lfail = [&](const std::string& msg) { fail(fmt::format("layer {}: {}", l, msg)); };
        if (lc.head_dim < 2 || lc.head_dim % 2)
            lfail(fmt::format("head dim {} must be even", lc.head_dim));
        if (lc.head_dim != (lc.sliding ? head_dim_swa : head_dim_global))
            lfail(fmt::format("head dim {} differs from the {} head dim", lc.head_dim,
                              lc.sliding ? "sliding" : "global"));
        if (lc.n_kv_heads < 1 || n_heads % lc.n_kv_heads)
            lfail(fmt::format("{} KV heads do not divide {} query heads", lc.n_kv_heads, n_heads));
        if (lc.ffn_dim < 1) lfail("FFN width must be positive");
        if (lc.rope_pairs < 0 || lc.rope_pairs > lc.head_dim / 2)
            lfail(fmt::format("{} rotated RoPE pairs exceed head_dim/2", lc.rope_pairs));
        const bool own = l < first_shared_layer();
        if (lc.has_kv != own) lfail("has_kv disagrees with shared_kv_layers");
        if (own && lc.kv_source != l) lfail("a layer with its own KV must read its own cache");
        if (!own) {
            const int s = lc.kv_source;
            if (s < 0 || s >= first_shared_layer() || layers[s].sliding != lc.sliding ||
                layers[s].head_dim != lc.head_dim || layers[s].n_kv_heads != lc.n_kv_heads)
                lfail(
                    fmt::format("KV donor {} is not an earlier own-KV layer of the same shape", s));
        }
    }
}

std::string Config::summary() const {
    int n_global = 0, n_keqv = 0;
    for (const auto& l : layers) {
        n_global += !l.sliding;
        n_keqv += l.has_kv && !l.has_v_proj;
    }
    std::string s = fmt::format(
        "{}: {} layers ({} sliding, {} global), d={}, heads={}, head dim {} sliding / {} global, "
        "vocab {}, window {}, context {}",
        name, n_layers, n_layers - n_global, n_global, d_model, n_heads, head_dim_swa,
        head_dim_global, vocab_size, sliding_window, context_length);
    bool uniform_kv = true;
    for (const auto& l : layers) uniform_kv &= l.n_kv_heads == layers[0].n_kv_heads;
    if (uniform_kv) {
        s += fmt::format("; KV heads {}", layers[0].n_kv_heads);
    } else {
        std::string kv;
        for (int l = 0; l < n_layers; ++l)
            kv += fmt::format("{}{}", l ? "," : "", layers[l].n_kv_heads);
        s += fmt::format("; KV heads per layer [{}]", kv);
    }
    if (n_keqv) s += fmt::format("; {} k_eq_v layers", n_keqv);
    if (n_kv_shared_layers) {
        s += fmt::format("; last {} layers share KV (donors", n_kv_shared_layers);
        std::map<int, int> donors;
        for (int l = first_shared_layer(); l < n_layers; ++l) donors[layers[l].kv_source] = l;
        for (auto [donor, _] : donors)
            s += fmt::format(" {}({})", donor, layers[donor].sliding ? "sliding" : "global");
        s += ")";
    }
    int ffn_min = layers[0].ffn_dim, ffn_max = layers[0].ffn_dim;
    for (const auto& l : layers) {
        ffn_min = std::min(ffn_min, l.ffn_dim);
        ffn_max = std::max(ffn_max, l.ffn_dim);
    }
    s += ffn_min == ffn_max ? fmt::format("; FFN {}", ffn_min)
                            : fmt::format("; FFN {}..{}", ffn_min, ffn_max);
    if (has_ple()) s += fmt::format("; PLE width {}", ple_dim);
    if (is_moe())
        s += fmt::format("; MoE {} experts, top {}, expert FFN {}", n_experts, n_experts_used,
                         expert_ffn_dim);
    s += fmt::format("; RoPE base {:g} sliding", rope_base_swa);
    for (const auto& l : layers)
        if (!l.sliding) {
            s += fmt::format(" / {:g} global ({} of {} pairs rotate)", rope_base_global,
                             l.rope_pairs, head_dim_global / 2);
            break;
        }
    return s;
}

// ---------------------------------------------------------------------------------------------

Config Config::from_gguf(const gguf::File& file) {
    MetaReader m(file);
    const gguf::Value& arch_v = m.require("general.architecture");
    const std::string arch =
        m.convert("general.architecture", [&] { return arch_v.as_string("general.architecture"); });
    if (arch != "gemma4")
        m.fail(fmt::format("general.architecture is '{}', this engine runs only 'gemma4'", arch));
    const std::string p = "gemma4.";

    Config c;
    c.name = file.path().filename().string();
    if (const gguf::Value* v = m.find("general.name"); v && v->type == gguf::ValueType::STRING)
        c.name = v->as_string("general.name");
    c.n_layers = m.u32(p + "block_count");
    if (c.n_layers < 1) m.fail(p + "block_count must be at least 1");
    const int L = c.n_layers;
    c.d_model = m.u32(p + "embedding_length");
    c.n_heads = m.u32(p + "attention.head_count");
    c.context_length = m.u32_or(p + "context_length", 131072);
    c.sliding_window = m.u32(p + "attention.sliding_window");
    c.ple_dim = m.u32_or(p + "embedding_length_per_layer_input", 0);
    c.n_kv_shared_layers = m.u32_or(p + "attention.shared_kv_layers", 0);
    c.head_dim_global = m.u32(p + "attention.key_length");
    c.head_dim_swa = m.u32(p + "attention.key_length_swa");
    c.rms_eps = m.f32_or(p + "attention.layer_norm_rms_epsilon", 1e-6f);
    // Every Gemma 4 checkpoint caps logits at 30; a file without the key still means 30.
    c.final_softcap = m.f32_or(p + "final_logit_softcapping", 30.0f);
    c.rope_base_global = m.f32_or(p + "rope.freq_base", 1e6f);
    c.rope_base_swa = m.f32_or(p + "rope.freq_base_swa", 1e4f);
    if (m.u32_or(p + "attention.value_length", c.head_dim_global) != c.head_dim_global ||
        m.u32_or(p + "attention.value_length_swa", c.head_dim_swa) != c.head_dim_swa)
        m.fail(
            "Gemma 4 needs value_length == key_length (and the same for _swa); this file "
            "differs");
    if (m.u32_or(p + "rope.dimension_count", c.head_dim_global) != c.head_dim_global ||
        m.u32_or(p + "rope.dimension_count_swa", c.head_dim_swa) != c.head_dim_swa)
        m.fail(
            "unsupported rope.dimension_count(_swa): partial rotation is expressed through "
            "rope_freqs, the dimension counts must equal the head dims");
    if (m.find(p + "expert_count")) {
        c.n_experts = m.u32(p + "expert_count");
        if (c.n_experts > 0) {
            c.n_experts_used = m.u32(p + "expert_used_count");
            c.expert_ffn_dim = m.u32(p + "expert_feed_forward_length");
        }
    }
    if (c.n_kv_shared_layers >= L)
        m.fail(fmt::format("{}attention.shared_kv_layers = {} leaves no layer with its own KV", p,
                           c.n_kv_shared_layers));

    // The vocabulary is the embedding's row count; converters may trim it below vocab_size.
    const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
    if (!embd) m.fail("missing tensor token_embd.weight");
    if (embd->dims.size() != 2)
        m.fail("tensor token_embd.weight has shape " + dims_str(embd->dims) + ", expected {d, V}");
    if (embd->dims[1] < 1 || embd->dims[1] > (uint64_t(1) << 30))
        m.fail("tensor token_embd.weight has an implausible vocabulary size");
    c.vocab_size = int(embd->dims[1]);

    const std::vector<bool> sliding = m.bool_per_layer(p + "attention.sliding_window_pattern", L);
    const std::vector<int> kv_heads = m.u32_per_layer(p + "attention.head_count_kv", L);
    const std::vector<int> ffn = m.u32_per_layer(p + "feed_forward_length", L);

    // Proportional RoPE on global layers: read from rope_freqs when present (1.0 = rotate,
    // huge = identity), else HF's default partial_rotary_factor of 0.25.
    int global_pairs = proportional_rope_pairs(c.head_dim_global, c.rope_partial_factor);
    if (const gguf::TensorInfo* rf = file.find_tensor("rope_freqs.weight")) {
        if (rf->type != ggml::Type::F32 || rf->dims.size() != 1 ||
            rf->dims[0] != uint64_t(c.head_dim_global / 2))
            m.fail(fmt::format("tensor rope_freqs.weight must be F32 {{{}}}, found {} {}",
                               c.head_dim_global / 2, ggml::type_name(rf->type),
                               dims_str(rf->dims)));
        const float* f = reinterpret_cast<const float*>(rf->data);
        int n_one = 0;
        while (n_one < int(rf->dims[0]) && f[n_one] == 1.0f) ++n_one;
        for (int j = n_one; j < int(rf->dims[0]); ++j)
            if (!(f[j] >= 1e20f))
                m.fail(
                    fmt::format("unsupported rope_freqs.weight: entry {} is {} (only leading "
                                "1.0 entries followed by >= 1e20 entries are supported)",
                                j, f[j]));
        global_pairs = n_one;
        c.rope_partial_factor = float(2.0 * n_one / c.head_dim_global);
    }

    c.layers.resize(L);
    for (int l = 0; l < L; ++l) {
        LayerConfig& lc = c.layers[l];
        lc.sliding = sliding[l];
        lc.head_dim = lc.sliding ? c.head_dim_swa : c.head_dim_global;
        lc.n_kv_heads = kv_heads[l];
        lc.ffn_dim = ffn[l];
        lc.has_v_proj = file.find_tensor(layer_tensor_name(l, "attn_v.weight")) != nullptr;
        lc.rope_base = lc.sliding ? c.rope_base_swa : c.rope_base_global;
        lc.rope_pairs = lc.sliding ? lc.head_dim / 2 : global_pairs;
    }
    try {
        assign_kv_donors(c);
        c.validate();
    } catch (const ConfigError& e) {
        m.fail(e.what());
    }

    // Every tensor the config implies must be there with its exact shape and a type we can
    // dequantize. MoE files may split the fused gate/up experts into two tensors.
    for (const TensorSpec& spec : expected_tensors(c)) {
        const gguf::TensorInfo* t = file.find_tensor(spec.name);
        std::vector<TensorSpec> alternatives;
        if (!t && spec.name.ends_with("ffn_gate_up_exps.weight")) {
            const uint64_t half = spec.dims[1] / 2;
            for (const char* s : {"ffn_gate_exps.weight", "ffn_up_exps.weight"})
                alternatives.push_back({layer_tensor_name(spec.layer, s),
                                        {spec.dims[0], half, spec.dims[2]},
                                        spec.role,
                                        spec.layer});
        } else {
            alternatives.push_back(spec);
        }
        for (const TensorSpec& want : alternatives) {
            t = file.find_tensor(want.name);
            if (!t) {
                if (!want.required) continue;
                m.fail(fmt::format("missing tensor {} (expected shape {})", want.name,
                                   dims_str(want.dims)));
            }
            if (t->dims != want.dims)
                m.fail(fmt::format("tensor {} has shape {}, expected {}", want.name,
                                   dims_str(t->dims), dims_str(want.dims)));
            const auto& info = ggml::type_info(t->type);
            if (!info.dequant_supported)
                m.fail(fmt::format("tensor {} has type {}, which this engine cannot dequantize",
                                   want.name, info.name));
            if (want.dims.size() == 1 && !is_float_type(t->type))
                m.fail(fmt::format("tensor {} is a vector stored as {}; expected F32, F16 or BF16",
                                   want.name, info.name));
        }
    }
    // An untied LM head is optional but, when present, must fit like token_embd.
    if (const gguf::TensorInfo* out = file.find_tensor("output.weight")) {
        if (out->dims != embd->dims)
            m.fail(fmt::format("tensor output.weight has shape {}, expected {}",
                               dims_str(out->dims), dims_str(embd->dims)));
        if (!ggml::type_info(out->type).dequant_supported)
            m.fail(
                fmt::format("tensor output.weight has type {}, which this engine cannot "
                            "dequantize",
                            ggml::type_name(out->type)));
    }
    // Extra tensors are tolerated: e.g. KV-shared layers of some exports still carry attn_k /
    // attn_v / attn_k_norm, which HF and llama.cpp ignore, and so do we.
    return c;
}

}  // namespace gj::gemma4
