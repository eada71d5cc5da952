// GGUF metadata values: checked typed access (conversions that cannot lose information) and
// display. Every failure is a FormatError that names the metadata key.
#include "engine/gguf/value.h"

#include <fmt/format.h>
#include <algorithm>
#include <limits>

namespace gj::gguf {

namespace {

bool is_unsigned(ValueType t) {
    return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 ||
           t == ValueType::UINT64;
}
bool is_signed(ValueType t) {
    return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 ||
           t == ValueType::INT64;
}
bool is_float(ValueType t) {
    return t == ValueType::FLOAT32 || t == ValueType::FLOAT64;
}

std::string type_mismatch(std::string_view key, const char* wanted, const Value& v) {
    return fmt::format("metadata key '{}': expected {}, found {} {}", printable(key), wanted,
                       value_type_name(v.type), v.to_display(4));
}

}  // namespace

std::string printable(std::string_view s, size_t max_len) {
    // Escapes are appended by hand, not with one fmt::format per byte: a hostile key is all
    // escapes, and every FormatError naming it (most inputs the fuzzer tries) pays for them.
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(std::min(s.size(), max_len));
    for (size_t i = 0; i < s.size() && i < max_len; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += static_cast<char>(c);
        } else {
            const char escape[4] = {'\\', 'x', kHex[c >> 4], kHex[c & 0xf]};
            out.append(escape, sizeof escape);
        }
    }
    if (s.size() > max_len) out += fmt::format("...({} bytes)", s.size());
    return out;
}

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
            return "uint8";
        case ValueType::INT8:
            return "int8";
        case ValueType::UINT16:
            return "uint16";
        case ValueType::INT16:
            return "int16";
        case ValueType::UINT32:
            return "uint32";
        case ValueType::INT32:
            return "int32";
        case ValueType::FLOAT32:
            return "float32";
        case ValueType::BOOL:
            return "bool";
        case ValueType::STRING:
            return "string";
        case ValueType::ARRAY:
            return "array";
        case ValueType::UINT64:
            return "uint64";
        case ValueType::INT64:
            return "int64";
        case ValueType::FLOAT64:
            return "float64";
    }
    return "invalid";
}

// ------------------------------------------------------------------------------------------------
// Value access

uint64_t Value::as_u64(std::string_view key) const {
    if (is_unsigned(type))
        if (auto p = std::get_if<uint64_t>(&data)) return *p;
    if (is_signed(type))
        if (auto p = std::get_if<int64_t>(&data); p && *p >= 0) return static_cast<uint64_t>(*p);
    throw FormatError(type_mismatch(key, "an unsigned integer", *this));
}

int64_t Value::as_i64(std::string_view key) const {
    if (is_signed(type))
        if (auto p = std::get_if<int64_t>(&data)) return *p;
    if (is_unsigned(type))
        if (auto p = std::get_if<uint64_t>(&data);
            p && *p <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            return static_cast<int64_t>(*p);
    throw FormatError(type_mismatch(key, "a signed integer", *this));
}

double Value::as_f64(std::string_view key) const {
    if (is_float(type))
        if (auto p = std::get_if<double>(&data)) return *p;
    // Integers convert only when the double holds them exactly (|v| <= 2^53).
    constexpr uint64_t kExact = uint64_t{1} << 53;
    if (is_unsigned(type))
        if (auto p = std::get_if<uint64_t>(&data); p && *p <= kExact)
            return static_cast<double>(*p);
    if (is_signed(type))
        if (auto p = std::get_if<int64_t>(&data);
            p && *p <= static_cast<int64_t>(kExact) && *p >= -static_cast<int64_t>(kExact))
            return static_cast<double>(*p);
    throw FormatError(type_mismatch(key, "a number", *this));
}

bool Value::as_bool(std::string_view key) const {
    if (type == ValueType::BOOL)
        if (auto p = std::get_if<bool>(&data)) return *p;
    throw FormatError(type_mismatch(key, "a bool", *this));
}

const std::string& Value::as_string(std::string_view key) const {
    if (type == ValueType::STRING)
        if (auto p = std::get_if<std::string>(&data)) return *p;
    throw FormatError(type_mismatch(key, "a string", *this));
}

const std::vector<Value>& Value::as_array(std::string_view key) const {
    if (type == ValueType::ARRAY)
        if (auto p = std::get_if<std::vector<Value>>(&data)) return *p;
    throw FormatError(type_mismatch(key, "an array", *this));
}

std::string Value::to_display(size_t max_elems) const {
    struct Visitor {
        size_t max_elems;
        ValueType type;
        std::string operator()(uint64_t v) const { return std::to_string(v); }
        std::string operator()(int64_t v) const { return std::to_string(v); }
        std::string operator()(double v) const {
            // A float32 prints as the shortest float that reads back the same (1e-06, not the
            // double expansion 9.99999997e-07 of the same bits).
            if (type == ValueType::FLOAT32) return fmt::format("{}", static_cast<float>(v));
            return fmt::format("{}", v);
        }
        std::string operator()(bool v) const { return v ? "true" : "false"; }
        std::string operator()(const std::string& v) const {
            return fmt::format("\"{}\"", printable(v, 120));
        }
        std::string operator()(const std::vector<Value>& v) const {
            std::string out = "[";
            for (size_t i = 0; i < v.size() && i < max_elems; ++i) {
                if (i) out += ", ";
                out += v[i].to_display(max_elems);
            }
            if (v.size() > max_elems) out += fmt::format(", ... ({} total)", v.size());
            return out + "]";
        }
    };
    return std::visit(Visitor{max_elems, type}, data);
}

}  // namespace gj::gguf
