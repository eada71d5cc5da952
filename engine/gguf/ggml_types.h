// Tensor element types as GGUF/ggml number them, with their block geometry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gj::ggml {

// Numeric ids are ggml's (they are what a GGUF tensor table stores). Every id ggml currently
// defines is listed so that any llama.cpp file parses; TypeInfo::dequant_supported says which
// ones this engine can compute with. Gaps (4, 5, 31-33, 36-38) are ids ggml removed.
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
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
};

struct TypeInfo {
    Type type;
    const char* name;        // "q8_0", "bf16" ... (lower case, as CLI flags spell them)
    uint32_t block_elems;    // elements per block (1 for float types)
    uint32_t block_bytes;    // bytes per block
    bool dequant_supported;  // engine/gguf/dequant.cpp can turn it into f32
};

// nullopt for an id this engine does not know (the GGUF reader turns that into a clear error).
std::optional<TypeInfo> type_info(uint32_t raw_type);
const TypeInfo& type_info(Type t);
std::optional<Type> type_from_name(std::string_view name);  // "q8_0" -> Q8_0
std::string type_name(Type t);

// Bytes of one row of n elements; nullopt when n is not a multiple of the block size or the
// byte count does not fit in 64 bits.
std::optional<uint64_t> row_bytes(Type t, uint64_t n);

// Throws std::invalid_argument ("<op>: N elements of type T is not a whole number of B-element
// blocks") when a row of n elements is not whole blocks of t (for (de)quantizing a row).
void check_whole_blocks(std::string_view op, Type t, int64_t n);

}  // namespace gj::ggml
