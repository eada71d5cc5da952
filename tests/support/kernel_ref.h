// CPU references for the kernel-template tests: Q8_1 activation quantization exactly as the GPU
// does it, rmsnorm, quantized matvecs (exact-path and fp32), the split weight layout, random
// well-conditioned weights, and a small GPU harness (kernel_ref_gpu.h).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/ggml_types.h"

namespace gj::test::kref {

// Q8_1 activations: per 32 values, q = round_even(x * 127 / amax) (saturated), d = amax / 127,
// s = d * sum(q). Same float operations as quantize_q8_1_group8 in gj_ptx.cuh, so bit-equal.
struct Q81 {
    std::vector<int8_t> q;
    std::vector<float> d, s;
};
Q81 quantize_q8_1(const float* x, size_t n);

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

// ggml blocks [rows][k / 32] -> the split layout of matvec_common.cuh (payload plane, then fp16
// scale plane).
std::vector<uint8_t> split_layout(ggml::Type type, const std::vector<uint8_t>& blocks, int rows,
                                  int k);

// One output of the matvec on the quantized path: sum over blocks of d_x * sum(w * q_x), in
// double; `scale` gets sum |w * d_x * q_x| (the size fp32 rounding errors scale with).
double matvec_row_q81(const float* w_row, const Q81& x, size_t col_offset, int k, double* scale);

float gelu_tanh(float x);

}  // namespace gj::test::kref
