#include "engine/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <queue>

namespace gj::tok {

namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // ▁ U+2581

// Open-addressing table from token text to id (the texts stay in VocabData::tokens): one array
// of ids, no per-entry allocation, so a 262144-token vocabulary indexes in milliseconds.
class TextIndex {
  public:
    void build(const std::vector<std::string>& tokens) {
        tokens_ = &tokens;
        size_t cap = 16;
        while (cap < tokens.size() * 2) cap *= 2;
        slots_.assign(cap, -1);
        mask_ = cap - 1;
        for (size_t i = 0; i < tokens.size(); ++i) {
            size_t h = hash(tokens[i]);
            while (slots_[h] >= 0 && tokens[static_cast<size_t>(slots_[h])] != tokens[i]) {
                h = (h + 1) & mask_;
            }
            if (slots_[h] < 0) slots_[h] = static_cast<int32_t>(i);  // the first duplicate wins
        }
    }
    int32_t find(std::string_view s) const {
        for (size_t h = hash(s);; h = (h + 1) & mask_) {
            const int32_t id = slots_[h];
            if (id < 0 || (*tokens_)[static_cast<size_t>(id)] == s) return id;
        }
    }

  private:
    size_t hash(std::string_view s) const {
        const size_t h = std::hash<std::string_view>{}(s);
        return h & mask_;
    }
    const std::vector<std::string>* tokens_ = nullptr;
    std::vector<int32_t> slots_;
    size_t mask_ = 0;
};

uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Merge {
    int32_t rank;
    int32_t result;
};

// Open-addressing table from a (left id, right id) pair to its merge.
class MergeTable {
  public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap *= 2;
        slots_.assign(cap, Slot{kEmpty, {0, 0}});
        mask_ = cap - 1;
    }
    void insert(uint64_t key, Merge m) {  // the first (lowest rank) of duplicate pairs wins
        size_t h = hash(key);
        while (slots_[h].key != kEmpty && slots_[h].key != key) h = (h + 1) & mask_;
        if (slots_[h].key == kEmpty) slots_[h] = {key, m};
    }
    const Merge* find(uint64_t key) const {
        for (size_t h = hash(key);; h = (h + 1) & mask_) {
            if (slots_[h].key == key) return &slots_[h].merge;
            if (slots_[h].key == kEmpty) return nullptr;
        }
    }

  private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are < 2^31: no real key is all ones
    struct Slot {
        uint64_t key;
        Merge merge;
    };
    size_t hash(uint64_t k) const {
        return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
    }
    std::vector<Slot> slots_;
    size_t mask_ = 0;
};

struct SpecialToken {
    std::string_view text;  // into VocabData::tokens
    int32_t id;
    bool always;  // USER_DEFINED: split out even when not parsing special tokens
};

// The value of "<0xXX>", or -1.
int parse_byte_token(std::string_view t) {
    auto hex = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// A prefix of s that is a valid UTF-8 character: its length, whether more bytes could still make
// it valid (s ends inside a well-formed character), or neither.
struct Utf8Scan {
    size_t length = 0;        // > 0: complete valid character
    bool incomplete = false;  // true: a valid prefix cut short by the end of s
};

Utf8Scan scan_utf8(std::string_view s) {
    const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
    const unsigned char c = b(0);
    if (c < 0x80) return {1, false};
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;  // no overlong forms
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return {};
    }
    for (size_t i = 1; i < len; ++i) {
        if (i >= s.size()) return {0, true};
        const unsigned char x = b(i);
        if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) return {};
    }
    return {len, false};
}

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t utf8_char_length(std::string_view s) {
    return s.empty() ? 0 : scan_utf8(s).length;
}

struct Tokenizer::Impl {
    VocabData v;
    TextIndex index;
    MergeTable merges;
    std::array<int32_t, 256> byte_ids{};
    // Special tokens bucketed by first byte, longest first within a bucket.
    std::array<std::vector<SpecialToken>, 256> specials;
    std::vector<int> byte_of_token;  // byte value for BYTE tokens, else -1

    void encode_text(std::string_view text, std::vector<int32_t>& out) const;
    void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;
    void byte_fallback(std::string_view bytes, std::vector<int32_t>& out) const;
};

Tokenizer::Tokenizer(VocabData vocab) : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.v = std::move(vocab);
    const VocabData& v = m.v;
    if (v.model != "gemma4") {
        throw TokenizerError("tokenizer.ggml.model is '" + v.model +
                             "'; only the Gemma 4 tokenizer ('gemma4') is supported");
    }
    const size_t n = v.tokens.size();
    if (n == 0) throw TokenizerError("the vocabulary (tokenizer.ggml.tokens) is empty");
    if (n > static_cast<size_t>(INT32_MAX)) throw TokenizerError("the vocabulary is too large");
    if (v.types.size() != n || v.scores.size() != n) {
        throw TokenizerError(
            "tokenizer.ggml.token_type/scores have " + std::to_string(v.types.size()) + "/" +
            std::to_string(v.scores.size()) + " entries for " + std::to_string(n) + " tokens");
    }
    for (auto [name, id] : {std::pair{"bos", v.bos_id}, std::pair{"eos", v.eos_id},
                            std::pair{"padding", v.pad_id}, std::pair{"unknown", v.unk_id}}) {
        if (id < 0 || static_cast<size_t>(id) >= n) {
            throw TokenizerError(std::string("tokenizer.ggml.") + name + "_token_id " +
                                 std::to_string(id) + " is outside the vocabulary of " +
                                 std::to_string(n) + " tokens");
        }
    }

    m.index.build(v.tokens);
    m.byte_ids.fill(-1);
    m.byte_of_token.assign(n, -1);
    for (size_t i = 0; i < n; ++i) {
        const auto id = static_cast<int32_t>(i);
        const std::string& t = v.tokens[i];
        const auto type = static_cast<TokenType>(v.types[i]);
        if (type == TokenType::Byte) {
            int b = parse_byte_token(t);
            if (b < 0) {
                throw TokenizerError("token " + std::to_string(i) + " '" + t +
                                     "' has type BYTE but is not of the form <0xXX>");
            }
            m.byte_of_token[i] = b;
        }
        if ((type == TokenType::Control || type == TokenType::UserDefined ||
             type == TokenType::Unknown) &&
            !t.empty()) {
            m.specials[static_cast<unsigned char>(t[0])].push_back(
                {t, id, type == TokenType::UserDefined});
        }
    }
    for (unsigned b = 0; b < 256; ++b) {
        static const char* hex = "0123456789ABCDEF";
        const char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
        m.byte_ids[b] = m.index.find(std::string_view(name, 6));
    }
    for (auto& bucket : m.specials) {
        std::stable_sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) {
            return a.text.size() > b.text.size();
        });
    }

    m.merges.reserve(v.merges.size());
    std::string joined;  // reused: no allocation per merge
    for (size_t r = 0; r < v.merges.size(); ++r) {
        const std::string& line = v.merges[r];
        // Split at the first space after the first character, as llama.cpp does, so a merge whose
        // left part is a lone space still parses.
        const size_t sp = line.size() > 1 ? line.find(' ', 1) : std::string::npos;
        auto bad = [&](const std::string& why) {
            return TokenizerError("tokenizer.ggml.merges[" + std::to_string(r) + "] '" + line +
                                  "' " + why);
        };
        if (sp == std::string::npos) throw bad("is not of the form 'left right'");
        const std::string_view left(line.data(), sp),
            right(line.data() + sp + 1, line.size() - sp - 1);
        const int32_t li = m.index.find(left), ri = m.index.find(right);
        if (li < 0 || ri < 0) throw bad("names a part that is not a token");
        joined.assign(left).append(right);
        const int32_t ji = m.index.find(joined);
        if (ji < 0) throw bad("produces '" + joined + "', which is not a token");
        m.merges.insert(pair_key(li, ri), Merge{static_cast<int32_t>(r), ji});
    }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int Tokenizer::vocab_size() const {
    return static_cast<int>(impl_->v.tokens.size());
}
const VocabData& Tokenizer::vocab() const {
    return impl_->v;
}

int32_t Tokenizer::find(std::string_view text) const {
    return impl_->index.find(text);
}

TokenType Tokenizer::type(int32_t id) const {
    if (id < 0 || id >= vocab_size()) {
        throw TokenizerError("token id " + std::to_string(id) + " is outside the vocabulary of " +
                             std::to_string(vocab_size()) + " tokens");
    }
    return static_cast<TokenType>(impl_->v.types[id]);
}

bool Tokenizer::is_stop_token(int32_t id) {
    return std::find(std::begin(kStopTokens), std::end(kStopTokens), id) != std::end(kStopTokens);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
    const Impl& m = *impl_;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos) out.push_back(m.v.bos_id);

    // Leftmost-longest special-token split; text between matches goes through BPE.
    size_t plain_start = 0;
    for (size_t i = 0; i < text.size();) {
        const SpecialToken* hit = nullptr;
        for (const auto& s : m.specials[static_cast<unsigned char>(text[i])]) {
            if ((parse_special || s.always) && text.substr(i, s.text.size()) == s.text) {
                hit = &s;
                break;
            }
        }
        if (!hit) {
            ++i;
            continue;
        }
        m.encode_text(text.substr(plain_start, i - plain_start), out);
        out.push_back(hit->id);
        i += hit->text.size();
        plain_start = i;
    }
    m.encode_text(text.substr(plain_start), out);
    return out;
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    std::string escaped;
    escaped.reserve(text.size() + text.size() / 4);
    for (char c : text) {
        if (c == ' ') {
            escaped.append(kSpaceMark);
        } else {
            escaped.push_back(c);
        }
    }
    // Runs of newlines and runs of everything else are tokenized separately.
    std::string_view s = escaped;
    for (size_t i = 0; i < s.size();) {
        const bool newline = s[i] == '\n';
        size_t j = i;
        while (j < s.size() && (s[j] == '\n') == newline) ++j;
        const std::string_view chunk = s.substr(i, j - i);
        if (const int32_t id = newline ? index.find(chunk) : -1; id >= 0) {
            out.push_back(id);  // a newline run that is a token stays whole
        } else {
            encode_chunk(chunk, out);
        }
        i = j;
    }
}

void Tokenizer::Impl::byte_fallback(std::string_view bytes, std::vector<int32_t>& out) const {
    for (char c : bytes) {
        const int32_t id = byte_ids[static_cast<unsigned char>(c)];
        out.push_back(id >= 0 ? id : v.unk_id);  // a vocabulary without byte tokens gets <unk>
    }
}

void Tokenizer::Impl::encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
    struct Symbol {
        uint32_t start, len;
        int32_t id;  // -1: not a token (falls back to bytes)
        int32_t prev, next;
    };
    struct Candidate {
        int32_t rank, left, right;
        int32_t left_id, right_id;
        bool operator<(const Candidate& o) const {  // priority_queue top = lowest rank, leftmost
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };

    std::vector<Symbol> sym;
    sym.reserve(chunk.size());
    for (size_t i = 0; i < chunk.size();) {
        size_t len = scan_utf8(chunk.substr(i)).length;
        if (len == 0) len = 1;  // an invalid byte is a symbol of its own
        const int32_t id = index.find(chunk.substr(i, len));
        const auto k = static_cast<int32_t>(sym.size());
        sym.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), id, k - 1, k + 1});
        i += len;
    }
    if (sym.empty()) return;
    sym.back().next = -1;

    std::priority_queue<Candidate> queue;
    auto consider = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
        if (const Merge* m = merges.find(pair_key(sym[l].id, sym[r].id))) {
            queue.push({m->rank, l, r, sym[l].id, sym[r].id});
        }
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i, i + 1);

    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        Symbol& l = sym[c.left];
        Symbol& r = sym[c.right];
        // Stale entries: either side merged into something else since this pair was queued.
        if (l.len == 0 || r.len == 0 || l.next != c.right || l.id != c.left_id ||
            r.id != c.right_id) {
            continue;
        }
        l.id = merges.find(pair_key(c.left_id, c.right_id))->result;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = c.left;
        consider(l.prev, c.left);
        consider(c.left, l.next);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) {
            out.push_back(sym[i].id);
        } else {
            byte_fallback(chunk.substr(sym[i].start, sym[i].len), out);
        }
    }
}

std::string Tokenizer::piece(int32_t id, bool render_special) const {
    const Impl& m = *impl_;
    const TokenType t = type(id);
    const std::string& text = m.v.tokens[id];
    switch (t) {
        case TokenType::Byte:
            return std::string(1, static_cast<char>(m.byte_of_token[id]));
        case TokenType::Control:
        case TokenType::Unknown:
            return render_special ? text : std::string();
        case TokenType::UserDefined:
            return text;
        case TokenType::Normal:
        case TokenType::Unused:
            break;
    }
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
            out.push_back(' ');
            i += kSpaceMark.size();
        } else {
            out.push_back(text[i++]);
        }
    }
    return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
    std::string out;
    for (int32_t id : ids) out += piece(id, render_special);
    return out;
}

std::string StreamDecoder::push(int32_t id) {
    pending_ += tok_->piece(id, render_special_);
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        const Utf8Scan s = scan_utf8(std::string_view(pending_).substr(i));
        if (s.incomplete) break;  // wait for the rest of the character
        if (s.length == 0) {
            out += kReplacementChar;
            ++i;
        } else {
            out.append(pending_, i, s.length);
            i += s.length;
        }
    }
    pending_.erase(0, i);
    return out;
}

std::string StreamDecoder::finish() {
    std::string out = pending_.empty() ? "" : std::string(kReplacementChar);
    pending_.clear();
    return out;
}

}  // namespace gj::tok
