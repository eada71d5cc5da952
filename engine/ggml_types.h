// Tensor element types as GGUF/ggml number them, with their block geometry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gj::ggml {

// Numeric ids are ggml's (they are what a GGUF tensor table stores).
enum class Type : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    BF16 = 30,
};

struct TypeInfo {
    Type type;
    const char* name;       // "q8_0", "bf16" ... (lower case, as CLI flags spell them)
    uint32_t block_elems;   // elements per block (1 for float types)
    uint32_t block_bytes;   // bytes per block
    bool dequant_supported; // engine/dequant.cpp can turn it into f32
};

// nullopt for an id this engine does not know (the GGUF reader turns that into a clear error).
std::optional<TypeInfo> type_info(uint32_t raw_type);
const TypeInfo& type_info(Type t);
std::optional<Type> type_from_name(std::string_view name);  // "q8_0" -> Q8_0
std::string type_name(Type t);

// Bytes of one row of n elements; nullopt when n is not a multiple of the block size.
std::optional<uint64_t> row_bytes(Type t, uint64_t n);

}  // namespace gj::ggml
