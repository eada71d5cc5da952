// A Gemma 4 GGUF opened once: the file mapped and parsed (gguf::File), its Config parsed and
// validated, and its tokenizer built from the file's vocabulary on first use. Every consumer of
// one model in a process (the CPU and GPU loaders, the tokenizer, a server's requests) shares one
// ModelFile instead of opening the path again: on a 262k-token vocabulary, parsing the metadata
// is real work on the way to the first token.
//
// Held by std::shared_ptr: tensors point into the mapping (gguf::TensorInfo::data), so a model
// bound to them keeps the ModelFile alive by holding the pointer too.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>

#include "engine/model/gemma4_config.h"

namespace gj::gguf {
class File;
}

namespace gj::tok {
class Tokenizer;
}

namespace gj::gemma4 {

class ModelFile {
  public:
    // Maps and parses the GGUF and its Config. Throws std::runtime_error (cannot open or map),
    // gguf::FormatError (bad content) or ConfigError (not a Gemma 4 model this engine runs), each
    // naming the path or the key.
    static std::shared_ptr<const ModelFile> open(const std::filesystem::path& path);
    ~ModelFile();
    ModelFile(const ModelFile&) = delete;
    ModelFile& operator=(const ModelFile&) = delete;

    const std::filesystem::path& path() const;
    const gguf::File& gguf() const { return *file_; }
    const Config& config() const { return cfg_; }
    // The file's tokenizer (tokenizer.ggml.*), read and built on the first call, from any thread;
    // a failure (gguf::FormatError, tok::TokenizerError) propagates and the next call tries again.
    const tok::Tokenizer& tokenizer() const;

  private:
    ModelFile() = default;
    std::unique_ptr<gguf::File> file_;
    Config cfg_;
    mutable std::mutex tokenizer_mutex_;  // a mutex, not call_once: a failed build may retry
    mutable std::unique_ptr<tok::Tokenizer> tokenizer_;
};

}  // namespace gj::gemma4
