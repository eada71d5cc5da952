#include "engine/generate/generate_cpu.h"

#include <algorithm>

namespace gj::gen {

std::vector<float> CpuForward::prefill(std::span<const int32_t> tokens) {
    std::vector<float> rows;
    for (size_t i = 0; i < tokens.size(); i += kPrefillChunk) {
        rows = session_.prefill(tokens.subspan(i, std::min(kPrefillChunk, tokens.size() - i)));
    }
    const auto v = static_cast<std::ptrdiff_t>(vocab_size());
    if (static_cast<std::ptrdiff_t>(rows.size()) < v) {
        throw GenerateError("prefill of an empty token list");
    }
    return std::vector<float>(rows.end() - v, rows.end());  // the last position's row
}

}  // namespace gj::gen
