// The tokenizer against Hugging Face `tokenizers` (tools/tokenizer_golden.py, which builds the
// Gemma 4 pipeline in tokenizers from the same vocabulary): identical ids and decoded text for
// every case, on the synthetic vocabulary and on one whose merge ranks are shuffled.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cache/sha256.h"
#include "engine/text/tokenizer.h"
#include "engine/text/vocab_json.h"
#include "tests/support/test_env.h"

namespace {

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + p.string());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

TEST(TokenizerGolden, MatchesHuggingFaceTokenizers) {
    const auto dir = gj::test::data_dir() / "tokenizer";
    const auto golden = nlohmann::json::parse(read_file(dir / "golden.json"));
    const auto cases = nlohmann::json::parse(read_file(dir / "cases.json"));
    ASSERT_EQ(golden["vocabularies"].size(), 2u);
    size_t checked = 0, nonempty = 0;
    for (const auto& [name, entry] : golden["vocabularies"].items()) {
        const std::string raw = read_file(dir / name);
        ASSERT_EQ(gj::cache::sha256_hex(raw), entry["sha256"].get<std::string>())
            << name << " changed since the goldens were made: rerun tools/tokenizer_golden.py";
        gj::tok::Tokenizer tok(gj::tok::vocab_from_json(raw));
        ASSERT_EQ(entry["cases"].size(), cases.size()) << "cases.json changed: rerun the script";
        for (size_t i = 0; i < cases.size(); ++i) {
            const auto& c = entry["cases"][i];
            const std::string text = c["text"];
            ASSERT_EQ(text, cases[i].get<std::string>());
            const auto expect = c["ids"].get<std::vector<int32_t>>();
            const auto ids = tok.encode(text, /*add_bos=*/false);
            EXPECT_EQ(ids, expect) << name << ": '" << text << "'";
            EXPECT_EQ(tok.decode(expect, /*render_special=*/true), c["decoded"].get<std::string>())
                << name << ": '" << text << "'";
            // With BOS the ids only gain the leading <bos>.
            auto with_bos = tok.encode(text, true);
            ASSERT_FALSE(with_bos.empty());
            EXPECT_EQ(with_bos[0], 2);
            EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), expect);
            ++checked;
            nonempty += !expect.empty();
        }
    }
    EXPECT_GE(checked, 80u);
    EXPECT_GE(nonempty, 78u);
}
