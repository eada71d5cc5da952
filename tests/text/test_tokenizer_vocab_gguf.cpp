// read_vocab/write_vocab: the tokenizer.ggml.* keys round-trip through a GGUF file, and bad
// tokenizer metadata is an error naming the key.
#include <gtest/gtest.h>

#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_data.h"
#include "tests/support/test_env.h"

namespace {

std::unique_ptr<gj::gguf::File> write_and_open(const std::filesystem::path& path,
                                               const std::function<void(gj::gguf::Writer&)>& fill) {
    gj::gguf::Writer w;
    fill(w);
    w.begin(path);
    w.finish();
    return gj::gguf::File::open(path);
}

void expect_format_error(const std::function<void()>& f, const std::string& needle) {
    try {
        f();
        FAIL() << "no error; expected one naming " << needle;
    } catch (const gj::gguf::FormatError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(VocabGguf, RoundTrip) {
    gj::test::ScratchDir dir("vocab");
    auto v = gj::tok::make_synthetic_vocab(3000, 4);
    v.chat_template = "{{ bos_token }}<|turn>";
    v.eos_id = 106;  // some exports use <turn|>
    auto f = write_and_open(dir.path() / "v.gguf", [&](auto& w) { gj::tok::write_vocab(w, v); });
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gemma4");
    EXPECT_FALSE(f->get("tokenizer.ggml.add_space_prefix").as_bool("add_space_prefix"));
    auto r = gj::tok::read_vocab(*f);
    EXPECT_EQ(r.model, v.model);
    EXPECT_EQ(r.tokens, v.tokens);
    EXPECT_EQ(r.scores, v.scores);
    EXPECT_EQ(r.types, v.types);
    EXPECT_EQ(r.merges, v.merges);
    EXPECT_EQ(r.bos_id, 2);
    EXPECT_EQ(r.eos_id, 106);
    EXPECT_EQ(r.pad_id, 0);
    EXPECT_EQ(r.unk_id, 3);
    EXPECT_TRUE(r.add_bos);
    EXPECT_EQ(r.chat_template, v.chat_template);
    gj::tok::Tokenizer t(std::move(r));
    EXPECT_EQ(t.decode(t.encode("the world", true)), "the world");
}

TEST(VocabGguf, BadMetadataNamesTheKey) {
    gj::test::ScratchDir dir("vocab-bad");
    const auto v = gj::tok::make_synthetic_vocab(1024, 0);
    int n = 0;
    auto file_with = [&](const std::function<void(gj::gguf::Writer&)>& tweak) {
        const auto path = dir.path() / std::to_string(n++);  // one file per variant
        return write_and_open(path, [&](auto& w) {
            gj::tok::write_vocab(w, v);
            tweak(w);
        });
    };
    auto f = file_with([](auto& w) { w.set_u32("tokenizer.ggml.bos_token_id", 5000); });
    expect_format_error([&] { gj::tok::read_vocab(*f); }, "tokenizer.ggml.bos_token_id");
    f = file_with([](auto& w) { w.set_f32_array("tokenizer.ggml.scores", {1.0f, 2.0f}); });
    expect_format_error([&] { gj::tok::read_vocab(*f); }, "tokenizer.ggml.scores");
    f = file_with([](auto& w) { w.set_u32("tokenizer.ggml.tokens", 7); });
    expect_format_error([&] { gj::tok::read_vocab(*f); }, "tokenizer.ggml.tokens");
    std::vector<int32_t> types(v.types);
    types[10] = 42;
    f = file_with([&](auto& w) { w.set_i32_array("tokenizer.ggml.token_type", types); });
    expect_format_error([&] { gj::tok::read_vocab(*f); }, "invalid token type 42");
    auto g = write_and_open(dir.path() / "none.gguf", [](auto& w) { w.set_u32("x", 1); });
    expect_format_error([&] { gj::tok::read_vocab(*g); }, "tokenizer.ggml.model");
}
