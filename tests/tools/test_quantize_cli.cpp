// `gemmajit quantize IN OUT TYPE`: an f32 synth requantized to q4_k_m has the types the mix gives
// (the same as `synth --wtype q4_k_m`), all metadata, and clear errors for bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/gguf/reader.h"
#include "tests/gguf/gguf_test_bytes.h"
#include "tests/support/test_env.h"

using gj::test::gemmajit_exe;
using gj::test::run_command;

TEST(QuantizeCli, F32SynthToQ4_K_MMatchesSynthQ4_K_M) {
    gj::test::ScratchDir dir("quantize-cli");
    const std::string f32 = (dir.path() / "f32.gguf").string();
    const std::string q = (dir.path() / "q.gguf").string();
    const std::string s = (dir.path() / "s.gguf").string();
    for (const std::string variant : {"tiny", "tiny-moe"}) {
        auto r =
            run_command(gemmajit_exe() + " synth --variant " + variant + " --wtype f32 -o " + f32);
        ASSERT_EQ(r.exit_code, 0) << r.out;
        r = run_command(gemmajit_exe() + " synth --variant " + variant + " --wtype q4_k_m -o " + s);
        ASSERT_EQ(r.exit_code, 0) << r.out;
        r = run_command(gemmajit_exe() + " quantize " + f32 + " " + q + " q4_k_m --threads 2");
        ASSERT_EQ(r.exit_code, 0) << r.out;
        EXPECT_NE(r.out.find("wrote " + q), std::string::npos) << r.out;
        EXPECT_FALSE(std::filesystem::exists(q + ".partial"));

        auto in = gj::gguf::File::open(f32);
        auto out = gj::gguf::File::open(q);
        auto syn = gj::gguf::File::open(s);
        EXPECT_EQ(out->metadata().size(), in->metadata().size());
        EXPECT_EQ(out->get_u64("general.file_type"), 15u);
        EXPECT_EQ(out->get_string("general.architecture"), "gemma4");
        ASSERT_EQ(out->tensors().size(), in->tensors().size());
        for (size_t i = 0; i < in->tensors().size(); ++i) {
            const auto& t = in->tensors()[i];
            EXPECT_EQ(out->tensors()[i].name, t.name);
            EXPECT_EQ(out->tensors()[i].dims, t.dims);
            EXPECT_EQ(out->tensors()[i].type, syn->tensor(t.name).type) << variant << " " << t.name;
        }
        // The values are the synth's own quantization of the same floats.
        for (size_t i = 0; i < in->tensors().size(); ++i) {
            const auto& a = out->tensors()[i];
            const auto& b = syn->tensor(a.name);
            ASSERT_EQ(a.n_bytes, b.n_bytes);
            EXPECT_EQ(0, std::memcmp(a.data, b.data, a.n_bytes)) << a.name;
        }
        r = run_command(gemmajit_exe() + " logits --cpu -m " + q + " --tokens 2,10,20");
        EXPECT_EQ(r.exit_code, 0) << r.out;
    }
}

TEST(QuantizeCli, BadInputsFailClearly) {
    gj::test::ScratchDir dir("quantize-cli-bad");
    const std::string f32 = (dir.path() / "f32.gguf").string();
    const std::string q8 = (dir.path() / "q8.gguf").string();
    const std::string out = (dir.path() / "out.gguf").string();
    ASSERT_EQ(run_command(gemmajit_exe() + " synth --variant tiny --wtype f32 -o " + f32).exit_code,
              0);
    ASSERT_EQ(run_command(gemmajit_exe() + " synth --variant tiny --wtype q8_0 -o " + q8).exit_code,
              0);
    const auto size_before = std::filesystem::file_size(f32);

    auto r = run_command(gemmajit_exe() + " quantize " + f32 + " " + out + " q3_k_m");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("unknown quantization type 'q3_k_m' (use f32,"), std::string::npos)
        << r.out;

    r = run_command(gemmajit_exe() + " quantize " + q8 + " " + out + " q4_k_m");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("is already quantized (tensor token_embd.weight is q8_0)"),
              std::string::npos)
        << r.out;

    r = run_command(gemmajit_exe() + " quantize " + f32 + " " + f32 + " q4_k_m");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("refusing to overwrite it"), std::string::npos) << r.out;
    r = run_command(gemmajit_exe() + " quantize " + f32 + " " + dir.path().string() +
                    "/./f32.gguf q4_k_m");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("refusing to overwrite it"), std::string::npos) << r.out;
    EXPECT_EQ(std::filesystem::file_size(f32), size_before);

    r = run_command(gemmajit_exe() + " quantize " + (dir.path() / "missing.gguf").string() + " " +
                    out + " q4_k_m");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("missing.gguf"), std::string::npos) << r.out;
    EXPECT_FALSE(std::filesystem::exists(out));
    EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

namespace {

// Every file in `dir`, by name.
std::vector<std::string> files_in(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace

// OUT is written to a fresh temporary beside it, never to a fixed "OUT.partial": an input of that
// name (which the fixed name used to truncate while it was mmapped: SIGBUS and a destroyed input)
// and an unrelated user's file of that name stay as they were, and failures leave nothing.
TEST(QuantizeCli, ExistingPartialFilesAreNeverOverwritten) {
    gj::test::ScratchDir dir("quantize-cli-partial");
    const auto f32 = dir.path() / "f32.gguf";
    ASSERT_EQ(run_command(gemmajit_exe() + " synth --variant tiny --wtype f32 -o " + f32.string())
                  .exit_code,
              0);
    const auto in = dir.path() / "m.gguf.partial";
    std::filesystem::copy_file(f32, in);
    const auto out = dir.path() / "m.gguf";
    auto r = run_command(gemmajit_exe() + " quantize " + in.string() + " " + out.string() +
                         " q8_0 --threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(gj::gguf_test::read_all(in), gj::gguf_test::read_all(f32));
    EXPECT_EQ(gj::gguf::File::open(out)->tensor("token_embd.weight").type, gj::ggml::Type::Q8_0);
    EXPECT_EQ(files_in(dir.path()),
              (std::vector<std::string>{"f32.gguf", "m.gguf", "m.gguf.partial"}));

    // A failed write (OUT is a directory; too many threads) leaves no file behind.
    const auto sub = dir.path() / "sub";
    std::filesystem::create_directory(sub);
    r = run_command(gemmajit_exe() + " quantize " + f32.string() + " " + sub.string() + " q8_0");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("is a directory"), std::string::npos) << r.out;
    r = run_command(gemmajit_exe() + " quantize " + f32.string() + " " +
                    (dir.path() / "t.gguf").string() + " q8_0 --threads 100000");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("--threads"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("1024"), std::string::npos) << r.out;
    EXPECT_TRUE(files_in(sub).empty());
    EXPECT_EQ(files_in(dir.path()),
              (std::vector<std::string>{"f32.gguf", "m.gguf", "m.gguf.partial", "sub"}));
}

TEST(QuantizeCli, KernelsPlanOfAMix) {
    // The e4b q4_k_m plan reads its K-quants in their split layouts (Q4_K matrices, Q6_K for some
    // V / FFN down and the tied embedding / LM head; the PLE table gathered from its GGUF blocks),
    // takes prefill products through dequant_f16 copies, and keeps the F32 PLE projection float.
    // The 26B's q5_k_m: its 2816-wide matrices are Q5_K (split, the routed experts too, with the
    // grouped int8 GEMM of prefill), the 2112-wide ffn_down falls back to Q8_0 (Q6_K rows) or
    // Q5_1 (split).
    auto r = run_command(gemmajit_exe() + " kernels --variant e4b --wtype q4_k_m --arch sm_90");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("e4b (q4_k_m)"), std::string::npos) << r.out;
    for (const char* want :
         {"matvec_q4_k.k2560.split ", "matvec_q4_k.k10240.split ", "matvec_q4_k.k2560.b8.split",
          "matvec_q6_k.k2560.split ", "matvec_q6_k.k10240.split ",
          "embed_rows.q6_k.n2560.v262144.split", "embed_rows.q6_k.n10752.v262144 ",
          "dequant_f16.q4_k.k2560.split", "dequant_f16.q6_k.k10240.split", "matvec_f.f32.k2560"})
        EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
    EXPECT_EQ(r.out.find("matvec_f.f16"), std::string::npos) << r.out;
    r = run_command(gemmajit_exe() + " kernels --variant 26b-a4b --wtype q5_k_m --arch sm_90");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("matvec_q8_0.k2112"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("matvec_q5_k.k2816.split "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("matvec_q5_k.k2816.split.moe "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("mmq.q5_k.k2816."), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("matvec_q5_1.k2112.split "), std::string::npos) << r.out;
    r = run_command(gemmajit_exe() + " kernels --variant e4b --wtype q9_z");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.out.find("q4_k_m"), std::string::npos) << r.out;
}
