// Text in, text out: `gemmajit tokenize` (inspect the tokenizer) and `gemmajit run` (chat-format a
// prompt, generate with streaming output).
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "engine/vocab_json.h"
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
    std::string text;
};

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

void run_tokenize(const TokenizeArgs& a) {
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
                    "use the synthetic Gemma 4 vocabulary of N tokens instead of a model");
    cmd->add_option("--seed", a->seed, "seed of the synthetic vocabulary");
    cmd->add_flag("--no-bos", a->no_bos, "do not prepend <bos>");
    cmd->add_flag("--no-special", a->no_special,
                  "treat control-token text (<|turn>, <bos>, ...) as plain text");
    cmd->add_flag("--ids", a->ids_only, "print only the comma-separated ids");
    cmd->add_option("--export-vocab", a->export_vocab, "write the vocabulary as JSON to FILE");
    cmd->add_option("text", a->text, "text to tokenize");
    cmd->callback([a] { run_tokenize(*a); });
}

}  // namespace

void add_run_commands(CLI::App& app) {
    add_tokenize_command(app);
}

}  // namespace gj::tools
