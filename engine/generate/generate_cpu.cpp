#include "engine/generate/generate_cpu.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gj::gen {

CpuForward::CpuForward(const gemma4::CpuModel& model, int context)
    : model_(model), session_(model), context_(model.config().context_length) {
    if (context > context_)
        throw std::invalid_argument("a context of " + std::to_string(context) +
                                    " positions exceeds the " + std::to_string(context_) +
                                    " positions " + model.config().name + " was trained for");
    if (context > 0) context_ = context;
}

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
