// The tokenizer section of a GGUF (tokenizer.ggml.*) as plain data: read from a file, written by
// the synthetic-model writer, and the synthetic vocabulary used for tests and `gemmajit synth`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gj::gguf {
class File;
class Writer;
}  // namespace gj::gguf

namespace gj::tok {

// llama.cpp token types.
enum class TokenType : int32_t {
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6
};

struct VocabData {
    std::string model = "gemma4";     // tokenizer.ggml.model
    std::vector<std::string> tokens;  // tokenizer.ggml.tokens
    std::vector<float> scores;        // tokenizer.ggml.scores
    std::vector<int32_t> types;       // tokenizer.ggml.token_type
    std::vector<std::string> merges;  // tokenizer.ggml.merges ("a b")
    int32_t bos_id = 2, eos_id = 1, pad_id = 0, unk_id = 3;
    bool add_bos = true;
    std::string chat_template;  // tokenizer.chat_template ("" = use the built-in Gemma 4 one)
};

VocabData read_vocab(const gguf::File& file);  // throws gguf::FormatError naming the key
void write_vocab(gguf::Writer& w, const VocabData& v);

// A deterministic vocabulary of exactly `vocab_size` tokens (>= 1024) that has every Gemma 4
// special token at its real id (pad 0, eos 1, bos 2, unk 3, mask 4, tool tokens 46-52, <|think|>
// 98, channel 100/101, turn 105/106, "\n" 107, ...), the 256 <0xXX> byte tokens, the printable
// ASCII characters, ▁ and merges producing common English words, so synthetic models tokenize and
// detokenize real text.
VocabData make_synthetic_vocab(int vocab_size, uint64_t seed = 0);

}  // namespace gj::tok
