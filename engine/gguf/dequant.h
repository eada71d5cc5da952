// Dequantization of ggml tensor data to fp32 on the CPU, with ggml's block layouts and formulas
// (bit-identical to ggml's reference dequantize_row_* functions). Used by the CPU reference
// forward, by host-side gathers (embedding rows) and by tests.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/gguf/reader.h"

namespace gj::ggml {

// True for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K (same as
// type_info(t).dequant_supported).
bool can_dequantize(Type t);

// Turns n elements (a multiple of the type's block size) starting at src into fp32.
// Throws std::invalid_argument naming the type when it is unsupported or n does not fit.
void dequantize_row(Type type, const uint8_t* src, float* dst, int64_t n);

// Rows [row_begin, row_begin + n_rows) of a tensor (rows are dims[0] elements) into dst, which
// holds n_rows * dims[0] floats. Throws std::out_of_range naming the tensor for rows outside it.
void dequantize_rows(const gguf::TensorInfo& t, uint64_t row_begin, uint64_t n_rows, float* dst);

// The whole tensor (n_elements floats).
std::vector<float> dequantize_tensor(const gguf::TensorInfo& t);

// Selected rows, in the given order (e.g. embedding lookups), into dst (rows.size() * dims[0]).
void gather_rows(const gguf::TensorInfo& t, std::span<const int64_t> rows, float* dst);

}  // namespace gj::ggml
