// `gemmajit run`, `chat` and `tokenize` end to end on a tiny synthetic model (CPU reference
// forward): deterministic output for a fixed seed, the speed report, and clear errors for bad
// input.
#include <gtest/gtest.h>

#include <fstream>

#include "jit/device.h"
#include "tests/support/test_env.h"

using gj::test::run_command;

namespace {

// One tiny model for the whole file (synthesis takes ~0.1 s).
const std::filesystem::path& tiny_model() {
    static gj::test::ScratchDir dir("run-cli");
    static const std::filesystem::path path = [] {
        auto p = dir.path() / "tiny.gguf";
        auto r = run_command(gj::test::gemmajit_exe() + " synth --variant tiny --seed 7 -o " +
                             p.string());
        if (r.exit_code != 0) throw std::runtime_error("synth failed: " + r.out);
        return p;
    }();
    return path;
}

struct Split {
    int exit_code;
    std::string out, err;
};

// Runs gemmajit with stdout and stderr kept apart.
Split run_split(const std::string& args) {
    static gj::test::ScratchDir dir("run-cli-err");
    static int n = 0;
    const auto err_path = dir.path() / ("stderr" + std::to_string(n++));
    auto r = run_command("( " + gj::test::gemmajit_exe() + " " + args + " 2>" + err_path.string() +
                         " )");
    std::ifstream f(err_path);
    std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return {r.exit_code, r.out, err};
}

std::string model_arg() {
    return "--model " + tiny_model().string();
}

}  // namespace

TEST(RunCli, GeneratesDeterministicallyForAFixedSeed) {
    const std::string args =
        model_arg() + " -p 'Tell me a short story.' -n 12 --seed 11 --temp 0.9 --top-k 40 --cpu";
    auto a = run_split("run " + args);
    ASSERT_EQ(a.exit_code, 0) << a.err;
    auto b = run_split("run " + args);
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_FALSE(a.out.empty());
    EXPECT_NE(a.err.find("prompt: "), std::string::npos) << a.err;
    EXPECT_NE(a.err.find("tokens/s"), std::string::npos) << a.err;
    EXPECT_NE(a.err.find("generation: "), std::string::npos) << a.err;
    EXPECT_EQ(a.err.find("GPU path"), std::string::npos) << "--cpu must silence the notice";
    // The time to the first token, one line after the speed report.
    const size_t ttft = a.err.find("\nfirst token: ");
    ASSERT_NE(ttft, std::string::npos) << a.err;
    EXPECT_GT(a.err.find(" s after start\n", ttft), ttft) << a.err;

    // Greedy decoding ignores the seed; sampling with another seed is allowed to differ.
    auto g1 = run_split("run " + model_arg() + " -p hi -n 10 --temp 0 --seed 1 --cpu");
    auto g2 = run_split("run " + model_arg() + " -p hi -n 10 --temp 0 --seed 2 --cpu");
    ASSERT_EQ(g1.exit_code, 0) << g1.err;
    EXPECT_EQ(g1.out, g2.out);
}

// Without --cpu the GPU generates, or (no GPU, as in CI) one notice says why the CPU does.
TEST(RunCli, WithoutCpuFlagUsesTheGpuOrSaysWhyNot) {
    auto r = run_split("run " + model_arg() + " -p hi -n 3 --think --system 'Be brief.'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("no usable GPU") != std::string::npos, !gj::jit::device_available())
        << r.err;
    EXPECT_NE(r.err.find("generation: 3 tokens"), std::string::npos) << r.err;
}

TEST(RunCli, BadInputIsAClearErrorBeforeAnyWork) {
    struct Case {
        std::string args, needle;
    };
    gj::test::ScratchDir dir("run-cli-bad");
    const auto long_prompt = dir.path() / "long.txt";
    {
        std::ofstream f(long_prompt);
        for (int i = 0; i < 6000; ++i) f << "qz ";  // about 12000 tokens; the context is 4096
    }
    const std::vector<Case> cases = {
        {"run --model /nonexistent/m.gguf -p hi --cpu", "/nonexistent/m.gguf"},
        {"run " + model_arg() + " -p hi --temp -1 --cpu", "temperature"},
        {"run " + model_arg() + " -p hi --top-p 0 --cpu", "top-p"},
        {"run " + model_arg() + " -p hi --top-p 1.5 --cpu", "top-p"},
        {"run " + model_arg() + " -p hi --min-p 2 --cpu", "min-p"},
        {"run " + model_arg() + " -p hi --top-k -2 --cpu", "top-k"},
        {"run " + model_arg() + " -p hi --repeat-penalty 0 --cpu", "repeat penalty"},
        {"run " + model_arg() + " -p hi -n -5 --cpu", "-n must be"},
        {"run " + model_arg() + " -p hi --think --no-think --cpu", "exclude each other"},
        {"run " + model_arg() + " --cpu", "prompt is empty"},
        {"run " + model_arg() + " -f /nonexistent/prompt.txt --cpu", "/nonexistent/prompt.txt"},
        {"run " + model_arg() + " -f " + long_prompt.string() + " --cpu",
         "the model's context holds 4096"},
        {"run --model " + long_prompt.string() + " -p hi --cpu", long_prompt.string()},
    };
    for (const auto& c : cases) {
        auto r = run_split(c.args);
        EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find("gemmajit: error: "), std::string::npos) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
        EXPECT_EQ(r.err.find("generation:"), std::string::npos) << c.args;
    }
}

// chat on the CPU: one reply per line; /reset starts over with the weights kept, so the same
// greedy message after it gets the reply of a fresh start.
TEST(ChatCli, RepliesAndResets) {
    gj::test::ScratchDir dir("chat-cli");
    const auto input = dir.path() / "input.txt";
    std::ofstream(input) << "hi\n/reset\nhi\n";
    auto r = run_split("chat " + model_arg() + " --cpu -n 4 --temp 0 < " + input.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("conversation reset"), std::string::npos) << r.err;
    const size_t nl = r.out.find('\n');
    ASSERT_NE(nl, std::string::npos) << r.out;
    EXPECT_EQ(r.out, r.out.substr(0, nl + 1) + r.out.substr(0, nl + 1));
}

TEST(TokenizeCli, PrintsIdsAndExportsTheVocabulary) {
    auto r = run_split("tokenize --synthetic-vocab 1024 --ids 'the cat'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("2,", 0), 0u) << r.out;  // BOS first
    auto m = run_split("tokenize " + model_arg() + " '<|turn>user'");
    ASSERT_EQ(m.exit_code, 0) << m.err;
    EXPECT_NE(m.out.find("105  <|turn>"), std::string::npos) << m.out;
    gj::test::ScratchDir dir("tokenize-cli");
    auto e = run_split("tokenize --synthetic-vocab 1024 --export-vocab " +
                       (dir.path() / "v.json").string());
    ASSERT_EQ(e.exit_code, 0) << e.err;
    EXPECT_GT(std::filesystem::file_size(dir.path() / "v.json"), 10000u);
    // -p/--prompt like run, or the text as the argument; not both.
    auto p = run_split("tokenize " + model_arg() + " --ids -p 'hello world'");
    ASSERT_EQ(p.exit_code, 0) << p.err;
    auto q = run_split("tokenize " + model_arg() + " --ids --prompt 'hello world'");
    auto positional = run_split("tokenize " + model_arg() + " --ids 'hello world'");
    EXPECT_EQ(p.out, q.out);
    EXPECT_EQ(p.out, positional.out);
    auto both = run_split("tokenize " + model_arg() + " -p hello world");
    EXPECT_EQ(both.exit_code, 1);
    EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
    auto bad = run_split("tokenize 'x'");
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("--synthetic-vocab"), std::string::npos) << bad.err;
}

// --tp (tensor parallelism) on run and bench: a count outside 1..8, from the flag or from
// GEMMAJIT_TP, and --tp with --cpu are errors before any work; without a GPU a split run says so
// (the two-GPU runs: tests/gpu/gpu_test_tensor_parallel.cpp).
TEST(RunCli, TensorParallelArgumentsAreChecked) {
    auto r = run_split("run " + model_arg() + " -p hi --tp 9");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("1 to 8 GPUs"), std::string::npos) << r.err;
    r = run_split("bench -m " + tiny_model().string() + " --tp 0x");
    EXPECT_NE(r.exit_code, 0);
    auto e = run_command("GEMMAJIT_TP=9 " + gj::test::gemmajit_exe() + " bench -m " +
                         tiny_model().string());
    EXPECT_EQ(e.exit_code, 1);
    EXPECT_NE(e.out.find("GEMMAJIT_TP"), std::string::npos) << e.out;
    r = run_split("run " + model_arg() + " -p hi --tp 2 --cpu");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("--cpu"), std::string::npos) << r.err;
    if (!gj::jit::device_available()) {
        r = run_split("run " + model_arg() + " -p hi --tp 2 -n 2");
        EXPECT_EQ(r.exit_code, 1);
        EXPECT_NE(r.err.find("needs GPUs"), std::string::npos) << r.err;
    }
}

// Option values outside their range are refused by the parser, before any work: thread counts
// past the thread pool's limit (a typo such as 100000 used to start 32k threads and exhaust the
// process limit), negative --ctx / --layers, seeds that are not unsigned 64-bit numbers (CLI11's
// strtoull turned -1 and overflowing numbers into 2^64 - 1), synthetic vocabularies out of range.
TEST(RunCli, OutOfRangeOptionValuesAreRefused) {
    gj::test::ScratchDir dir("run-cli-range");
    const std::string out = (dir.path() / "x.gguf").string();
    struct Case {
        std::string args, needle;
    };
    const std::string m = model_arg();
    const std::vector<Case> cases = {
        {"run " + m + " -p hi --cpu --threads 100000", "--threads"},
        {"run " + m + " -p hi --cpu --threads -1", "--threads"},
        {"chat " + m + " --cpu --threads 1025", "--threads"},
        {"synth --variant tiny --threads 100000 -o " + out, "--threads"},
        {"quantize " + tiny_model().string() + " " + out + " q8_0 --threads 5000", "--threads"},
        {"logits " + m + " --cpu --tokens 2 --threads 100000", "--threads"},
        {"run " + m + " -p hi --cpu --ctx -5", "--ctx"},
        {"chat " + m + " --cpu --ctx -5", "--ctx"},
        {"run " + m + " -p hi --cpu --seed -1", "--seed"},
        {"run " + m + " -p hi --cpu --seed 18446744073709551616", "--seed"},
        {"chat " + m + " --cpu --seed 0x10", "--seed"},
        {"synth --variant tiny --seed -3 -o " + out, "--seed"},
        {"tokenize --synthetic-vocab 1024 --seed -1 hi", "--seed"},
        {"bench " + m + " --seed -1", "--seed"},
        {"tokenize --synthetic-vocab -5 hi", "--synthetic-vocab"},
        {"tokenize --synthetic-vocab 2000000000 hi", "--synthetic-vocab"},
        {"synth --variant tiny --layers -1 -o " + out, "--layers"},
    };
    for (const auto& c : cases) {
        auto r = run_split(c.args + " < /dev/null");
        EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.err;
        EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
        EXPECT_EQ(r.err.find("generation:"), std::string::npos) << c.args;
    }
    EXPECT_FALSE(std::filesystem::exists(out));
    // The largest seed is a seed.
    auto r = run_split("tokenize --synthetic-vocab 1024 --seed 18446744073709551615 --ids hi");
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(RunCli, PromptFilesThatAreNotPromptsAreClearErrors) {
    gj::test::ScratchDir dir("run-cli-file");
    auto r = run_split("run " + model_arg() + " --cpu -f " + dir.path().string());
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("is a directory"), std::string::npos) << r.err;
    // A device without end: read up to the cap, then refused (it used to die of bad_alloc).
    r = run_split("run " + model_arg() + " --cpu -f /dev/zero");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("holds more than 64 MiB"), std::string::npos) << r.err;
}

// --ctx on the CPU reference holds the sequence to that many positions, as on the GPU (it used to
// be ignored: --ctx 64 generated thousands of tokens); more than the model's context is an error.
TEST(RunCli, CtxLimitsTheCpuSequence) {
    auto r = run_split("run " + model_arg() + " -p hi --cpu --temp 0 -n 500 --ctx 64");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.err.find("prompt: ");
    ASSERT_NE(at, std::string::npos) << r.err;
    const int prompt = std::stoi(r.err.substr(at + 8));
    // Positions prompt .. 63 are decoded; the token sampled at the last one needs none.
    EXPECT_NE(r.err.find("generation: " + std::to_string(64 - prompt + 1) + " tokens"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("stopped by context full"), std::string::npos) << r.err;
    r = run_split("run " + model_arg() + " -p hi --cpu -n 2 --ctx 5000");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("--ctx 5000 exceeds the 4096 positions"), std::string::npos) << r.err;
    r = run_split("run " + model_arg() + " -p 'Tell me a story.' --cpu -n 2 --ctx 8");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("holds 8"), std::string::npos) << r.err;
}

// chat: CRLF input reads as the same commands and messages; /reset also empties the repetition
// penalty's window, so the same message after it gets the reply of a fresh start; a bad --model
// is a "gemmajit: error" with exit code 1 like everywhere else (it was CLI11's, exit 105).
TEST(ChatCli, CrlfInputPenaltyResetAndBadModel) {
    gj::test::ScratchDir dir("chat-cli-crlf");
    const auto input = dir.path() / "input.txt";
    std::ofstream(input) << "hi\r\n/reset\r\nhi\r\n/quit\r\nnever sent\r\n";
    auto r =
        run_split("chat " + model_arg() +
                  " --cpu -n 8 --temp 0 --repeat-penalty 3 --repeat-last-n 64 < " + input.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("conversation reset"), std::string::npos) << r.err;
    const size_t nl = r.out.find('\n');
    ASSERT_NE(nl, std::string::npos) << r.out;
    EXPECT_EQ(r.out, r.out.substr(0, nl + 1) + r.out.substr(0, nl + 1));

    for (const std::string& bad : {std::string("/nonexistent/m.gguf"), dir.path().string()}) {
        r = run_split("chat --model " + bad + " --cpu < /dev/null");
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_NE(r.err.find("gemmajit: error: "), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
    }
}
