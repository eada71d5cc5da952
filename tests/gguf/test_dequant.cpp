// Dequantization against hand-built blocks: each block is packed here from chosen quants and
// scales following ggml's layout description, and the expected floats come from those chosen
// values, so a wrong nibble order, scale packing or sign convention in engine/gguf/dequant.cpp
// fails.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "engine/gguf/dequant.h"
#include "engine/gguf/half.h"
#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"
#include "tests/support/test_env.h"

using gj::ggml::Type;
using ::testing::HasSubstr;

namespace {

void put_half(std::vector<uint8_t>& b, size_t at, float v) {
    const uint16_t h = gj::f32_to_f16(v);
    ASSERT_EQ(gj::f16_to_f32(h), v) << "test values must be exact in fp16";
    std::memcpy(b.data() + at, &h, 2);
}

std::vector<float> dequant(Type t, const std::vector<uint8_t>& block, int64_t n) {
    std::vector<float> out(n, -999.0f);
    gj::ggml::dequantize_row(t, block.data(), out.data(), n);
    return out;
}

// The 12 scale bytes of a Q4_K/Q5_K super-block from 8 six-bit scales and 8 six-bit mins: bytes
// 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for the
// mins; bytes 8-11 the low 4 bits of scale 4+i (low nibble) and min 4+i (high nibble).
std::array<uint8_t, 12> pack_scales_k4(const int sc[8], const int mn[8]) {
    std::array<uint8_t, 12> s{};
    for (int i = 0; i < 4; ++i) {
        s[i] = uint8_t(sc[i] | ((sc[i + 4] >> 4) << 6));
        s[i + 4] = uint8_t(mn[i] | ((mn[i + 4] >> 4) << 6));
        s[i + 8] = uint8_t((sc[i + 4] & 0xF) | ((mn[i + 4] & 0xF) << 4));
    }
    return s;
}

const int kScales[8] = {63, 1, 17, 32, 48, 5, 63, 20};  // > 15 in slots 4-7 uses the top bits
const int kMins[8] = {0, 63, 9, 31, 33, 62, 16, 1};

}  // namespace

TEST(Dequant, F32F16Bf16) {
    const std::vector<float> want = {1.0f, -2.5f, 0.0f, 65504.0f, 0x1p-24f, -0.75f};
    std::vector<uint8_t> f32(want.size() * 4), f16(want.size() * 2), bf16(want.size() * 2);
    std::memcpy(f32.data(), want.data(), f32.size());
    for (size_t i = 0; i < want.size(); ++i) {
        const uint16_t h = gj::f32_to_f16(want[i]), b = gj::f32_to_bf16(want[i]);
        std::memcpy(f16.data() + 2 * i, &h, 2);
        std::memcpy(bf16.data() + 2 * i, &b, 2);
    }
    EXPECT_EQ(dequant(Type::F32, f32, 6), want);
    EXPECT_EQ(dequant(Type::F16, f16, 6), want);
    const auto b = dequant(Type::BF16, bf16, 6);
    EXPECT_EQ(b[1], -2.5f);
    EXPECT_EQ(b[3], 65536.0f);  // 65504 needs more than bf16's 8 mantissa bits
    EXPECT_EQ(b[4], 0x1p-24f);
}

TEST(Dequant, Q8_0) {
    // Two blocks: d = 0.5 with q = 4j - 64, then d = -3 with q = (j % 2 ? 127 : -128).
    std::vector<uint8_t> b(68);
    put_half(b, 0, 0.5f);
    put_half(b, 34, -3.0f);
    for (int j = 0; j < 32; ++j) {
        b[2 + j] = uint8_t(int8_t(4 * j - 64));
        b[36 + j] = uint8_t(int8_t(j % 2 ? 127 : -128));
    }
    const auto y = dequant(Type::Q8_0, b, 64);
    EXPECT_EQ(y[0], -32.0f);
    EXPECT_EQ(y[31], 30.0f);
    for (int j = 0; j < 32; ++j) {
        EXPECT_EQ(y[j], 0.5f * (4 * j - 64)) << j;
        EXPECT_EQ(y[32 + j], j % 2 ? -381.0f : 384.0f) << j;
    }
}

TEST(Dequant, Q4_0) {
    // Low nibbles are elements 0-15, high nibbles elements 16-31; value = (nibble - 8) * d.
    std::vector<uint8_t> b(18);
    put_half(b, 0, 2.0f);
    for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t(j | ((15 - j) << 4));
    const auto y = dequant(Type::Q4_0, b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], 2.0f * (j - 8)) << j;
        EXPECT_EQ(y[16 + j], 2.0f * (7 - j)) << j;
    }
    EXPECT_EQ(y[0], -16.0f);
    EXPECT_EQ(y[16], 14.0f);
}

TEST(Dequant, Q4_K) {
    // Sub-block s (32 elements) has value d*scale[s]*q - dmin*min[s]. Element e lies in 64-group
    // g = e/64: its quant is the low nibble of qs[32g + e%32] for the first 32 of the group and
    // the high nibble for the second 32.
    const float d = 0.25f, dmin = 1.5f;
    std::vector<uint8_t> b(144);
    put_half(b, 0, d);
    put_half(b, 2, dmin);
    const auto sc = pack_scales_k4(kScales, kMins);
    std::copy(sc.begin(), sc.end(), b.begin() + 4);
    auto quant = [](int e) { return (e * 7 + e / 32) & 15; };
    for (int e = 0; e < 256; ++e) {
        const int g = e / 64, hi = (e % 64) / 32;
        b[16 + 32 * g + e % 32] |= uint8_t(quant(e) << (4 * hi));
    }
    const auto y = dequant(Type::Q4_K, b, 256);
    for (int e = 0; e < 256; ++e) {
        const int s = e / 32;
        EXPECT_FLOAT_EQ(y[e], d * kScales[s] * quant(e) - dmin * kMins[s]) << e;
    }
    EXPECT_EQ(y[0], 0.0f);                        // q 0, scale 63, min 0
    EXPECT_EQ(y[1], 0.25f * 63 * 7);              // q 7
    EXPECT_EQ(y[32], 0.25f * 1 * 1 - 1.5f * 63);  // sub-block 1: q (224+1)&15 = 1
    EXPECT_EQ(y[255], 0.25f * 20 * ((255 * 7 + 7) & 15) - 1.5f * 1);
}

TEST(Dequant, Q5_K) {
    // As Q4_K plus a fifth bit: for 64-group g, the first 32 take bit 2g of qh[e%32], the second
    // 32 take bit 2g+1.
    const float d = 0.5f, dmin = 0.125f;
    std::vector<uint8_t> b(176);
    put_half(b, 0, d);
    put_half(b, 2, dmin);
    const auto sc = pack_scales_k4(kScales, kMins);
    std::copy(sc.begin(), sc.end(), b.begin() + 4);
    auto quant = [](int e) { return (e * 13 + 5) & 31; };
    for (int e = 0; e < 256; ++e) {
        const int g = e / 64, hi = (e % 64) / 32, q = quant(e);
        b[48 + 32 * g + e % 32] |= uint8_t((q & 15) << (4 * hi));
        if (q & 16) b[16 + e % 32] |= uint8_t(1u << (2 * g + hi));
    }
    const auto y = dequant(Type::Q5_K, b, 256);
    for (int e = 0; e < 256; ++e) {
        const int s = e / 32;
        EXPECT_FLOAT_EQ(y[e], d * kScales[s] * quant(e) - dmin * kMins[s]) << e;
    }
    EXPECT_EQ(y[0], 0.5f * 63 * 5);   // q 5
    EXPECT_EQ(y[1], 0.5f * 63 * 18);  // q 18 needs the fifth bit
}

TEST(Dequant, Q6_K) {
    // Element e: half n = e/128, r = e%128, quarter k = r/32, l = r%32. Low 4 bits: ql[64n + l +
    // 32(k&1)], low nibble for k<2, high for k>=2. High 2 bits: qh[32n + l] >> 2k. Scale:
    // scales[8n + l/16 + 2k] (int8). Value = d * scale * (q - 32).
    const float d = 0.0625f;
    std::vector<uint8_t> b(210);
    int8_t scales[16];
    for (int i = 0; i < 16; ++i) scales[i] = int8_t(i % 3 == 0 ? -(i * 8 + 1) : i * 8 + 3);
    std::memcpy(b.data() + 192, scales, 16);
    put_half(b, 208, d);
    auto quant = [](int e) { return (e * 29 + 11) & 63; };
    for (int e = 0; e < 256; ++e) {
        const int n = e / 128, r = e % 128, k = r / 32, l = r % 32, q = quant(e);
        b[64 * n + l + 32 * (k & 1)] |= uint8_t((q & 15) << (k >= 2 ? 4 : 0));
        b[128 + 32 * n + l] |= uint8_t((q >> 4) << (2 * k));
    }
    const auto y = dequant(Type::Q6_K, b, 256);
    for (int e = 0; e < 256; ++e) {
        const int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
        const int s = scales[8 * n + l / 16 + 2 * k];
        EXPECT_EQ(y[e], d * s * (quant(e) - 32)) << e;
    }
    EXPECT_EQ(y[0], 0.0625f * -1 * (11 - 32));                      // scale[0] = -1
    EXPECT_EQ(y[32], 0.0625f * 19 * (((32 * 29 + 11) & 63) - 32));  // scale[2] = 19
}

TEST(Dequant, RefusesUnsupportedTypesAndPartialBlocks) {
    std::vector<uint8_t> b(64);
    std::vector<float> y(32);
    EXPECT_THAT([&] { gj::ggml::dequantize_row(Type::Q2_K, b.data(), y.data(), 256); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("q2_k")));
    EXPECT_THAT([&] { gj::ggml::dequantize_row(Type::IQ4_XS, b.data(), y.data(), 256); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("iq4_xs")));
    EXPECT_THAT([&] { gj::ggml::dequantize_row(Type::Q8_0, b.data(), y.data(), 31); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("31")));
    for (Type t : {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q4_0, Type::Q4_1, Type::Q5_0,
                   Type::Q5_1, Type::IQ4_NL, Type::Q4_K, Type::Q5_K, Type::Q6_K})
        EXPECT_TRUE(gj::ggml::can_dequantize(t) && gj::ggml::type_info(t).dequant_supported);
    EXPECT_FALSE(gj::ggml::type_info(Type::Q2_K).dequant_supported);
}

TEST(Dequant, RowsAndGathersFromAGgufTensor) {
    gj::test::ScratchDir dir("dequant_rows");
    const auto path = dir.path() / "t.gguf";
    // 4 rows of 64 Q8_0 elements; row r has d = r + 1 and q = j - 32 + r.
    std::vector<uint8_t> payload(4 * 2 * 34);
    for (int r = 0; r < 4; ++r)
        for (int blk = 0; blk < 2; ++blk) {
            const size_t at = size_t(r * 2 + blk) * 34;
            put_half(payload, at, float(r + 1));
            for (int j = 0; j < 32; ++j)
                payload[at + 2 + j] = uint8_t(int8_t(blk * 32 + j - 32 + r));
        }
    {
        gj::gguf::Writer w;
        w.add_tensor("emb", Type::Q8_0, {64, 4});
        w.begin(path);
        w.write_tensor_data("emb", payload);
        w.finish();
    }
    auto f = gj::gguf::File::open(path);
    const auto& t = f->tensor("emb");
    auto expect_row = [](const float* y, int r) {
        for (int i = 0; i < 64; ++i) ASSERT_EQ(y[i], float(r + 1) * (i - 32 + r)) << r << " " << i;
    };
    const auto all = gj::ggml::dequantize_tensor(t);
    ASSERT_EQ(all.size(), 256u);
    for (int r = 0; r < 4; ++r) expect_row(all.data() + 64 * r, r);
    std::vector<float> two(128);
    gj::ggml::dequantize_rows(t, 2, 2, two.data());
    expect_row(two.data(), 2);
    expect_row(two.data() + 64, 3);
    const std::vector<int64_t> ids = {3, 0, 3};
    std::vector<float> g(192);
    gj::ggml::gather_rows(t, ids, g.data());
    expect_row(g.data(), 3);
    expect_row(g.data() + 64, 0);
    expect_row(g.data() + 128, 3);
    EXPECT_THAT([&] { gj::ggml::dequantize_rows(t, 3, 2, two.data()); },
                ::testing::ThrowsMessage<std::out_of_range>(HasSubstr("'emb'")));
    const std::vector<int64_t> bad = {4};
    EXPECT_THROW(gj::ggml::gather_rows(t, bad, g.data()), std::out_of_range);
    const std::vector<int64_t> neg = {-1};
    EXPECT_THROW(gj::ggml::gather_rows(t, neg, g.data()), std::out_of_range);
}
