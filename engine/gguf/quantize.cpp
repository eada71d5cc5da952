// ggml's reference quantizers of the 32-element formats (quantize_row_{q8_0,q4_0,q4_1,q5_0,q5_1}
// _ref) and the float conversions, written as plain loops over one block so the compiler can
// vectorize them; the K-quants are in quantize_k.cpp.
#include "engine/gguf/quantize.h"

#include <fmt/format.h>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "engine/gguf/half.h"
#include "engine/gguf/quantize_blocks.h"

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

// Q4_1 (20 B): fp16 d, fp16 m, qs[16]; x = d * q + m, q in 0..15 (nibbles as in Q4_0).
void quantize_q4_1(const float* x, uint8_t* dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float* xb = x + i * kQK;
        float lo = xb[0], hi = xb[0];
        for (int j = 1; j < kQK; ++j) {
            lo = std::min(lo, xb[j]);
            hi = std::max(hi, xb[j]);
        }
        const float d = (hi - lo) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* out = dst + i * 20;
        const uint16_t dh = f32_to_f16(d), mh = f32_to_f16(lo);
        std::memcpy(out, &dh, 2);
        std::memcpy(out + 2, &mh, 2);
        for (int j = 0; j < kQK / 2; ++j) {
            // (x - min) * id lies in [0, 15]: + 0.5 and truncation round to nearest.
            const int q0 = std::min(15, int(int8_t((xb[j] - lo) * id + 0.5f)));
            const int q1 = std::min(15, int(int8_t((xb[kQK / 2 + j] - lo) * id + 0.5f)));
            out[4 + j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

// Stores the 5-bit levels q[0..32) of one Q5_0/Q5_1 block: low nibbles as in Q4_0 at qs, the
// fifth bits as a little-endian u32 at qh (bit j: element j).
void pack_q5(const int* q, uint8_t* qh, uint8_t* qs) {
    uint32_t h = 0;
    for (int j = 0; j < kQK / 2; ++j) {
        qs[j] = uint8_t((q[j] & 0xF) | ((q[kQK / 2 + j] & 0xF) << 4));
        h |= uint32_t((q[j] >> 4) & 1) << j;
        h |= uint32_t((q[kQK / 2 + j] >> 4) & 1) << (j + kQK / 2);
    }
    std::memcpy(qh, &h, 4);
}

// Q5_0 (22 B): fp16 d, qh[4], qs[16]; x = d * (q - 16), d = (signed extreme) / -16.
void quantize_q5_0(const float* x, uint8_t* dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float* xb = x + i * kQK;
        float amax = 0, max = 0;
        for (int j = 0; j < kQK; ++j)
            if (amax < std::fabs(xb[j])) {
                amax = std::fabs(xb[j]);
                max = xb[j];
            }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* out = dst + i * 22;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(out, &dh, 2);
        int q[kQK];
        for (int j = 0; j < kQK; ++j) q[j] = std::min(31, int(int8_t(xb[j] * id + 16.5f)));
        pack_q5(q, out + 2, out + 6);
    }
}

// Q5_1 (24 B): fp16 d, fp16 m, qh[4], qs[16]; x = d * q + m, q in 0..31.
void quantize_q5_1(const float* x, uint8_t* dst, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float* xb = x + i * kQK;
        float lo = xb[0], hi = xb[0];
        for (int j = 1; j < kQK; ++j) {
            lo = std::min(lo, xb[j]);
            hi = std::max(hi, xb[j]);
        }
        const float d = (hi - lo) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* out = dst + i * 24;
        const uint16_t dh = f32_to_f16(d), mh = f32_to_f16(lo);
        std::memcpy(out, &dh, 2);
        std::memcpy(out + 2, &mh, 2);
        int q[kQK];
        for (int j = 0; j < kQK; ++j) q[j] = std::min(31, int(uint8_t((xb[j] - lo) * id + 0.5f)));
        pack_q5(q, out + 4, out + 8);
    }
}

}  // namespace

bool can_quantize(Type t) {
    switch (t) {
        case Type::F32:
        case Type::F16:
        case Type::BF16:
        case Type::Q8_0:
        case Type::Q4_0:
        case Type::Q4_1:
        case Type::Q5_0:
        case Type::Q5_1:
        case Type::Q4_K:
        case Type::Q5_K:
        case Type::Q6_K:
            return true;
        default:
            return false;
    }
}

namespace {
// The formats added with the K-quants check finiteness once up front, then quantize.
void quantize_blocks(Type type, const float* src, uint8_t* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(src[i])) non_finite(type, i);
    const int64_t nb = n / type_info(type).block_elems;
    switch (type) {
        case Type::Q4_1:
            quantize_q4_1(src, dst, nb);
            break;
        case Type::Q5_0:
            quantize_q5_0(src, dst, nb);
            break;
        case Type::Q5_1:
            quantize_q5_1(src, dst, nb);
            break;
        case Type::Q4_K:
            detail::quantize_q4_k(src, dst, nb);
            break;
        case Type::Q5_K:
            detail::quantize_q5_k(src, dst, nb);
            break;
        case Type::Q6_K:
            detail::quantize_q6_k(src, dst, nb);
            break;
        default:
            break;  // excluded by can_quantize
    }
}
}  // namespace

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
            quantize_blocks(type, src, dst, n);
            break;
    }
}

}  // namespace gj::ggml
