// ggml block layouts (ggml-common.h) and the reference dequantization formulas (ggml-quants.c).
// The arithmetic follows ggml's order of operations exactly so results are bit-identical.
#include "engine/gguf/dequant.h"

#include <fmt/format.h>
#include <cstring>
#include <stdexcept>

#include "engine/gguf/half.h"
#include "engine/gguf/quantize_blocks.h"

namespace gj::ggml {

namespace {

constexpr int kQK = 32;     // elements per block of the legacy formats
constexpr int kQK_K = 256;  // elements per K-quant super-block

// Block structs as ggml declares them; fp16 fields are kept as raw bits.
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQK];
};
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[kQK / 2];  // element j in the low nibble of qs[j], element j+16 in the high one
};
struct BlockQ4_K {
    uint16_t d;          // super-block scale for the 6-bit sub-block scales
    uint16_t dmin;       // super-block scale for the 6-bit sub-block mins
    uint8_t scales[12];  // 8 scales + 8 mins, 6 bits each, packed by get_scale_min_k4
    uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[kQK_K / 8];  // fifth bit of each element
    uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];      // low 4 bits
    uint8_t qh[kQK_K / 4];      // high 2 bits
    int8_t scales[kQK_K / 16];  // 8-bit sub-block scales
    uint16_t d;
};
struct BlockQ4_1 {
    uint16_t d, m;  // x = d * q + m
    uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];  // fifth bit of element j at bit j (little-endian u32)
    uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[kQK / 2];  // indices into kIQ4NLValues, nibbles as in Q4_0
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 &&
              sizeof(BlockIQ4_NL) == 18);

// IQ4_NL's 16 non-uniform levels (ggml's kvalues_iq4nl).
constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Blocks are read by memcpy: tensor data offsets are only 32-byte aligned and block sizes are odd
// multiples of 2, so the structs in the file are not aligned for their types in general.
template <typename Block>
Block load_block(const uint8_t* src, int64_t i) {
    Block b;
    std::memcpy(&b, src + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
    return b;
}

using detail::scale_min_k4;

void dequant_q8_0(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<BlockQ8_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < kQK; ++j) y[i * kQK + j] = b.qs[j] * d;
    }
}

void dequant_q4_0(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<BlockQ4_0>(src, i);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < kQK / 2; ++j) {
            const int x0 = (b.qs[j] & 0x0F) - 8;
            const int x1 = (b.qs[j] >> 4) - 8;
            y[i * kQK + j] = x0 * d;
            y[i * kQK + j + kQK / 2] = x1 * d;
        }
    }
}

void dequant_q4_1(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<BlockQ4_1>(src, i);
        const float d = f16_to_f32(b.d);
        const float m = f16_to_f32(b.m);
        for (int j = 0; j < kQK / 2; ++j) {
            y[i * kQK + j] = (b.qs[j] & 0x0F) * d + m;
            y[i * kQK + j + kQK / 2] = (b.qs[j] >> 4) * d + m;
        }
    }
}

// Q5_0 (offset -16, no min) and Q5_1 (min m): the low nibble plus bit j / j+16 of qh.
template <typename Block, bool kHasMin>
void dequant_q5(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<Block>(src, i);
        const float d = f16_to_f32(b.d);
        uint32_t qh;
        std::memcpy(&qh, b.qh, 4);
        for (int j = 0; j < kQK / 2; ++j) {
            const int h0 = int((qh >> j) << 4) & 0x10;
            const int h1 = int(qh >> (j + 12)) & 0x10;
            const int x0 = (b.qs[j] & 0x0F) | h0;
            const int x1 = (b.qs[j] >> 4) | h1;
            if constexpr (kHasMin) {
                const float m = f16_to_f32(b.m);
                y[i * kQK + j] = x0 * d + m;
                y[i * kQK + j + kQK / 2] = x1 * d + m;
            } else {
                y[i * kQK + j] = (x0 - 16) * d;
                y[i * kQK + j + kQK / 2] = (x1 - 16) * d;
            }
        }
    }
}

void dequant_iq4_nl(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<BlockIQ4_NL>(src, i);
        const float d = f16_to_f32(b.d);
        for (int j = 0; j < kQK / 2; ++j) {
            y[i * kQK + j] = d * kIQ4NLValues[b.qs[j] & 0xF];
            y[i * kQK + j + kQK / 2] = d * kIQ4NLValues[b.qs[j] >> 4];
        }
    }
}

void dequant_q4_k(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<BlockQ4_K>(src, i);
        const float d = f16_to_f32(b.d);
        const float min = f16_to_f32(b.dmin);
        const uint8_t* q = b.qs;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < kQK_K; j += 64) {
            scale_min_k4(is + 0, b.scales, &sc, &m);
            const float d1 = d * sc;
            const float m1 = min * m;
            scale_min_k4(is + 1, b.scales, &sc, &m);
            const float d2 = d * sc;
            const float m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

void dequant_q5_k(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<BlockQ5_K>(src, i);
        const float d = f16_to_f32(b.d);
        const float min = f16_to_f32(b.dmin);
        const uint8_t* ql = b.qs;
        const uint8_t* qh = b.qh;
        int is = 0;
        uint8_t sc, m;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < kQK_K; j += 64) {
            scale_min_k4(is + 0, b.scales, &sc, &m);
            const float d1 = d * sc;
            const float m1 = min * m;
            scale_min_k4(is + 1, b.scales, &sc, &m);
            const float d2 = d * sc;
            const float m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

void dequant_q6_k(const uint8_t* src, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<BlockQ6_K>(src, i);
        const float d = f16_to_f32(b.d);
        const uint8_t* ql = b.ql;
        const uint8_t* qh = b.qh;
        const int8_t* sc = b.scales;
        for (int n = 0; n < kQK_K; n += 128) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int8_t q1 =
                    static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 =
                    static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 =
                    static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 =
                    static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

}  // namespace

bool can_dequantize(Type t) {
    switch (t) {
        case Type::F32:
        case Type::F16:
        case Type::BF16:
        case Type::Q8_0:
        case Type::Q4_0:
        case Type::Q4_1:
        case Type::Q5_0:
        case Type::Q5_1:
        case Type::IQ4_NL:
        case Type::Q4_K:
        case Type::Q5_K:
        case Type::Q6_K:
            return true;
        default:
            return false;
    }
}

void dequantize_row(Type type, const uint8_t* src, float* dst, int64_t n) {
    const TypeInfo& info = type_info(type);
    if (!can_dequantize(type))
        throw std::invalid_argument(
            fmt::format("dequantize: tensor type {} is not supported", info.name));
    check_whole_blocks("dequantize", type, n);
    const int64_t nb = n / info.block_elems;
    switch (type) {
        case Type::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
            break;
        case Type::F16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, src + 2 * i, 2);
                dst[i] = f16_to_f32(h);
            }
            break;
        case Type::BF16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, src + 2 * i, 2);
                dst[i] = bf16_to_f32(h);
            }
            break;
        case Type::Q8_0:
            dequant_q8_0(src, dst, nb);
            break;
        case Type::Q4_0:
            dequant_q4_0(src, dst, nb);
            break;
        case Type::Q4_1:
            dequant_q4_1(src, dst, nb);
            break;
        case Type::Q5_0:
            dequant_q5<BlockQ5_0, false>(src, dst, nb);
            break;
        case Type::Q5_1:
            dequant_q5<BlockQ5_1, true>(src, dst, nb);
            break;
        case Type::IQ4_NL:
            dequant_iq4_nl(src, dst, nb);
            break;
        case Type::Q4_K:
            dequant_q4_k(src, dst, nb);
            break;
        case Type::Q5_K:
            dequant_q5_k(src, dst, nb);
            break;
        case Type::Q6_K:
            dequant_q6_k(src, dst, nb);
            break;
        default:
            break;  // excluded by can_dequantize above
    }
}

void dequantize_rows(const gguf::TensorInfo& t, uint64_t row_begin, uint64_t n_rows, float* dst) {
    const uint64_t rows = t.rows();
    if (row_begin > rows || n_rows > rows - row_begin)
        throw std::out_of_range(fmt::format("dequantize: rows [{}, {}) of tensor '{}' ({} rows)",
                                            row_begin, row_begin + n_rows, t.name, rows));
    const uint64_t ne0 = t.dims.at(0);
    const uint64_t stride = t.n_bytes / rows;
    for (uint64_t r = 0; r < n_rows; ++r)
        dequantize_row(t.type, t.data + (row_begin + r) * stride, dst + r * ne0,
                       static_cast<int64_t>(ne0));
}

std::vector<float> dequantize_tensor(const gguf::TensorInfo& t) {
    std::vector<float> out(t.n_elements);
    dequantize_rows(t, 0, t.rows(), out.data());
    return out;
}

void gather_rows(const gguf::TensorInfo& t, std::span<const int64_t> rows, float* dst) {
    const uint64_t ne0 = t.dims.at(0);
    for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] < 0)
            throw std::out_of_range(fmt::format("dequantize: row {} of tensor '{}' ({} rows)",
                                                rows[i], t.name, t.rows()));
        dequantize_rows(t, static_cast<uint64_t>(rows[i]), 1, dst + i * ne0);
    }
}

}  // namespace gj::ggml
