// `gemmajit logits`: JSON and binary outputs agree with the library, and bad input (missing
// file, token out of range, empty or malformed token list) is a clear error with exit code != 0.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/cpu/cpu_forward.h"
#include "engine/model/synth.h"
#include "tests/support/test_env.h"

using gj::test::gemmajit_exe;
using gj::test::run_command;

namespace {

class LogitsCli : public ::testing::Test {
  protected:
    void SetUp() override {
        gj::synth::Options o;
        o.variant = "tiny";
        o.threads = 2;
        gj::synth::write_model(o, dir_.path() / "m.gguf");
    }
    std::string model() const { return (dir_.path() / "m.gguf").string(); }
    std::string logits_cmd(const std::string& args) const {
        return gemmajit_exe() + " logits --cpu --threads 2 --model " + model() + " " + args;
    }
    gj::test::ScratchDir dir_{"logits-cli"};
};

}  // namespace

TEST_F(LogitsCli, JsonAndBinaryOutputsMatchTheLibrary) {
    const std::vector<int32_t> tokens = {2, 10, 20, 1000, 5};
    gj::gemma4::CpuOptions co;
    co.threads = 2;
    auto m = gj::gemma4::CpuModel::load(model(), co);
    gj::gemma4::CpuSession s(*m);
    const std::vector<float> want = s.prefill(tokens);
    const size_t V = m->config().vocab_size;

    const std::string json_path = (dir_.path() / "l.json").string();
    auto r = run_command(logits_cmd("--tokens 2,10,20,1000,5 -o " + json_path));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::ifstream jf(json_path);
    const auto j = nlohmann::json::parse(jf);
    EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), tokens);
    EXPECT_EQ(j.at("vocab_size").get<size_t>(), V);
    ASSERT_EQ(j.at("logits").size(), tokens.size());
    for (size_t t = 0; t < tokens.size(); ++t)
        for (size_t v = 0; v < V; v += 97)
            EXPECT_FLOAT_EQ(j["logits"][t][v].get<float>(), want[t * V + v]);

    const std::string bin_path = (dir_.path() / "l.bin").string();
    r = run_command(logits_cmd("--tokens 2,10,20,1000,5 -o " + bin_path));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::ifstream bf(bin_path, std::ios::binary);
    char magic[4];
    uint32_t header[3];
    bf.read(magic, 4);
    bf.read(reinterpret_cast<char*>(header), sizeof header);
    EXPECT_EQ(std::string(magic, 4), "GJLG");
    EXPECT_EQ(header[0], 1u);
    EXPECT_EQ(header[1], tokens.size());
    EXPECT_EQ(header[2], V);
    std::vector<float> got(tokens.size() * V);
    bf.read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size() * sizeof(float)));
    EXPECT_EQ(got, want);

    // Table output; without --cpu the GPU computes it, or a note says why the CPU does.
    r = run_command(gemmajit_exe() + " logits --model " + model() + " --tokens 2,10");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(r.out.find("no usable GPU") != std::string::npos, !gj::jit::device_available())
        << r.out;
    EXPECT_NE(r.out.find("pos    1 token     10 -> argmax"), std::string::npos) << r.out;
}

TEST_F(LogitsCli, BadInputFailsClearly) {
    auto r = run_command(logits_cmd("--tokens 2,1024"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("token id 1024 at position 1 is outside the vocabulary [0, 1024)"),
              std::string::npos)
        << r.out;

    r = run_command(logits_cmd("--tokens ' , '"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("the token list is empty"), std::string::npos) << r.out;

    r = run_command(logits_cmd("--tokens 2,x7"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("'x7' is not a token id"), std::string::npos) << r.out;

    r = run_command(logits_cmd("--tokens 2,-3"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("'-3' is not a token id"), std::string::npos) << r.out;

    // More positions than the context (the tiny presets': 4096).
    std::string many = "2";
    for (int i = 0; i < 4096; ++i) many += ",5";
    r = run_command(logits_cmd("--tokens " + many));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("4097 tokens are more than the 4096 positions"), std::string::npos)
        << r.out.substr(0, 400);

    r = run_command(gemmajit_exe() + " logits --cpu --model /nonexistent/m.gguf --tokens 2");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("/nonexistent/m.gguf"), std::string::npos) << r.out;
}
