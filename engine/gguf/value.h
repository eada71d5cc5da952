// GGUF metadata values: the value types of the format, one typed Value (scalar, string or array)
// with checked accessors and builders, and FormatError, which the reader and the accessors raise
// for a file whose content is wrong (a truncated, corrupt or hostile file is never a crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gj::gguf {

struct FormatError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

enum class ValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// Keys and names from a hostile file may hold anything; messages show them escaped and bounded.
std::string printable(std::string_view s, size_t max_len = 96);

// One metadata value. Arrays hold one element type; nested arrays are supported by GGUF and kept.
struct Value {
    ValueType type = ValueType::UINT32;
    ValueType array_type = ValueType::UINT32;  // element type when type == ARRAY
    std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<Value>> data;

    // Typed access with conversions that cannot lose information; throws FormatError naming `key`
    // (pass the metadata key for the message) when the type does not fit.
    uint64_t as_u64(std::string_view key) const;
    int64_t as_i64(std::string_view key) const;
    double as_f64(std::string_view key) const;
    bool as_bool(std::string_view key) const;
    const std::string& as_string(std::string_view key) const;
    const std::vector<Value>& as_array(std::string_view key) const;
    std::string to_display(size_t max_elems = 8) const;  // for `gemmajit info`-style dumps

    // Builders for writing metadata (the stored variant alternative follows the type).
    static Value make_u8(uint8_t v) { return {ValueType::UINT8, ValueType::UINT32, uint64_t{v}}; }
    static Value make_i8(int8_t v) { return {ValueType::INT8, ValueType::UINT32, int64_t{v}}; }
    static Value make_u16(uint16_t v) {
        return {ValueType::UINT16, ValueType::UINT32, uint64_t{v}};
    }
    static Value make_i16(int16_t v) { return {ValueType::INT16, ValueType::UINT32, int64_t{v}}; }
    static Value make_u32(uint32_t v) {
        return {ValueType::UINT32, ValueType::UINT32, uint64_t{v}};
    }
    static Value make_i32(int32_t v) { return {ValueType::INT32, ValueType::UINT32, int64_t{v}}; }
    static Value make_u64(uint64_t v) { return {ValueType::UINT64, ValueType::UINT32, v}; }
    static Value make_i64(int64_t v) { return {ValueType::INT64, ValueType::UINT32, v}; }
    static Value make_f32(float v) { return {ValueType::FLOAT32, ValueType::UINT32, double{v}}; }
    static Value make_f64(double v) { return {ValueType::FLOAT64, ValueType::UINT32, v}; }
    static Value make_bool(bool v) { return {ValueType::BOOL, ValueType::UINT32, v}; }
    static Value make_string(std::string v) {
        return {ValueType::STRING, ValueType::UINT32, std::move(v)};
    }
    // Every element must have type `elem` (nested arrays: elem == ARRAY).
    static Value make_array(ValueType elem, std::vector<Value> v) {
        return {ValueType::ARRAY, elem, std::move(v)};
    }
};

}  // namespace gj::gguf
