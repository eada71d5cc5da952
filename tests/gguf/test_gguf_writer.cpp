// GGUF writer: round trips of every metadata type, the tensor table layout llama.cpp expects,
// payload chunks written from several threads, and misuse or a fatal signal that must leave no
// file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"
#include "tests/gguf/gguf_test_bytes.h"
#include "tests/support/test_env.h"

using gj::ggml::Type;
using gj::gguf::Value;
using gj::gguf::ValueType;
using gj::gguf_test::pattern;
using gj::gguf_test::read_all;
using ::testing::HasSubstr;

namespace {

// The writer's temporaries beside `path`: "<path>.partial-XXXXXX".
std::vector<std::filesystem::path> temporaries_of(const std::filesystem::path& path) {
    std::vector<std::filesystem::path> found;
    const std::string prefix = path.filename().string() + ".partial-";
    for (const auto& e : std::filesystem::directory_iterator(path.parent_path()))
        if (e.path().filename().string().starts_with(prefix)) found.push_back(e.path());
    return found;
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
        EXPECT_TRUE(temporaries_of(path).empty());
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
        EXPECT_EQ(temporaries_of(path).size(), 1u);
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
        EXPECT_TRUE(temporaries_of(path).empty());
        EXPECT_FALSE(std::filesystem::exists(path));
    }
    {
        gj::gguf::Writer w;
        w.add_tensor("a", Type::F32, {4});
        w.begin(path);
        EXPECT_EQ(temporaries_of(path).size(), 1u);
    }  // destroyed without finish()
    EXPECT_TRUE(temporaries_of(path).empty());
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
    {
        // A directory cannot be renamed over: refused before anything is written.
        gj::gguf::Writer w;
        EXPECT_THAT([&] { w.begin(dir.path()); },
                    ::testing::ThrowsMessage<std::runtime_error>(HasSubstr("is a directory")));
    }
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_TRUE(temporaries_of(path).empty());
}

// The temporary is a new file: an existing "<path>.partial" (a user's file, or the very input a
// requantization reads) is never opened for writing, whether the write succeeds or fails.
TEST(GgufWriter, NeverTouchesAnExistingPartialFile) {
    gj::test::ScratchDir dir("gguf_wpartial");
    const auto path = dir.path() / "m.gguf";
    const auto users = std::filesystem::path(path.string() + ".partial");
    const auto payload = pattern(1000, 7);
    {
        std::ofstream f(users, std::ios::binary);
        f.write(reinterpret_cast<const char*>(payload.data()), std::streamsize(payload.size()));
    }
    {
        gj::gguf::Writer w;
        w.add_tensor("a", Type::F32, {4});
        w.begin(path);
        w.write_tensor_data("a", pattern(16, 1));
        w.finish();
    }
    EXPECT_EQ(read_all(users), payload);
    EXPECT_EQ(gj::gguf::File::open(path)->tensors().size(), 1u);
    {
        gj::gguf::Writer w;
        w.add_tensor("a", Type::F32, {4});
        w.begin(path);
        EXPECT_THROW(w.finish(), std::logic_error);  // no tensor data: the write fails
    }
    EXPECT_EQ(read_all(users), payload);
    // Only the earlier complete file, the user's file, and no temporary.
    EXPECT_EQ(gj::gguf::File::open(path)->tensors().size(), 1u);
    EXPECT_TRUE(temporaries_of(path).empty());
    size_t entries = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path()))
        ++entries;
    EXPECT_EQ(entries, 2u);
}

// Several writers of one output at once each get their own temporary.
TEST(GgufWriter, TemporariesOfOneOutputAreDistinct) {
    gj::test::ScratchDir dir("gguf_wdistinct");
    const auto path = dir.path() / "m.gguf";
    std::vector<std::unique_ptr<gj::gguf::Writer>> writers;
    for (int i = 0; i < 8; ++i) {
        writers.push_back(std::make_unique<gj::gguf::Writer>());
        writers.back()->add_tensor("a", Type::F32, {4});
        writers.back()->begin(path);
    }
    EXPECT_EQ(temporaries_of(path).size(), 8u);
    writers.clear();
    EXPECT_TRUE(temporaries_of(path).empty());
}

// A process killed while it writes (Ctrl-C, SIGTERM, a closed terminal) leaves no temporary, and
// still dies of that signal; a signal the program handles itself is left to it. Each case runs
// in a child process that signals itself halfway through a write.
TEST(GgufWriter, AFatalSignalRemovesTheTemporary) {
    gj::test::ScratchDir dir("gguf_wsignal");
    for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
        SCOPED_TRACE(sig);
        const auto path = dir.path() / ("m" + std::to_string(sig) + ".gguf");
        const pid_t child = ::fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            gj::gguf::Writer w;
            w.add_tensor("a", Type::F32, {1024});
            w.begin(path);
            w.write_tensor_chunk("a", 0, pattern(64, 3));
            if (temporaries_of(path).size() != 1) ::_exit(3);
            ::raise(sig);
            ::_exit(4);  // not reached: the signal ends the process
        }
        int status = 0;
        ASSERT_EQ(::waitpid(child, &status, 0), child);
        ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
        EXPECT_EQ(WTERMSIG(status), sig);
        EXPECT_TRUE(temporaries_of(path).empty());
        EXPECT_FALSE(std::filesystem::exists(path));
    }
    // A program's own handler stays: the temporary is then the writer's to remove as usual.
    const auto path = dir.path() / "handled.gguf";
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        static volatile sig_atomic_t seen = 0;
        ::signal(SIGUSR1, SIG_IGN);  // unrelated; only the three signals are taken
        struct sigaction sa {};
        sa.sa_handler = [](int) { seen = 1; };
        ::sigaction(SIGTERM, &sa, nullptr);
        {
            gj::gguf::Writer w;
            w.add_tensor("a", Type::F32, {4});
            w.begin(path);
            ::raise(SIGTERM);
            if (!seen || temporaries_of(path).size() != 1) ::_exit(5);
        }  // destroyed without finish(): removed
        ::_exit(temporaries_of(path).empty() ? 0 : 6);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
}
