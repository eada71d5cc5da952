#include "engine/ggml_types.h"

#include <array>

namespace gj::ggml {

namespace {
// Block geometry as ggml defines it (QK_K = 256 super-blocks for the K-quants).
constexpr std::array<TypeInfo, 15> kTypes = {{
    {Type::F32, "f32", 1, 4, true},
    {Type::F16, "f16", 1, 2, true},
    {Type::Q4_0, "q4_0", 32, 18, true},
    {Type::Q4_1, "q4_1", 32, 20, false},
    {Type::Q5_0, "q5_0", 32, 22, false},
    {Type::Q5_1, "q5_1", 32, 24, false},
    {Type::Q8_0, "q8_0", 32, 34, true},
    {Type::Q8_1, "q8_1", 32, 36, false},
    {Type::Q2_K, "q2_k", 256, 84, false},
    {Type::Q3_K, "q3_k", 256, 110, false},
    {Type::Q4_K, "q4_k", 256, 144, true},
    {Type::Q5_K, "q5_k", 256, 176, true},
    {Type::Q6_K, "q6_k", 256, 210, true},
    {Type::Q8_K, "q8_k", 256, 292, false},
    {Type::BF16, "bf16", 1, 2, true},
}};
}  // namespace

std::optional<TypeInfo> type_info(uint32_t raw_type) {
    for (const auto& t : kTypes)
        if (static_cast<uint32_t>(t.type) == raw_type) return t;
    return std::nullopt;
}

const TypeInfo& type_info(Type t) {
    for (const auto& info : kTypes)
        if (info.type == t) return info;
    return kTypes[0];  // unreachable: every enumerator is in the table
}

std::optional<Type> type_from_name(std::string_view name) {
    for (const auto& t : kTypes)
        if (name == t.name) return t.type;
    return std::nullopt;
}

std::string type_name(Type t) { return type_info(t).name; }

std::optional<uint64_t> row_bytes(Type t, uint64_t n) {
    const auto& info = type_info(t);
    if (n % info.block_elems != 0) return std::nullopt;
    return n / info.block_elems * info.block_bytes;
}

}  // namespace gj::ggml
