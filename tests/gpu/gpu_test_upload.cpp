// The weight upload through the pinned staging ring (GEMMAJIT_PARALLEL_UPLOAD, the default) puts
// exactly the bytes on the GPU that one pageable copy per tensor puts there: every matrix (the
// repacked split layouts included), the embedding tables and the fp32 norm vectors, bit for bit,
// on the tiny presets in several weight types and K-quant mixes, and on an E4B-shaped model.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/gpu/gpu_model.h"
#include "engine/model/synth.h"
#include "jit/cuda_driver.h"
#include "jit/env_flags.h"
#include "tests/support/test_env.h"

using gj::gemma4::GpuModel;
using gj::gemma4::GpuModelOptions;
namespace ggml = gj::ggml;

namespace {

std::vector<uint8_t> download(CUdeviceptr p, uint64_t bytes) {
    std::vector<uint8_t> out(bytes);
    if (bytes == 0) return out;
    gj::jit::Device& dev = gj::jit::Device::get();
    gj::jit::check_driver(gj::jit::driver().cuMemcpyDtoHAsync(out.data(), p, bytes, dev.stream()),
                          "cuMemcpyDtoHAsync");
    dev.synchronize();
    return out;
}

// Everything a load put on the GPU, as named byte strings.
std::vector<std::pair<std::string, std::vector<uint8_t>>> snapshot(const GpuModel& m) {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
    for (const gj::gemma4::GpuMatrix* g : m.matrices())
        out.emplace_back(g->name, download(g->ptr, g->bytes));
    out.emplace_back("token_embd", download(m.token_embd().ptr, m.token_embd().bytes));
    if (m.config().has_ple() && m.ple_table().on_gpu)
        out.emplace_back("ple_table", download(m.ple_table().ptr, m.ple_table().bytes));
    const uint64_t d = uint64_t(m.config().d_model) * 4;
    out.emplace_back("output_norm", download(m.output_norm(), d));
    for (size_t l = 0; l < m.layers().size(); ++l) {
        const auto& g = m.layers()[l];
        const std::string p = "layer " + std::to_string(l) + " ";
        out.emplace_back(p + "attn_norm", download(g.attn_norm, d));
        out.emplace_back(p + "post_ffw_norm", download(g.post_ffw_norm, d));
        out.emplace_back(p + "output_scale", download(g.output_scale, 4));
    }
    return out;
}

// `mix`: a quant mix name (q4_k_m, ...) that decides the tensor types instead of wtype.
void expect_same_upload(const std::string& variant, ggml::Type wtype, int layers,
                        const std::string& mix = "") {
    gj::test::ScratchDir dir("upload");
    gj::synth::Options o;
    o.variant = variant;
    o.wtype = wtype;
    o.mix = mix;
    o.layers = layers;
    const auto path = dir.path() / "model.gguf";
    gj::synth::write_model(o, path);

    auto load = [&](const char* parallel) {
        const gj::jit::Flags f = gj::jit::Flags::parse({{"GEMMAJIT_PARALLEL_UPLOAD", parallel}});
        GpuModelOptions mo;
        mo.context = 256;
        mo.flags = &f;
        return GpuModel::load(path, mo);
    };
    const auto plain = snapshot(*load("0"));
    const auto staged = snapshot(*load("1"));
    ASSERT_EQ(plain.size(), staged.size());
    size_t bytes = 0;
    for (size_t i = 0; i < plain.size(); ++i) {
        ASSERT_EQ(plain[i].first, staged[i].first);
        ASSERT_EQ(plain[i].second.size(), staged[i].second.size()) << plain[i].first;
        EXPECT_TRUE(plain[i].second == staged[i].second)
            << variant << " " << ggml::type_name(wtype) << ": " << plain[i].first
            << " differs between the two uploads";
        bytes += plain[i].second.size();
    }
    EXPECT_GT(bytes, 0u);
}

TEST(ParallelUpload, BitIdenticalToPlainCopiesOnTinyPresets) {
    GJ_REQUIRE_GPU();
    for (const char* variant : {"tiny", "tiny-e2b", "tiny-keqv"})
        for (ggml::Type t : {ggml::Type::Q8_0, ggml::Type::Q4_0, ggml::Type::BF16})
            expect_same_upload(variant, t, 0);
}

// K-quant mixes: Q4_K / Q5_K / Q6_K matrices and the tied Q6_K (pure q5_k: Q5_K) embedding table
// repacked to their split layouts through the staging buffer, the PLE table copied as it is.
TEST(ParallelUpload, BitIdenticalToPlainCopiesOnKQuantMixes) {
    GJ_REQUIRE_GPU();
    for (const char* mix : {"q4_k_m", "q5_k_m", "q5_k"})
        expect_same_upload("tiny-256", ggml::Type::Q8_0, 0, mix);
}

// Matrices of tens of MiB span several staging slots; the PLE table and the LM head are large.
TEST(ParallelUpload, BitIdenticalToPlainCopiesAtE4bShapes) {
    GJ_REQUIRE_GPU();
    expect_same_upload("e4b", ggml::Type::Q8_0, 2);
}

}  // namespace
