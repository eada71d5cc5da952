// embed_rows on the GPU against the CPU's ggml dequantization: every table type (f32, f16, bf16,
// q8_0, q4_0, q4_1, q5_0, q5_1, and the K-quants q4_k, q5_k, q6_k read in their super-blocks; Q6_K
// is what llama.cpp's Q4_K_M files store embeddings in) at the token-embedding widths of the tiny
// presets and the real models and at the PLE table widths (L * P), single tokens and batches with
// repeated ids. The GPU computes the same two fp32 products as the CPU, so the comparison is bit
// for bit. K-quant tables also in their split layout (the tied LM head's; the planes made
// on the CPU by kref::split_layout). Also: ids outside the table give NaN rows, and a grid sized
// for a larger batch leaves the rows past T untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/gguf/quantize.h"
#include "engine/gpu/kernels/embed_rows.h"
#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::MatvecLayout;
using gj::jit::DeviceBuffer;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

struct Case {
    ggml::Type type;
    int n;      // row width
    int vocab;  // table rows
    MatvecLayout layout = MatvecLayout::Ggml;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    return ggml::type_name(info.param.type) + "_n" + std::to_string(info.param.n) +
           (info.param.layout == MatvecLayout::Split ? "_split" : "");
}

// Random table rows quantized to the type (values ~ N(0, 1), like real embeddings' scale).
std::vector<uint8_t> random_table(ggml::Type type, int vocab, int n, std::mt19937& rng) {
    const size_t row_bytes = *ggml::row_bytes(type, n);
    std::vector<uint8_t> table(row_bytes * vocab);
    for (int r = 0; r < vocab; ++r) {
        const auto v = random_normal(n, 1.0f, rng);
        ggml::quantize_row(type, v.data(), &table[r * row_bytes], n);
    }
    return table;
}

// Bitwise float comparison (NaN patterns included).
bool same_bits(float a, float b) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    return ua == ub;
}

class EmbedTest : public ::testing::TestWithParam<Case> {};

TEST_P(EmbedTest, MatchesCpuBitForBit) {
    GJ_REQUIRE_GPU();
    const Case c = GetParam();
    const KernelSpec spec = gj::gemma4::embed_rows_spec(c.n, c.type, c.vocab, c.layout);
    SCOPED_TRACE(spec.name);
    GpuKernels g({spec});
    std::mt19937 rng(c.n + int(c.type));
    const auto table = random_table(c.type, c.vocab, c.n, rng);
    auto dtable = to_device(
        c.layout == MatvecLayout::Split ? split_layout(c.type, table, c.vocab, c.n) : table);
    const unsigned threads = unsigned(gj::gemma4::spec_constant(spec, "THREADS"));
    const auto& kern = g.get(spec.name, "embed_rows");
    const float scale = std::sqrt(float(c.n));  // like sqrtf(d)
    // T = 1 (decode), then a batch with repeats and both ends of the table.
    for (const std::vector<int>& ids :
         {std::vector<int>{c.vocab / 2},
          std::vector<int>{0, c.vocab - 1, 3, 3, c.vocab / 3, 0, c.vocab - 2}}) {
        const int T = int(ids.size());
        const int t_max = T + 2;  // grid rows past T must exit without writing
        auto dids = to_device(ids);
        std::vector<float> sentinel(size_t(t_max) * c.n, 12345.0f);
        auto dout = to_device(sentinel);
        launch(kern, {ceil_div(c.n / 4, threads), unsigned(t_max)}, {threads}, dids.ptr(), T,
               dtable.ptr(), dout.ptr(), scale);
        const auto got = from_device<float>(dout, sentinel.size());
        const auto want = embed_rows(c.type, table, c.n, ids, scale);
        int bad = 0;
        for (size_t i = 0; i < want.size() && bad < 5; ++i)
            if (!same_bits(got[i], want[i])) {
                ++bad;
                ADD_FAILURE() << "T=" << T << " token " << i / c.n << " element " << i % c.n
                              << ": got " << got[i] << " want " << want[i];
            }
        for (size_t i = want.size(); i < got.size(); ++i)
            ASSERT_EQ(got[i], 12345.0f) << "row " << i / c.n << " past T was written";
    }
}

INSTANTIATE_TEST_SUITE_P(
    Widths, EmbedTest,
    ::testing::Values(
        // Tiny presets: d = 128; PLE tables 8 * 32 = 256.
        Case{ggml::Type::F32, 128, 1024}, Case{ggml::Type::F16, 128, 1280},
        Case{ggml::Type::BF16, 256, 1024}, Case{ggml::Type::Q8_0, 128, 1024},
        Case{ggml::Type::Q4_0, 256, 1280},
        // Real d: E2B 1536, E4B 2560, 26B 2816, 12B 3840, 31B 5376 (first quarter-rows partial).
        Case{ggml::Type::BF16, 1536, 300}, Case{ggml::Type::Q8_0, 2560, 300},
        Case{ggml::Type::Q4_0, 2560, 300}, Case{ggml::Type::F16, 2816, 300},
        Case{ggml::Type::F32, 3840, 300}, Case{ggml::Type::Q8_0, 5376, 300},
        // PLE tables: E2B 35 * 256, E4B 42 * 256.
        Case{ggml::Type::Q8_0, 8960, 200}, Case{ggml::Type::BF16, 10752, 200},
        Case{ggml::Type::Q4_0, 10752, 200}, Case{ggml::Type::F16, 10752, 200},
        // K-quants: 256 (one super-block, 210-byte Q6_K rows: every other row starts 2 bytes
        // past a word), 768, E2B / E4B / 31B widths, the E4B PLE table (42 * 256).
        Case{ggml::Type::Q6_K, 256, 513}, Case{ggml::Type::Q4_K, 256, 300},
        Case{ggml::Type::Q5_K, 768, 300}, Case{ggml::Type::Q6_K, 1536, 300},
        Case{ggml::Type::Q6_K, 2560, 300}, Case{ggml::Type::Q4_K, 2560, 300},
        Case{ggml::Type::Q5_K, 5376, 200}, Case{ggml::Type::Q6_K, 10752, 200},
        Case{ggml::Type::Q4_K, 10752, 200},
        // Split tables (a tied LM head's): one super-block, E4B and 31B widths.
        Case{ggml::Type::Q6_K, 256, 513, MatvecLayout::Split},
        Case{ggml::Type::Q4_K, 256, 300, MatvecLayout::Split},
        Case{ggml::Type::Q6_K, 2560, 300, MatvecLayout::Split},
        Case{ggml::Type::Q4_K, 2560, 300, MatvecLayout::Split},
        Case{ggml::Type::Q6_K, 5376, 200, MatvecLayout::Split},
        Case{ggml::Type::Q5_K, 256, 300, MatvecLayout::Split},
        Case{ggml::Type::Q5_K, 2560, 300, MatvecLayout::Split},
        Case{ggml::Type::Q5_K, 5376, 200, MatvecLayout::Split},
        // The 32-block fallbacks (Q5_0: 22-byte blocks, rows of 96 start 2 bytes past a word
        // every other row).
        Case{ggml::Type::Q4_1, 128, 300}, Case{ggml::Type::Q5_0, 96, 301},
        Case{ggml::Type::Q5_1, 2816, 200}, Case{ggml::Type::Q5_0, 2816, 200}),
    case_name);

TEST(Embed, IdsOutsideTheTableGiveNanRows) {
    GJ_REQUIRE_GPU();
    const int n = 256, vocab = 100;
    const KernelSpec spec = gj::gemma4::embed_rows_spec(n, ggml::Type::Q8_0, vocab);
    GpuKernels g({spec});
    std::mt19937 rng(3);
    auto dtable = to_device(random_table(ggml::Type::Q8_0, vocab, n, rng));
    const std::vector<int> ids = {-1, vocab, 5, 1 << 30};
    auto dids = to_device(ids);
    DeviceBuffer dout(ids.size() * n * 4);
    const unsigned threads = unsigned(gj::gemma4::spec_constant(spec, "THREADS"));
    launch(g.get(spec.name, "embed_rows"), {ceil_div(n / 4, threads), unsigned(ids.size())},
           {threads}, dids.ptr(), int(ids.size()), dtable.ptr(), dout.ptr(), 1.0f);
    const auto got = from_device<float>(dout, ids.size() * n);
    for (size_t t = 0; t < ids.size(); ++t)
        for (int i = 0; i < n; ++i)
            ASSERT_EQ(std::isnan(got[t * n + i]), t != 2) << "token " << ids[t] << " element " << i;
}

}  // namespace
