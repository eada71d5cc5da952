// dequant_f16 on the GPU against the CPU: K-quant rows (Q4_K, Q5_K, Q6_K in their GGUF
// super-blocks) and Q4_1 / Q5_0 / Q5_1 rows to fp16 must equal the CPU's dequantized floats rounded
// to fp16, bit for bit, for one and several super-blocks per row, 210-byte Q6_K rows that start 2
// bytes past a word, and a grid whose last block is partial (nothing written past the matrix);
// the K-quants and the fallbacks also from their split layouts (the planes made on the CPU by
// kref::split_layout),
// as are Q8_0 and Q4_0 (GEMMAJIT_MMQ_VARIANT=blas), which are read in that layout only.
#include <gtest/gtest.h>

#include <random>

#include "engine/gguf/dequant.h"
#include "engine/gguf/half.h"
#include "engine/gpu/kernels/dequant_f16.h"
#include "engine/gpu/kernels/spec_util.h"
#include "tests/support/kernel_ref.h"
#include "tests/support/kernel_ref_gpu.h"
#include "tests/support/test_env.h"

using namespace gj::test::kref;
using gj::gemma4::MatvecLayout;
using gj::jit::KernelSpec;
namespace ggml = gj::ggml;

namespace {

struct Case {
    ggml::Type type;
    int k, rows;
    MatvecLayout layout = MatvecLayout::Ggml;
};

class DequantF16Test : public ::testing::TestWithParam<Case> {};

TEST_P(DequantF16Test, MatchesCpuBitForBit) {
    GJ_REQUIRE_GPU();
    const Case c = GetParam();
    const KernelSpec spec = gj::gemma4::dequant_f16_spec(c.type, c.k, c.layout);
    SCOPED_TRACE(spec.name + " rows " + std::to_string(c.rows));
    GpuKernels g({spec});
    std::mt19937 rng(c.k * 7 + c.rows);
    std::vector<float> deq;
    const auto blocks = random_weights(c.type, c.rows, c.k, rng, deq);
    auto src = to_device(c.layout == MatvecLayout::Split ? split_layout(c.type, blocks, c.rows, c.k)
                                                         : blocks);
    const size_t n = size_t(c.rows) * c.k;
    std::vector<uint16_t> sentinel(n + 64, 0xBEEF);
    auto dst = to_device(sentinel);
    const unsigned threads = unsigned(gj::gemma4::spec_constant(spec, "THREADS"));
    const size_t elems = size_t(gj::gemma4::spec_constant(spec, "ELEMS"));
    launch(g.get(spec.name, "dequant_f16"), {ceil_div(n / elems, threads)}, {threads}, src.ptr(),
           dst.ptr(), c.rows);
    const auto got = from_device<uint16_t>(dst, sentinel.size());
    int bad = 0;
    for (size_t i = 0; i < n && bad < 5; ++i)
        if (got[i] != gj::f32_to_f16(deq[i])) {
            ++bad;
            ADD_FAILURE() << "row " << i / c.k << " element " << i % c.k << ": got 0x" << std::hex
                          << got[i] << " want 0x" << gj::f32_to_f16(deq[i]) << std::dec;
        }
    for (size_t i = n; i < got.size(); ++i) ASSERT_EQ(got[i], 0xBEEF) << "written past the matrix";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DequantF16Test,
    ::testing::Values(Case{ggml::Type::Q4_K, 256, 33}, Case{ggml::Type::Q4_K, 2560, 70},
                      Case{ggml::Type::Q5_K, 256, 33}, Case{ggml::Type::Q5_K, 10240, 9},
                      Case{ggml::Type::Q6_K, 256, 33}, Case{ggml::Type::Q6_K, 768, 17},
                      Case{ggml::Type::Q6_K, 2560, 70}, Case{ggml::Type::Q4_1, 32, 33},
                      Case{ggml::Type::Q5_0, 96, 31}, Case{ggml::Type::Q5_1, 2112, 9},
                      Case{ggml::Type::Q4_K, 256, 33, MatvecLayout::Split},
                      Case{ggml::Type::Q4_K, 2560, 70, MatvecLayout::Split},
                      Case{ggml::Type::Q4_K, 10240, 9, MatvecLayout::Split},
                      Case{ggml::Type::Q5_K, 256, 33, MatvecLayout::Split},
                      Case{ggml::Type::Q5_K, 2560, 70, MatvecLayout::Split},
                      Case{ggml::Type::Q5_K, 10240, 9, MatvecLayout::Split},
                      Case{ggml::Type::Q6_K, 256, 33, MatvecLayout::Split},
                      Case{ggml::Type::Q6_K, 10240, 9, MatvecLayout::Split},
                      Case{ggml::Type::Q4_1, 32, 33, MatvecLayout::Split},
                      Case{ggml::Type::Q5_0, 96, 31, MatvecLayout::Split},
                      Case{ggml::Type::Q5_0, 2112, 9, MatvecLayout::Split},
                      Case{ggml::Type::Q5_1, 2112, 9, MatvecLayout::Split},
                      Case{ggml::Type::Q8_0, 32, 33, MatvecLayout::Split},
                      Case{ggml::Type::Q8_0, 2560, 70, MatvecLayout::Split},
                      Case{ggml::Type::Q4_0, 96, 31, MatvecLayout::Split},
                      Case{ggml::Type::Q4_0, 10240, 9, MatvecLayout::Split}),
    [](const ::testing::TestParamInfo<Case>& i) {
        return ggml::type_name(i.param.type) + "_k" + std::to_string(i.param.k) + "_r" +
               std::to_string(i.param.rows) +
               (i.param.layout == MatvecLayout::Split ? "_split" : "");
    });

}  // namespace
