// The synthetic vocabulary: exact size, Gemma 4 special tokens at their real ids, byte tokens,
// valid merges, determinism.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <unordered_map>

#include "engine/text/tokenizer_data.h"

using gj::tok::make_synthetic_vocab;
using gj::tok::TokenType;

namespace {

void expect_token(const gj::tok::VocabData& v, int id, const std::string& text, TokenType type) {
    ASSERT_LT(id, static_cast<int>(v.tokens.size()));
    EXPECT_EQ(v.tokens[id], text) << "id " << id;
    EXPECT_EQ(v.types[id], static_cast<int32_t>(type)) << "id " << id << " " << text;
}

void check_structure(const gj::tok::VocabData& v, int size) {
    ASSERT_EQ(v.tokens.size(), static_cast<size_t>(size));
    ASSERT_EQ(v.scores.size(), v.tokens.size());
    ASSERT_EQ(v.types.size(), v.tokens.size());
    EXPECT_EQ(v.model, "gemma4");
    EXPECT_EQ(v.bos_id, 2);
    EXPECT_EQ(v.eos_id, 1);
    EXPECT_EQ(v.pad_id, 0);
    EXPECT_EQ(v.unk_id, 3);
    EXPECT_TRUE(v.add_bos);
    expect_token(v, 0, "<pad>", TokenType::Control);
    expect_token(v, 1, "<eos>", TokenType::Control);
    expect_token(v, 2, "<bos>", TokenType::Control);
    expect_token(v, 3, "<unk>", TokenType::Unknown);
    expect_token(v, 4, "<mask>", TokenType::Control);
    expect_token(v, 46, "<|tool>", TokenType::Control);
    expect_token(v, 47, "<tool|>", TokenType::Control);
    expect_token(v, 48, "<|tool_call>", TokenType::UserDefined);
    expect_token(v, 49, "<tool_call|>", TokenType::UserDefined);
    expect_token(v, 50, "<|tool_response>", TokenType::UserDefined);
    expect_token(v, 51, "<tool_response|>", TokenType::UserDefined);
    expect_token(v, 52, "<|\"|>", TokenType::UserDefined);
    expect_token(v, 98, "<|think|>", TokenType::Control);
    expect_token(v, 100, "<|channel>", TokenType::UserDefined);
    expect_token(v, 101, "<channel|>", TokenType::UserDefined);
    expect_token(v, 105, "<|turn>", TokenType::Control);
    expect_token(v, 106, "<turn|>", TokenType::Control);
    expect_token(v, 107, "\n", TokenType::Normal);
    expect_token(v, 108, "\n\n", TokenType::Normal);
    expect_token(v, 238, "<0x00>", TokenType::Byte);
    expect_token(v, 238 + 0x0A, "<0x0A>", TokenType::Byte);
    expect_token(v, 238 + 255, "<0xFF>", TokenType::Byte);

    std::unordered_map<std::string, int> index;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
        EXPECT_FALSE(v.tokens[i].empty()) << "empty token at " << i;
        EXPECT_TRUE(index.emplace(v.tokens[i], static_cast<int>(i)).second)
            << "duplicate token '" << v.tokens[i] << "' at " << i;
        EXPECT_GE(v.types[i], 1);
        EXPECT_LE(v.types[i], 6);
    }
    for (char c = '!'; c <= '~'; ++c) EXPECT_TRUE(index.count(std::string(1, c))) << c;
    EXPECT_TRUE(index.count("\xE2\x96\x81"));
    EXPECT_TRUE(index.count("\xE2\x96\x81the"));
    // Every merge joins two tokens into a token, and no merge appears twice.
    std::set<std::string> seen;
    EXPECT_GT(v.merges.size(), 100u);
    for (const auto& m : v.merges) {
        auto sp = m.find(' ', 1);
        ASSERT_NE(sp, std::string::npos) << m;
        auto a = m.substr(0, sp), b = m.substr(sp + 1);
        EXPECT_TRUE(index.count(a)) << m;
        EXPECT_TRUE(index.count(b)) << m;
        EXPECT_TRUE(index.count(a + b)) << m;
        EXPECT_TRUE(seen.insert(m).second) << "duplicate merge " << m;
    }
}

}  // namespace

TEST(SyntheticVocab, SmallestSizeHasEverything) {
    check_structure(make_synthetic_vocab(1024), 1024);
}

TEST(SyntheticVocab, OddAndMediumSizes) {
    check_structure(make_synthetic_vocab(1031, 5), 1031);
    check_structure(make_synthetic_vocab(2048, 1), 2048);
    check_structure(make_synthetic_vocab(8192, 2), 8192);
}

TEST(SyntheticVocab, RealSizeHasMediaTokens) {
    auto v = make_synthetic_vocab(262144, 0);
    check_structure(v, 262144);
    expect_token(v, 255999, "<|image>", TokenType::Control);
    expect_token(v, 258884, "<|video|>", TokenType::Control);
    // Large vocabularies are filled with real merged tokens, not placeholders.
    size_t unused = 0;
    for (auto t : v.types) unused += t == static_cast<int32_t>(TokenType::Unused);
    EXPECT_LT(unused, 1000u);
    EXPECT_GT(v.merges.size(), 250000u);
}

TEST(SyntheticVocab, DeterministicPerSeed) {
    auto a = make_synthetic_vocab(4096, 7), b = make_synthetic_vocab(4096, 7),
         c = make_synthetic_vocab(4096, 8);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.merges, b.merges);
    EXPECT_NE(a.tokens, c.tokens);
}

TEST(SyntheticVocab, RejectsTooSmall) {
    EXPECT_THROW(make_synthetic_vocab(1023), std::invalid_argument);
    EXPECT_THROW(make_synthetic_vocab(0), std::invalid_argument);
}
