// K-quants and the 32-element fallback formats: dequantization of hand-made blocks with known
// values (scales, mins, Q4_K/Q5_K's 6-bit scale packing, Q6_K's signed scales, Q5's fifth bits),
// and quantize -> dequantize error on Gaussian rows against bounds measured for ggml's algorithm
// and against a naive min/max quantizer with exact float scales.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "engine/gguf/dequant.h"
#include "engine/gguf/half.h"
#include "engine/gguf/quantize.h"

using gj::ggml::Type;

namespace {

void put_f16(std::vector<uint8_t>& b, size_t at, float v) {
    const uint16_t h = gj::f32_to_f16(v);
    std::memcpy(b.data() + at, &h, 2);
}

std::vector<float> dequant(Type t, const std::vector<uint8_t>& b, int n) {
    std::vector<float> y(static_cast<size_t>(n));
    gj::ggml::dequantize_row(t, b.data(), y.data(), n);
    return y;
}

// Q4_K/Q5_K scale bytes with scale 2 / min 3 for sub-block 0 and scale 37 / min 58 for
// sub-block 5 (37 and 58 need the top 2 bits stored in bytes 1 and 5).
void put_k4_scales(std::vector<uint8_t>& b) {
    uint8_t* s = b.data() + 4;
    s[0] = 2;                             // scale 0
    s[4] = 3;                             // min 0
    s[9] = (37 & 0xF) | (58 & 0xF) << 4;  // low nibbles of scale 5 / min 5
    s[1] |= (37 >> 4) << 6;               // top bits of scale 5
    s[5] |= (58 >> 4) << 6;               // top bits of min 5
}

}  // namespace

TEST(DequantK, Q4_KScalesMinsAndNibbles) {
    std::vector<uint8_t> b(144, 0);
    put_f16(b, 0, 1.0f);  // d
    put_f16(b, 2, 0.5f);  // dmin
    put_k4_scales(b);
    b[16 + 0] = 7;          // element 0: sub-block 0, low nibble of qs[0]
    b[16 + 64 + 1] = 0x90;  // element 161: sub-block 5 = high nibbles of qs[64..96)
    const auto y = dequant(Type::Q4_K, b, 256);
    EXPECT_FLOAT_EQ(y[0], 1.0f * 2 * 7 - 0.5f * 3);
    EXPECT_FLOAT_EQ(y[1], -0.5f * 3);
    EXPECT_FLOAT_EQ(y[161], 37.0f * 9 - 0.5f * 58);
    EXPECT_FLOAT_EQ(y[100], 0.0f);  // sub-block 3: scale 0, min 0
}

TEST(DequantK, Q5_KFifthBit) {
    std::vector<uint8_t> b(176, 0);
    put_f16(b, 0, 1.0f);
    put_f16(b, 2, 0.5f);
    put_k4_scales(b);
    b[48 + 64 + 1] = 0x90;  // element 161: low 4 bits 9 (qs at offset 48)
    b[16 + 1] = 0x20;       // qh[1] bit 5: fifth bit of sub-block 5 (third 64-group, upper half)
    b[16 + 0] = 0x01;       // qh[0] bit 0: element 0 gets 16
    const auto y = dequant(Type::Q5_K, b, 256);
    EXPECT_FLOAT_EQ(y[0], 2.0f * 16 - 0.5f * 3);
    EXPECT_FLOAT_EQ(y[161], 37.0f * 25 - 0.5f * 58);
}

TEST(DequantK, Q6_KSignedScales) {
    std::vector<uint8_t> b(210, 0);
    put_f16(b, 208, 0.5f);
    auto* sc = reinterpret_cast<int8_t*>(b.data() + 192);
    sc[0] = -3;
    sc[13] = 5;
    // Element 0: level 10 (low nibble 10, high bits 0) -> 10 - 32 = -22.
    b[0] = 10;
    // Element 210 = 128 + 64 + 18 (second half, third quarter, sub-block 13): level 50 = 0x32:
    // high nibble of ql[64 + 18], bits 4-5 of qh[32 + 18].
    b[64 + 18] = 0x20;
    b[128 + 32 + 18] = 0x30;
    const auto y = dequant(Type::Q6_K, b, 256);
    EXPECT_FLOAT_EQ(y[0], 0.5f * -3 * -22);
    EXPECT_FLOAT_EQ(y[210], 0.5f * 5 * 18);
    EXPECT_FLOAT_EQ(y[1], 0.5f * -3 * -32);  // level 0 is -32
}

TEST(DequantK, LegacyFallbackFormats) {
    std::vector<uint8_t> q41(20, 0);
    put_f16(q41, 0, 0.5f);
    put_f16(q41, 2, -1.0f);
    q41[4] = 0xF3;  // element 0: 3, element 16: 15
    auto y = dequant(Type::Q4_1, q41, 32);
    EXPECT_FLOAT_EQ(y[0], 0.5f);
    EXPECT_FLOAT_EQ(y[16], 6.5f);

    std::vector<uint8_t> q50(22, 0);
    put_f16(q50, 0, 2.0f);
    const uint32_t qh = 1u << 3;  // element 3 gets the fifth bit
    std::memcpy(q50.data() + 2, &qh, 4);
    q50[6 + 3] = 0x01;
    y = dequant(Type::Q5_0, q50, 32);
    EXPECT_FLOAT_EQ(y[3], (17 - 16) * 2.0f);
    EXPECT_FLOAT_EQ(y[20], -32.0f);

    std::vector<uint8_t> q51(24, 0);
    put_f16(q51, 0, 1.0f);
    put_f16(q51, 2, 10.0f);
    const uint32_t qh1 = 1u << 31;  // element 31
    std::memcpy(q51.data() + 4, &qh1, 4);
    q51[8 + 15] = 0xF0;
    y = dequant(Type::Q5_1, q51, 32);
    EXPECT_FLOAT_EQ(y[31], 41.0f);
    EXPECT_FLOAT_EQ(y[0], 10.0f);

    std::vector<uint8_t> iq(18, 0);
    put_f16(iq, 0, 1.0f);
    iq[2] = 0xF0;
    y = dequant(Type::IQ4_NL, iq, 32);
    EXPECT_FLOAT_EQ(y[0], -127.0f);
    EXPECT_FLOAT_EQ(y[16], 113.0f);
}

namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    return x;
}

double rel_rmse(const std::vector<float>& x, const std::vector<float>& y) {
    double e = 0, s = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        e += double(x[i] - y[i]) * (x[i] - y[i]);
        s += double(x[i]) * x[i];
    }
    return std::sqrt(e / s);
}

std::vector<float> round_trip(Type t, const std::vector<float>& x) {
    std::vector<uint8_t> q(*gj::ggml::row_bytes(t, x.size()));
    gj::ggml::quantize_row(t, x.data(), q.data(), int64_t(x.size()));
    return dequant(t, q, int(x.size()));
}

// Naive asymmetric quantization with exact float scale and min per block of `block` values:
// min/max grid, round to nearest (a lower bound on what min/max can do in the real format).
std::vector<float> naive_minmax(const std::vector<float>& x, int block, int nmax) {
    std::vector<float> y(x.size());
    for (size_t b = 0; b < x.size(); b += block) {
        float lo = x[b], hi = x[b];
        for (int i = 0; i < block; ++i) {
            lo = std::min(lo, x[b + i]);
            hi = std::max(hi, x[b + i]);
        }
        lo = std::min(lo, 0.0f);
        const float d = (hi - lo) / nmax;
        for (int i = 0; i < block; ++i) y[b + i] = lo + d * std::round((x[b + i] - lo) / d);
    }
    return y;
}

// Naive symmetric: scale = amax / nmax_pos with float scales, levels -nmax..nmax-1.
std::vector<float> naive_absmax(const std::vector<float>& x, int block, int nmax) {
    std::vector<float> y(x.size());
    for (size_t b = 0; b < x.size(); b += block) {
        float amax = 0;
        for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
        const float d = amax / (nmax - 1);
        for (int i = 0; i < block; ++i)
            y[b + i] = d * std::clamp(std::round(x[b + i] / d), float(-nmax), float(nmax - 1));
    }
    return y;
}

}  // namespace

// Relative RMS error on N(0,1) rows (64 rows of 4096), measured with this code: q4_k 0.0715,
// q5_k 0.0362, q6_k 0.0178, q4_1 0.0783, q5_0 0.0428, q5_1 0.0379 (the ordering and the sizes of
// ggml's reference quantizers: every extra bit halves the error, K-quants beat the 32-block
// formats of equal width). Bounds are ~5% above the measurement.
TEST(QuantizeK, GaussianRowErrorBounds) {
    const auto x = gaussian(64 * 4096, 7);
    struct Case {
        Type t;
        double bound;
    };
    for (const Case& c :
         {Case{Type::Q4_K, 0.075}, Case{Type::Q5_K, 0.038}, Case{Type::Q6_K, 0.0187},
          Case{Type::Q4_1, 0.082}, Case{Type::Q5_0, 0.045}, Case{Type::Q5_1, 0.040}}) {
        const double e = rel_rmse(x, round_trip(c.t, x));
        EXPECT_LT(e, c.bound) << gj::ggml::type_name(c.t);
        EXPECT_GT(e, c.bound * 0.5) << gj::ggml::type_name(c.t) << ": suspiciously exact";
        std::printf("%s rel. RMSE %.4f\n", gj::ggml::type_name(c.t).c_str(), e);
    }
}

TEST(QuantizeK, SearchBeatsNaiveMinMax) {
    // The searched scales (and 6-bit packed ones at that) beat min/max rounding with exact float
    // scales on the same sub-block size.
    const auto x = gaussian(16 * 4096, 11);
    EXPECT_LT(rel_rmse(x, round_trip(Type::Q4_K, x)), rel_rmse(x, naive_minmax(x, 32, 15)));
    EXPECT_LT(rel_rmse(x, round_trip(Type::Q5_K, x)), rel_rmse(x, naive_minmax(x, 32, 31)));
    EXPECT_LT(rel_rmse(x, round_trip(Type::Q6_K, x)), rel_rmse(x, naive_absmax(x, 16, 32)));
}

TEST(QuantizeK, EdgeRows) {
    for (Type t : {Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::Q4_1, Type::Q5_0, Type::Q5_1}) {
        // All zeros decode to zeros; a constant row decodes close to the constant; a row with one
        // large outlier keeps it within a few percent.
        std::vector<float> z(256, 0.0f);
        for (float v : round_trip(t, z)) EXPECT_EQ(v, 0.0f) << gj::ggml::type_name(t);
        std::vector<float> c(256, -0.75f);
        for (float v : round_trip(t, c)) EXPECT_NEAR(v, -0.75f, 0.02f) << gj::ggml::type_name(t);
        auto o = gaussian(256, 3);
        o[77] = 40.0f;
        EXPECT_NEAR(round_trip(t, o)[77], 40.0f, 1.5f) << gj::ggml::type_name(t);
        // Non-finite input is refused.
        o[5] = NAN;
        std::vector<uint8_t> q(*gj::ggml::row_bytes(t, 256));
        EXPECT_THROW(gj::ggml::quantize_row(t, o.data(), q.data(), 256), std::invalid_argument);
    }
    std::vector<float> x(128, 1.0f);
    std::vector<uint8_t> q(1024);
    EXPECT_THROW(gj::ggml::quantize_row(Type::Q4_K, x.data(), q.data(), 128),
                 std::invalid_argument);  // not whole 256-blocks
}
