#include "engine/cpu/cpu_forward.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "engine/gguf/reader.h"

namespace gj::gemma4 {

namespace {

// ---------------------------------------------------------------------------------------------
// Numeric building blocks. Every dot product goes through dot(), whose summation order depends
// only on n, so the result for a row never depends on the batch it was computed in.

float dot(const float* a, const float* b, size_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
    for (; i < n; ++i) acc[i % 8] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Y[t][r] = W.row(r) . X[t] for T input rows of W.cols() values; Y is [T][W.rows()].
void matmul(ThreadPool& pool, const Matrix& W, const float* X, int T, float* Y) {
    const uint64_t rows = W.rows(), cols = W.cols();
    constexpr uint64_t kRowsPerItem = 32;
    const uint64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem;
    pool.parallel_for(items, [&](size_t item) {
        thread_local std::vector<float> scratch;
        if (scratch.size() < cols) scratch.resize(cols);
        const uint64_t end = std::min(rows, (item + 1) * kRowsPerItem);
        for (uint64_t r = item * kRowsPerItem; r < end; ++r) {
            const float* w = W.row(r, scratch.data());
            for (int t = 0; t < T; ++t)
                Y[uint64_t(t) * rows + r] = dot(w, X + uint64_t(t) * cols, cols);
        }
    });
}

std::vector<float> matmul(ThreadPool& pool, const Matrix& W, const std::vector<float>& X, int T) {
    std::vector<float> Y(uint64_t(T) * W.rows());
    matmul(pool, W, X.data(), T, Y.data());
    return Y;
}

// HF Gemma4RMSNorm: x * (mean(x^2) + eps)^-0.5 * w, with no +1 on the gain; w == nullptr is the
// weightless variant (V norm, router input).
void rms_norm(const float* x, size_t n, const float* w, float eps, float* out) {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const float inv = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    for (size_t i = 0; i < n; ++i) out[i] = w ? (x[i] * inv) * w[i] : x[i] * inv;
}

// Norm each of the `rows` consecutive slices of `n` values in place.
void rms_norm_rows(float* x, size_t rows, size_t n, const float* w, float eps) {
    for (size_t r = 0; r < rows; ++r) rms_norm(x + r * n, n, w, eps, x + r * n);
}

float gelu_tanh(float x) {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// NeoX RoPE on one head: dims j and j + hd/2 rotate by pos * base^(-2j/hd) for j < pairs; the
// other pairs (proportional RoPE on global layers) pass through. Frequencies and angles are f32
// as in HF's rotary embedding.
void rope(float* x, int head_dim, int pairs, float base, int pos) {
    const int half = head_dim / 2;
    for (int j = 0; j < pairs; ++j) {
        const float inv_freq = 1.0f / std::pow(base, float(2 * j) / float(head_dim));
        const float angle = float(pos) * inv_freq;
        const float c = std::cos(angle), s = std::sin(angle);
        const float x0 = x[j], x1 = x[j + half];
        x[j] = x0 * c - x1 * s;
        x[j + half] = x1 * c + x0 * s;
    }
}

void add_in_place(std::vector<float>& x, const std::vector<float>& y) {
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::unique_ptr<CpuModel> CpuModel::load(std::shared_ptr<const ModelFile> file,
                                         const CpuOptions& opts) {
    std::unique_ptr<CpuModel> m(new CpuModel());
    m->file_ = std::move(file);
    m->weights_ = std::make_unique<Weights>(m->file_->gguf(), m->file_->config(), opts.weights);
    m->pool_ = std::make_unique<ThreadPool>(opts.threads);
    return m;
}

std::unique_ptr<CpuModel> CpuModel::load(const std::filesystem::path& path,
                                         const CpuOptions& opts) {
    return load(ModelFile::open(path), opts);
}

CpuModel::~CpuModel() = default;

CpuSession::CpuSession(const CpuModel& model)
    : model_(model), cfg_(model.config()), w_(model.weights()), cache_(cfg_.n_layers) {}

void CpuSession::reset() {
    for (auto& c : cache_) c.k.clear(), c.v.clear();
    n_past_ = 0;
}

void CpuSession::rewind(int keep) {
    if (keep < 0 || keep > n_past_) {
        throw std::invalid_argument("rewind to " + std::to_string(keep) + ": the sequence holds " +
                                    std::to_string(n_past_) + " positions");
    }
    // Rows are [position][row width], so dropping the tail positions is a resize of each layer.
    for (auto& c : cache_) {
        if (n_past_ == 0) continue;
        const size_t k_row = c.k.size() / static_cast<size_t>(n_past_);
        const size_t v_row = c.v.size() / static_cast<size_t>(n_past_);
        c.k.resize(k_row * static_cast<size_t>(keep));
        c.v.resize(v_row * static_cast<size_t>(keep));
    }
    n_past_ = keep;
}

std::vector<float> CpuSession::decode(int32_t token) {
    return prefill({&token, 1});
}

std::vector<float> CpuSession::prefill(std::span<const int32_t> tokens) {
    if (tokens.empty()) throw std::invalid_argument("prefill needs at least one token");
    for (int32_t tok : tokens)
        if (tok < 0 || tok >= cfg_.vocab_size)
            throw std::invalid_argument(
                fmt::format("token id {} is outside the vocabulary [0, {})", tok, cfg_.vocab_size));
    const int T = int(tokens.size());
    const size_t d = cfg_.d_model;
    ThreadPool& pool = model_.pool();

    // 1. Token embedding times sqrt(d).
    std::vector<float> x(T * d);
    {
        std::vector<float> scratch(d);
        const float scale = cfg_.embed_scale();
        for (int t = 0; t < T; ++t) {
            const float* e = w_.token_embd.row(uint64_t(tokens[t]), scratch.data());
            for (size_t i = 0; i < d; ++i) x[t * d + i] = e[i] * scale;
        }
    }
    // 2. Per-layer embeddings from the token and from the scaled embedding.
    std::vector<float> ple;
    if (cfg_.has_ple()) ple = ple_inputs(tokens, x);

    // 3. Decoder layers. A failure part-way (e.g. out of memory) leaves the cache as it was.
    layer_outputs_.assign(size_t(cfg_.n_layers) * T * d, 0.0f);
    try {
        for (int l = 0; l < cfg_.n_layers; ++l) {
            attention_block(l, x, T);
            ffn_block(l, x, T);
            if (cfg_.has_ple()) ple_block(l, x, ple, T);
            const float s = w_.layers[l].output_scale;  // scales the whole residual stream
            for (float& v : x) v *= s;
            std::copy(x.begin(), x.end(), layer_outputs_.begin() + size_t(l) * T * d);
        }
    } catch (...) {
        for (int l = 0; l < cfg_.n_layers; ++l) {
            const size_t keep = size_t(n_past_) * cfg_.kv_dim(l);
            if (cache_[l].k.size() > keep) cache_[l].k.resize(keep), cache_[l].v.resize(keep);
        }
        throw;
    }

    // 4. Final norm, tied LM head, softcap.
    rms_norm_rows(x.data(), T, d, w_.output_norm.data(), cfg_.rms_eps);
    std::vector<float> logits = matmul(pool, w_.output, x, T);
    if (cfg_.final_softcap > 0) {
        const float cap = cfg_.final_softcap;
        for (float& v : logits) v = std::tanh(v / cap) * cap;
    }
    n_past_ += T;
    return logits;
}

// PLE, once per token before layer 0 (HF get_per_layer_inputs + project_per_layer_inputs):
// ((rms_norm_P(W_proj . e / sqrt(d)) * g) + table[tok] * sqrt(P)) / sqrt(2), as [T][L][P].
std::vector<float> CpuSession::ple_inputs(std::span<const int32_t> tokens,
                                          const std::vector<float>& x) {
    const int T = int(tokens.size());
    const size_t LP = size_t(cfg_.n_layers) * cfg_.ple_dim;
    std::vector<float> ctx = matmul(model_.pool(), w_.per_layer_model_proj, x, T);
    const float proj_scale = float(1.0 / std::sqrt(double(cfg_.d_model)));
    for (float& v : ctx) v *= proj_scale;
    rms_norm_rows(ctx.data(), size_t(T) * cfg_.n_layers, cfg_.ple_dim,
                  w_.per_layer_proj_norm.data(), cfg_.rms_eps);
    const float token_scale = std::sqrt(float(cfg_.ple_dim));
    const float mix_scale = float(1.0 / std::sqrt(2.0));
    std::vector<float> scratch(LP);
    for (int t = 0; t < T; ++t) {
        const float* row = w_.per_layer_token_embd.row(uint64_t(tokens[t]), scratch.data());
        float* c = ctx.data() + t * LP;
        for (size_t i = 0; i < LP; ++i) c[i] = (c[i] + row[i] * token_scale) * mix_scale;
    }
    return ctx;
}

void CpuSession::attention_block(int l, std::vector<float>& x, int T) {
    const LayerConfig& lc = cfg_.layers[l];
    const LayerWeights& w = w_.layers[l];
    ThreadPool& pool = model_.pool();
    const size_t d = cfg_.d_model;
    const int H = cfg_.n_heads, Hkv = lc.n_kv_heads, hd = lc.head_dim;
    const size_t kv_dim = size_t(Hkv) * hd, q_dim = size_t(H) * hd;

    std::vector<float> h(x.size());
    for (int t = 0; t < T; ++t) rms_norm(&x[t * d], d, w.attn_norm.data(), cfg_.rms_eps, &h[t * d]);

    // Q: per-head RMSNorm with the q_norm gain, then RoPE.
    std::vector<float> q = matmul(pool, w.attn_q, h, T);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
            float* qh = &q[t * q_dim + size_t(i) * hd];
            rms_norm(qh, hd, w.q_norm.data(), cfg_.rms_eps, qh);
            rope(qh, hd, lc.rope_pairs, lc.rope_base, n_past_ + t);
        }

    // K and V of this layer appended to its cache. V comes from the raw K projection on k_eq_v
    // layers (before k_norm and RoPE) and is RMS-normed without a gain.
    if (lc.has_kv) {
        std::vector<float> k = matmul(pool, w.attn_k, h, T);
        std::vector<float> v = w.attn_v.present() ? matmul(pool, w.attn_v, h, T) : k;
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < Hkv; ++j) {
                float* kh = &k[t * kv_dim + size_t(j) * hd];
                rms_norm(kh, hd, w.k_norm.data(), cfg_.rms_eps, kh);
                rope(kh, hd, lc.rope_pairs, lc.rope_base, n_past_ + t);
                float* vh = &v[t * kv_dim + size_t(j) * hd];
                rms_norm(vh, hd, nullptr, cfg_.rms_eps, vh);
            }
        LayerCache& c = cache_[l];
        c.k.insert(c.k.end(), k.begin(), k.end());
        c.v.insert(c.v.end(), v.begin(), v.end());
    }

    // Attention over the source layer's cache (the donor for KV-shared layers; it already holds
    // this batch because the donor is an earlier layer). Scale 1.0, causal, sliding layers see
    // keys j with 0 <= i - j < W.
    const LayerCache& src = cache_[lc.kv_source];
    const int group = H / Hkv;
    std::vector<float> o(size_t(T) * q_dim);
    pool.parallel_for(size_t(T) * H, [&](size_t item) {
        const int t = int(item / H), head = int(item % H);
        const int i = n_past_ + t;
        const int lo = lc.sliding ? std::max(0, i - cfg_.sliding_window + 1) : 0;
        const float* qh = &q[t * q_dim + size_t(head) * hd];
        const size_t kv_off = size_t(head / group) * hd;
        std::vector<float> s(size_t(i - lo + 1));
        float mx = -INFINITY;
        for (int j = lo; j <= i; ++j) {
            s[j - lo] = dot(qh, &src.k[size_t(j) * kv_dim + kv_off], hd);
            mx = std::max(mx, s[j - lo]);
        }
        float sum = 0;
        for (float& e : s) sum += (e = std::exp(e - mx));
        float* oh = &o[t * q_dim + size_t(head) * hd];
        std::fill(oh, oh + hd, 0.0f);
        for (int j = lo; j <= i; ++j) {
            const float a = s[j - lo] / sum;
            const float* vj = &src.v[size_t(j) * kv_dim + kv_off];
            for (int e = 0; e < hd; ++e) oh[e] += a * vj[e];
        }
    });

    std::vector<float> attn = matmul(pool, w.attn_output, o, T);
    rms_norm_rows(attn.data(), T, d, w.post_attention_norm.data(), cfg_.rms_eps);
    add_in_place(x, attn);
}

void CpuSession::ffn_block(int l, std::vector<float>& x, int T) {
    const LayerWeights& w = w_.layers[l];
    ThreadPool& pool = model_.pool();
    const size_t d = cfg_.d_model;

    std::vector<float> z(x.size());
    for (int t = 0; t < T; ++t) rms_norm(&x[t * d], d, w.ffn_norm.data(), cfg_.rms_eps, &z[t * d]);
    std::vector<float> gate = matmul(pool, w.ffn_gate, z, T);
    std::vector<float> up = matmul(pool, w.ffn_up, z, T);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
    std::vector<float> y = matmul(pool, w.ffn_down, gate, T);

    if (cfg_.is_moe()) {
        // The dense MLP and the routed experts get their own post-norms; their sum then goes
        // through post_ffw_norm like a dense layer's output.
        rms_norm_rows(y.data(), T, d, w.post_ffw_norm_1.data(), cfg_.rms_eps);
        std::vector<float> y2(x.size(), 0.0f);
        moe_block(l, x, y2, T);
        add_in_place(y, y2);
    }
    rms_norm_rows(y.data(), T, d, w.post_ffw_norm.data(), cfg_.rms_eps);
    add_in_place(x, y);
}

std::vector<std::pair<int, float>> route_token(const float* lg, int E, int K,
                                               const float* expert_scale) {
    const float mx = *std::max_element(lg, lg + E);
    std::vector<float> p(E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(lg[e] - mx));
    for (float& v : p) v /= sum;
    std::vector<int> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
    float top_sum = 0;
    for (int k = 0; k < K; ++k) top_sum += p[idx[k]];
    std::vector<std::pair<int, float>> chosen;
    for (int k = 0; k < K; ++k)
        chosen.push_back({idx[k], p[idx[k]] / top_sum * expert_scale[idx[k]]});
    // Experts are accumulated in ascending index order, independent of the batch.
    std::sort(chosen.begin(), chosen.end());
    return chosen;
}

// Routed experts of a MoE layer on the post-attention residual x; writes the normed expert sum.
void CpuSession::moe_block(int l, const std::vector<float>& x, std::vector<float>& y, int T) {
    const LayerWeights& w = w_.layers[l];
    ThreadPool& pool = model_.pool();
    const size_t d = cfg_.d_model;
    const int E = cfg_.n_experts, K = cfg_.n_experts_used;

    // Router: weightless RMSNorm of x, times the router scale vector and 1/sqrt(d); softmax over
    // all experts, top-K, renormalized to sum 1, then times the per-expert scale.
    std::vector<float> r(x.size());
    const float root = float(1.0 / std::sqrt(double(d)));
    for (int t = 0; t < T; ++t) {
        rms_norm(&x[t * d], d, nullptr, cfg_.rms_eps, &r[t * d]);
        for (size_t i = 0; i < d; ++i) r[t * d + i] = (r[t * d + i] * w.router_scale[i]) * root;
    }
    std::vector<float> logits = matmul(pool, w.router, r, T);
    std::vector<std::vector<std::pair<int, float>>> chosen(T);  // (expert, weight) per token
    for (int t = 0; t < T; ++t)
        chosen[t] = route_token(&logits[size_t(t) * E], E, K, w.expert_scale.data());

    std::vector<float> z2(x.size());
    for (int t = 0; t < T; ++t)
        rms_norm(&x[t * d], d, w.pre_ffw_norm_2.data(), cfg_.rms_eps, &z2[t * d]);

    // Per expert, the tokens that chose it, as one batch. Outputs are added per token in
    // ascending expert order below.
    std::vector<std::vector<float>> out(size_t(T) * K);  // [t][slot] expert output
    for (int e = 0; e < E; ++e) {
        std::vector<int> toks, slots;
        for (int t = 0; t < T; ++t)
            for (int k = 0; k < K; ++k)
                if (chosen[t][k].first == e) toks.push_back(t), slots.push_back(k);
        if (toks.empty()) continue;
        const int n = int(toks.size());
        std::vector<float> in(size_t(n) * d);
        for (int i = 0; i < n; ++i) std::copy_n(&z2[size_t(toks[i]) * d], d, &in[size_t(i) * d]);
        std::vector<float> g = matmul(pool, w.gate_exps[e], in, n);
        std::vector<float> u = matmul(pool, w.up_exps[e], in, n);
        for (size_t i = 0; i < g.size(); ++i) g[i] = gelu_tanh(g[i]) * u[i];
        std::vector<float> dn = matmul(pool, w.down_exps[e], g, n);
        for (int i = 0; i < n; ++i)
            out[size_t(toks[i]) * K + slots[i]].assign(&dn[size_t(i) * d], &dn[size_t(i) * d] + d);
    }
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
            const float wt = chosen[t][k].second;
            const std::vector<float>& o = out[size_t(t) * K + k];
            for (size_t i = 0; i < d; ++i) y[t * d + i] += wt * o[i];
        }
    rms_norm_rows(y.data(), T, d, w.post_ffw_norm_2.data(), cfg_.rms_eps);
}

// PLE injection: x += post_norm(proj(gelu(inp_gate . x) * ple[l])).
void CpuSession::ple_block(int l, std::vector<float>& x, const std::vector<float>& ple, int T) {
    const LayerWeights& w = w_.layers[l];
    ThreadPool& pool = model_.pool();
    const size_t d = cfg_.d_model, P = cfg_.ple_dim, LP = size_t(cfg_.n_layers) * P;
    std::vector<float> g = matmul(pool, w.inp_gate, x, T);
    for (int t = 0; t < T; ++t)
        for (size_t i = 0; i < P; ++i)
            g[t * P + i] = gelu_tanh(g[t * P + i]) * ple[t * LP + size_t(l) * P + i];
    std::vector<float> u = matmul(pool, w.proj, g, T);
    rms_norm_rows(u.data(), T, d, w.post_norm.data(), cfg_.rms_eps);
    add_in_place(x, u);
}

}  // namespace gj::gemma4
