// CPU quantization of fp32 rows into ggml formats, for writing (synthetic) GGUF files. The
// results are byte-identical to ggml's reference quantizers (quantize_row_*_ref), so a file
// written here holds what llama.cpp's own tools would have produced from the same floats.
#pragma once

#include <cstdint>

#include "engine/gguf/ggml_types.h"

namespace gj::ggml {

// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
bool can_quantize(Type t);

// Quantizes n elements (a multiple of the block size) from src into row_bytes(type, n) bytes at
// dst. Throws std::invalid_argument naming the type when it is unsupported, when n does not fit
// the blocks, or (block types) when a value is not finite (ggml's reference would be undefined).
// Thread-safe: no shared state; call it from as many threads as there are rows to fill.
void quantize_row(Type type, const float* src, uint8_t* dst, int64_t n);

}  // namespace gj::ggml
