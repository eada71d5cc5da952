// GGUF v2/v3 reader: the file is memory-mapped and every size, offset and count is bounds- and
// overflow-checked. A truncated, corrupt or hostile file raises gguf::FormatError naming the field;
// never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/gguf/value.h"

namespace gj::gguf {

struct TensorInfo {
    std::string name;
    ggml::Type type;
    std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous (input) dimension
    uint64_t offset = 0;         // from the start of the data section
    uint64_t n_elements = 0;
    uint64_t n_bytes = 0;
    const uint8_t* data = nullptr;  // into the mapping; valid while the File lives
    uint64_t rows() const { return dims.empty() ? 0 : n_elements / dims[0]; }
};

class File {
  public:
    // Throws FormatError (bad content) or std::runtime_error (cannot open/map) naming the path.
    static std::unique_ptr<File> open(const std::filesystem::path& path);
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;

    uint32_t version() const { return version_; }
    const std::filesystem::path& path() const { return path_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }  // file offset of the data section

    const std::map<std::string, Value, std::less<>>& metadata() const { return kv_; }
    const Value* find(std::string_view key) const;
    const Value& get(std::string_view key) const;  // throws FormatError "missing metadata key ..."
    // Convenience typed getters; the *_opt forms return nullopt when the key is absent.
    uint64_t get_u64(std::string_view key) const;
    std::optional<uint64_t> get_u64_opt(std::string_view key) const;
    double get_f64(std::string_view key) const;
    std::optional<double> get_f64_opt(std::string_view key) const;
    std::string get_string(std::string_view key) const;
    std::optional<std::string> get_string_opt(std::string_view key) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;
    // Throws FormatError "missing tensor ...".
    const TensorInfo& tensor(std::string_view name) const;

  private:
    File() = default;
    std::filesystem::path path_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    std::map<std::string, Value, std::less<>> kv_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
    uint64_t data_offset_ = 0;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    bool owns_mapping_ = false;  // File::open maps the file; parse() borrows the caller's buffer
    friend struct FileParser;
};

// Parse from memory (used by File::open and by the fuzz target). The buffer must outlive the
// result.
std::unique_ptr<File> parse(const uint8_t* data, size_t size, const std::filesystem::path& name);

}  // namespace gj::gguf
