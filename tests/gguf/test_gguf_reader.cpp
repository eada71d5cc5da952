// GGUF reader: typed value access and getters, and hostile input (truncation at every byte, bit
// flips, absurd counts) that must end in gguf::FormatError naming the problem; also the seed
// corpus written independently of this code.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"
#include "tests/gguf/gguf_test_bytes.h"
#include "tests/support/test_env.h"

using gj::ggml::Type;
using gj::gguf::FormatError;
using gj::gguf::printable;
using gj::gguf::Value;
using gj::gguf::ValueType;
using gj::gguf_test::pattern;
using gj::gguf_test::read_all;
using ::testing::HasSubstr;

namespace {

// Raw GGUF byte builder for hand-made (also deliberately broken) files.
struct Raw {
    std::vector<uint8_t> b;
    template <typename T>
    Raw& put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        b.insert(b.end(), p, p + sizeof(T));
        return *this;
    }
    Raw& str(std::string_view s) {
        put<uint64_t>(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        b.insert(b.end(), {'G', 'G', 'U', 'F'});
        return put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
    }
    Raw& kv_u32(std::string_view key, uint32_t v) {
        return str(key).put<uint32_t>(uint32_t(ValueType::UINT32)).put<uint32_t>(v);
    }
    Raw& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
        str(name).put<uint32_t>(uint32_t(dims.size()));
        for (auto d : dims) put<uint64_t>(d);
        return put<uint32_t>(type).put<uint64_t>(offset);
    }
    Raw& pad(size_t alignment) {
        while (b.size() % alignment) b.push_back(0);
        return *this;
    }
    Raw& zeros(size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
};

std::string parse_error(const std::vector<uint8_t>& bytes) {
    try {
        gj::gguf::parse(bytes.data(), bytes.size(), "hostile.gguf");
    } catch (const FormatError& e) {
        return e.what();
    }
    return "(no error)";
}

// A small valid file with a bit of everything; its last tensor ends exactly at the end of the
// file (32 bytes, no trailing padding) so that every truncation cuts something the reader needs.
std::vector<uint8_t> small_valid_file(const std::filesystem::path& dir) {
    gj::gguf::Writer w;
    w.set_string("general.architecture", "gemma4");
    w.set_u32("gemma4.block_count", 2);
    w.set_f32("gemma4.attention.layer_norm_rms_epsilon", 1e-6f);
    w.set_bool_array("gemma4.attention.sliding_window_pattern", {true, false});
    w.set_string_array("tokenizer.ggml.tokens", {"<pad>", "a", ""});
    w.set("nested", Value::make_array(ValueType::ARRAY,
                                      {Value::make_array(ValueType::INT16, {Value::make_i16(-3)}),
                                       Value::make_array(ValueType::INT16, {})}));
    w.add_tensor("q", Type::Q8_0, {32, 2});
    w.add_tensor("norm", Type::F32, {8});
    w.begin(dir / "small.gguf");
    w.write_tensor_data("q", pattern(68, 1));
    w.write_tensor_data("norm", pattern(32, 2));
    w.finish();
    return read_all(dir / "small.gguf");
}

}  // namespace

TEST(GgufValue, ConversionsRefuseLossAndNameTheKey) {
    EXPECT_EQ(Value::make_i32(7).as_u64("k"), 7u);
    EXPECT_EQ(Value::make_u32(7).as_i64("k"), 7);
    EXPECT_EQ(Value::make_u32(7).as_f64("k"), 7.0);
    EXPECT_EQ(Value::make_i64(-(int64_t{1} << 53)).as_f64("k"), -9007199254740992.0);
    EXPECT_THAT([] { Value::make_i32(-1).as_u64("gemma4.block_count"); },
                ::testing::ThrowsMessage<FormatError>(HasSubstr("gemma4.block_count")));
    EXPECT_THROW(Value::make_u64(uint64_t{1} << 63).as_i64("k"), FormatError);
    EXPECT_THROW(Value::make_u64((uint64_t{1} << 53) + 1).as_f64("k"), FormatError);
    EXPECT_THROW(Value::make_f32(1.0f).as_u64("k"), FormatError);
    EXPECT_THROW(Value::make_string("1").as_u64("k"), FormatError);
    EXPECT_THROW(Value::make_u8(1).as_bool("k"), FormatError);
    EXPECT_THROW(Value::make_u8(1).as_string("k"), FormatError);
    EXPECT_THROW(Value::make_u8(1).as_array("k"), FormatError);
    EXPECT_EQ(Value::make_string("a\nb").to_display(), "\"a\\x0ab\"");
    EXPECT_EQ(Value::make_f32(1e-6f).to_display(), "1e-06");
    EXPECT_EQ(Value::make_f64(0.1).to_display(), "0.1");
    EXPECT_EQ(Value::make_i8(-3).to_display(), "-3");
    EXPECT_EQ(Value::make_bool(false).to_display(), "false");
    std::vector<Value> many;
    for (int i = 0; i < 10; ++i) many.push_back(Value::make_u32(i));
    EXPECT_EQ(Value::make_array(ValueType::UINT32, many).to_display(3),
              "[0, 1, 2, ... (10 total)]");
}

TEST(GgufValue, PrintableEscapesAndBoundsHostileNames) {
    EXPECT_EQ(printable("general.name"), "general.name");
    EXPECT_EQ(printable(std::string_view("a\0\x7f\\~\xff", 6)), "a\\x00\\x7f\\x5c~\\xff");
    EXPECT_EQ(printable(std::string(100, '\x01'), 2), "\\x01\\x01...(100 bytes)");
}

TEST(GgufFile, TypedGettersReportMissingKeysAndTensors) {
    gj::test::ScratchDir dir("gguf_get");
    const auto bytes = small_valid_file(dir.path());
    auto f = gj::gguf::parse(bytes.data(), bytes.size(), "small.gguf");
    EXPECT_EQ(f->get_string("general.architecture"), "gemma4");
    EXPECT_EQ(f->get_u64_opt("gemma4.block_count"), 2u);
    EXPECT_EQ(f->get_u64_opt("absent"), std::nullopt);
    EXPECT_EQ(f->get_f64_opt("absent"), std::nullopt);
    EXPECT_EQ(f->get_string_opt("absent"), std::nullopt);
    EXPECT_NEAR(*f->get_f64_opt("gemma4.attention.layer_norm_rms_epsilon"), 1e-6, 1e-12);
    EXPECT_THAT([&] { f->get_u64("gemma4.context_length"); },
                ::testing::ThrowsMessage<FormatError>(
                    AllOf(HasSubstr("gemma4.context_length"), HasSubstr("small.gguf"))));
    EXPECT_THAT([&] { f->get_u64("general.architecture"); },
                ::testing::ThrowsMessage<FormatError>(HasSubstr("general.architecture")));
    EXPECT_THAT([&] { f->tensor("token_embd.weight"); },
                ::testing::ThrowsMessage<FormatError>(HasSubstr("token_embd.weight")));
    EXPECT_EQ(f->find_tensor("absent"), nullptr);
    EXPECT_EQ(f->tensor("norm").rows(), 1u);
}

TEST(GgufReader, OpenReportsUnreadablePaths) {
    gj::test::ScratchDir dir("gguf_open");
    EXPECT_THAT([&] { gj::gguf::File::open(dir.path() / "missing.gguf"); },
                ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("missing.gguf")));
    EXPECT_THAT([&] { gj::gguf::File::open(dir.path()); },
                ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("not a regular file")));
    std::ofstream(dir.path() / "empty.gguf").close();
    EXPECT_THAT([&] { gj::gguf::File::open(dir.path() / "empty.gguf"); },
                ::testing::ThrowsMessage<FormatError>(HasSubstr("empty.gguf")));
}

TEST(GgufReader, AcceptsVersion2) {
    auto bytes = Raw().header(1, 1, 2).kv_u32("k", 5).tensor("t", {8}, 0, 0).pad(32).zeros(32).b;
    auto f = gj::gguf::parse(bytes.data(), bytes.size(), "v2.gguf");
    EXPECT_EQ(f->version(), 2u);
    EXPECT_EQ(f->get_u64("k"), 5u);
    EXPECT_EQ(f->tensor("t").n_bytes, 32u);
}

TEST(GgufReader, TruncationAtEveryByteIsAFormatError) {
    gj::test::ScratchDir dir("gguf_trunc");
    const auto bytes = small_valid_file(dir.path());
    ASSERT_NO_THROW(gj::gguf::parse(bytes.data(), bytes.size(), "full"));
    for (size_t len = 0; len < bytes.size(); ++len) {
        // A copy of exactly len bytes so that ASan sees any read past the end.
        const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + len);
        EXPECT_THROW(gj::gguf::parse(cut.data(), cut.size(), "cut"), FormatError) << len;
    }
}

TEST(GgufReader, EveryBitFlipParsesOrFailsCleanly) {
    gj::test::ScratchDir dir("gguf_flip");
    const auto bytes = small_valid_file(dir.path());
    size_t failures = 0;
    for (size_t i = 0; i < bytes.size(); ++i)
        for (int bit = 0; bit < 8; ++bit) {
            auto m = bytes;
            m[i] ^= uint8_t(1u << bit);
            try {
                auto f = gj::gguf::parse(m.data(), m.size(), "flip");
                for (const auto& [k, v] : f->metadata()) (void)v.to_display(1000);
                for (const auto& t : f->tensors())
                    ASSERT_LE(t.data + t.n_bytes, m.data() + m.size()) << t.name;
            } catch (const FormatError&) {
                ++failures;
            }
        }
    EXPECT_GT(failures, bytes.size());  // most header flips must be caught
}

TEST(GgufReader, HostileHeadersNameTheProblem) {
    const uint64_t kHuge = uint64_t{1} << 60;
    struct Case {
        const char* what;
        std::vector<uint8_t> bytes;
        std::vector<std::string> expect;  // substrings of the message
    };
    const std::vector<Case> cases = {
        {"magic", Raw().put<uint32_t>(0x46554746).put<uint32_t>(3).zeros(16).b, {"not a GGUF"}},
        {"v1", Raw().header(0, 0, 1).b, {"version 1"}},
        {"v4", Raw().header(0, 0, 4).b, {"unsupported GGUF version 4"}},
        {"big endian", Raw().header(0, 0, 0x03000000).b, {"big-endian"}},
        {"kv count", Raw().header(0, kHuge).b, {"metadata entry count", "1152921504606846976"}},
        {"tensor count", Raw().header(kHuge, 0).b, {"tensor count 1152921504606846976"}},
        {"key length",
         Raw().header(0, 1).put<uint64_t>(~uint64_t{0}).zeros(16).b,
         {"key of metadata entry 0", "18446744073709551615", "at byte offset 24"}},
        {"string length",
         Raw().header(0, 1).str("s").put<uint32_t>(8).put<uint64_t>(uint64_t{1} << 63).b,
         {"metadata key 's'", "9223372036854775808"}},
        {"value type",
         Raw().header(0, 1).str("k").put<uint32_t>(13).zeros(8).b,
         {"value type of metadata key 'k'", "13"}},
        {"array elem type",
         Raw().header(0, 1).str("a").put<uint32_t>(9).put<uint32_t>(99).put<uint64_t>(0).b,
         {"element type of array metadata key 'a'", "99"}},
        {"array count",
         Raw().header(0, 1).str("a").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(kHuge).b,
         {"array metadata key 'a' claims 1152921504606846976 elements"}},
        {"string array count",
         Raw().header(0, 1).str("a").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3).zeros(20).b,
         {"array metadata key 'a' claims 3 elements"}},
        {"bool byte",
         Raw().header(0, 1).str("b").put<uint32_t>(7).put<uint8_t>(2).b,
         {"metadata key 'b'", "bool byte is 2"}},
        {"duplicate key",
         Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b,
         {"duplicate metadata key 'k'", "at byte offset 41"}},
        {"alignment type",
         Raw().header(0, 1).str("general.alignment").put<uint32_t>(10).put<uint64_t>(64).b,
         {"general.alignment must be uint32"}},
        {"alignment value",
         Raw().header(0, 1).kv_u32("general.alignment", 48).b,
         {"general.alignment 48 is not a power of two"}},
        {"alignment zero",
         Raw().header(0, 1).kv_u32("general.alignment", 0).b,
         {"general.alignment 0"}},
        {"zero dims",
         Raw().header(1, 0).tensor("t", {}, 0, 0).pad(32).zeros(64).b,
         {"tensor 't' has 0 dimensions"}},
        {"five dims",
         Raw().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad(32).zeros(64).b,
         {"tensor 't' has 5 dimensions"}},
        {"zero dim",
         Raw().header(1, 0).tensor("t", {4, 0}, 0, 0).pad(32).zeros(64).b,
         {"tensor 't' dimension 1 is 0"}},
        {"dims overflow",
         Raw().header(1, 0).tensor("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).pad(32).b,
         {"tensor 't' element count overflows"}},
        {"byte size overflow",  // found by fuzz_gguf: 4 * (2^62 + 3) wrapped around to 12
         Raw().header(1, 0).tensor("t", {(uint64_t{1} << 62) + 3}, 0, 0).pad(32).zeros(64).b,
         {"tensor 't' byte size overflows"}},
        {"unknown type",
         Raw().header(1, 0).tensor("blk.0.w", {32}, 99, 0).pad(32).zeros(64).b,
         {"tensor 'blk.0.w' has unknown ggml type id 99", "at byte offset"}},
        {"removed type id",
         Raw().header(1, 0).tensor("w", {32}, 4, 0).pad(32).zeros(64).b,
         {"tensor 'w' has unknown ggml type id 4"}},
        {"block size",
         Raw().header(1, 0).tensor("q", {33}, 8, 0).pad(32).zeros(64).b,
         {"tensor 'q' of type q8_0", "33", "block size 32"}},
        {"misaligned",
         Raw().header(1, 0).tensor("t", {4}, 0, 16).pad(32).zeros(64).b,
         {"tensor 't' data offset 16 is not a multiple of the alignment 32"}},
        {"beyond eof",
         Raw().header(1, 0).tensor("t", {16}, 0, 0).pad(32).zeros(63).b,
         {"tensor 't' data (64 bytes at data offset 0) lies beyond the end of the file"}},
        {"offset overflow",
         Raw().header(1, 0).tensor("t", {16}, 0, ~uint64_t{31}).pad(32).zeros(64).b,
         {"tensor 't'", "beyond the end"}},
        {"overlap",
         Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad(32).zeros(96).b,
         {"tensor 'b' data (offset 32) overlaps tensor 'a'"}},
        {"duplicate tensor",
         Raw().header(2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad(32).zeros(64).b,
         {"duplicate tensor name 'a'"}},
        {"binary name",
         Raw().header(1, 0).tensor(std::string("\x01\xff", 2), {8}, 77, 0).b,
         {"tensor '\\x01\\xff' has unknown ggml type id 77"}},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.what);
        const std::string msg = parse_error(c.bytes);
        EXPECT_THAT(msg, HasSubstr("hostile.gguf"));
        EXPECT_THAT(msg, HasSubstr("byte offset"));
        for (const auto& e : c.expect) EXPECT_THAT(msg, HasSubstr(e));
    }
}

TEST(GgufReader, NestedArraysAreDepthLimited) {
    auto nested = [](int depth) {
        Raw r;
        r.header(0, 1).str("deep").put<uint32_t>(9);
        for (int i = 1; i < depth; ++i) r.put<uint32_t>(9).put<uint64_t>(1);
        r.put<uint32_t>(4).put<uint64_t>(1).put<uint32_t>(42);
        return r.b;
    };
    auto ok = nested(8);
    auto f = gj::gguf::parse(ok.data(), ok.size(), "deep.gguf");
    const Value* v = &f->get("deep");
    for (int i = 1; i < 8; ++i) v = &v->as_array("deep")[0];
    EXPECT_EQ(v->as_array("deep")[0].as_u64("deep"), 42u);
    EXPECT_THAT(parse_error(nested(9)), HasSubstr("'deep': arrays nested deeper than 8"));
    // A file of nothing but array headers must not recurse without bound either.
    Raw r;
    r.header(0, 1).str("bomb").put<uint32_t>(9);
    for (int i = 0; i < 100000; ++i) r.put<uint32_t>(9).put<uint64_t>(1);
    EXPECT_THAT(parse_error(r.b), HasSubstr("nested deeper"));
}

TEST(GgufReader, CapsTheTotalNumberOfArrayElements) {
    // Every byte of a u8 array would become a ~48-byte Value; the total is capped at 2^24.
    const uint64_t n = (uint64_t{1} << 24) + 1;
    auto bytes = Raw().header(0, 1).str("big").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(n).b;
    bytes.resize(bytes.size() + n);
    EXPECT_THAT(parse_error(bytes), HasSubstr("'big' has 16777217 elements"));
}

TEST(GgufReader, ReadsTheIndependentlyWrittenSeedCorpus) {
    // tests/fuzz/corpus_gguf is written by a Python script that shares no code with the reader.
    const auto dir = gj::test::source_dir() / "tests/fuzz/corpus_gguf";
    auto kv = gj::gguf::File::open(dir / "kv_every_type");
    EXPECT_EQ(kv->get_u64("u64"), uint64_t{1} << 63);
    EXPECT_EQ(kv->get("i64").as_i64("i64"), -(int64_t{1} << 40));
    EXPECT_EQ(kv->get_f64("f64"), 1e-300);
    EXPECT_EQ(kv->get("arr.nested").as_array("")[1].as_array("")[0].as_string(""), "x");
    auto t = gj::gguf::File::open(dir / "tensors_every_dequant_type");
    ASSERT_EQ(t->tensors().size(), 8u);
    EXPECT_EQ(t->tensor("h.q6_k").type, Type::Q6_K);
    EXPECT_EQ(t->tensor("e.q4_0").rows(), 2u);
    auto v2 = gj::gguf::File::open(dir / "v2_align64");
    EXPECT_EQ(v2->version(), 2u);
    EXPECT_EQ(v2->alignment(), 64u);
    EXPECT_EQ(v2->tensor("n").offset, 128u);  // 2 * 2 * 34 = 136 bytes of q8_0 padded to 64
    EXPECT_EQ(v2->tensor("w").dims, (std::vector<uint64_t>{32, 1, 1, 2}));
    auto tok = gj::gguf::File::open(dir / "tokenizer_like");
    EXPECT_EQ(tok->get("tokenizer.ggml.tokens").as_array("")[3].as_string(""),
              "\xe2\x96\x81"
              "a");
}
