// Text in, text out: `gemmajit tokenize` (inspect the tokenizer) and `gemmajit run` (chat-format a
// prompt, generate with streaming output, on the GPU when one is present).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "engine/generate/backend.h"
#include "engine/generate/generate.h"
#include "engine/gguf/reader.h"
#include "engine/model/model_file.h"
#include "engine/text/chat_format.h"
#include "engine/text/sampler.h"
#include "engine/text/tokenizer.h"
#include "engine/text/vocab_json.h"
#include "jit/env_flags.h"
#include "tools/cmd_options.h"
#include "tools/commands.h"

namespace gj::tools {

namespace {

struct TokenizeArgs {
    std::string model;
    int synthetic_vocab = 0;
    uint64_t seed = 0;
    bool no_bos = false;
    bool no_special = false;
    bool ids_only = false;
    std::string export_vocab;
    std::string text;      // -p/--prompt
    std::string text_arg;  // the same, given as the positional argument
};

// --synthetic-vocab: make_synthetic_vocab needs 1024 tokens for its fixed ids; the top is 4x
// Gemma 4's 262144, ample for tests and small enough to build in seconds.
constexpr int kMinSyntheticVocab = 1024;
constexpr int kMaxSyntheticVocab = 1 << 20;

tok::VocabData load_vocab(const TokenizeArgs& a) {
    if (!a.model.empty() && a.synthetic_vocab > 0) {
        throw std::invalid_argument("give either --model or --synthetic-vocab, not both");
    }
    if (a.synthetic_vocab > 0) return tok::make_synthetic_vocab(a.synthetic_vocab, a.seed);
    if (a.model.empty()) throw std::invalid_argument("give --model FILE or --synthetic-vocab N");
    auto file = gguf::File::open(a.model);
    return tok::read_vocab(*file);
}

// A token's text for display: control characters escaped, so one token is one line.
std::string printable(std::string_view s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out;
}

void run_tokenize(TokenizeArgs a) {
    if (!a.text.empty() && !a.text_arg.empty())
        throw std::invalid_argument("give the text with -p or as the argument, not both");
    if (a.text.empty()) a.text = a.text_arg;
    tok::VocabData vocab = load_vocab(a);
    if (!a.export_vocab.empty()) {
        std::ofstream out(a.export_vocab, std::ios::binary);
        out << tok::vocab_to_json(vocab);
        out.close();
        if (!out) throw std::runtime_error("cannot write " + a.export_vocab);
    }
    tok::Tokenizer t(std::move(vocab));
    if (a.text.empty() && !a.export_vocab.empty()) return;
    auto ids = t.encode(a.text, !a.no_bos, !a.no_special);
    if (a.ids_only) {
        for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
        std::printf("\n");
        return;
    }
    for (int32_t id : ids) {
        std::printf("%7d  %s\n", id, printable(t.vocab().tokens[static_cast<size_t>(id)]).c_str());
    }
    std::printf("%zu tokens\n", ids.size());
}

void add_tokenize_command(CLI::App& app) {
    auto a = std::make_shared<TokenizeArgs>();
    auto* cmd = app.add_subcommand("tokenize", "show how text tokenizes (ids and token texts)");
    cmd->add_option("--model,-m", a->model, "GGUF file whose tokenizer to use");
    cmd->add_option("--synthetic-vocab", a->synthetic_vocab,
                    "use the synthetic Gemma 4 vocabulary of N tokens instead of a model")
        ->check(CLI::Range(kMinSyntheticVocab, kMaxSyntheticVocab));
    cmd->add_option("--seed", a->seed, "seed of the synthetic vocabulary")->check(seed_check());
    cmd->add_flag("--no-bos", a->no_bos, "do not prepend <bos>");
    cmd->add_flag("--no-special", a->no_special,
                  "treat control-token text (<|turn>, <bos>, ...) as plain text");
    cmd->add_flag("--ids", a->ids_only, "print only the comma-separated ids");
    cmd->add_option("--export-vocab", a->export_vocab, "write the vocabulary as JSON to FILE");
    cmd->add_option("-p,--prompt", a->text, "text to tokenize");
    cmd->add_option("text", a->text_arg, "text to tokenize (the same as -p)");
    cmd->callback([a] { run_tokenize(*a); });
}

// ---- run ---------------------------------------------------------------------------------------

struct RunArgs {
    std::string model;
    std::string prompt;
    std::string prompt_file;
    std::string system;
    int n_predict = 256;
    sample::SamplerParams sampling;
    bool think = false;
    bool no_think = false;
    bool cpu = false;
    int threads = 0;
    int context = 0;
    int tp = 0;  // --tp (0: GEMMAJIT_TP)
};

// A prompt file larger than this cannot be a prompt (the largest context, 262144 tokens, is
// about 1 MiB of text); the cap stops a device such as /dev/zero from being read until memory
// runs out.
constexpr size_t kMaxPromptFileBytes = size_t(64) << 20;

std::string read_text_file(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw std::runtime_error("prompt file " + path + " is a directory");
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read prompt file " + path);
    std::string text;
    std::vector<char> buf(size_t(1) << 16);
    while (f.read(buf.data(), std::streamsize(buf.size())) || f.gcount() > 0) {
        text.append(buf.data(), size_t(f.gcount()));
        if (text.size() > kMaxPromptFileBytes)
            throw std::runtime_error("prompt file " + path + " holds more than " +
                                     std::to_string(kMaxPromptFileBytes >> 20) +
                                     " MiB; a prompt must fit the model's context");
    }
    if (f.bad()) throw std::runtime_error("error reading prompt file " + path);
    return text;
}

void run_generate(RunArgs a) {
    const int ranks = tp_ranks(a.tp, a.cpu);
    // Everything that can be wrong with the arguments is reported before any file is read.
    a.sampling.validate();
    if (a.n_predict < -1) {
        throw std::invalid_argument("-n must be >= 0, or -1 for no limit; got " +
                                    std::to_string(a.n_predict));
    }
    if (a.think && a.no_think) {
        throw std::invalid_argument("--think and --no-think exclude each other");
    }
    if (!a.prompt.empty() && !a.prompt_file.empty()) {
        throw std::invalid_argument("give the prompt with -p or --file, not both");
    }
    if (!a.prompt_file.empty()) a.prompt = read_text_file(a.prompt_file);
    if (a.prompt.empty()) {
        throw std::invalid_argument("the prompt is empty (give -p TEXT or --file FILE)");
    }
    if (!std::filesystem::is_regular_file(a.model)) {
        throw std::runtime_error("model file " + a.model + " does not exist or is not a file");
    }

    // Tokenizer, chat format and prompt length first: a prompt that cannot fit fails before the
    // weights are loaded. The file is opened and parsed once; the backend loads from it.
    const std::shared_ptr<const gemma4::ModelFile> file = gemma4::ModelFile::open(a.model);
    const gemma4::Config& cfg = file->config();
    const tok::Tokenizer& tokenizer = file->tokenizer();
    const chat::ChatStyle style = chat::ChatStyle::from_template(tokenizer.vocab().chat_template);
    if (!style.recognized && !is_worker()) {
        std::fprintf(stderr,
                     "gemmajit: the model's chat template does not look like Gemma 4's; using the "
                     "built-in Gemma 4 format\n");
    }
    std::vector<chat::Message> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system, {}, {}});
    messages.push_back({"user", a.prompt, {}, {}});
    chat::ChatOptions chat_opts;
    chat_opts.enable_thinking = a.think;
    const std::string rendered = chat::render(messages, chat_opts, style);
    // The rendered text starts with "<bos>" itself, so no BOS is added.
    const std::vector<int32_t> prompt = tokenizer.encode(rendered, /*add_bos=*/false);
    gen::check_prompt_fits(prompt.size(), cfg.context_length);
    check_context_option(a.context, cfg);
    if (a.context > 0) gen::check_prompt_fits(prompt.size(), a.context);

    // Tensor parallelism: the workers are forked here, before anything touches the GPU; every
    // rank runs the same generation (same prompt, same sampling seed, the same token picked from
    // the gathered candidates) and rank 0 prints it.
    gemma4::RankGroup group(ranks);
    set_process_rank(group.rank());
    gen::BackendOptions bo = backend_options(a.cpu, a.threads, a.context);
    if (is_worker()) bo.prefill_progress = nullptr;  // rank 0 shows the prompt's progress
    if (ranks > 1) bo.tp = group.connect(jit::Flags::process());
    auto backend = gen::Backend::open(file, bo);
    gen::Forward& forward = backend->forward();
    sample::Sampler sampler(a.sampling);
    gen::GenerateOptions gen_opts;
    gen_opts.max_tokens = a.n_predict;
    // generate() hands each generated token's text (possibly empty: a control token, or part of
    // a UTF-8 character) to the callback right after sampling it, so its first call is the first
    // token's; with no token generated the only call is the final flush.
    double first_token_s = -1;
    const gen::GenerateResult r =
        gen::generate(forward, tokenizer, sampler, prompt, gen_opts, [&](std::string_view text) {
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
            if (first_token_s < 0) first_token_s = seconds_since_start();
        });
    std::printf("\n");
    std::fflush(stdout);
    if (is_worker()) return;  // rank 0 reports
    auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
    std::fprintf(stderr,
                 "prompt: %d tokens in %.3f s (%.2f tokens/s)\n"
                 "generation: %zu tokens in %.3f s (%.2f tokens/s), stopped by %s\n",
                 r.prompt_tokens, r.prompt_seconds, rate(r.prompt_tokens, r.prompt_seconds),
                 r.tokens.size(), r.generate_seconds,
                 rate(static_cast<double>(r.tokens.size()), r.generate_seconds),
                 gen::stop_reason_name(r.reason));
    if (r.tokens.empty()) {
        std::fprintf(stderr, "first token: none generated\n");
    } else {
        std::fprintf(stderr, "first token: %.3f s after start\n", first_token_s);
    }
    group.finish();  // throws when a worker failed
}

void add_run_command(CLI::App& app) {
    auto a = std::make_shared<RunArgs>();
    auto* cmd = app.add_subcommand("run", "chat-format a prompt and generate a reply (streamed)");
    cmd->add_option("--model,-m", a->model, "GGUF model file")->required();
    cmd->add_option("-p,--prompt", a->prompt, "the user message");
    cmd->add_option("-f,--file", a->prompt_file, "read the user message from FILE");
    cmd->add_option("--system", a->system, "system message");
    cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate at most (-1 = no limit)")
        ->capture_default_str();
    add_sampling_options(cmd, a->sampling);
    cmd->add_flag("--think", a->think, "let the model reason first (<|think|> in the system turn)");
    cmd->add_flag("--no-think", a->no_think, "no reasoning (the default)");
    cmd->add_flag("--cpu", a->cpu, "use the CPU reference forward (default: the GPU when present)");
    cmd->add_option("--ctx", a->context,
                    "context in tokens (0: the model's; on the GPU reduced to what fits in "
                    "memory)")
        ->check(CLI::Range(0, std::numeric_limits<int>::max()));
    cmd->add_option("--threads", a->threads, "CPU worker threads (0 = all cores)")
        ->check(threads_check());
    add_tp_option(cmd, a->tp);
    cmd->callback([a] { run_generate(*a); });
}

}  // namespace

gen::BackendOptions backend_options(bool cpu, int threads, int context) {
    gen::BackendOptions o;
    o.cpu = cpu;
    o.threads = threads;
    o.context = context;
    o.status = status_line;
    if (isatty(STDERR_FILENO)) {
        o.prefill_progress = [](int done, int total) {
            if (total >= 1024)
                std::fprintf(stderr, "\rgemmajit: prompt %d / %d tokens%s", done, total,
                             done == total ? "\n" : "");
        };
    }
    return o;
}

void add_sampling_options(CLI::App* cmd, sample::SamplerParams& s) {
    cmd->add_option("--temp", s.temperature, "temperature (0 = greedy)")->capture_default_str();
    cmd->add_option("--top-k", s.top_k, "top-k (0 = off)")->capture_default_str();
    cmd->add_option("--top-p", s.top_p, "top-p in (0, 1] (1 = off)")->capture_default_str();
    cmd->add_option("--min-p", s.min_p, "min-p in [0, 1] (0 = off)")->capture_default_str();
    cmd->add_option("--repeat-penalty", s.repeat_penalty, "repetition penalty (1 = off)")
        ->capture_default_str();
    cmd->add_option("--repeat-last-n", s.repeat_last_n, "tokens the repetition penalty looks at")
        ->capture_default_str();
    cmd->add_option("--seed", s.seed, "sampling seed")->capture_default_str()->check(seed_check());
}

void add_run_commands(CLI::App& app) {
    add_run_command(app);
    add_tokenize_command(app);
}

}  // namespace gj::tools
