#include "engine/gguf/ggml_types.h"

#include <fmt/format.h>

#include <stdexcept>

namespace gj::ggml {

namespace {
// Block geometry as ggml defines it (ggml-common.h block structs; QK_K = 256 super-blocks for
// the K-, IQ- and TQ-quants).
constexpr TypeInfo kTypes[] = {
    {Type::F32, "f32", 1, 4, true},
    {Type::F16, "f16", 1, 2, true},
    {Type::Q4_0, "q4_0", 32, 18, true},
    {Type::Q4_1, "q4_1", 32, 20, true},
    {Type::Q5_0, "q5_0", 32, 22, true},
    {Type::Q5_1, "q5_1", 32, 24, true},
    {Type::Q8_0, "q8_0", 32, 34, true},
    {Type::Q8_1, "q8_1", 32, 36, false},
    {Type::Q2_K, "q2_k", 256, 84, false},
    {Type::Q3_K, "q3_k", 256, 110, false},
    {Type::Q4_K, "q4_k", 256, 144, true},
    {Type::Q5_K, "q5_k", 256, 176, true},
    {Type::Q6_K, "q6_k", 256, 210, true},
    {Type::Q8_K, "q8_k", 256, 292, false},
    {Type::IQ2_XXS, "iq2_xxs", 256, 66, false},
    {Type::IQ2_XS, "iq2_xs", 256, 74, false},
    {Type::IQ3_XXS, "iq3_xxs", 256, 98, false},
    {Type::IQ1_S, "iq1_s", 256, 50, false},
    {Type::IQ4_NL, "iq4_nl", 32, 18, true},
    {Type::IQ3_S, "iq3_s", 256, 110, false},
    {Type::IQ2_S, "iq2_s", 256, 82, false},
    {Type::IQ4_XS, "iq4_xs", 256, 136, false},
    {Type::I8, "i8", 1, 1, false},
    {Type::I16, "i16", 1, 2, false},
    {Type::I32, "i32", 1, 4, false},
    {Type::I64, "i64", 1, 8, false},
    {Type::F64, "f64", 1, 8, false},
    {Type::IQ1_M, "iq1_m", 256, 56, false},
    {Type::BF16, "bf16", 1, 2, true},
    {Type::TQ1_0, "tq1_0", 256, 54, false},
    {Type::TQ2_0, "tq2_0", 256, 66, false},
    {Type::MXFP4, "mxfp4", 32, 17, false},
};
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

std::string type_name(Type t) {
    return type_info(t).name;
}

void check_whole_blocks(std::string_view op, Type t, int64_t n) {
    const TypeInfo& info = type_info(t);
    if (n < 0 || n % info.block_elems != 0)
        throw std::invalid_argument(
            fmt::format("{}: {} elements of type {} is not a whole number of {}-element blocks", op,
                        n, info.name, info.block_elems));
}

std::optional<uint64_t> row_bytes(Type t, uint64_t n) {
    const auto& info = type_info(t);
    uint64_t bytes;
    if (n % info.block_elems != 0 ||
        __builtin_mul_overflow(n / info.block_elems, uint64_t{info.block_bytes}, &bytes))
        return std::nullopt;
    return bytes;
}

}  // namespace gj::ggml
