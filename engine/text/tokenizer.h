// The Gemma 4 tokenizer (`tokenizer.ggml.model = "gemma4"`): SentencePiece-style BPE with merges.
//
// Encoding, as llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4 and the Hugging Face tokenizer.json do it:
//   1. split out special tokens (leftmost-longest match): USER_DEFINED always, CONTROL and
//      UNKNOWN too when parse_special is set;
//   2. in the remaining text replace every ' ' by ▁ (U+2581); no prefix space, no normalization;
//   3. pre-split into runs of newlines and runs of non-newlines; a pure newline run that is itself
//      a token is emitted whole;
//   4. BPE over UTF-8 characters by merge rank (lowest rank first, leftmost on ties);
//   5. a symbol that is not a token falls back to its bytes as <0xXX> tokens.
// Bytes that are not valid UTF-8 are single symbols, so they end up as byte tokens: invalid input
// never fails. Decoding turns ▁ back into ' ' and <0xXX> tokens back into raw bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/tokenizer_data.h"

namespace gj::tok {

struct TokenizerError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Gemma 4's end-of-generation set (<eos>, <turn|>, <|tool_response>), used whatever the file's
// eos id says: exports disagree on it.
inline constexpr int32_t kStopTokens[] = {1, 106, 50};

class Tokenizer {
  public:
    // Validates the vocabulary (model "gemma4", consistent lengths, merges that name tokens) and
    // builds the lookup tables. Throws TokenizerError naming the problem.
    explicit Tokenizer(VocabData vocab);
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                bool parse_special = true) const;

    // The bytes a token stands for. CONTROL/UNKNOWN tokens are empty unless render_special.
    std::string piece(int32_t id, bool render_special = false) const;
    std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

    int vocab_size() const;
    const VocabData& vocab() const;
    int32_t find(std::string_view token_text) const;  // -1 when not a token
    TokenType type(int32_t id) const;
    int32_t bos_id() const { return vocab().bos_id; }
    bool add_bos() const { return vocab().add_bos; }
    static bool is_stop_token(int32_t id);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text that only ever contains complete UTF-8 characters: bytes
// of a character split across byte tokens are held back until the character is complete. Bytes
// that can never form a valid character come out as U+FFFD.
class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer& tok, bool render_special = false)
        : tok_(&tok), render_special_(render_special) {}
    std::string push(int32_t id);  // text that became complete with this token (may be empty)
    std::string finish();          // whatever is still held back (incomplete: U+FFFD)

  private:
    const Tokenizer* tok_;
    bool render_special_;
    std::string pending_;
};

// Length of the valid UTF-8 character at s[0] (1-4), or 0 when s does not start with one (an
// invalid byte, or a character cut short by the end of s).
size_t utf8_char_length(std::string_view s);

}  // namespace gj::tok
