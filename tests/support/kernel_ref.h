// CPU references for the kernel-template tests: Q8_1 activation quantization exactly as the GPU
// does it, rmsnorm (and its residual/scale/second-norm form), quantized and float matvecs, the
// split weight layout, random well-conditioned weights, embedding gathers, the PLE steps, the
// final softcap with argmax / top-k, and a small GPU harness (kernel_ref_gpu.h).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/gguf/ggml_types.h"

namespace gj::test::kref {

// Q8_1 activations: per 32 values, q = round_even(x * 127 / amax) (saturated), d = amax / 127,
// s = d * sum(q). Same float operations as quantize_q8_1_group8 in gj_ptx.cuh, so bit-equal.
struct Q81 {
    std::vector<int8_t> q;
    std::vector<float> d, s;
};
Q81 quantize_q8_1(const float* x, size_t n);
// The d|s pairs of every 32-block in the interleaved order the kernels read them.
std::vector<float> interleave(const Q81& q);

// No NaN or inf in v.
bool all_finite(const std::vector<float>& v);

// x / sqrt(mean(x^2) + eps) [* w] [+ residual] per row of n (w and residual may be null);
// accumulated in double.
std::vector<float> rmsnorm(const std::vector<float>& x, int rows, int n, const float* w,
                           const float* residual, float eps);

// Random matrix [rows][k] with weights ~ N(0, 1/k), quantized to `type` by the ggml reference
// quantizer; `dequant` receives the exact values the blocks hold.
std::vector<uint8_t> random_weights(ggml::Type type, int rows, int k, std::mt19937& rng,
                                    std::vector<float>& dequant);

// Normal(0, sigma) values.
std::vector<float> random_normal(size_t n, float sigma, std::mt19937& rng);
// Norm weights around 1: 1 + Normal(0, sigma) (Gemma 4 stores them without the +1 offset).
std::vector<float> random_norm_weights(size_t n, float sigma, std::mt19937& rng);

// ggml blocks [rows][k / 32] -> the split layout of matvec_common.cuh (payload plane, then fp16
// scale plane); Q4_K / Q5_K / Q6_K super-blocks -> their split planes
// (kernel_templates/kquant.cuh); Q4_1 / Q5_0 / Q5_1 -> theirs (kernel_templates/q32_blocks.cuh).
std::vector<uint8_t> split_layout(ggml::Type type, const std::vector<uint8_t>& blocks, int rows,
                                  int k);

// One output of the matvec on the quantized path: sum over blocks of d_x * sum(w * q_x), in
// double; `scale` gets sum |w * d_x * q_x| (the size fp32 rounding errors scale with).
double matvec_row_q81(const float* w_row, const Q81& x, size_t col_offset, int k, double* scale);

float gelu_tanh(float x);

// rmsnorm_ext: y = (residual + norm(x) * w) * scale; y2 = norm(y) * w2 (when w2 is given),
// each norm accumulated in double. Rows of n; w may be null (weightless first norm).
struct NormChain {
    std::vector<float> y, y2;
};
NormChain rmsnorm_chain(const std::vector<float>& x, int rows, int n, const float* w,
                        const std::vector<float>& residual, float scale, const float* w2,
                        float eps);

// One output of a float matvec: sum_j w[j] * x[j] in double; `scale` gets sum |w[j] * x[j]|.
double dot_f64(const float* w, const float* x, int k, double* scale);

// embed_rows: rows of `table` (stored as `type`, n wide) for each id, dequantized exactly as
// ggml does and multiplied by `scale` in fp32 (what the GPU computes, bit for bit).
std::vector<float> embed_rows(ggml::Type type, const std::vector<uint8_t>& table, int n,
                              const std::vector<int>& ids, float scale);

// PLE precompute: ple = (RMSNorm(ctx * inv_sqrt_d per P-slice) * w + tok) * (1 / sqrt(2)), as the
// CPU forward computes it (norm in double, the rest in fp32). ctx, tok: [rows][P].
std::vector<float> ple_finish(const std::vector<float>& ctx, const std::vector<float>& tok,
                              const std::vector<float>& w, int p, float inv_sqrt_d, float eps);

// Final softcap as the CPU forward applies it: tanh(z / cap) * cap in fp32 (cap <= 0: none).
float softcap(float z, float cap);

// The logits kernels' order: larger value first, NaN above everything, -0 equal to +0, ties to
// the lower index. argmax returns -1 when the maximum is NaN; topk the first k indices in order.
bool logit_before(float a, int ia, float b, int ib);
int argmax(const std::vector<float>& v);
std::vector<int> topk(const std::vector<float>& v, int k);

// ---- Attention (attn_prep, flash_decode) ----

// NeoX RoPE of one head row in place: dims j and j + hd/2 rotate by float(pos) * freq_j for
// j < pairs, freq_j the fp32 value of base^(-2j/hd) (as HF and the CPU forward compute it).
void rope_neox(float* x, int head_dim, int pairs, float base, int pos);

// What attn_prep produces, in fp32 before the cache's rounding: q [T][H*hd] (normed with q_norm_w,
// RoPE'd), k [T][Hkv*hd] (normed with k_norm_w, RoPE'd), v [T][Hkv*hd] (weightless norm of v_raw,
// or of k_raw when v_raw is null: k_eq_v). k and v are empty when !has_kv.
struct AttnPrepRef {
    std::vector<float> q, k, v;
};
AttnPrepRef attn_prep(const std::vector<float>& q, const std::vector<float>& k_raw,
                      const std::vector<float>* v_raw, const float* q_norm_w, const float* k_norm_w,
                      const std::vector<int>& positions, int n_heads, int n_kv_heads, int head_dim,
                      int rope_pairs, float rope_base, float eps, bool has_kv);

// KV cache element encoding (f16 or bf16, round to nearest even) and decoding.
uint16_t kv_encode(float x, bool bf16);
float kv_decode(uint16_t h, bool bf16);

// A q8_0 KV cache plane (kernel_templates/attn_kv.cuh) from rows of head_dim floats
// [slots][Hkv][head_dim]: int8 payload of every element, then one fp16 scale per 32 elements
// (at byte x.size()), each 32-block quantized by ggml's Q8_0 reference (ggml::quantize_row).
std::vector<uint8_t> kv_q8_encode(const std::vector<float>& x);
// Its values (scale * q), and its scales as floats [elements / 32].
std::vector<float> kv_q8_decode(const std::vector<uint8_t>& plane);
std::vector<float> kv_q8_scales(const std::vector<uint8_t>& plane);

// Attention in double over caches given as floats [slots][Hkv][hd]: query head i of token t at
// position p = positions[t] sees keys j in [lo, p], lo = window ? max(0, p - window + 1) : 0, at
// slot j % slots; scale 1.0. Returns out [T][H*hd]. Per (t, head), `score_mag` receives
// max_j sum_i |q_i k_ji| (what worst-case fp32 rounding of a score scales with) and `score_l2`
// max_j sqrt(sum_i (q_i k_ji)^2) (what independent rounding errors of k scale with).
std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k_cache,
                             const std::vector<float>& v_cache, const std::vector<int>& positions,
                             int n_heads, int n_kv_heads, int head_dim, int window, int slots,
                             std::vector<double>* score_mag = nullptr,
                             std::vector<double>* score_l2 = nullptr);

}  // namespace gj::test::kref
