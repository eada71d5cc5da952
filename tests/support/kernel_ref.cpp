#include "tests/support/kernel_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "engine/dequant.h"
#include "engine/half.h"
#include "engine/quantize.h"

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

std::vector<uint8_t> split_layout(ggml::Type type, const std::vector<uint8_t>& blocks, int rows,
                                  int k) {
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

}  // namespace gj::test::kref
