// GGUF v3 reader (memory-mapped, every size/offset/count bounds- and overflow-checked) and writer.
// A truncated, corrupt or hostile file raises gguf::FormatError naming the field; never a crash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/ggml_types.h"

namespace gj::gguf {

struct FormatError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

enum class ValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

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
};

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

    const std::map<std::string, Value, std::less<>>& metadata() const { return kv_; }
    const Value* find(std::string_view key) const;
    const Value& get(std::string_view key) const;  // throws FormatError "missing metadata key ..."
    // Convenience typed getters; the *_or forms return the fallback when the key is absent.
    uint64_t get_u64(std::string_view key) const;
    std::optional<uint64_t> get_u64_opt(std::string_view key) const;
    double get_f64(std::string_view key) const;
    std::optional<double> get_f64_opt(std::string_view key) const;
    std::string get_string(std::string_view key) const;
    std::optional<std::string> get_string_opt(std::string_view key) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;
    const TensorInfo& tensor(std::string_view name) const;  // throws FormatError "missing tensor ..."

private:
    File() = default;
    std::filesystem::path path_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    std::map<std::string, Value, std::less<>> kv_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    friend struct FileParser;
};

// Parse from memory (used by File::open and by the fuzz target). The buffer must outlive the result.
std::unique_ptr<File> parse(const uint8_t* data, size_t size, const std::filesystem::path& name);

// Streaming writer: metadata and tensor descriptors first, then tensor payloads in declaration
// order. Payloads may be produced in parallel into caller buffers and written with write_tensor_data.
class Writer {
public:
    explicit Writer(uint64_t alignment = 32);
    void set(std::string key, Value v);  // later set() of the same key replaces it
    void set_u32(std::string key, uint32_t v);
    void set_f32(std::string key, float v);
    void set_bool(std::string key, bool v);
    void set_string(std::string key, std::string v);
    void set_u32_array(std::string key, const std::vector<uint32_t>& v);
    void set_i32_array(std::string key, const std::vector<int32_t>& v);
    void set_f32_array(std::string key, const std::vector<float>& v);
    void set_bool_array(std::string key, const std::vector<bool>& v);
    void set_string_array(std::string key, const std::vector<std::string>& v);
    // Declares a tensor; returns its byte size. Throws if the shape does not fit the type's blocks.
    uint64_t add_tensor(std::string name, ggml::Type type, std::vector<uint64_t> dims);

    // Writes header, metadata and tensor table, reserves the data section (file is sized, so the
    // tensor payloads can be written at their offsets in any order and from several threads).
    void begin(const std::filesystem::path& path);
    void write_tensor_data(std::string_view name, std::span<const uint8_t> bytes);  // thread-safe
    void finish();  // flushes and closes; throws on I/O error (the partial file is removed)
    ~Writer();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace gj::gguf
