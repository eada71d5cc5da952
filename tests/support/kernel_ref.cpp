#include "tests/support/kernel_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "engine/gguf/dequant.h"
#include "engine/gguf/half.h"
#include "engine/gguf/quantize.h"
#include "engine/gguf/quantize_blocks.h"

namespace gj::test::kref {

Q81 quantize_q8_1(const float* x, size_t n) {
    if (n % 32 != 0) throw std::invalid_argument("quantize_q8_1: n must be a multiple of 32");
    Q81 r;
    r.q.resize(n);
    for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
        const float d = amax * (1.0f / 127.0f);
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            const float v = std::nearbyint(x[32 * b + j] * inv);  // ties to even
            const int q = static_cast<int>(std::clamp(v, -128.0f, 127.0f));
            r.q[32 * b + j] = static_cast<int8_t>(q);
            sum += q;
        }
        r.d.push_back(d);
        r.s.push_back(d * static_cast<float>(sum));
    }
    return r;
}

std::vector<float> rmsnorm(const std::vector<float>& x, int rows, int n, const float* w,
                           const float* residual, float eps) {
    std::vector<float> y(x.size());
    for (int r = 0; r < rows; ++r) {
        const float* xr = &x[static_cast<size_t>(r) * n];
        double ss = 0;
        for (int i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
        const double scale = 1.0 / std::sqrt(ss / n + eps);
        for (int i = 0; i < n; ++i) {
            double v = xr[i] * scale * (w ? w[i] : 1.0f);
            if (residual) v += residual[static_cast<size_t>(r) * n + i];
            y[static_cast<size_t>(r) * n + i] = static_cast<float>(v);
        }
    }
    return y;
}

std::vector<float> random_normal(size_t n, float sigma, std::mt19937& rng) {
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& e : v) e = dist(rng);
    return v;
}

std::vector<float> random_norm_weights(size_t n, float sigma, std::mt19937& rng) {
    std::vector<float> w = random_normal(n, sigma, rng);
    for (float& v : w) v += 1.0f;
    return w;
}

std::vector<uint8_t> random_weights(ggml::Type type, int rows, int k, std::mt19937& rng,
                                    std::vector<float>& dequant) {
    const auto row_bytes = *ggml::row_bytes(type, k);
    std::vector<uint8_t> blocks(row_bytes * rows);
    dequant.resize(static_cast<size_t>(rows) * k);
    const auto values =
        random_normal(static_cast<size_t>(rows) * k, 1.0f / std::sqrt(float(k)), rng);
    for (int r = 0; r < rows; ++r) {
        ggml::quantize_row(type, &values[static_cast<size_t>(r) * k], &blocks[r * row_bytes], k);
        ggml::dequantize_row(type, &blocks[r * row_bytes], &dequant[static_cast<size_t>(r) * k], k);
    }
    return blocks;
}

namespace {

// Q4_K super-blocks -> the split planes of kernel_templates/matvec_q4_k.cu, element by element:
// element e of a block is nibble (e % 64 >= 32) of qs[32 (e / 64) + e % 32], and sub-block s's
// 16 bytes hold its elements b (low nibble) and 16 + b (high nibble) in byte b.
std::vector<uint8_t> split_layout_q4_k(const std::vector<uint8_t>& blocks, int rows, int k) {
    const size_t n_super = size_t(rows) * (k / 256), units = n_super * 8;
    std::vector<uint8_t> out(n_super * 148);
    uint8_t* dm = &out[units * 16];
    uint8_t* sm = dm + n_super * 4;
    for (size_t b = 0; b < n_super; ++b) {
        const uint8_t* blk = &blocks[b * 144];
        const uint8_t* qs = blk + 16;
        auto nibble = [&](int e) {
            return (qs[32 * (e / 64) + e % 32] >> (e % 64 >= 32 ? 4 : 0)) & 15;
        };
        for (int s = 0; s < 8; ++s) {
            uint8_t* unit = &out[(b * 8 + s) * 16];
            for (int i = 0; i < 16; ++i)
                unit[i] = uint8_t(nibble(32 * s + i) | (nibble(32 * s + 16 + i) << 4));
            uint8_t sc, m;
            ggml::detail::scale_min_k4(s, blk + 4, &sc, &m);
            sm[2 * (b * 8 + s)] = sc;
            sm[2 * (b * 8 + s) + 1] = m;
        }
        std::copy(blk, blk + 4, dm + 4 * b);
    }
    return out;
}

// Q5_K super-blocks -> the split planes of kernel_templates/kquant.cuh, element by element:
// element e of a block has low bits nibble (e % 64 >= 32) of qs[32 (e / 64) + e % 32] (qs at byte
// 48) and fifth bit bit 2 (e / 64) + (e % 64 >= 32) of qh[e % 32] (qh at byte 16); sub-block s's
// nibbles are in the Q4_0 order as for Q4_K, and element i of it has its fifth bit at byte i % 4,
// bit i / 4 of the unit's fifth-bit word.
std::vector<uint8_t> split_layout_q5_k(const std::vector<uint8_t>& blocks, int rows, int k) {
    const size_t n_super = size_t(rows) * (k / 256), units = n_super * 8;
    std::vector<uint8_t> out(n_super * 180);
    uint8_t* qh_plane = &out[units * 16];
    uint8_t* dm = &out[units * 20];
    uint8_t* sm = dm + n_super * 4;
    for (size_t b = 0; b < n_super; ++b) {
        const uint8_t* blk = &blocks[b * 176];
        const uint8_t* qh = blk + 16;
        const uint8_t* qs = blk + 48;
        auto nibble = [&](int e) {
            return (qs[32 * (e / 64) + e % 32] >> (e % 64 >= 32 ? 4 : 0)) & 15;
        };
        auto fifth = [&](int e) { return (qh[e % 32] >> (2 * (e / 64) + (e % 64 >= 32))) & 1; };
        for (int s = 0; s < 8; ++s) {
            const size_t unit = b * 8 + s;
            for (int i = 0; i < 16; ++i)
                out[unit * 16 + i] = uint8_t(nibble(32 * s + i) | (nibble(32 * s + 16 + i) << 4));
            for (int i = 0; i < 32; ++i)
                qh_plane[unit * 4 + i % 4] |= uint8_t(fifth(32 * s + i) << (i / 4));
            uint8_t sc, m;
            ggml::detail::scale_min_k4(s, blk + 4, &sc, &m);
            sm[2 * unit] = sc;
            sm[2 * unit + 1] = m;
        }
        std::copy(blk, blk + 4, dm + 4 * b);
    }
    return out;
}

// Q6_K super-blocks -> the split planes of kernel_templates/kquant.cuh, element by element:
// element e = 128 n + 32 g + l (l < 32) of a block has low bits nibble (g >= 2) of
// ql[64 n + 32 (g % 2) + l], top bits 2g, 2g+1 of qh[32 n + l], scale scales[8 n + 2 g + l / 16].
std::vector<uint8_t> split_layout_q6_k(const std::vector<uint8_t>& blocks, int rows, int k) {
    const size_t n_super = size_t(rows) * (k / 256), units = n_super * 8;
    std::vector<uint8_t> out(n_super * 210);
    uint8_t* qh_plane = &out[units * 16];
    uint8_t* sc_plane = &out[units * 24];
    uint8_t* d_plane = &out[units * 26];
    for (size_t b = 0; b < n_super; ++b) {
        const uint8_t* blk = &blocks[b * 210];
        auto low = [&](int e) {
            const int n = e / 128, g = (e % 128) / 32, l = e % 32;
            return (blk[64 * n + 32 * (g % 2) + l] >> (g >= 2 ? 4 : 0)) & 15;
        };
        auto top = [&](int e) {
            const int n = e / 128, g = (e % 128) / 32, l = e % 32;
            return (blk[128 + 32 * n + l] >> (2 * g)) & 3;
        };
        for (int s = 0; s < 8; ++s) {
            const size_t unit = b * 8 + s;
            const int e0 = 32 * s;
            for (int i = 0; i < 16; ++i)
                out[unit * 16 + i] = uint8_t(low(e0 + i) | (low(e0 + 16 + i) << 4));
            // Word w, byte i: elements 8w+i, 16+8w+i, 8w+4+i, 16+8w+4+i, two bits each.
            for (int w = 0; w < 2; ++w)
                for (int i = 0; i < 4; ++i)
                    qh_plane[unit * 8 + 4 * w + i] = uint8_t(
                        top(e0 + 8 * w + i) | (top(e0 + 16 + 8 * w + i) << 2) |
                        (top(e0 + 8 * w + 4 + i) << 4) | (top(e0 + 16 + 8 * w + 4 + i) << 6));
            sc_plane[2 * unit] = blk[192 + e0 / 16];
            sc_plane[2 * unit + 1] = blk[192 + e0 / 16 + 1];
        }
        std::copy(blk + 208, blk + 210, d_plane + 2 * b);
    }
    return out;
}

// Q4_1 / Q5_0 / Q5_1 blocks -> the split planes of kernel_templates/q32_blocks.cuh, element by
// element: the 16 payload bytes as they are; element e's fifth bit (bit e of the block's qh
// word) at byte e % 4 of the unit's fifth-bit word, bit (e % 16) / 4 + (e >= 16 ? 4 : 0); then the
// scale bytes (Q5_0: d; Q4_1 / Q5_1: d, m).
std::vector<uint8_t> split_layout_q32(ggml::Type type, const std::vector<uint8_t>& blocks, int rows,
                                      int k) {
    const bool fifth = type != ggml::Type::Q4_1;
    const int scale_bytes = type == ggml::Type::Q5_0 ? 2 : 4;
    const int qs_at = type == ggml::Type::Q4_1 ? 4 : type == ggml::Type::Q5_0 ? 6 : 8;
    const int qh_at = type == ggml::Type::Q5_0 ? 2 : 4;
    const size_t block_bytes = ggml::type_info(type).block_bytes;
    const size_t units = size_t(rows) * (k / 32);
    std::vector<uint8_t> out(units * block_bytes);
    uint8_t* qh_plane = &out[units * 16];
    uint8_t* scale_plane = &out[units * (fifth ? 20 : 16)];
    for (size_t i = 0; i < units; ++i) {
        const uint8_t* blk = &blocks[i * block_bytes];
        std::copy(blk + qs_at, blk + qs_at + 16, &out[i * 16]);
        if (fifth)
            for (int e = 0; e < 32; ++e)
                if ((blk[qh_at + e / 8] >> (e % 8)) & 1)
                    qh_plane[4 * i + e % 4] |= uint8_t(1 << ((e % 16) / 4 + (e >= 16 ? 4 : 0)));
        std::copy(blk, blk + scale_bytes, scale_plane + scale_bytes * i);
    }
    return out;
}

}  // namespace

std::vector<uint8_t> split_layout(ggml::Type type, const std::vector<uint8_t>& blocks, int rows,
                                  int k) {
    if (type == ggml::Type::Q4_K) return split_layout_q4_k(blocks, rows, k);
    if (type == ggml::Type::Q5_K) return split_layout_q5_k(blocks, rows, k);
    if (type == ggml::Type::Q6_K) return split_layout_q6_k(blocks, rows, k);
    if (type == ggml::Type::Q4_1 || type == ggml::Type::Q5_0 || type == ggml::Type::Q5_1)
        return split_layout_q32(type, blocks, rows, k);
    const auto& info = ggml::type_info(type);
    const size_t n_blocks = static_cast<size_t>(rows) * (k / 32);
    const size_t payload = info.block_bytes - 2;
    std::vector<uint8_t> out(n_blocks * info.block_bytes);
    for (size_t i = 0; i < n_blocks; ++i) {
        const uint8_t* b = &blocks[i * info.block_bytes];
        std::copy(b + 2, b + info.block_bytes, &out[i * payload]);
        std::copy(b, b + 2, &out[n_blocks * payload + 2 * i]);
    }
    return out;
}

double matvec_row_q81(const float* w_row, const Q81& x, size_t col_offset, int k, double* scale) {
    double y = 0, mag = 0;
    for (int b = 0; b < k / 32; ++b) {
        const size_t xb = col_offset / 32 + b;
        double s = 0, m = 0;
        for (int j = 0; j < 32; ++j) {
            const double t = double(w_row[32 * b + j]) * x.q[col_offset + 32 * b + j];
            s += t;
            m += std::fabs(t);
        }
        y += s * x.d[xb];
        mag += m * x.d[xb];
    }
    if (scale) *scale = mag;
    return y;
}

float gelu_tanh(float x) {
    const double v = x;
    return static_cast<float>(0.5 * v *
                              (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
}

NormChain rmsnorm_chain(const std::vector<float>& x, int rows, int n, const float* w,
                        const std::vector<float>& residual, float scale, const float* w2,
                        float eps) {
    NormChain r;
    r.y = rmsnorm(x, rows, n, w, residual.data(), eps);
    for (float& v : r.y) v *= scale;
    if (w2) r.y2 = rmsnorm(r.y, rows, n, w2, nullptr, eps);
    return r;
}

double dot_f64(const float* w, const float* x, int k, double* scale) {
    double s = 0, m = 0;
    for (int j = 0; j < k; ++j) {
        const double t = double(w[j]) * x[j];
        s += t;
        m += std::fabs(t);
    }
    if (scale) *scale = m;
    return s;
}

std::vector<float> embed_rows(ggml::Type type, const std::vector<uint8_t>& table, int n,
                              const std::vector<int>& ids, float scale) {
    const size_t row_bytes = *ggml::row_bytes(type, n);
    std::vector<float> out(ids.size() * n);
    for (size_t t = 0; t < ids.size(); ++t) {
        float* o = &out[t * n];
        ggml::dequantize_row(type, &table[size_t(ids[t]) * row_bytes], o, n);
        for (int i = 0; i < n; ++i) o[i] *= scale;
    }
    return out;
}

void rope_neox(float* x, int head_dim, int pairs, float base, int pos) {
    const int half = head_dim / 2;
    for (int j = 0; j < pairs; ++j) {
        const float e = float(2 * j) / float(head_dim);
        const float freq = 1.0f / static_cast<float>(std::pow(double(base), double(e)));
        const float angle = float(pos) * freq;
        const float c = std::cos(angle), s = std::sin(angle);
        const float x0 = x[j], x1 = x[j + half];
        x[j] = x0 * c - x1 * s;
        x[j + half] = x1 * c + x0 * s;
    }
}

AttnPrepRef attn_prep(const std::vector<float>& q, const std::vector<float>& k_raw,
                      const std::vector<float>* v_raw, const float* q_norm_w, const float* k_norm_w,
                      const std::vector<int>& positions, int n_heads, int n_kv_heads, int head_dim,
                      int rope_pairs, float rope_base, float eps, bool has_kv) {
    const int T = static_cast<int>(positions.size());
    AttnPrepRef r;
    r.q = rmsnorm(q, T * n_heads, head_dim, q_norm_w, nullptr, eps);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < n_heads; ++h)
            rope_neox(&r.q[(size_t(t) * n_heads + h) * head_dim], head_dim, rope_pairs, rope_base,
                      positions[t]);
    if (!has_kv) return r;
    r.k = rmsnorm(k_raw, T * n_kv_heads, head_dim, k_norm_w, nullptr, eps);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < n_kv_heads; ++h)
            rope_neox(&r.k[(size_t(t) * n_kv_heads + h) * head_dim], head_dim, rope_pairs,
                      rope_base, positions[t]);
    r.v = rmsnorm(v_raw ? *v_raw : k_raw, T * n_kv_heads, head_dim, nullptr, nullptr, eps);
    return r;
}

uint16_t kv_encode(float x, bool bf16) {
    return bf16 ? f32_to_bf16(x) : f32_to_f16(x);
}

float kv_decode(uint16_t h, bool bf16) {
    return bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

std::vector<uint8_t> kv_q8_encode(const std::vector<float>& x) {
    if (x.size() % 32 != 0) throw std::invalid_argument("kv_q8_encode: not whole 32-blocks");
    const size_t blocks = x.size() / 32;
    std::vector<uint8_t> plane(x.size() + blocks * 2);
    uint8_t block[34];  // ggml block_q8_0: fp16 d, then 32 int8
    for (size_t b = 0; b < blocks; ++b) {
        ggml::quantize_row(ggml::Type::Q8_0, &x[32 * b], block, 32);
        std::copy(block + 2, block + 34, &plane[32 * b]);
        std::copy(block, block + 2, &plane[x.size() + 2 * b]);
    }
    return plane;
}

std::vector<float> kv_q8_scales(const std::vector<uint8_t>& plane) {
    if (plane.size() % 34 != 0) throw std::invalid_argument("kv_q8_scales: not a q8_0 plane");
    const size_t elements = plane.size() / 34 * 32;
    std::vector<float> d(elements / 32);
    for (size_t b = 0; b < d.size(); ++b)
        d[b] = f16_to_f32(uint16_t(plane[elements + 2 * b] | plane[elements + 2 * b + 1] << 8));
    return d;
}

std::vector<float> kv_q8_decode(const std::vector<uint8_t>& plane) {
    const auto d = kv_q8_scales(plane);
    std::vector<float> x(d.size() * 32);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int8_t(plane[i])) * d[i / 32];
    return x;
}

std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k_cache,
                             const std::vector<float>& v_cache, const std::vector<int>& positions,
                             int n_heads, int n_kv_heads, int head_dim, int window, int slots,
                             std::vector<double>* score_mag, std::vector<double>* score_l2) {
    const int T = static_cast<int>(positions.size());
    const int group = n_heads / n_kv_heads;
    std::vector<float> out(size_t(T) * n_heads * head_dim);
    if (score_mag) score_mag->assign(size_t(T) * n_heads, 0.0);
    if (score_l2) score_l2->assign(size_t(T) * n_heads, 0.0);
    for (int t = 0; t < T; ++t) {
        const int p = positions[t];
        const int lo = window > 0 ? std::max(0, p - window + 1) : 0;
        for (int h = 0; h < n_heads; ++h) {
            const float* qh = &q[(size_t(t) * n_heads + h) * head_dim];
            const int kvh = h / group;
            auto row = [&](const std::vector<float>& c, int j) {
                return &c[(size_t(j % slots) * n_kv_heads + kvh) * head_dim];
            };
            std::vector<double> s(size_t(p - lo + 1));
            double mx = -INFINITY, mag = 0, l2 = 0;
            for (int j = lo; j <= p; ++j) {
                const float* kj = row(k_cache, j);
                double dot = 0, m = 0, m2 = 0;
                for (int i = 0; i < head_dim; ++i) {
                    const double term = double(qh[i]) * kj[i];
                    dot += term;
                    m += std::fabs(term);
                    m2 += term * term;
                }
                s[j - lo] = dot;
                mx = std::max(mx, dot);
                mag = std::max(mag, m);
                l2 = std::max(l2, std::sqrt(m2));
            }
            double sum = 0;
            for (double& e : s) sum += (e = std::exp(e - mx));
            std::vector<double> o(head_dim, 0.0);
            for (int j = lo; j <= p; ++j) {
                const float* vj = row(v_cache, j);
                for (int i = 0; i < head_dim; ++i) o[i] += s[j - lo] / sum * vj[i];
            }
            float* oh = &out[(size_t(t) * n_heads + h) * head_dim];
            for (int i = 0; i < head_dim; ++i) oh[i] = static_cast<float>(o[i]);
            if (score_mag) (*score_mag)[size_t(t) * n_heads + h] = mag;
            if (score_l2) (*score_l2)[size_t(t) * n_heads + h] = l2;
        }
    }
    return out;
}

std::vector<float> ple_finish(const std::vector<float>& ctx, const std::vector<float>& tok,
                              const std::vector<float>& w, int p, float inv_sqrt_d, float eps) {
    std::vector<float> c(ctx.size());
    for (size_t i = 0; i < ctx.size(); ++i) c[i] = ctx[i] * inv_sqrt_d;
    std::vector<float> out = rmsnorm(c, int(ctx.size() / p), p, w.data(), nullptr, eps);
    const float mix = float(1.0 / std::sqrt(2.0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = (out[i] + tok[i]) * mix;
    return out;
}

float softcap(float z, float cap) {
    return cap > 0 ? std::tanh(z / cap) * cap : z;
}

bool logit_before(float a, int ia, float b, int ib) {
    const bool na = std::isnan(a), nb = std::isnan(b);
    if (na != nb) return na;
    if (!na && a != b) return a > b;
    return ia < ib;
}

int argmax(const std::vector<float>& v) {
    int best = 0;
    for (int i = 1; i < int(v.size()); ++i)
        if (logit_before(v[i], i, v[best], best)) best = i;
    return std::isnan(v[best]) ? -1 : best;
}

std::vector<int> topk(const std::vector<float>& v, int k) {
    std::vector<int> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return logit_before(v[a], a, v[b], b); });
    idx.resize(k);
    return idx;
}

std::vector<float> interleave(const Q81& q) {
    std::vector<float> ds;
    for (size_t i = 0; i < q.d.size(); ++i) ds.push_back(q.d[i]), ds.push_back(q.s[i]);
    return ds;
}

bool all_finite(const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
}

}  // namespace gj::test::kref
