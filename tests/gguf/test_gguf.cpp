// GGUF reader/writer: round trips of every metadata type, the tensor table layout llama.cpp
// expects, and hostile input (truncation at every byte, bit flips, absurd counts) that must end
// in gguf::FormatError naming the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include "engine/gguf/gguf.h"
#include "tests/support/test_env.h"

using gj::ggml::Type;
using gj::gguf::FormatError;
using gj::gguf::Value;
using gj::gguf::ValueType;
using ::testing::HasSubstr;

namespace {

std::vector<uint8_t> read_all(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint8_t> pattern(uint64_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
    return v;
}

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

TEST(GgufWriter, RoundTripsEveryMetadataType) {
    gj::test::ScratchDir dir("gguf_rt");
    const auto path = dir.path() / "kv.gguf";
    {
        gj::gguf::Writer w;
        w.set_u8("u8", 255);
        w.set_i8("i8", -128);
        w.set_u16("u16", 65535);
        w.set_i16("i16", -32768);
        w.set_u32("u32", 4294967295u);
        w.set_i32("i32", std::numeric_limits<int32_t>::min());
        w.set_u64("u64", std::numeric_limits<uint64_t>::max());
        w.set_i64("i64", std::numeric_limits<int64_t>::min());
        w.set_f32("f32", 0.1f);
        w.set_f64("f64", -1e300);
        w.set_bool("bool", true);
        w.set_string("str", std::string("with\0nul and \xc3\xa9", 15));
        w.set_string("empty", "");
        w.set_u32_array("arr.u32", {1, 2, 4294967295u});
        w.set_i32_array("arr.i32", {-1, 0, 7});
        w.set_f32_array("arr.f32", {1.5f, -0.0f, 1e-40f});
        w.set_bool_array("arr.bool", {true, false, true});
        w.set_string_array("arr.str", {"x", "", "longer string"});
        w.set("arr.u8",
              Value::make_array(ValueType::UINT8, {Value::make_u8(0), Value::make_u8(9)}));
        w.set("arr.i64", Value::make_array(ValueType::INT64, {Value::make_i64(-5)}));
        w.set("arr.f64", Value::make_array(ValueType::FLOAT64, {Value::make_f64(2.25)}));
        w.set("arr.empty", Value::make_array(ValueType::STRING, {}));
        w.set("arr.nested",
              Value::make_array(ValueType::ARRAY,
                                {Value::make_array(ValueType::STRING, {Value::make_string("in")}),
                                 Value::make_array(ValueType::STRING, {})}));
        w.set_u32("replaced", 1);
        w.set_u32("replaced", 2);  // later set() wins
        w.begin(path);
        w.finish();
    }
    auto f = gj::gguf::File::open(path);
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->alignment(), 32u);
    EXPECT_EQ(f->metadata().size(), 24u);
    EXPECT_EQ(f->get("u8").type, ValueType::UINT8);
    EXPECT_EQ(f->get_u64("u8"), 255u);
    EXPECT_EQ(f->get("i8").as_i64("i8"), -128);
    EXPECT_EQ(f->get_u64("u16"), 65535u);
    EXPECT_EQ(f->get("i16").as_i64("i16"), -32768);
    EXPECT_EQ(f->get_u64("u32"), 4294967295u);
    EXPECT_EQ(f->get("i32").as_i64("i32"), std::numeric_limits<int32_t>::min());
    EXPECT_EQ(f->get_u64("u64"), std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(f->get("i64").as_i64("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f->get("f32").type, ValueType::FLOAT32);
    EXPECT_EQ(f->get_f64("f32"), double(0.1f));
    EXPECT_EQ(f->get_f64("f64"), -1e300);
    EXPECT_TRUE(f->get("bool").as_bool("bool"));
    EXPECT_EQ(f->get_string("str"), std::string("with\0nul and \xc3\xa9", 15));
    EXPECT_EQ(f->get_string("empty"), "");
    EXPECT_EQ(f->get_u64("replaced"), 2u);

    const auto& au32 = f->get("arr.u32").as_array("arr.u32");
    ASSERT_EQ(au32.size(), 3u);
    EXPECT_EQ(f->get("arr.u32").array_type, ValueType::UINT32);
    EXPECT_EQ(au32[2].as_u64("arr.u32"), 4294967295u);
    EXPECT_EQ(f->get("arr.i32").as_array("")[0].as_i64(""), -1);
    const auto& af32 = f->get("arr.f32").as_array("");
    EXPECT_EQ(af32[0].as_f64(""), 1.5);
    EXPECT_TRUE(std::signbit(af32[1].as_f64("")));
    EXPECT_EQ(af32[2].as_f64(""), double(1e-40f));  // subnormal survives
    const auto& ab = f->get("arr.bool").as_array("");
    EXPECT_TRUE(ab[0].as_bool(""));
    EXPECT_FALSE(ab[1].as_bool(""));
    const auto& as = f->get("arr.str").as_array("");
    EXPECT_EQ(as[2].as_string(""), "longer string");
    EXPECT_EQ(as[1].as_string(""), "");
    EXPECT_EQ(f->get("arr.u8").as_array("")[1].as_u64(""), 9u);
    EXPECT_EQ(f->get("arr.i64").as_array("")[0].as_i64(""), -5);
    EXPECT_EQ(f->get("arr.f64").as_array("")[0].as_f64(""), 2.25);
    EXPECT_TRUE(f->get("arr.empty").as_array("").empty());
    EXPECT_EQ(f->get("arr.empty").array_type, ValueType::STRING);
    const auto& nested = f->get("arr.nested");
    EXPECT_EQ(nested.array_type, ValueType::ARRAY);
    ASSERT_EQ(nested.as_array("").size(), 2u);
    EXPECT_EQ(nested.as_array("")[0].array_type, ValueType::STRING);
    EXPECT_EQ(nested.as_array("")[0].as_array("")[0].as_string(""), "in");
    EXPECT_TRUE(nested.as_array("")[1].as_array("").empty());
    EXPECT_TRUE(f->tensors().empty());
}

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

TEST(GgufWriter, TensorTableFollowsTheLlamaCppLayout) {
    for (uint64_t alignment : {32u, 64u, 4096u}) {
        SCOPED_TRACE(alignment);
        gj::test::ScratchDir dir("gguf_layout");
        const auto path = dir.path() / "t.gguf";
        struct Decl {
            std::string name;
            Type type;
            std::vector<uint64_t> dims;
            uint64_t bytes;
        };
        const std::vector<Decl> decls = {
            {"f32.odd", Type::F32, {3}, 12},
            {"q8", Type::Q8_0, {64, 3}, 2 * 34 * 3},
            {"q4k", Type::Q4_K, {256, 2, 1}, 2 * 144},
            {"bf16", Type::BF16, {5, 7}, 70},
            {"q6k.4d", Type::Q6_K, {256, 1, 2, 1}, 2 * 210},
            {"q4_0", Type::Q4_0, {32}, 18},
        };
        {
            gj::gguf::Writer w(alignment);
            w.set_string("general.architecture", "test");
            for (const auto& d : decls) EXPECT_EQ(w.add_tensor(d.name, d.type, d.dims), d.bytes);
            w.begin(path);
            // Reverse order: payloads may arrive in any order.
            for (size_t i = decls.size(); i-- > 0;)
                w.write_tensor_data(decls[i].name, pattern(decls[i].bytes, uint8_t(i)));
            w.finish();
        }
        EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
        const auto file_bytes = read_all(path);
        auto f = gj::gguf::File::open(path);
        EXPECT_EQ(f->alignment(), alignment);
        EXPECT_EQ(f->find("general.alignment") != nullptr, alignment != 32);
        EXPECT_EQ(f->data_offset() % alignment, 0u);
        ASSERT_EQ(f->tensors().size(), decls.size());
        uint64_t expect_offset = 0;  // llama.cpp requires exactly this running, padded offset
        for (size_t i = 0; i < decls.size(); ++i) {
            const auto& t = f->tensors()[i];
            EXPECT_EQ(t.name, decls[i].name);
            EXPECT_EQ(t.type, decls[i].type);
            EXPECT_EQ(t.dims, decls[i].dims);
            EXPECT_EQ(t.n_bytes, decls[i].bytes);
            EXPECT_EQ(t.offset, expect_offset);
            expect_offset += (t.n_bytes + alignment - 1) / alignment * alignment;
        }
        EXPECT_EQ(file_bytes.size(), f->data_offset() + expect_offset);  // trailing pad written
        for (size_t i = 0; i < decls.size(); ++i) {
            const auto& t = f->tensors()[i];
            const auto want = pattern(decls[i].bytes, uint8_t(i));
            EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), want) << t.name;
            // Padding after each tensor is zero.
            const uint64_t abs_end = f->data_offset() + t.offset + t.n_bytes;
            for (uint64_t p = abs_end; p % alignment; ++p) EXPECT_EQ(file_bytes[p], 0) << p;
        }
        EXPECT_EQ(f->tensor("bf16").rows(), 7u);
        EXPECT_EQ(f->tensor("q6k.4d").n_elements, 512u);
    }
}

TEST(GgufWriter, ChunksFromSeveralThreadsLandAtTheirOffsets) {
    gj::test::ScratchDir dir("gguf_threads");
    const auto path = dir.path() / "t.gguf";
    constexpr int kThreads = 8;
    constexpr uint64_t kChunk = 34 * 1000;  // whole Q8_0 blocks
    gj::gguf::Writer w;
    const uint64_t big = w.add_tensor("big", Type::Q8_0, {32 * 1000, kThreads});
    ASSERT_EQ(big, kChunk * kThreads);
    std::vector<std::string> names;
    for (int i = 0; i < kThreads; ++i) {
        names.push_back("small." + std::to_string(i));
        w.add_tensor(names.back(), Type::F16, {uint64_t(100 + i)});
    }
    w.begin(path);
    const auto payload = pattern(big, 3);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            w.write_tensor_chunk("big", i * kChunk,
                                 std::span<const uint8_t>(payload).subspan(i * kChunk, kChunk));
            w.write_tensor_data(names[i], pattern(2 * (100 + i), uint8_t(i)));
        });
    for (auto& t : threads) t.join();
    w.finish();
    auto f = gj::gguf::File::open(path);
    const auto& t = f->tensor("big");
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), payload);
    for (int i = 0; i < kThreads; ++i) {
        const auto& s = f->tensor(names[i]);
        EXPECT_EQ(std::vector<uint8_t>(s.data, s.data + s.n_bytes),
                  pattern(2 * (100 + i), uint8_t(i)));
    }
}

TEST(GgufWriter, RefusesMisuseAndRemovesThePartialFile) {
    gj::test::ScratchDir dir("gguf_werr");
    const auto path = dir.path() / "w.gguf";
    const auto partial = std::filesystem::path(path.string() + ".partial");
    {
        gj::gguf::Writer w;
        EXPECT_THROW(w.add_tensor("bad.q8", Type::Q8_0, {33}), std::invalid_argument);
        EXPECT_THROW(w.add_tensor("bad.k", Type::Q4_K, {128, 2}), std::invalid_argument);
        EXPECT_THROW(w.add_tensor("zero", Type::F32, {4, 0}), std::invalid_argument);
        EXPECT_THROW(w.add_tensor("five", Type::F32, {1, 1, 1, 1, 1}), std::invalid_argument);
        EXPECT_THROW(w.add_tensor("none", Type::F32, {}), std::invalid_argument);
        EXPECT_THROW(w.add_tensor(std::string(64, 'n'), Type::F32, {1}), std::invalid_argument);
        EXPECT_THROW(w.add_tensor("huge", Type::F32, {uint64_t{1} << 32, uint64_t{1} << 32}),
                     std::invalid_argument);
        EXPECT_THROW(w.add_tensor("bytes", Type::F32, {(uint64_t{1} << 62) + 3}),
                     std::invalid_argument);
        w.add_tensor("a", Type::F32, {4});
        w.add_tensor("b", Type::F32, {4});
        EXPECT_THROW(w.add_tensor("a", Type::F32, {4}), std::invalid_argument);
        EXPECT_THROW(w.write_tensor_data("a", pattern(16, 0)), std::logic_error);  // before begin
        w.begin(path);
        EXPECT_TRUE(std::filesystem::exists(partial));
        EXPECT_FALSE(std::filesystem::exists(path));
        EXPECT_THROW(w.set_u32("late", 1), std::logic_error);
        EXPECT_THROW(w.add_tensor("late", Type::F32, {1}), std::logic_error);
        EXPECT_THROW(w.write_tensor_data("a", pattern(15, 0)), std::invalid_argument);
        EXPECT_THROW(w.write_tensor_data("nope", pattern(16, 0)), std::invalid_argument);
        EXPECT_THROW(w.write_tensor_chunk("a", 8, pattern(9, 0)), std::invalid_argument);
        w.write_tensor_data("a", pattern(16, 0));
        EXPECT_THROW(w.write_tensor_data("a", pattern(16, 0)), std::invalid_argument);
        w.write_tensor_chunk("b", 0, pattern(8, 0));
        // "b" is half written: finish() names it and removes the partial file.
        EXPECT_THAT([&] { w.finish(); },
                    ::testing::ThrowsMessage<std::logic_error>(HasSubstr("'b' (8 of 16 bytes)")));
        EXPECT_FALSE(std::filesystem::exists(partial));
        EXPECT_FALSE(std::filesystem::exists(path));
    }
    {
        gj::gguf::Writer w;
        w.add_tensor("a", Type::F32, {4});
        w.begin(path);
        EXPECT_TRUE(std::filesystem::exists(partial));
    }  // destroyed without finish()
    EXPECT_FALSE(std::filesystem::exists(partial));
    EXPECT_FALSE(std::filesystem::exists(path));

    EXPECT_THROW(gj::gguf::Writer(48), std::invalid_argument);
    EXPECT_THROW(gj::gguf::Writer(0), std::invalid_argument);
    {
        gj::gguf::Writer w(64);
        w.set_u32("general.alignment", 32);  // contradicts the layout
        EXPECT_THROW(w.begin(path), std::invalid_argument);
    }
    {
        gj::gguf::Writer w;
        w.set("bad", Value{ValueType::UINT8, ValueType::UINT32, uint64_t{256}});
        EXPECT_THROW(w.begin(path), std::invalid_argument);
    }
    {
        gj::gguf::Writer w;
        w.set("mixed", Value::make_array(ValueType::UINT32, {Value::make_i32(1)}));
        EXPECT_THROW(w.begin(path), std::invalid_argument);
    }
    {
        gj::gguf::Writer w;
        EXPECT_THROW(w.begin(dir.path() / "no_such_dir" / "x.gguf"), std::runtime_error);
    }
    EXPECT_FALSE(std::filesystem::exists(path));
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
