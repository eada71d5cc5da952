// `gemmajit synth` and `gemmajit info` from the command line: success output and clear errors.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_env.h"

using gj::test::gemmajit_exe;
using gj::test::run_command;

TEST(SynthCli, WritesAModelThatInfoDescribes) {
    gj::test::ScratchDir dir("synth-cli");
    const std::string model = (dir.path() / "m.gguf").string();
    auto r = run_command(gemmajit_exe() + " synth --variant tiny-keqv --wtype q4_0 --seed 3 -o " +
                         model);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("wrote " + model), std::string::npos) << r.out;

    r = run_command(gemmajit_exe() + " info --model " + model);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("KV heads per layer [4,4,4,1,4,4,4,1]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("k_eq_v"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("q4_0"), std::string::npos) << r.out;
}

TEST(SynthCli, BadArgumentsFailClearly) {
    gj::test::ScratchDir dir("synth-cli-bad");
    const std::string out = " -o " + (dir.path() / "x.gguf").string();
    auto r = run_command(gemmajit_exe() + " synth --variant e5b" + out);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("unknown model variant 'e5b'"), std::string::npos) << r.out;

    r = run_command(gemmajit_exe() + " synth --variant tiny --wtype q3_q" + out);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("unknown weight type 'q3_q'"), std::string::npos) << r.out;

    r = run_command(gemmajit_exe() + " synth --variant tiny --wtype q2_k" + out);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("unknown weight type 'q2_k' (use q8_0, q4_0, bf16, f16, f32, q4_k"),
              std::string::npos)
        << r.out;

    r = run_command(gemmajit_exe() + " synth --variant tiny --layers 99" + out);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("cannot keep 99 layers"), std::string::npos) << r.out;

    r = run_command(gemmajit_exe() + " info --model " + (dir.path() / "missing.gguf").string());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("missing.gguf"), std::string::npos) << r.out;
}
