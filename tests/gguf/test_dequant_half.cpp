// fp16 / bf16 <-> fp32 conversions (engine/gguf/half.h): exhaustive over all 16-bit patterns, with
// round-to-nearest-even checked at every midpoint, subnormals, overflow, infinities and NaN.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/gguf/half.h"

namespace {

// Value of an fp16 bit pattern from the IEEE definition, computed in double.
double half_value(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    double v;
    if (exp == 31)
        v = mant ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
    else if (exp == 0)
        v = std::ldexp(mant, -24);
    else
        v = std::ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

bool is_half_nan(uint16_t h) {
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

}  // namespace

TEST(Half, F16ToF32MatchesTheIeeeDefinitionForAllPatterns) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = gj::f16_to_f32(uint16_t(h));
        const double want = half_value(uint16_t(h));
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(f)) << h;
            EXPECT_EQ(std::signbit(f), (h >> 15) != 0) << h;
        } else {
            EXPECT_EQ(double(f), want) << h;
            EXPECT_EQ(std::signbit(f), (h >> 15) != 0) << h;  // -0.0 too
        }
    }
}

TEST(Half, F32ToF16RoundTripsEveryHalf) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint16_t back = gj::f32_to_f16(gj::f16_to_f32(uint16_t(h)));
        if (is_half_nan(uint16_t(h))) {
            EXPECT_TRUE(is_half_nan(back)) << h;
            EXPECT_EQ(back & 0x8000, h & 0x8000) << h;
        } else {
            EXPECT_EQ(back, h) << h;
        }
    }
}

TEST(Half, F32ToF16RoundsToNearestEvenAtEveryMidpoint) {
    // Between every pair of adjacent finite halves (subnormals included): the exact midpoint goes
    // to the even one, one float ulp either side goes to the nearer one.
    for (uint16_t h = 0; h < 0x7bff; ++h) {
        for (uint16_t sign : {uint16_t(0), uint16_t(0x8000)}) {
            const uint16_t lo = uint16_t(h | sign), hi = uint16_t((h + 1) | sign);
            const float mid = float((half_value(lo) + half_value(hi)) / 2);  // exact in fp32
            const uint16_t even = (h & 1) ? hi : lo;
            EXPECT_EQ(gj::f32_to_f16(mid), even) << h;
            EXPECT_EQ(gj::f32_to_f16(std::nextafter(mid, 0.0f)), lo) << h;
            EXPECT_EQ(gj::f32_to_f16(std::nextafter(mid, sign ? -1e9f : 1e9f)), hi) << h;
        }
    }
}

TEST(Half, F32ToF16EdgeCases) {
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(gj::f32_to_f16(0.0f), 0x0000);
    EXPECT_EQ(gj::f32_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(gj::f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(gj::f32_to_f16(-2.0f), 0xc000);
    EXPECT_EQ(gj::f32_to_f16(65504.0f), 0x7bff);                        // largest half
    EXPECT_EQ(gj::f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // just below the tie
    EXPECT_EQ(gj::f32_to_f16(65520.0f), 0x7c00);  // tie between 65504 and 65536: even is inf
    EXPECT_EQ(gj::f32_to_f16(-1e10f), 0xfc00);
    EXPECT_EQ(gj::f32_to_f16(inf), 0x7c00);
    EXPECT_EQ(gj::f32_to_f16(-inf), 0xfc00);
    EXPECT_EQ(gj::f32_to_f16(std::numeric_limits<float>::max()), 0x7c00);
    EXPECT_EQ(gj::f32_to_f16(0x1p-24f), 0x0001);    // smallest subnormal
    EXPECT_EQ(gj::f32_to_f16(0x1p-25f), 0x0000);    // tie with 0: even is 0
    EXPECT_EQ(gj::f32_to_f16(0x1.8p-24f), 0x0002);  // tie between 1 and 2 ulps: even is 2
    EXPECT_EQ(gj::f32_to_f16(0x1p-26f), 0x0000);
    EXPECT_EQ(gj::f32_to_f16(-0x1p-26f), 0x8000);
    EXPECT_EQ(gj::f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
    EXPECT_EQ(gj::f32_to_f16(0x1p-14f), 0x0400);      // smallest normal
    EXPECT_EQ(gj::f32_to_f16(0x1.ff8p-15f), 0x03ff);  // largest subnormal
    EXPECT_EQ(gj::f32_to_f16(0x1.ffcp-15f), 0x0400);  // tie: rounds up into the normals
    const uint16_t qnan = gj::f32_to_f16(std::numeric_limits<float>::quiet_NaN());
    EXPECT_TRUE(is_half_nan(qnan));
    // A NaN whose payload lies only in the dropped bits must not become infinity.
    EXPECT_TRUE(is_half_nan(gj::f32_to_f16(std::bit_cast<float>(0x7f800001u))));
    EXPECT_TRUE(is_half_nan(gj::f32_to_f16(std::bit_cast<float>(0xff800001u))));
    EXPECT_EQ(gj::f32_to_f16(std::bit_cast<float>(0xff800001u)) & 0x8000, 0x8000);
}

#ifdef __FLT16_MAX__
TEST(Half, F32ToF16AgreesWithTheCompilersFloat16) {
    // Independent oracle: the compiler's _Float16 conversion (IEEE round to nearest even).
    uint32_t s = 12345;
    for (int i = 0; i < 2000000; ++i) {
        s = s * 1664525u + 1013904223u;
        const float f = std::bit_cast<float>(s);
        if (std::isnan(f)) continue;
        const _Float16 ref = static_cast<_Float16>(f);
        ASSERT_EQ(gj::f32_to_f16(f), std::bit_cast<uint16_t>(ref)) << std::hexfloat << f;
    }
}
#endif

TEST(Bf16, ConversionsRoundToNearestEven) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = gj::bf16_to_f32(uint16_t(h));
        EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
        const bool nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
        if (nan) {
            EXPECT_TRUE(std::isnan(gj::bf16_to_f32(gj::f32_to_bf16(f)))) << h;
            continue;
        }
        EXPECT_EQ(gj::f32_to_bf16(f), h) << h;
        if ((h & 0x7fff) >= 0x7f7f) continue;  // no finite neighbour above
        const uint32_t mid = (h << 16) | 0x8000;
        const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
        EXPECT_EQ(gj::f32_to_bf16(std::bit_cast<float>(mid)), even) << h;
        EXPECT_EQ(gj::f32_to_bf16(std::bit_cast<float>(mid - 1)), h) << h;
        EXPECT_EQ(gj::f32_to_bf16(std::bit_cast<float>(mid + 1)), uint16_t(h + 1)) << h;
    }
    EXPECT_EQ(gj::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
    EXPECT_EQ(gj::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
    EXPECT_EQ(gj::f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
    EXPECT_EQ(gj::f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie
    EXPECT_TRUE(std::isnan(gj::bf16_to_f32(gj::f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
    EXPECT_EQ(gj::f32_to_bf16(std::bit_cast<float>(0xff800001u)) & 0x8000, 0x8000);
}
