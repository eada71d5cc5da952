// Quantization: byte equality with ggml's reference quantizers (transcribed literally below),
// hand-checked blocks, and quantize -> dequantize error bounds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/gguf/dequant.h"
#include "engine/gguf/half.h"
#include "engine/gguf/quantize.h"

using gj::ggml::Type;
using ::testing::HasSubstr;

namespace {

// ggml-quants.c quantize_row_q8_0_ref / quantize_row_q4_0_ref, kept as close to the C as C++
// allows (roundf, (int8_t) casts, MIN) so they serve as an independent oracle for the fast code.
void ref_q8_0(const float* x, uint8_t* y, int64_t k) {
    for (int64_t i = 0; i < k / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = std::max(amax, fabsf(x[i * 32 + j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t dh = gj::f32_to_f16(d);
        std::memcpy(y + i * 34, &dh, 2);
        for (int j = 0; j < 32; ++j)
            y[i * 34 + 2 + j] = uint8_t(int8_t(roundf(x[i * 32 + j] * id)));
    }
}

void ref_q4_0(const float* x, uint8_t* y, int64_t k) {
    const int qk = 32;
    for (int64_t i = 0; i < k / qk; i++) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < qk; j++) {
            const float v = x[i * qk + j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t dh = gj::f32_to_f16(d);
        std::memcpy(y + i * 18, &dh, 2);
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = x[i * qk + 0 + j] * id;
            const float x1 = x[i * qk + qk / 2 + j] * id;
            const uint8_t xi0 = std::min<int8_t>(15, (int8_t)(x0 + 8.5f));
            const uint8_t xi1 = std::min<int8_t>(15, (int8_t)(x1 + 8.5f));
            y[i * 18 + 2 + j] = uint8_t(xi0 | (xi1 << 4));
        }
    }
}

// Deterministic test data: normal-ish values with varied block scales, plus exact ties, zero
// blocks and blocks whose largest magnitude is negative.
std::vector<float> test_data(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed;
    auto next = [&] {
        s = s * 1664525u + 1013904223u;
        return (s >> 8) * 0x1p-24f;  // [0, 1)
    };
    for (size_t i = 0; i < n; ++i) {
        const float u1 = std::max(next(), 1e-7f), u2 = next();
        const float scale = std::ldexp(1.0f, int(i / 32 % 13) - 6);
        v[i] = scale * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    }
    for (size_t j = 0; j < 32 && 64 + j < n; ++j) v[j] = 0.0f;  // zero block
    for (size_t j = 0; j < 32 && 64 + j < n; ++j) v[32 + j] = float(int(j) - 16) * 0.5f;  // ties
    for (size_t j = 0; j < 32 && 96 + j < n; ++j) v[64 + j] = float(j) - 31.0f;           // neg max
    return v;
}

std::vector<uint8_t> quantize(Type t, const std::vector<float>& x) {
    std::vector<uint8_t> out(*gj::ggml::row_bytes(t, x.size()), 0xAA);
    gj::ggml::quantize_row(t, x.data(), out.data(), int64_t(x.size()));
    return out;
}

}  // namespace

TEST(Quantize, Q8_0MatchesTheGgmlReferenceBytes) {
    const auto x = test_data(32 * 4096, 1);
    std::vector<uint8_t> want(34 * 4096);
    ref_q8_0(x.data(), want.data(), int64_t(x.size()));
    EXPECT_EQ(quantize(Type::Q8_0, x), want);
}

TEST(Quantize, Q4_0MatchesTheGgmlReferenceBytes) {
    const auto x = test_data(32 * 4096, 2);
    std::vector<uint8_t> want(18 * 4096);
    ref_q4_0(x.data(), want.data(), int64_t(x.size()));
    EXPECT_EQ(quantize(Type::Q4_0, x), want);
}

TEST(Quantize, HandCheckedBlocks) {
    // Q8_0: x = j - 16, amax 16, d = 16/127; q = round(x * 127/16). x = 1 -> 7.9375 -> 8;
    // x = -16 -> -127; x = 0 -> 0.
    std::vector<float> x(32);
    for (int j = 0; j < 32; ++j) x[j] = float(j - 16);
    auto q8 = quantize(Type::Q8_0, x);
    uint16_t dh;
    std::memcpy(&dh, q8.data(), 2);
    EXPECT_EQ(dh, gj::f32_to_f16(16.0f / 127.0f));
    EXPECT_EQ(int8_t(q8[2 + 0]), -127);
    EXPECT_EQ(int8_t(q8[2 + 16]), 0);
    EXPECT_EQ(int8_t(q8[2 + 17]), 8);
    EXPECT_EQ(int8_t(q8[2 + 31]), 119);  // 15 * 7.9375 = 119.06

    // Q4_0: largest magnitude -16 (signed max), d = -16 / -8 = 2, nibble = trunc(x/2 + 8.5):
    // x = -16 -> 0, x = 15 -> 15 (16.0 clamped), x = 1 -> 9 (9.0), x = -1 -> 8 (8.0).
    auto q4 = quantize(Type::Q4_0, x);
    std::memcpy(&dh, q4.data(), 2);
    EXPECT_EQ(gj::f16_to_f32(dh), 2.0f);
    EXPECT_EQ(q4[2 + 0] & 15, 0);    // x[0] = -16
    EXPECT_EQ(q4[2 + 15] >> 4, 15);  // x[31] = 15 -> 16 clamped
    EXPECT_EQ(q4[2 + 1] >> 4, 9);    // x[17] = 1
    EXPECT_EQ(q4[2 + 15] & 15, 8);   // x[15] = -1 -> 8.0 truncates to 8
    // When the largest magnitude is positive the scale is negative.
    x[0] = 20.0f;
    q4 = quantize(Type::Q4_0, x);
    std::memcpy(&dh, q4.data(), 2);
    EXPECT_EQ(gj::f16_to_f32(dh), -2.5f);
    EXPECT_EQ(q4[2 + 0] & 15, 0);  // 20 / -2.5 + 8.5 = 0.5 -> 0, dequantizes to +20
}

TEST(Quantize, ErrorBounds) {
    // Q8_0: q = round(x/d) with d = amax/127 gives |x - q d| <= d/2; storing d in fp16 adds at
    // most |q| * d * 2^-11 <= 127 d 2^-11. Bound: d (0.5 + 127 * 2^-11) (+ fp32 rounding).
    // Q4_0: d = max/-8, nibble = min(15, trunc(x/d + 8.5)) rounds to nearest, so |x - (q-8) d| <=
    // |d|/2, except for values with x/d in (7.5, 8] (only the opposite-signed extreme) that are
    // clamped to 7 d: error <= |d|. fp16 storage of d adds at most 8 |d| 2^-11.
    const auto x = test_data(32 * 8192, 3);
    for (Type t : {Type::Q8_0, Type::Q4_0}) {
        SCOPED_TRACE(gj::ggml::type_name(t));
        const auto q = quantize(t, x);
        std::vector<float> y(x.size());
        gj::ggml::dequantize_row(t, q.data(), y.data(), int64_t(x.size()));
        double worst_ratio = 0;  // largest error / |d| seen
        for (size_t b = 0; b < x.size() / 32; ++b) {
            float amax = 0, max = 0;
            for (int j = 0; j < 32; ++j)
                if (std::fabs(x[b * 32 + j]) > amax)
                    amax = std::fabs(x[b * 32 + j]), max = x[b * 32 + j];
            const double d = t == Type::Q8_0 ? amax / 127.0 : std::fabs(max / 8.0);
            for (int j = 0; j < 32; ++j) {
                const double xi = x[b * 32 + j], err = std::fabs(xi - y[b * 32 + j]);
                double bound;
                if (t == Type::Q8_0)
                    bound = d * (0.5 + 127 * 0x1p-11);
                else
                    bound = d * ((xi / -(max / 8.0) > 7.5 ? 1.0 : 0.5) + 8 * 0x1p-11);
                ASSERT_LE(err, bound * (1 + 1e-6) + 1e-30) << "block " << b << " elem " << j;
                if (d > 0) worst_ratio = std::max(worst_ratio, err / d);
            }
        }
        // The bound is tight: some element actually comes close to it.
        EXPECT_GT(worst_ratio, t == Type::Q8_0 ? 0.45 : 0.9);
    }
}

TEST(Quantize, FloatTypesUseTheHalfConversions) {
    const auto x = test_data(1000, 4);
    const auto f32 = quantize(Type::F32, x);
    EXPECT_EQ(std::memcmp(f32.data(), x.data(), f32.size()), 0);
    const auto f16 = quantize(Type::F16, x), bf16 = quantize(Type::BF16, x);
    for (size_t i = 0; i < x.size(); ++i) {
        uint16_t h, b;
        std::memcpy(&h, f16.data() + 2 * i, 2);
        std::memcpy(&b, bf16.data() + 2 * i, 2);
        ASSERT_EQ(h, gj::f32_to_f16(x[i]));
        ASSERT_EQ(b, gj::f32_to_bf16(x[i]));
    }
}

TEST(Quantize, RefusesWhatItCannotDo) {
    std::vector<float> x(256, 1.0f);
    std::vector<uint8_t> out(1024);
    EXPECT_THAT([&] { gj::ggml::quantize_row(Type::Q2_K, x.data(), out.data(), 256); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("q2_k")));
    EXPECT_THAT([&] { gj::ggml::quantize_row(Type::Q8_0, x.data(), out.data(), 48); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("48")));
    x[37] = std::nanf("");
    EXPECT_THAT([&] { gj::ggml::quantize_row(Type::Q8_0, x.data(), out.data(), 64); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("index 37")));
    x[37] = -INFINITY;
    EXPECT_THAT([&] { gj::ggml::quantize_row(Type::Q4_0, x.data(), out.data(), 64); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("index 37")));
    EXPECT_FALSE(gj::ggml::can_quantize(Type::Q2_K));
}
