// K-quant quantizers (Q4_K, Q5_K, Q6_K) with the algorithm of ggml's reference quantizers
// (quantize_row_q{4,5,6}_K_ref, no importance matrix): per sub-block a searched scale (and min),
// then the sub-block scales themselves quantized to 6 or 8 bits against one fp16 super-block scale,
// then every value re-rounded against the scale it will actually be decoded with.
//
// Block formats (ggml-common.h), 256 elements per super-block:
//   Q4_K (144 B): fp16 d, fp16 dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128] nibbles;
//                 x = d * sc[j] * q - dmin * m[j], q in 0..15, j = 32-element sub-block
//   Q5_K (176 B): as Q4_K plus qh[32] holding the fifth bit; q in 0..31
//   Q6_K (210 B): ql[128] low nibbles, qh[64] high 2 bits, int8 scales[16], fp16 d;
//                 x = d * scales[j] * (q - 32), q in 0..63, j = 16-element sub-block
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/gguf/half.h"
#include "engine/gguf/quantize_blocks.h"

namespace gj::ggml::detail {

namespace {

constexpr int kQK_K = 256;

inline int clamp_int(int v, int lo, int hi) {
    return std::min(hi, std::max(lo, v));
}

// Fits x[i] ~ scale * L[i] - min with L[i] in 0..nmax and min >= 0, minimising the w-weighted
// squared error. The min/max grid is the starting point; then the range is stretched to
// nmax + rmin + rdelta * s grid steps (s = 0..nstep), and for each rounding the weighted
// least-squares scale and offset are solved in closed form (offset clamped to <= 0, i.e. a
// non-negative min). The best assignment wins. n <= 32. Returns the scale; *min_out the min.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* min_out,
                    float rmin, float rdelta, int nstep) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    lo = std::min(lo, 0.0f);  // the offset is a subtracted min: never positive
    if (hi == lo) {
        std::memset(L, 0, size_t(n));
        *min_out = -lo;
        return 0.0f;
    }
    float iscale = nmax / (hi - lo);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; ++i) {
        L[i] = uint8_t(clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax));
        const float diff = scale * L[i] + lo - x[i];
        best += w[i] * diff * diff;
    }
    uint8_t trial[32];
    for (int s = 0; s <= nstep; ++s) {
        iscale = (rmin + rdelta * s + nmax) / (hi - lo);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax);
            trial[i] = uint8_t(l);
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det <= 0) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        float this_lo = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (this_lo > 0) {  // a positive offset is not representable: refit the scale alone
            this_lo = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; ++i) {
            const float diff = this_scale * trial[i] + this_lo - x[i];
            err += w[i] * diff * diff;
        }
        if (err < best) {
            std::memcpy(L, trial, size_t(n));
            best = err;
            scale = this_scale;
            lo = this_lo;
        }
    }
    *min_out = -lo;
    return scale;
}

// Fits x[i] ~ scale * (L[i] - nmax) with L[i] - nmax in -nmax..nmax-1, weights x^2 (large values
// matter most): the scale that maps the signed extreme to -nmax, then 18 nearby grids
// (nmax +- 0.1 .. 0.9), each with its least-squares scale; keeps the one of largest
// (sum w x l)^2 / sum w l^2, i.e. the least weighted error. Returns the scale (0 for all zeros).
float fit_scale_symmetric(int n, int nmax, const float* x, int8_t* L) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; ++i)
        if (std::fabs(x[i]) > amax) {
            amax = std::fabs(x[i]);
            max = x[i];
        }
    if (amax < 1e-30f) {
        std::memset(L, 0, size_t(n));
        return 0.0f;
    }
    auto grid = [&](float iscale, float* sumlx, float* suml2, bool store) {
        *sumlx = *suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            if (store) L[i] = int8_t(l + nmax);
            const float w = x[i] * x[i];
            *sumlx += w * x[i] * l;
            *suml2 += w * l * l;
        }
    };
    float sumlx, suml2;
    const float iscale0 = -nmax / max;
    grid(iscale0, &sumlx, &suml2, true);
    if (!(suml2 > 0)) return 1 / iscale0;  // weights underflowed (|x| ~ 1e-20): plain grid
    float scale = sumlx / suml2;
    float best = scale * sumlx;
    for (int s = -9; s <= 9; ++s) {
        if (s == 0) continue;
        const float iscale = -(nmax + 0.1f * s) / max;
        grid(iscale, &sumlx, &suml2, false);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            grid(iscale, &sumlx, &suml2, true);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// The shared part of Q4_K and Q5_K for one super-block: fits the eight 32-element sub-blocks,
// stores d, dmin and the packed 6-bit scales/mins at out[0..16), and leaves the final levels
// (0..nmax) of the 256 values in L.
void quantize_scale_min_block(const float* x, int nmax, float rmin, int nstep, uint8_t* out,
                              uint8_t* L) {
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        const float* xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
        const float av_x = std::sqrt(sum_x2 / 32);
        // Error weights: the sub-block's RMS plus the value's magnitude.
        for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
        max_scale = std::max(max_scale, scales[j]);
        max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t* packed = out + 4;
    std::memset(packed, 0, 12);
    for (int j = 0; j < 8; ++j) {
        const int ls = clamp_int(nearest_int(inv_scale * scales[j]), 0, 63);
        const int lm = clamp_int(nearest_int(inv_min * mins[j]), 0, 63);
        if (j < 4) {
            packed[j] = uint8_t(ls);
            packed[j + 4] = uint8_t(lm);
        } else {
            packed[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
            packed[j - 4] |= uint8_t((ls >> 4) << 6);
            packed[j] |= uint8_t((lm >> 4) << 6);
        }
    }
    const uint16_t d = f32_to_f16(max_scale / 63.0f);
    const uint16_t dmin = f32_to_f16(max_min / 63.0f);
    std::memcpy(out, &d, 2);
    std::memcpy(out + 2, &dmin, 2);
    // Re-round every value against the scale and min as they will be decoded.
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        scale_min_k4(j, packed, &sc, &m);
        const float dj = f16_to_f32(d) * sc;
        if (dj == 0) continue;  // keep the fitted levels: they decode to -dm either way
        const float mj = f16_to_f32(dmin) * m;
        for (int i = 0; i < 32; ++i)
            L[32 * j + i] = uint8_t(clamp_int(nearest_int((x[32 * j + i] + mj) / dj), 0, nmax));
    }
}

}  // namespace

void quantize_q4_k(const float* x, uint8_t* dst, int64_t nb) {
    uint8_t L[kQK_K];
    for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
        uint8_t* out = dst + i * 144;
        quantize_scale_min_block(x, 15, -1.0f, 20, out, L);
        // qs: 32 bytes per 64 values; element l in the low nibble, element l + 32 in the high.
        uint8_t* q = out + 16;
        for (int j = 0; j < kQK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
    }
}

void quantize_q5_k(const float* x, uint8_t* dst, int64_t nb) {
    uint8_t L[kQK_K];
    for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
        uint8_t* out = dst + i * 176;
        quantize_scale_min_block(x, 31, -0.5f, 15, out, L);
        // qh[l] bit 2k / 2k+1: fifth bit of element 64k + l / 64k + l + 32; qs as in Q4_K.
        uint8_t* qh = out + 16;
        uint8_t* ql = out + 48;
        std::memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < kQK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = uint8_t(l1 | (l2 << 4));
            }
            m1 = uint8_t(m1 << 2);
            m2 = uint8_t(m2 << 2);
        }
    }
}

void quantize_q6_k(const float* x, uint8_t* dst, int64_t nb) {
    int8_t L[kQK_K];
    for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
        uint8_t* out = dst + i * 210;
        uint8_t* ql = out;
        uint8_t* qh = out + 128;
        int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
        float scales[16];
        float max_scale = 0, max_abs = 0;  // the signed sub-block scale of largest magnitude
        for (int j = 0; j < 16; ++j) {
            scales[j] = fit_scale_symmetric(16, 32, x + 16 * j, L + 16 * j);
            if (std::fabs(scales[j]) > max_abs) {
                max_abs = std::fabs(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs == 0) {
            std::memset(out, 0, 210);
            continue;
        }
        // Sub-block scales as int8 against d = max_scale / -128 (the extreme maps to -128).
        const float iscale = -128.0f / max_scale;
        const uint16_t d = f32_to_f16(1 / iscale);
        std::memcpy(out + 208, &d, 2);
        for (int j = 0; j < 16; ++j) sc[j] = int8_t(std::min(127, nearest_int(iscale * scales[j])));
        for (int j = 0; j < 16; ++j) {
            const float dj = f16_to_f32(d) * sc[j];
            if (dj == 0) continue;
            for (int l = 0; l < 16; ++l)
                L[16 * j + l] = int8_t(clamp_int(nearest_int(x[16 * j + l] / dj), -32, 31) + 32);
        }
        // Per 128 values: ql[l] = low nibbles of elements l and l+64, ql[l+32] of l+32 and l+96;
        // qh[l] = the top 2 bits of elements l, l+32, l+64, l+96 (bits 0-1, 2-3, 4-5, 6-7).
        for (int j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
                ql[l] = uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = uint8_t((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

}  // namespace gj::ggml::detail
