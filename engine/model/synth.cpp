#include "engine/model/synth.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <future>
#include <optional>
#include <stdexcept>
#include <vector>

#include "engine/base/thread_pool.h"
#include "engine/gguf/quantize.h"
#include "engine/gguf/writer.h"
#include "engine/model/quant_mix.h"
#include "engine/text/tokenizer_data.h"

namespace gj::synth {

namespace {

using gemma4::Config;
using gemma4::TensorRole;
using gemma4::TensorSpec;

// ---------------------------------------------------------------------------------------------
// Deterministic random streams.

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

class Stream {
  public:
    Stream(uint64_t seed, const std::string& tensor, uint64_t chunk) {
        state_ = seed ^ fnv1a(tensor);
        splitmix64(state_);
        state_ ^= chunk * 0xD1B54A32D192ED03ull;
        splitmix64(state_);
    }
    uint64_t next() { return splitmix64(state_); }
    // Uniform in [0, 1).
    float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
    // Approximately N(0, 1): Irwin-Hall sum of four 16-bit uniforms, rescaled to unit variance.
    float normal() {
        const uint64_t r = next();
        float s = 0;
        for (int i = 0; i < 4; ++i)
            s += (float((r >> (16 * i)) & 0xffff) + 0.5f) * (1.0f / 65536.0f);
        return (s - 2.0f) * 1.7320508075688772f;
    }

  private:
    uint64_t state_;
};

// Fills `n` values of the tensor starting at element `first` (a chunk), by role.
void draw(const TensorSpec& t, const Config& cfg, Stream& rng, uint64_t first, float* out,
          uint64_t n) {
    switch (t.role) {
        case TensorRole::Embedding: {
            const bool ple = t.name.starts_with("per_layer");
            const float sd =
                ple ? 1.0f / std::sqrt(float(cfg.ple_dim)) : 2.0f / std::sqrt(float(cfg.d_model));
            for (uint64_t i = 0; i < n; ++i) out[i] = sd * rng.normal();
            return;
        }
        case TensorRole::Linear:
        case TensorRole::Experts:
        case TensorRole::PleModelProj:
        case TensorRole::PleLayerProj: {
            const float sd = 1.0f / std::sqrt(float(t.fan_in()));
            for (uint64_t i = 0; i < n; ++i) out[i] = sd * rng.normal();
            return;
        }
        case TensorRole::Router:
            for (uint64_t i = 0; i < n; ++i) out[i] = 2.0f * rng.normal();
            return;
        case TensorRole::NormGain:
        case TensorRole::RouterScale:
            for (uint64_t i = 0; i < n; ++i) out[i] = 1.0f + 0.1f * rng.normal();
            return;
        case TensorRole::QkNormGain:
            for (uint64_t i = 0; i < n; ++i) out[i] = 0.25f * (1.0f + 0.1f * rng.normal());
            return;
        case TensorRole::ExpertScale:
            for (uint64_t i = 0; i < n; ++i) out[i] = 0.5f + rng.uniform();
            return;
        case TensorRole::LayerScale:
            for (uint64_t i = 0; i < n; ++i) out[i] = 0.6f + 0.4f * rng.uniform();
            return;
        case TensorRole::RopeFreqs: {
            int pairs = 0;
            for (const auto& l : cfg.layers)
                if (!l.sliding) pairs = l.rope_pairs;
            for (uint64_t i = 0; i < n; ++i) out[i] = first + i < uint64_t(pairs) ? 1.0f : 1e30f;
            return;
        }
    }
}

std::optional<gemma4::QuantMix> mix_of(const Options& opts) {
    if (opts.mix.empty()) return std::nullopt;
    auto m = gemma4::quant_mix_from_name(opts.mix);
    if (!m)
        throw std::invalid_argument(fmt::format("unknown quant mix '{}' (use {})", opts.mix,
                                                gemma4::quant_mix_names_text()));
    return m;
}

uint32_t llama_file_type(ggml::Type wtype) {
    switch (wtype) {
        case ggml::Type::F32:
            return 0;  // LLAMA_FTYPE_ALL_F32
        case ggml::Type::F16:
            return 1;  // MOSTLY_F16
        case ggml::Type::Q4_0:
            return 2;  // MOSTLY_Q4_0
        case ggml::Type::Q8_0:
            return 7;  // MOSTLY_Q8_0
        case ggml::Type::BF16:
            return 32;  // MOSTLY_BF16
        default:
            break;
    }
    throw std::invalid_argument(
        fmt::format("unsupported synthetic weight type {} (use q8_0, q4_0, "
                    "bf16, f16 or f32)",
                    ggml::type_name(wtype)));
}

void write_metadata(gguf::Writer& w, const Config& c, const Options& opts) {
    const std::string p = "gemma4.";
    w.set_string("general.architecture", "gemma4");
    w.set_string("general.name", fmt::format("gemmajit synthetic {}", c.name));
    const auto mix = mix_of(opts);
    w.set_u32("general.file_type", mix ? mix->file_type : llama_file_type(opts.wtype));
    w.set_u32("general.quantization_version", 2);
    w.set_string("gemmajit.synth.variant", opts.variant);
    w.set("gemmajit.synth.seed", gguf::Value::make_u64(opts.seed));

    w.set_u32(p + "context_length", c.context_length);
    w.set_u32(p + "embedding_length", c.d_model);
    w.set_u32(p + "block_count", c.n_layers);
    w.set_u32(p + "vocab_size", c.vocab_size);
    std::vector<uint32_t> ffn, kv;
    std::vector<bool> sliding;
    for (const auto& l : c.layers) {
        ffn.push_back(l.ffn_dim);
        kv.push_back(l.n_kv_heads);
        sliding.push_back(l.sliding);
    }
    // Scalar when uniform, one value per layer otherwise (E2B's FFN, 12B/26B/31B's KV heads).
    auto scalar_or_array = [&](const std::string& key, const std::vector<uint32_t>& v) {
        if (std::equal(v.begin() + 1, v.end(), v.begin()))
            w.set_u32(key, v[0]);
        else
            w.set_u32_array(key, v);
    };
    scalar_or_array(p + "feed_forward_length", ffn);
    w.set_u32(p + "attention.head_count", c.n_heads);
    scalar_or_array(p + "attention.head_count_kv", kv);
    w.set_u32(p + "attention.key_length", c.head_dim_global);
    w.set_u32(p + "attention.value_length", c.head_dim_global);
    w.set_u32(p + "attention.key_length_swa", c.head_dim_swa);
    w.set_u32(p + "attention.value_length_swa", c.head_dim_swa);
    w.set_f32(p + "attention.layer_norm_rms_epsilon", c.rms_eps);
    w.set_u32(p + "attention.sliding_window", c.sliding_window);
    w.set_bool_array(p + "attention.sliding_window_pattern", sliding);
    w.set_u32(p + "attention.shared_kv_layers", c.n_kv_shared_layers);
    w.set_u32(p + "embedding_length_per_layer_input", c.ple_dim);
    w.set_f32(p + "rope.freq_base", c.rope_base_global);
    w.set_f32(p + "rope.freq_base_swa", c.rope_base_swa);
    w.set_u32(p + "rope.dimension_count", c.head_dim_global);
    w.set_u32(p + "rope.dimension_count_swa", c.head_dim_swa);
    w.set_f32(p + "final_logit_softcapping", c.final_softcap);
    if (c.is_moe()) {
        w.set_u32(p + "expert_count", c.n_experts);
        w.set_u32(p + "expert_used_count", c.n_experts_used);
        w.set_u32(p + "expert_feed_forward_length", c.expert_ffn_dim);
    }
    tok::write_vocab(w, tok::make_synthetic_vocab(c.vocab_size));
}

std::string gib(uint64_t bytes) {
    return fmt::format("{:.2f} GiB", double(bytes) / (1ull << 30));
}

}  // namespace

ggml::Type tensor_type(TensorRole role, ggml::Type wtype) {
    const bool quantized = ggml::type_info(wtype).block_elems > 1;
    switch (role) {
        case TensorRole::Embedding:
        case TensorRole::Linear:
        case TensorRole::Experts:
            return wtype;
        case TensorRole::PleModelProj:
            return quantized ? ggml::Type::BF16 : wtype;
        case TensorRole::PleLayerProj:
            return quantized ? ggml::Type::F32 : wtype;
        default:
            return ggml::Type::F32;
    }
}

Config config_for(const Options& opts) {
    Config c = Config::preset(opts.variant);
    if (opts.layers > 0) c = c.first_layers(opts.layers);
    if (opts.context > 0) c.context_length = opts.context;
    return c;
}

std::vector<ggml::Type> tensor_types(const Options& opts, const Config& cfg) {
    const std::vector<TensorSpec> specs = gemma4::expected_tensors(cfg);
    std::vector<ggml::Type> types;
    if (const auto mix = mix_of(opts)) {
        std::vector<gemma4::MixTensor> in;
        for (const TensorSpec& t : specs) in.push_back({t.name, t.dims, ggml::Type::F32});
        return gemma4::mix_types(*mix, in, cfg.n_layers);
    }
    for (const TensorSpec& t : specs) types.push_back(tensor_type(t.role, opts.wtype));
    return types;
}

Config write_model(const Options& opts, const std::filesystem::path& path) {
    // Rejects unsupported weight types before any work.
    if (!mix_of(opts)) llama_file_type(opts.wtype);
    const Config cfg = config_for(opts);
    const std::vector<TensorSpec> specs = gemma4::expected_tensors(cfg);
    const std::vector<ggml::Type> types = tensor_types(opts, cfg);

    gguf::Writer w;
    write_metadata(w, cfg, opts);
    uint64_t total = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
        const TensorSpec& t = specs[i];
        try {
            total += w.add_tensor(t.name, types[i], t.dims);
        } catch (const std::exception& e) {
            throw std::invalid_argument(fmt::format("{}: cannot store tensor {} as {}: {}",
                                                    cfg.name, t.name, ggml::type_name(types[i]),
                                                    e.what()));
        }
    }
    w.begin(path);

    ThreadPool pool(opts.threads);
    const bool verbose = opts.progress && total > (uint64_t(256) << 20);
    if (verbose)
        opts.progress(fmt::format("synth: writing {} ({} tensors, {}) with {} threads",
                                  path.string(), specs.size(), gib(total), pool.size()));
    // Generation of tensor i+1 overlaps the write of tensor i.
    std::future<void> pending_write;
    std::vector<uint8_t> pending_buf;
    uint64_t done = 0, next_report = total / 10;
    for (size_t ti = 0; ti < specs.size(); ++ti) {
        const TensorSpec& t = specs[ti];
        const ggml::Type type = types[ti];
        const uint64_t cols = t.dims[0];
        uint64_t rows = 1;
        for (size_t k = 1; k < t.dims.size(); ++k) rows *= t.dims[k];
        const uint64_t row_bytes = *ggml::row_bytes(type, cols);
        std::vector<uint8_t> buf(rows * row_bytes);
        // Fixed chunking (~256K elements), independent of the thread count.
        const uint64_t chunk_rows = std::max<uint64_t>(1, (uint64_t(1) << 18) / cols);
        const uint64_t n_chunks = (rows + chunk_rows - 1) / chunk_rows;
        pool.parallel_for(n_chunks, [&](size_t chunk) {
            const uint64_t r0 = chunk * chunk_rows;
            const uint64_t nr = std::min(chunk_rows, rows - r0);
            thread_local std::vector<float> vals;
            vals.resize(nr * cols);
            Stream rng(opts.seed, t.name, chunk);
            draw(t, cfg, rng, r0 * cols, vals.data(), nr * cols);
            ggml::quantize_row(type, vals.data(), buf.data() + r0 * row_bytes, int64_t(nr * cols));
        });
        if (pending_write.valid()) pending_write.get();
        pending_buf = std::move(buf);
        pending_write = std::async(std::launch::async, [&w, name = t.name, &pending_buf] {
            w.write_tensor_data(name, pending_buf);
        });
        done += rows * row_bytes;
        if (verbose && done >= next_report) {
            opts.progress(fmt::format("synth: {} / {} ({:.0f}%)", gib(done), gib(total),
                                      100.0 * double(done) / double(total)));
            next_report = done + total / 10;
        }
    }
    if (pending_write.valid()) pending_write.get();
    w.finish();
    if (verbose) opts.progress(fmt::format("synth: wrote {}", path.string()));
    return cfg;
}

}  // namespace gj::synth
