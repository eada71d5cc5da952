// `gemmajit quantize`: a Gemma 4 GGUF of float tensors (F32/F16/BF16) rewritten with the tensor
// types of a quant mix (engine/model/quant_mix.h), every metadata key copied (general.file_type
// and general.quantization_version set for the new types), tensors in the input's order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

namespace gj::gemma4 {

struct RequantizeOptions {
    int threads = 0;                                   // <= 0: one per hardware thread
    std::function<void(const std::string&)> progress;  // one line per 10% on big files; may be null
};

struct RequantizeResult {
    uint64_t bytes_in = 0, bytes_out = 0;  // tensor data
    std::map<std::string, int> tensors_by_type;
};

// Throws std::invalid_argument for an unknown mix name (listing the known ones), an input that
// holds block-quantized tensors (naming one), or `out` naming the same file as `in`;
// gguf::FormatError / ConfigError for an input that is not a Gemma 4 GGUF; std::runtime_error for
// I/O failures. `out` is written as a new temporary <out>.partial-XXXXXX and renamed when
// complete (gguf::Writer), so it never holds a half-written model, and neither `in` nor any other
// existing file is opened for writing (not even an input named <out>.partial).
RequantizeResult requantize(const std::filesystem::path& in, const std::filesystem::path& out,
                            const std::string& mix_name, const RequantizeOptions& opts = {});

}  // namespace gj::gemma4
