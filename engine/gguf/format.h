// GGUF v3 file-format constants and limits for the reader and the writer (internal to
// engine/gguf/): what one side writes the other must accept, so each is defined once.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "engine/gguf/value.h"

namespace gj::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;   // GGML_MAX_DIMS
inline constexpr int kMaxArrayDepth = 8;  // nested arrays deeper than this are refused
inline constexpr size_t kMaxTensorNameLen =
    63;  // GGML_MAX_NAME - 1: llama.cpp refuses longer names

// Whether a raw type tag names a ValueType (tags come from the file, or from a caller's cast).
inline bool valid_value_type(uint32_t t) {
    return t <= static_cast<uint32_t>(ValueType::FLOAT64);
}

}  // namespace gj::gguf
