// The Gemma 4 BPE tokenizer: algorithm details against hand-built vocabularies and a quadratic
// reference BPE, round trips, streaming decode, bad vocabularies, load speed.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <map>
#include <random>

#include "engine/text/tokenizer.h"

using gj::tok::StreamDecoder;
using gj::tok::Tokenizer;
using gj::tok::TokenizerError;
using gj::tok::TokenType;
using gj::tok::VocabData;

namespace {

const std::string kSp = "\xE2\x96\x81";  // ▁

// A vocabulary with the given tokens (all NORMAL unless typed) plus the 256 byte tokens.
VocabData tiny_vocab(const std::vector<std::pair<std::string, TokenType>>& toks,
                     std::vector<std::string> merges) {
    VocabData v;
    for (const auto& [t, type] : toks) {
        v.tokens.push_back(t);
        v.types.push_back(static_cast<int32_t>(type));
    }
    for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        v.tokens.push_back(buf);
        v.types.push_back(static_cast<int32_t>(TokenType::Byte));
    }
    v.scores.assign(v.tokens.size(), 0.0f);
    v.merges = std::move(merges);
    v.bos_id = 2;
    v.eos_id = 1;
    v.pad_id = 0;
    v.unk_id = 3;
    return v;
}

std::vector<std::pair<std::string, TokenType>> base_specials() {
    return {{"<pad>", TokenType::Control},
            {"<eos>", TokenType::Control},
            {"<bos>", TokenType::Control},
            {"<unk>", TokenType::Unknown}};
}

int byte_id(const Tokenizer& t, unsigned b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    return t.find(buf);
}

// Quadratic textbook BPE on one pre-split chunk: merge the lowest-ranked adjacent pair (leftmost
// on ties) until none applies. Independent of the tokenizer's priority-queue implementation.
using RankMap = std::map<std::pair<std::string, std::string>, int>;

RankMap rank_map(const Tokenizer& t) {
    RankMap rank;
    const auto& merges = t.vocab().merges;
    for (size_t r = 0; r < merges.size(); ++r) {
        auto sp = merges[r].find(' ', 1);
        rank.emplace(std::pair{merges[r].substr(0, sp), merges[r].substr(sp + 1)},
                     static_cast<int>(r));
    }
    return rank;
}

std::vector<int32_t> reference_chunk(const Tokenizer& t, const RankMap& rank,
                                     const std::string& chunk) {
    std::vector<std::string> sym;
    for (size_t i = 0; i < chunk.size();) {
        size_t len = gj::tok::utf8_char_length(std::string_view(chunk).substr(i));
        if (len == 0) len = 1;
        sym.push_back(chunk.substr(i, len));
        i += len;
    }
    for (;;) {
        int best = INT_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            if (t.find(sym[i]) < 0 || t.find(sym[i + 1]) < 0) continue;
            auto it = rank.find({sym[i], sym[i + 1]});
            if (it != rank.end() && it->second < best) best = it->second, at = i;
        }
        if (best == INT_MAX) break;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + static_cast<long>(at) + 1);
    }
    std::vector<int32_t> out;
    for (const auto& s : sym) {
        if (int id = t.find(s); id >= 0) {
            out.push_back(id);
        } else {
            for (unsigned char c : s) out.push_back(byte_id(t, c));
        }
    }
    return out;
}

// Reference for text without special tokens: escape spaces, split newline runs, BPE each run.
std::vector<int32_t> reference_encode(const Tokenizer& t, const RankMap& rank,
                                      const std::string& text) {
    std::string s;
    for (char c : text) s += c == ' ' ? kSp : std::string(1, c);
    std::vector<int32_t> out;
    for (size_t i = 0; i < s.size();) {
        bool nl = s[i] == '\n';
        size_t j = i;
        while (j < s.size() && (s[j] == '\n') == nl) ++j;
        std::string chunk = s.substr(i, j - i);
        if (nl && t.find(chunk) >= 0) {
            out.push_back(t.find(chunk));
        } else {
            auto part = reference_chunk(t, rank, chunk);
            out.insert(out.end(), part.begin(), part.end());
        }
        i = j;
    }
    return out;
}

std::string random_text(std::mt19937_64& rng, size_t max_len) {
    static const std::vector<std::string> alphabet = {
        "a",  "b",    "e",    "h",    "t",   "o",   "n",   "s",   " ",
        " ",  " ",    "\n",   "\n\n", "the", "The", "and", "ing", "1",
        "9",  ".",    ",",    "!",    "'",   "é",   "ü",   "中",  "\xF0\x9F\x99\x82" /* 🙂 */,
        "\t", "\xFF", "\xC3", "\x80", "q",   "z",   "X",   "{",   "}",
        ":",  "<",    ">",    "|"};
    std::string s;
    size_t n = rng() % (max_len + 1);
    for (size_t i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
}

const Tokenizer& synthetic(int size) {
    static std::map<int, Tokenizer> cache;
    auto it = cache.find(size);
    if (it == cache.end())
        it = cache.emplace(size, Tokenizer(gj::tok::make_synthetic_vocab(size, 3))).first;
    return it->second;
}

}  // namespace

TEST(Tokenizer, CommonWordsAreSingleTokens) {
    const Tokenizer& t = synthetic(2048);
    auto ids = t.encode("the quick brown fox", false);
    std::vector<int32_t> expect = {t.find("the"), t.find(kSp + "quick"), t.find(kSp + "brown"),
                                   t.find(kSp + "fox")};
    EXPECT_EQ(ids, expect);
    auto with_bos = t.encode("Hello", true);
    ASSERT_EQ(with_bos.size(), 2u);
    EXPECT_EQ(with_bos[0], 2);
    EXPECT_EQ(with_bos[1], t.find("Hello"));
    EXPECT_TRUE(t.encode("", false).empty());
    EXPECT_EQ(t.encode("", true), std::vector<int32_t>{2});
}

TEST(Tokenizer, MatchesReferenceBpeOnRandomText) {
    for (int size : {1024, 4096}) {
        const Tokenizer& t = synthetic(size);
        std::mt19937_64 rng(size);
        const RankMap rank = rank_map(t);
        for (int i = 0; i < 3000; ++i) {
            std::string s = random_text(rng, 30);
            ASSERT_EQ(t.encode(s, false, false), reference_encode(t, rank, s))
                << "text: '" << s << "'";
        }
    }
}

TEST(Tokenizer, RoundTripsArbitraryBytes) {
    const Tokenizer& t = synthetic(4096);
    std::mt19937_64 rng(11);
    for (int i = 0; i < 2000; ++i) {
        std::string s = random_text(rng, 40);
        if (i % 3 == 0) s += "<|turn>user\n" + random_text(rng, 5) + "<turn|><eos>";
        for (int k = 0; k < 3 && i % 5 == 0; ++k) s.push_back(static_cast<char>(rng() % 256));
        auto ids = t.encode(s, true);
        EXPECT_EQ(t.decode(ids, true), "<bos>" + s);
        // Without rendering control tokens only their text disappears.
        std::string stripped = t.decode(ids, false);
        EXPECT_LE(stripped.size(), s.size());
    }
}

TEST(Tokenizer, SpecialTokensLeftmostLongestAndParseSpecial) {
    const Tokenizer& t = synthetic(2048);
    auto ids = t.encode("<|turn>user\nhi<turn|>\n<|channel>x<channel|>", false);
    ASSERT_GE(ids.size(), 6u);
    EXPECT_EQ(ids[0], 105);
    EXPECT_EQ(ids.back(), 101);
    EXPECT_NE(std::find(ids.begin(), ids.end(), 106), ids.end());
    EXPECT_NE(std::find(ids.begin(), ids.end(), 100), ids.end());
    // Without parse_special, CONTROL text is plain text but USER_DEFINED tokens still split out.
    auto plain = t.encode("<|turn><|channel>", false, false);
    EXPECT_EQ(std::find(plain.begin(), plain.end(), 105), plain.end());
    EXPECT_EQ(plain.back(), 100);
    EXPECT_EQ(t.decode(plain), "<|turn><|channel>");

    // Overlapping specials: the longest one starting at the leftmost position wins.
    auto toks = base_specials();
    toks.push_back({"<a>", TokenType::Control});
    toks.push_back({"<a><b>", TokenType::Control});
    toks.push_back({"<b>", TokenType::Control});
    toks.push_back({"x", TokenType::Normal});
    Tokenizer small(tiny_vocab(toks, {}));
    EXPECT_EQ(small.encode("x<a><b><b>", false),
              (std::vector<int32_t>{small.find("x"), small.find("<a><b>"), small.find("<b>")}));
}

TEST(Tokenizer, SpacesBecomeSpaceMarkWithoutPrefix) {
    const Tokenizer& t = synthetic(2048);
    auto ids = t.encode(" the  end ", false);
    EXPECT_EQ(ids.front(), t.find(kSp + "the"));
    EXPECT_EQ(t.decode(ids), " the  end ");
    EXPECT_EQ(t.encode("a", false), std::vector<int32_t>{t.find("a")});  // no "▁a"
}

TEST(Tokenizer, NewlineRunThatIsATokenStaysWhole) {
    // "\n\n\n" is a token but no merge builds it; BPE alone would leave three "\n".
    auto toks = base_specials();
    for (const char* s : {"\n", "\n\n\n", "a"}) toks.push_back({s, TokenType::Normal});
    Tokenizer t(tiny_vocab(toks, {}));
    int nl = t.find("\n"), nl3 = t.find("\n\n\n"), a = t.find("a");
    EXPECT_EQ(t.encode("a\n\n\na", false), (std::vector<int32_t>{a, nl3, a}));
    EXPECT_EQ(t.encode("\n\n", false), (std::vector<int32_t>{nl, nl}));
    EXPECT_EQ(t.encode("\n\n\n\n", false), (std::vector<int32_t>{nl, nl, nl, nl}));
}

TEST(Tokenizer, MergeRankOrderAndLeftmostTies) {
    auto toks = base_specials();
    for (const char* s : {"a", "b", "c", "ab", "bc", "abc", "aa", "aaa"})
        toks.push_back({s, TokenType::Normal});
    // "b c" outranks "a b": abc -> a bc (no "a bc" merge) ; ties in "aaa" merge leftmost first.
    Tokenizer t(tiny_vocab(toks, {"b c", "a b", "ab c", "a a"}));
    EXPECT_EQ(t.encode("abc", false), (std::vector<int32_t>{t.find("a"), t.find("bc")}));
    EXPECT_EQ(t.encode("aaa", false), (std::vector<int32_t>{t.find("aa"), t.find("a")}));
    Tokenizer u(tiny_vocab(toks, {"a b", "b c", "ab c"}));
    EXPECT_EQ(u.encode("abc", false), std::vector<int32_t>{u.find("abc")});
}

TEST(Tokenizer, ByteFallbackForUnknownSymbolsAndInvalidUtf8) {
    const Tokenizer& t = synthetic(1024);
    const std::string emoji = "\xF0\x9F\x99\x82";
    auto ids = t.encode(emoji, false);
    EXPECT_EQ(ids, (std::vector<int32_t>{byte_id(t, 0xF0), byte_id(t, 0x9F), byte_id(t, 0x99),
                                         byte_id(t, 0x82)}));
    EXPECT_EQ(t.decode(ids), emoji);
    std::string bad = "a\xFF\xC3(\xE2\x96";
    auto bad_ids = t.encode(bad, false);
    EXPECT_EQ(t.decode(bad_ids), bad);
    EXPECT_EQ(bad_ids[1], byte_id(t, 0xFF));
}

TEST(Tokenizer, StreamDecoderEmitsOnlyCompleteCharacters) {
    const Tokenizer& t = synthetic(1024);
    StreamDecoder d(t);
    EXPECT_EQ(d.push(byte_id(t, 0xF0)), "");
    EXPECT_EQ(d.push(byte_id(t, 0x9F)), "");
    EXPECT_EQ(d.push(byte_id(t, 0x99)), "");
    EXPECT_EQ(d.push(byte_id(t, 0x82)), "\xF0\x9F\x99\x82");
    EXPECT_EQ(d.push(t.find("a")), "a");
    EXPECT_EQ(d.push(2), "");                             // <bos> is not rendered
    EXPECT_EQ(d.push(byte_id(t, 0xFF)), "\xEF\xBF\xBD");  // can never be valid
    EXPECT_EQ(d.push(byte_id(t, 0xC3)), "");
    EXPECT_EQ(d.push(t.find("a")),
              "\xEF\xBF\xBD"
              "a");  // lead byte cut off by an ASCII char
    EXPECT_EQ(d.push(byte_id(t, 0xE2)), "");
    EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
    EXPECT_EQ(d.finish(), "");

    StreamDecoder shown(t, true);
    EXPECT_EQ(shown.push(105), "<|turn>");
    EXPECT_EQ(shown.push(100), "<|channel>");
    StreamDecoder hidden(t);
    EXPECT_EQ(hidden.push(100), "<|channel>");  // USER_DEFINED always renders
}

TEST(Tokenizer, RejectsBadVocabularies) {
    auto expect_error = [](VocabData v, const std::string& needle) {
        try {
            Tokenizer t(std::move(v));
            FAIL() << "no error; expected one mentioning " << needle;
        } catch (const TokenizerError& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    auto toks = base_specials();
    toks.push_back({"a", TokenType::Normal});
    VocabData v = tiny_vocab(toks, {});
    v.model = "llama";
    expect_error(v, "'llama'");
    expect_error(tiny_vocab(toks, {"a b"}), "merges[0] 'a b'");
    expect_error(tiny_vocab(toks, {"ab"}), "not of the form");
    expect_error(tiny_vocab(toks, {"a a"}), "'aa', which is not a token");
    v = tiny_vocab(toks, {});
    v.bos_id = 100000;
    expect_error(v, "bos_token_id 100000");
    v = tiny_vocab(toks, {});
    v.types[4] = static_cast<int32_t>(TokenType::Byte);
    expect_error(v, "type BYTE");
    v = tiny_vocab(toks, {});
    v.scores.pop_back();
    expect_error(v, "entries for");
    const Tokenizer& t = synthetic(1024);
    EXPECT_THROW(t.piece(1024), TokenizerError);
    EXPECT_THROW(t.piece(-1), TokenizerError);
}

TEST(Tokenizer, RealSizedVocabularyLoadsFast) {
    auto v = gj::tok::make_synthetic_vocab(262144, 0);
    // Pad the merge list to the real file's 514,906 entries with alternative splits of existing
    // tokens (valid merges with lower priority), so the load handles the real table size.
    std::unordered_map<std::string, int> index;
    for (size_t i = 0; i < v.tokens.size(); ++i) index.emplace(v.tokens[i], static_cast<int>(i));
    for (size_t i = 0; i < v.tokens.size() && v.merges.size() < 514906; ++i) {
        const std::string& s = v.tokens[i];
        if (v.types[i] != static_cast<int32_t>(TokenType::Normal)) continue;
        for (size_t cut = 1; cut < s.size() && v.merges.size() < 514906; ++cut) {
            if (index.count(s.substr(0, cut)) && index.count(s.substr(cut)) &&
                s.find(' ') == std::string::npos) {
                v.merges.push_back(s.substr(0, cut) + " " + s.substr(cut));
            }
        }
    }
    ASSERT_GE(v.merges.size(), 500000u);
    auto t0 = std::chrono::steady_clock::now();
    Tokenizer t(std::move(v));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("load of 262144 tokens + %zu merges: %.3f s\n", t.vocab().merges.size(), s);
    // About 0.3 s in an idle Release build; the bound only catches a blow-up (a quadratic load
    // would take minutes), not noise from loaded CI machines or sanitizers.
    EXPECT_LT(s, 30.0);
    std::string text;
    for (int i = 0; i < 2000; ++i) text += "The quick brown fox jumps over the lazy dog. ";
    t0 = std::chrono::steady_clock::now();
    auto ids = t.encode(text, true);
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("encode of %zu bytes: %zu tokens in %.3f s\n", text.size(), ids.size(), s);
    EXPECT_EQ(t.decode(ids), text);
}
