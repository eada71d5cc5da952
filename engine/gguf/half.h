// IEEE fp16 and bfloat16 <-> fp32 conversions, bit-exact with hardware (F16C, CUDA __float2half_rn)
// and with ggml: round to nearest, ties to even; subnormals kept (no flush to zero); infinities
// kept; NaN stays NaN (quieted, sign kept). Header-only so hot loops inline them.
#pragma once

#include <bit>
#include <cstdint>

namespace gj {

inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf/NaN
    if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
    // Zero or subnormal: mant * 2^-24 is exact in fp32.
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -mag : mag;
}

inline uint16_t f32_to_f16(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)  // NaN: keep the top payload bits, force quiet
        return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
    if (u >= 0x477ff000u)  // >= 65520 (halfway above the largest half): rounds to inf
        return static_cast<uint16_t>(sign | 0x7c00u);
    if (u < 0x38800000u) {  // below 2^-14: the result is subnormal or zero
        // Adding 0.5 (2^-1) aligns the float so that its low mantissa bits are the half's
        // subnormal mantissa (units of 2^-24); the FP add itself rounds to nearest even.
        const float shifted = std::bit_cast<float>(u) + 0.5f;
        return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
    }
    // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
    const uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;  // (15 - 127) << 23, plus the rounding bias, modulo 2^32
    return static_cast<uint16_t>(sign | (u >> 13));
}

inline float bf16_to_f32(uint16_t h) {
    return std::bit_cast<float>(uint32_t(h) << 16);
}

inline uint16_t f32_to_bf16(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: truncate, force quiet so it stays NaN
        return static_cast<uint16_t>((u >> 16) | 0x40u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace gj
