// Internal to engine/gguf: the per-format row quantizers behind ggml::quantize_row
// (quantize.cpp: floats and the 32-element formats; quantize_k.cpp: the 256-element K-quants)
// and the rounding helper they share. Each takes nb whole blocks of finite values.
#pragma once

#include <cstdint>
#include <cstring>

namespace gj::ggml::detail {

// Round to nearest, ties to even, for |x| < 2^22: adding 1.5 * 2^23 leaves the rounded integer
// in the low mantissa bits (ggml's nearest_int; the float add does the rounding).
inline int nearest_int(float x) {
    const float v = x + 12582912.0f;
    int32_t i;
    std::memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

// Scale j and min j (0..7) of a Q4_K/Q5_K super-block's 12 scale bytes: j < 4 are the low 6
// bits of bytes j / j+4; j >= 4 take 4 bits from byte j+4 (low nibble scale, high nibble min) and
// their top 2 bits from the high bits of bytes j-4 / j (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

void quantize_q4_k(const float* x, uint8_t* dst, int64_t nb);
void quantize_q5_k(const float* x, uint8_t* dst, int64_t nb);
void quantize_q6_k(const float* x, uint8_t* dst, int64_t nb);

}  // namespace gj::ggml::detail
