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

#include "engine/gguf/ggml_types.h"

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

// Streaming writer: metadata and tensor descriptors first, then tensor payloads in any order.
// Payloads may be produced in parallel into caller buffers and written with write_tensor_data.
// The layout is gguf-py's, which llama.cpp loads: header, metadata, tensor table, padding to the
// alignment, then each tensor at the running offset, padded to the alignment. (Nested arrays are
// valid GGUF and written as given, but llama.cpp's reader refuses them.) The file is written as
// "<path>.partial" and renamed to <path> by finish(); on error, or destruction without finish(),
// the partial file is removed. Misuse (bad key, shape or value; calls out of order) throws
// std::invalid_argument / std::logic_error, I/O failure std::runtime_error naming the path.
class Writer {
  public:
    explicit Writer(uint64_t alignment = 32);  // a power of two; != 32 adds general.alignment
    void set(std::string key, Value v);        // later set() of the same key replaces it
    void set_u8(std::string key, uint8_t v);
    void set_i8(std::string key, int8_t v);
    void set_u16(std::string key, uint16_t v);
    void set_i16(std::string key, int16_t v);
    void set_u32(std::string key, uint32_t v);
    void set_i32(std::string key, int32_t v);
    void set_u64(std::string key, uint64_t v);
    void set_i64(std::string key, int64_t v);
    void set_f32(std::string key, float v);
    void set_f64(std::string key, double v);
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
    // Writes part of a tensor (for payloads too large for one buffer); thread-safe. Chunks must
    // not overlap; finish() checks that every tensor received exactly its byte size.
    void write_tensor_chunk(std::string_view name, uint64_t offset_in_tensor,
                            std::span<const uint8_t> bytes);
    void finish();  // flushes and closes; throws on I/O error (the partial file is removed)
    ~Writer();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace gj::gguf
