// `gemmajit chat --model FILE`: an interactive multi-turn chat. The KV cache is kept across
// turns: each new user message is appended to the sequence as the chat-format text that follows
// the model's last reply ("<turn|>\n<|turn>user\n...<turn|>\n<|turn>model\n..."), so only the new
// tokens are prefilled. Lines starting with '/' are commands: /reset starts over, /quit ends.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "engine/generate/backend.h"
#include "engine/gguf/reader.h"
#include "engine/model/model_file.h"
#include "engine/text/chat_format.h"
#include "engine/text/sampler.h"
#include "engine/text/tokenizer.h"
#include "tools/cmd_options.h"
#include "tools/commands.h"

namespace gj::tools {

namespace {

struct ChatArgs {
    std::string model;
    std::string system;
    int n_predict = 1024;
    sample::SamplerParams sampling;
    bool think = false;
    bool cpu = false;
    int threads = 0;
    int context = 0;
};

// The text of one user turn and the generation prompt, without <bos> and without the system turn
// the renderer adds when thinking is on (that belongs to the first turn only).
std::string user_turn(const std::string& text, const chat::ChatOptions& opts,
                      const chat::ChatStyle& style) {
    const std::string full = chat::render({{"user", text, {}, {}}}, opts, style);
    const size_t at = full.find("<|turn>user\n");
    if (at == std::string::npos)
        throw std::logic_error("chat format: a rendered user turn lacks <|turn>user");
    return full.substr(at);
}

void run_chat(ChatArgs a) {
    a.sampling.validate();
    if (a.n_predict < -1)
        throw std::invalid_argument("-n must be >= 0, or -1 for no limit; got " +
                                    std::to_string(a.n_predict));
    // Checked here rather than by a CLI11 validator, so a bad path is the same
    // "gemmajit: error: ..." with exit code 1 as in run and the other commands.
    if (!std::filesystem::is_regular_file(a.model))
        throw std::runtime_error("model file " + a.model + " does not exist or is not a file");
    // One open and parse of the file; the tokenizer first, so a bad vocabulary fails before the
    // weights are loaded.
    const std::shared_ptr<const gemma4::ModelFile> file = gemma4::ModelFile::open(a.model);
    const tok::Tokenizer& tokenizer = file->tokenizer();
    check_context_option(a.context, file->config());
    auto backend = gen::Backend::open(file, backend_options(a.cpu, a.threads, a.context));
    const chat::ChatStyle style = chat::ChatStyle::from_template(tokenizer.vocab().chat_template);
    gen::Forward& forward = backend->forward();
    sample::Sampler sampler(a.sampling);
    chat::ChatOptions chat_opts;
    chat_opts.enable_thinking = a.think;
    const bool interactive = isatty(STDIN_FILENO);
    if (interactive)
        std::fprintf(stderr,
                     "gemmajit: chat with %s (context %d tokens); /reset starts over, "
                     "/quit or Ctrl-D ends\n",
                     backend->config().name.c_str(), forward.context_length());

    bool first = true;
    std::string line;
    for (;;) {
        if (interactive) std::fprintf(stderr, "> ");
        if (!std::getline(std::cin, line)) break;
        // Input with CRLF line ends (a Windows file, some terminals) must read as the same
        // commands and messages.
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        if (line == "/quit" || line == "/exit") break;
        if (line == "/reset") {
            backend->reset();
            sampler.clear_history();  // the repetition penalty must not reach into the old one
            first = true;
            std::fprintf(stderr, "gemmajit: conversation reset\n");
            continue;
        }
        std::string text;
        if (first) {
            std::vector<chat::Message> messages;
            if (!a.system.empty()) messages.push_back({"system", a.system, {}, {}});
            messages.push_back({"user", line, {}, {}});
            text = chat::render(messages, chat_opts, style);
        } else {
            // Closes the model's turn (its stop token was sampled, not fed) and opens the next.
            text = "<turn|>\n" + user_turn(line, chat_opts, style);
        }
        const std::vector<int32_t> tokens = tokenizer.encode(text, /*add_bos=*/false);
        if (size_t(forward.position()) + tokens.size() >= size_t(forward.context_length())) {
            std::fprintf(stderr,
                         "gemmajit: this message (%zu tokens) does not fit the %d positions left "
                         "of the context; /reset starts a new conversation\n",
                         tokens.size(), forward.context_length() - forward.position());
            continue;
        }
        gen::GenerateOptions go;
        go.max_tokens = a.n_predict;
        const gen::GenerateResult r =
            gen::generate(forward, tokenizer, sampler, tokens, go, [](std::string_view t) {
                std::fwrite(t.data(), 1, t.size(), stdout);
                std::fflush(stdout);
            });
        std::printf("\n");
        std::fflush(stdout);
        first = false;
        if (interactive)
            std::fprintf(
                stderr, "gemmajit: %zu tokens, %.1f tokens/s (%s); %d of %d positions used\n",
                r.tokens.size(),
                r.generate_seconds > 0 ? double(r.tokens.size()) / r.generate_seconds : 0.0,
                gen::stop_reason_name(r.reason), forward.position(), forward.context_length());
    }
}

}  // namespace

void add_chat_command(CLI::App& app) {
    auto a = std::make_shared<ChatArgs>();
    auto* cmd = app.add_subcommand(
        "chat",
        "interactive multi-turn chat (one message per line; the KV cache is kept across "
        "turns)");
    cmd->add_option("--model,-m", a->model, "GGUF model file")->required();
    cmd->add_option("--system", a->system, "system message");
    cmd->add_option("-n,--n-predict", a->n_predict, "tokens per reply at most (-1 = no limit)")
        ->capture_default_str();
    add_sampling_options(cmd, a->sampling);
    cmd->add_flag("--think", a->think, "let the model reason first (<|think|> in the system turn)");
    cmd->add_flag("--cpu", a->cpu, "use the CPU reference forward");
    cmd->add_option("--threads", a->threads, "CPU worker threads (0 = all cores)")
        ->check(threads_check());
    cmd->add_option("--ctx", a->context,
                    "context in tokens (0: the model's; on the GPU reduced to what fits in "
                    "memory)")
        ->check(CLI::Range(0, std::numeric_limits<int>::max()));
    cmd->callback([a] { run_chat(*a); });
}

}  // namespace gj::tools
