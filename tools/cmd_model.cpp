// Model commands: synth (write a synthetic GGUF), quantize (requantize a float GGUF), info
// (config and tensor summary of a GGUF), logits (logits of every position of a token list).
//
// `logits -o FILE` formats:
//   *.json  {"model": path, "tokens": [ids], "vocab_size": V, "logits": [[V floats] per position]}
//   *.bin   "GJLG" magic, u32 version (1), u32 positions, u32 vocab, then positions * vocab f32,
//           all little-endian, row-major by position.
// Without -o a short table (argmax and top 5 per position) goes to stdout.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cpu/cpu_forward.h"
#include "engine/gguf/reader.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/session.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/model_file.h"
#include "engine/model/quant_mix.h"
#include "engine/model/requantize.h"
#include "engine/model/synth.h"
#include "jit/device.h"
#include "tools/cmd_options.h"
#include "tools/commands.h"

namespace gj::tools {

namespace {

std::vector<int32_t> parse_token_list(const std::string& text) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t comma = text.find(',', pos);
        if (comma == std::string::npos) comma = text.size();
        std::string item = text.substr(pos, comma - pos);
        item.erase(0, item.find_first_not_of(" \t"));
        item.erase(item.find_last_not_of(" \t") + 1);
        if (!item.empty()) {
            size_t used = 0;
            long long v = -1;
            try {
                v = std::stoll(item, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != item.size() || v < 0 || v > INT32_MAX)
                throw std::invalid_argument(
                    fmt::format("--tokens: '{}' is not a token id (expected e.g. 2,10,20)", item));
            ids.push_back(int32_t(v));
        }
        pos = comma + 1;
    }
    if (ids.empty()) throw std::invalid_argument("--tokens: the token list is empty");
    return ids;
}

void write_logits_json(const std::string& path, const std::string& model,
                       const std::vector<int32_t>& tokens, int vocab,
                       const std::vector<float>& logits) {
    nlohmann::json j;
    j["model"] = model;
    j["tokens"] = tokens;
    j["vocab_size"] = vocab;
    auto rows = nlohmann::json::array();
    for (size_t t = 0; t < tokens.size(); ++t)
        rows.push_back(
            std::vector<float>(logits.begin() + t * vocab, logits.begin() + (t + 1) * vocab));
    j["logits"] = std::move(rows);
    std::ofstream out(path);
    if (!out) throw std::runtime_error("cannot write " + path);
    out << j.dump() << "\n";
    if (!out) throw std::runtime_error("error writing " + path);
}

void write_logits_bin(const std::string& path, size_t positions, int vocab,
                      const std::vector<float>& logits) {
    std::ofstream out(path, std::ios::binary);
    if (!out) throw std::runtime_error("cannot write " + path);
    const uint32_t header[3] = {1, uint32_t(positions), uint32_t(vocab)};
    out.write("GJLG", 4);
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(reinterpret_cast<const char*>(logits.data()),
              std::streamsize(logits.size() * sizeof(float)));
    if (!out) throw std::runtime_error("error writing " + path);
}

void print_logits_table(const std::vector<int32_t>& tokens, int vocab,
                        const std::vector<float>& logits) {
    std::vector<int> idx(vocab);
    for (size_t t = 0; t < tokens.size(); ++t) {
        const float* row = logits.data() + t * vocab;
        std::iota(idx.begin(), idx.end(), 0);
        const int k = std::min(5, vocab);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                          [&](int a, int b) { return row[a] > row[b]; });
        std::string top;
        for (int i = 0; i < k; ++i) top += fmt::format(" {}:{:.4f}", idx[i], row[idx[i]]);
        fmt::print("pos {:4d} token {:6d} -> argmax {:6d} | top{}\n", t, tokens[t], idx[0], top);
    }
}

// The synth --wtype names: the plain types keep synth's own conventions (synth.h), the rest are
// llama.cpp's quantizer mixes (quant_mix.h).
const char* const kPlainWtypes[] = {"q8_0", "q4_0", "bf16", "f16", "f32"};
const char* const kMixWtypes[] = {"q4_k",   "q5_k", "q6_k", "q4_k_m",
                                  "q5_k_m", "q4_1", "q5_0", "q5_1"};

std::string synth_wtype_list() {
    std::string s;
    for (const char* n : kPlainWtypes) s += (s.empty() ? "" : ", ") + std::string(n);
    for (const char* n : kMixWtypes) s += ", " + std::string(n);
    return s;
}

void cmd_synth(const synth::Options& base, const std::string& wtype, const std::string& out) {
    synth::Options opts = base;
    const bool plain = std::find(std::begin(kPlainWtypes), std::end(kPlainWtypes), wtype) !=
                       std::end(kPlainWtypes);
    const bool mix =
        std::find(std::begin(kMixWtypes), std::end(kMixWtypes), wtype) != std::end(kMixWtypes);
    if (!plain && !mix)
        throw std::invalid_argument(
            fmt::format("--wtype: unknown weight type '{}' (use {})", wtype, synth_wtype_list()));
    if (plain)
        opts.wtype = *ggml::type_from_name(wtype);
    else
        opts.mix = wtype;
    opts.progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
    const auto start = std::chrono::steady_clock::now();
    gemma4::Config cfg = synth::write_model(opts, out);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("wrote {} ({} bytes, {:.1f} s)\n{}\n", out, std::filesystem::file_size(out), secs,
               cfg.summary());
}

void cmd_quantize(const std::string& in, const std::string& out, const std::string& type,
                  int threads) {
    gemma4::RequantizeOptions opts;
    opts.threads = threads;
    opts.progress = status_line;
    const auto start = std::chrono::steady_clock::now();
    const auto r = gemma4::requantize(in, out, type, opts);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string types;
    for (const auto& [name, n] : r.tensors_by_type) types += fmt::format(" {} x{}", name, n);
    fmt::print("wrote {} ({}: {} -> {} bytes of tensor data, {:.1f} s)\n  tensor types:{}\n", out,
               type, r.bytes_in, r.bytes_out, secs, types);
}

void cmd_info(const std::string& path) {
    const auto model_file = gemma4::ModelFile::open(path);
    const gguf::File* file = &model_file->gguf();
    const gemma4::Config& cfg = model_file->config();
    fmt::print("{}\n{}\n\n", path, cfg.summary());
    fmt::print("layer  type     head_dim  kv_heads  ffn     kv_source  v_proj  rope_pairs\n");
    for (int l = 0; l < cfg.n_layers; ++l) {
        const auto& lc = cfg.layers[l];
        fmt::print("{:5d}  {:7s}  {:8d}  {:8d}  {:6d}  {:9d}  {:6s}  {:10d}\n", l,
                   lc.sliding ? "sliding" : "global", lc.head_dim, lc.n_kv_heads, lc.ffn_dim,
                   lc.kv_source, lc.has_kv ? (lc.has_v_proj ? "yes" : "k_eq_v") : "shared",
                   lc.rope_pairs);
    }
    std::map<std::string, std::pair<int, uint64_t>> by_type;
    uint64_t total = 0;
    for (const auto& t : file->tensors()) {
        auto& e = by_type[ggml::type_name(t.type)];
        e.first += 1;
        e.second += t.n_bytes;
        total += t.n_bytes;
    }
    fmt::print("\n{} tensors, {} bytes of tensor data, {} metadata keys\n", file->tensors().size(),
               total, file->metadata().size());
    for (const auto& [name, e] : by_type)
        fmt::print("  {:6s} {:5d} tensors {:14d} bytes\n", name, e.first, e.second);
}

void cmd_logits(const std::string& path, const std::string& token_text, bool cpu, int threads,
                const std::string& out) {
    const std::vector<int32_t> tokens = parse_token_list(token_text);
    std::string why;
    const bool gpu = !cpu && jit::device_available(&why);
    if (!cpu && !gpu)
        fmt::print(stderr,
                   "gemmajit: no usable GPU ({}); computing logits with the CPU reference\n", why);
    const auto file = gemma4::ModelFile::open(path);  // the one open and parse of the file
    // Every position must be one the model was trained for, on the CPU as on the GPU (whose load
    // refuses a longer context).
    if (const int trained = file->config().context_length; tokens.size() > size_t(trained))
        throw std::invalid_argument(
            fmt::format("--tokens: {} tokens are more than the {} positions of {}'s context",
                        tokens.size(), trained, path));
    std::vector<float> logits;
    int vocab = 0;
    auto check_vocab = [&](int v) {
        vocab = v;
        for (size_t i = 0; i < tokens.size(); ++i)
            if (tokens[i] >= vocab)
                throw std::invalid_argument(fmt::format(
                    "--tokens: token id {} at position {} is outside the vocabulary [0, {}) of {}",
                    tokens[i], i, vocab, path));
    };
    if (gpu) {
        gemma4::GpuModelOptions opts;
        // Just the positions asked for (a multiple of 256), so the KV cache stays small.
        const int trained = file->config().context_length;
        opts.context = std::min(trained, int((tokens.size() + 255) / 256 * 256));
        opts.progress = status_line;
        auto model = gemma4::GpuModel::load(file, opts);
        check_vocab(model->config().vocab_size);
        gemma4::GpuSession session(*model);
        logits = session.prefill_logits(tokens);
    } else {
        gemma4::CpuOptions opts;
        opts.threads = threads;
        auto model = gemma4::CpuModel::load(file, opts);
        check_vocab(model->config().vocab_size);
        gemma4::CpuSession session(*model);
        logits = session.prefill(tokens);
    }
    if (out.empty()) {
        print_logits_table(tokens, vocab, logits);
    } else if (out.ends_with(".bin")) {
        write_logits_bin(out, tokens.size(), vocab, logits);
    } else {
        write_logits_json(out, path, tokens, vocab, logits);
    }
}

}  // namespace

void add_model_commands(CLI::App& app) {
    {
        auto* cmd = app.add_subcommand("synth",
                                       "write a synthetic Gemma 4 GGUF (random, "
                                       "well-conditioned weights at a preset's shapes)");
        auto opts = std::make_shared<synth::Options>();
        auto wtype = std::make_shared<std::string>("q8_0");
        auto out = std::make_shared<std::string>();
        std::string variants;
        for (const auto& n : gemma4::Config::preset_names()) variants += " " + n;
        cmd->add_option("--variant", opts->variant, "model preset:" + variants)->required();
        cmd->add_option("--wtype", *wtype,
                        "weight type: " + synth_wtype_list() +
                            " (k-quants and _m mixes as llama-quantize writes them)")
            ->capture_default_str();
        cmd->add_option("--layers", opts->layers, "keep only the first N layers (0 = all)")
            ->check(CLI::Range(0, std::numeric_limits<int>::max()));
        cmd->add_option("--seed", opts->seed, "random seed")
            ->capture_default_str()
            ->check(seed_check());
        cmd->add_option("--threads", opts->threads, "worker threads (0 = all cores)")
            ->check(threads_check());
        cmd->add_option("-o,--output", *out, "output GGUF path")->required();
        cmd->callback([=] { cmd_synth(*opts, *wtype, *out); });
    }
    {
        auto* cmd = app.add_subcommand("quantize",
                                       "requantize an F32/F16/BF16 Gemma 4 GGUF (types per tensor "
                                       "as llama-quantize picks them)");
        auto in = std::make_shared<std::string>();
        auto out = std::make_shared<std::string>();
        auto type = std::make_shared<std::string>();
        auto threads = std::make_shared<int>(0);
        cmd->add_option("IN", *in, "input GGUF (F32, F16 or BF16 tensors)")->required();
        cmd->add_option("OUT", *out, "output GGUF (written atomically; never the input)")
            ->required();
        cmd->add_option("TYPE", *type, "type or mix: " + gemma4::quant_mix_names_text())
            ->required();
        cmd->add_option("--threads", *threads, "worker threads (0 = all cores)")
            ->check(threads_check());
        cmd->callback([=] { cmd_quantize(*in, *out, *type, *threads); });
    }
    {
        auto* cmd = app.add_subcommand("info", "print a GGUF model's config and tensor summary");
        auto model = std::make_shared<std::string>();
        cmd->add_option("--model,-m", *model, "GGUF file")->required();
        cmd->callback([=] { cmd_info(*model); });
    }
    {
        auto* cmd = app.add_subcommand(
            "logits", "logits of every position of a token list (on the GPU when one is present)");
        auto model = std::make_shared<std::string>();
        auto tokens = std::make_shared<std::string>();
        auto out = std::make_shared<std::string>();
        auto cpu = std::make_shared<bool>(false);
        auto threads = std::make_shared<int>(0);
        cmd->add_option("--model,-m", *model, "GGUF file")->required();
        cmd->add_option("--tokens", *tokens, "comma-separated token ids, e.g. 2,10,20")->required();
        cmd->add_flag("--cpu", *cpu, "use the CPU fp32 reference forward");
        cmd->add_option("--threads", *threads, "CPU worker threads (0 = all cores)")
            ->check(threads_check());
        cmd->add_option("-o,--output", *out,
                        "write all logits: FILE.json, or FILE.bin (GJLG binary, see source)");
        cmd->callback([=] { cmd_logits(*model, *tokens, *cpu, *threads, *out); });
    }
}

}  // namespace gj::tools
