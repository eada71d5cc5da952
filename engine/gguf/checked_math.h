// Overflow-checked size arithmetic for the GGUF reader and writer: sizes and offsets come from an
// untrusted file (or a caller's shapes), so every sum, product and round-up reports overflow as
// nullopt instead of wrapping around.
#pragma once

#include <cstdint>
#include <optional>

namespace gj::gguf {

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}
// Rounds up to a multiple of a power-of-two alignment; nullopt on overflow.
inline std::optional<uint64_t> align_up(uint64_t v, uint64_t alignment) {
    auto r = checked_add(v, alignment - 1);
    if (!r) return std::nullopt;
    return *r & ~(alignment - 1);
}

}  // namespace gj::gguf
