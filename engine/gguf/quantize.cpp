// ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) and the float
// conversions, written as plain loops over one block so the compiler can vectorize them.
#include "engine/gguf/quantize.h"

#include <fmt/format.h>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine/gguf/half.h"

namespace gj::ggml {

namespace {

constexpr int kQK = 32;

[[noreturn]] void non_finite(Type type, int64_t index) {
    throw std::invalid_argument(
        fmt::format("quantize {}: value at index {} is not finite", type_name(type), index));
}

// roundf (half away from zero) without a libm call: exact for |x| < 2^31, which holds here
// because |x| <= 127 after scaling.
inline int round_half_away(float x) {
    int i = static_cast<int>(x);                   // truncates toward zero
    const float frac = x - static_cast<float>(i);  // exact
    i += (frac >= 0.5f) - (frac <= -0.5f);
    return i;
}

void quantize_q8_0(const float* x, uint8_t* dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float* xb = x + i * kQK;
        float amax = 0.0f;  // absolute max
        bool finite = true;
        for (int j = 0; j < kQK; ++j) {
            amax = std::max(amax, std::fabs(xb[j]));
            finite &= std::isfinite(xb[j]);
        }
        if (!finite)
            for (int j = 0; j < kQK; ++j)
                if (!std::isfinite(xb[j])) non_finite(Type::Q8_0, i * kQK + j);
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* out = dst + i * 34;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(out, &dh, 2);
        for (int j = 0; j < kQK; ++j)
            out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(round_half_away(xb[j] * id)));
    }
}

void quantize_q4_0(const float* x, uint8_t* dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float* xb = x + i * kQK;
        float amax = 0.0f;  // absolute max
        float max = 0.0f;   // the signed value with that magnitude (first one on ties)
        bool finite = true;
        for (int j = 0; j < kQK; ++j) {
            const float v = xb[j];
            finite &= std::isfinite(v);
            if (amax < std::fabs(v)) {
                amax = std::fabs(v);
                max = v;
            }
        }
        if (!finite)
            for (int j = 0; j < kQK; ++j)
                if (!std::isfinite(xb[j])) non_finite(Type::Q4_0, i * kQK + j);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* out = dst + i * 18;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(out, &dh, 2);
        for (int j = 0; j < kQK / 2; ++j) {
            const float x0 = xb[j] * id;
            const float x1 = xb[kQK / 2 + j] * id;
            // x * id lies in [-8, 8] (up to rounding), so x + 8.5 truncates into 0..16.
            const uint8_t xi0 =
                static_cast<uint8_t>(std::min<int8_t>(15, static_cast<int8_t>(x0 + 8.5f)));
            const uint8_t xi1 =
                static_cast<uint8_t>(std::min<int8_t>(15, static_cast<int8_t>(x1 + 8.5f)));
            out[2 + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
        }
    }
}

}  // namespace

bool can_quantize(Type t) {
    return t == Type::F32 || t == Type::F16 || t == Type::BF16 || t == Type::Q8_0 ||
           t == Type::Q4_0;
}

void quantize_row(Type type, const float* src, uint8_t* dst, int64_t n) {
    const TypeInfo& info = type_info(type);
    if (!can_quantize(type))
        throw std::invalid_argument(
            fmt::format("quantize: tensor type {} is not supported", info.name));
    check_whole_blocks("quantize", type, n);
    switch (type) {
        case Type::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            break;
        case Type::F16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t h = f32_to_f16(src[i]);
                std::memcpy(dst + 2 * i, &h, 2);
            }
            break;
        case Type::BF16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t h = f32_to_bf16(src[i]);
                std::memcpy(dst + 2 * i, &h, 2);
            }
            break;
        case Type::Q8_0:
            quantize_q8_0(src, dst, n / kQK);
            break;
        case Type::Q4_0:
            quantize_q4_0(src, dst, n / kQK);
            break;
        default:
            break;  // excluded by can_quantize above
    }
}

}  // namespace gj::ggml
