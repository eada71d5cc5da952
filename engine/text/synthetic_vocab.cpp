// make_synthetic_vocab: a deterministic Gemma 4-shaped vocabulary for synthetic models and tests.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/text/tokenizer_data.h"

namespace gj::tok {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // ▁ U+2581

struct FixedToken {
    int id;
    const char* text;
    TokenType type;
};

// Gemma 4's special tokens at their real ids. The converter marks the tool-call, tool-response,
// string-quote and channel tokens USER_DEFINED so they render in output; the rest are CONTROL.
constexpr FixedToken kSpecialTokens[] = {
    {0, "<pad>", TokenType::Control},
    {1, "<eos>", TokenType::Control},
    {2, "<bos>", TokenType::Control},
    {3, "<unk>", TokenType::Unknown},
    {4, "<mask>", TokenType::Control},
    {46, "<|tool>", TokenType::Control},
    {47, "<tool|>", TokenType::Control},
    {48, "<|tool_call>", TokenType::UserDefined},
    {49, "<tool_call|>", TokenType::UserDefined},
    {50, "<|tool_response>", TokenType::UserDefined},
    {51, "<tool_response|>", TokenType::UserDefined},
    {52, "<|\"|>", TokenType::UserDefined},
    {98, "<|think|>", TokenType::Control},
    {100, "<|channel>", TokenType::UserDefined},
    {101, "<channel|>", TokenType::UserDefined},
    {105, "<|turn>", TokenType::Control},
    {106, "<turn|>", TokenType::Control},
};

// Multimodal markers; only placed when the vocabulary is large enough to hold their real ids.
constexpr FixedToken kMediaTokens[] = {
    {255999, "<|image>", TokenType::Control},  {256000, "<|audio>", TokenType::Control},
    {258880, "<|image|>", TokenType::Control}, {258881, "<|audio|>", TokenType::Control},
    {258882, "<image|>", TokenType::Control},  {258883, "<audio|>", TokenType::Control},
    {258884, "<|video|>", TokenType::Control},
};

constexpr int kNewlineFirstId = 107;  // "\n" .. 31 newlines at 107..137, as in Gemma's vocab
constexpr int kMaxNewlineRun = 31;
constexpr int kSpaceRunFirstId = 138;  // ▁▁ .. 31 ▁ at 138..167
constexpr int kMaxSpaceRun = 31;
constexpr int kByteFirstId = 238;  // <0x00>..<0xFF> at 238..493, as in the real file

// Non-ASCII characters given their own tokens so that text with accents, typographic punctuation
// and a little CJK tokenizes without byte fallback (anything else, e.g. emoji, falls back).
constexpr const char* kExtraChars[] = {
    "\t", "é",  "è",  "ê",  "à",  "á",  "ç",  "ñ",  "ö",  "ü", "ä", "ß", "ó", "í",  "ú",  "É",
    "—",  "–",  "’",  "‘",  "“",  "”",  "…",  "•",  "€",  "£", "°", "×", "→", "中", "文", "日",
    "本", "語", "人", "大", "の", "は", "に", "한", "국", "ы", "и", "а", "Ж", "я",  "α",  "β",
};

// Words (and a few fragments) turned into single tokens by merges, most frequent first.
constexpr const char* kWords[] = {
    "the",     "of",      "and",     "to",       "a",      "in",      "is",       "that",
    "for",     "it",      "as",      "was",      "with",   "be",      "by",       "on",
    "not",     "he",      "I",       "this",     "are",    "or",      "his",      "from",
    "at",      "which",   "but",     "have",     "an",     "had",     "they",     "you",
    "were",    "their",   "one",     "all",      "we",     "can",     "her",      "has",
    "there",   "been",    "if",      "more",     "when",   "will",    "would",    "who",
    "so",      "no",      "what",    "up",       "out",    "about",   "into",     "than",
    "them",    "only",    "other",   "some",     "time",   "could",   "these",    "two",
    "may",     "first",   "then",    "do",       "any",    "like",    "my",       "now",
    "over",    "such",    "our",     "man",      "me",     "even",    "most",     "made",
    "after",   "also",    "did",     "many",     "before", "must",    "through",  "back",
    "years",   "where",   "much",    "your",     "way",    "well",    "down",     "should",
    "because", "each",    "just",    "those",    "people", "how",     "too",      "little",
    "state",   "good",    "very",    "make",     "world",  "still",   "own",      "see",
    "men",     "work",    "long",    "get",      "here",   "between", "both",     "life",
    "being",   "under",   "never",   "day",      "same",   "another", "know",     "while",
    "last",    "might",   "us",      "great",    "old",    "year",    "off",      "come",
    "since",   "against", "go",      "came",     "right",  "used",    "take",     "three",
    "Hello",   "hello",   "world",   "model",    "token",  "answer",  "question", "water",
    "number",  "write",   "code",    "function", "return", "value",   "name",     "data",
    "file",    "user",    "system",  "help",     "thank",  "thanks",  "please",   "yes",
    "think",   "thought", "quick",   "brown",    "fox",    "jumps",   "lazy",     "dog",
    "cat",     "city",    "capital", "France",   "Paris",  "story",   "tell",     "short",
    "explain", "what's",  "it's",    "don't",    "I'm",    "ing",     "ed",       "er",
    "ly",      "tion",    "es",      "s",        "'s",     "ment",    "ness",
};

// The byte token text for b, e.g. "<0x0A>".
std::string byte_token(unsigned b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b & 0xFFu);
    return buf;
}

std::string unused_token(int id) {
    return "<unused" + std::to_string(id) + ">";
}

// Splits UTF-8 text into characters (the BPE base symbols). Only used on builder-chosen text.
std::vector<std::string> utf8_chars(std::string_view s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
        len = std::min(len, s.size() - i);
        out.emplace_back(s.substr(i, len));
        i += len;
    }
    return out;
}

// Builds the vocabulary id by id, keeping the reserved ids free for the fixed tokens.
class SyntheticBuilder {
  public:
    explicit SyntheticBuilder(int vocab_size) : size_(vocab_size) {
        v_.tokens.assign(size_, "");
        v_.scores.assign(size_, 0.0f);
        v_.types.assign(size_, 0);
    }

    void place(int id, std::string text, TokenType type) {
        if (id >= size_) return;
        v_.scores[id] = type == TokenType::Control ? -1000.0f : 0.0f;
        v_.types[id] = static_cast<int32_t>(type);
        index_.emplace(text, id);
        v_.tokens[id] = std::move(text);
    }

    bool full() {
        while (next_ < size_ && v_.types[next_] != 0) ++next_;
        return next_ >= size_;
    }

    // Appends a NORMAL token at the next free id; false when the vocabulary is full.
    bool append(const std::string& text) {
        if (index_.count(text)) return true;
        if (full()) return false;
        place(next_, text, TokenType::Normal);
        return true;
    }

    bool has(const std::string& text) const { return index_.count(text) != 0; }

    // Adds merges (and merged tokens) until BPE turns `word` into one token. Each new merge gets
    // the lowest priority so far, so earlier words keep tokenizing to a single token. Returns
    // false when the vocabulary filled up first.
    bool learn_word(std::string_view word) {
        for (;;) {
            auto symbols = bpe(word);
            if (symbols.size() <= 1) return true;
            if (!add_merge(symbols[0], symbols[1])) return false;
        }
    }

    bool add_merge(const std::string& a, const std::string& b) {
        if (!append(a + b)) return false;
        auto key = a + ' ' + b;
        if (merge_rank_.count(key)) return true;
        merge_rank_.emplace(key, static_cast<int>(v_.merges.size()));
        v_.merges.push_back(std::move(key));
        return true;
    }

    // Reference BPE (quadratic, fine for single words): merge the lowest-ranked adjacent pair,
    // leftmost first, until no pair has a merge.
    std::vector<std::string> bpe(std::string_view word) const {
        auto sym = utf8_chars(word);
        for (;;) {
            int best = std::numeric_limits<int>::max();
            size_t best_at = 0;
            for (size_t i = 0; i + 1 < sym.size(); ++i) {
                auto it = merge_rank_.find(sym[i] + ' ' + sym[i + 1]);
                if (it != merge_rank_.end() && it->second < best) {
                    best = it->second;
                    best_at = i;
                }
            }
            if (best == std::numeric_limits<int>::max()) return sym;
            sym[best_at] += sym[best_at + 1];
            sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
        }
    }

    const std::vector<std::string>& tokens() const { return v_.tokens; }
    int32_t type_of(int id) const { return v_.types[id]; }

    VocabData finish() {
        // Whatever is still free (only possible in small vocabularies that ran out of words
        // before filling up, or in gaps below the fixed ids) becomes an unused placeholder.
        for (int id = 0; id < size_; ++id) {
            if (v_.types[id] == 0) place(id, unused_token(id), TokenType::Unused);
        }
        return std::move(v_);
    }

  private:
    int size_;
    int next_ = 0;
    VocabData v_;
    std::unordered_map<std::string, int> index_;
    std::unordered_map<std::string, int> merge_rank_;
};

}  // namespace

VocabData make_synthetic_vocab(int vocab_size, uint64_t seed) {
    if (vocab_size < 1024) {
        throw std::invalid_argument("synthetic vocabulary needs at least 1024 tokens, got " +
                                    std::to_string(vocab_size));
    }
    SyntheticBuilder b(vocab_size);
    for (const auto& t : kSpecialTokens) b.place(t.id, t.text, t.type);
    for (const auto& t : kMediaTokens) b.place(t.id, t.text, t.type);
    for (int k = 1; k <= kMaxNewlineRun; ++k) {
        b.place(kNewlineFirstId + k - 1, std::string(static_cast<size_t>(k), '\n'),
                TokenType::Normal);
    }
    for (int k = 2; k <= kMaxSpaceRun; ++k) {
        std::string run;
        for (int i = 0; i < k; ++i) run += kSpace;
        b.place(kSpaceRunFirstId + k - 2, run, TokenType::Normal);
    }
    // Free low ids below the byte block stay unused placeholders, as in Gemma's own vocabulary.
    for (int id = 0; id < kByteFirstId; ++id) {
        if (b.type_of(id) == 0) b.place(id, unused_token(id), TokenType::Unused);
    }
    for (unsigned byte = 0; byte < 256; ++byte) {
        b.place(kByteFirstId + static_cast<int>(byte), byte_token(byte), TokenType::Byte);
    }

    // Base symbols: ▁ and printable ASCII (the space itself never occurs: it becomes ▁), extras.
    b.append(std::string(kSpace));
    for (char c = '!'; c <= '~'; ++c) b.append(std::string(1, c));
    for (const char* c : kExtraChars) b.append(c);

    // Newline runs must come out of BPE whole too (the tokenizer keeps a pure newline run that is
    // a token whole anyway; merges make Hugging Face's BPE agree).
    bool room = true;
    for (int k = 2; k <= kMaxNewlineRun && room; ++k) {
        room = b.learn_word(std::string(static_cast<size_t>(k), '\n'));
    }
    for (int k = 2; k <= 8 && room; ++k) {  // short runs of spaces, e.g. code indentation
        std::string run;
        for (int i = 0; i < k; ++i) run += kSpace;
        room = b.learn_word(run);
    }
    for (const char* w : kWords) {
        if (!room) break;
        room = b.learn_word(std::string(kSpace) + w) && b.learn_word(w);
    }
    for (int d = 0; d < 100 && room; ++d) room = b.learn_word(std::to_string(d));

    // Fill the rest with seeded random extensions of existing tokens by one base character (each
    // a new token with its merge), so large vocabularies get a realistic number of tokens and
    // merges. Extending a uniformly drawn token keeps typical token lengths short.
    std::mt19937_64 rng(seed);
    std::vector<std::string> base;
    std::vector<std::string> pool;
    for (const auto& t : b.tokens()) {
        if (t.empty() || t.find('\n') != std::string::npos || t.find("<") == 0) continue;
        if (utf8_chars(t).size() == 1) base.push_back(t);
        pool.push_back(t);
    }
    // Bounded attempts keep this terminating for any size.
    for (size_t attempts = 0; room && !b.full() && attempts < 16u * static_cast<size_t>(vocab_size);
         ++attempts) {
        std::string x = pool[rng() % pool.size()];
        std::string y = base[rng() % base.size()];
        if (x.size() + y.size() > 32 || b.has(x + y)) continue;
        room = b.add_merge(x, y);
        pool.push_back(x + y);
    }
    VocabData v = b.finish();
    v.model = "gemma4";
    v.bos_id = 2;
    v.eos_id = 1;
    v.pad_id = 0;
    v.unk_id = 3;
    v.add_bos = true;
    return v;
}

}  // namespace gj::tok
