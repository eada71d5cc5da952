// GGUF v3 writer: metadata, tensor declarations, then tensor payloads in any order (also from
// several threads), into a file that llama.cpp and gguf-py read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/gguf/value.h"

namespace gj::gguf {

// Streaming writer: metadata and tensor descriptors first, then tensor payloads in any order.
// Payloads may be produced in parallel into caller buffers and written with write_tensor_data.
// The layout is gguf-py's, which llama.cpp loads: header, metadata, tensor table, padding to the
// alignment, then each tensor at the running offset, padded to the alignment. (Nested arrays are
// valid GGUF and written as given, but llama.cpp's reader refuses them.) The file is written as a
// new temporary "<path>.partial-XXXXXX" (created exclusively, so no existing file is ever opened
// for writing) and renamed to <path> by finish(); on error, destruction without finish(), or the
// process dying of SIGINT / SIGTERM / SIGHUP meanwhile (partial_cleanup.h), the temporary is
// removed. Misuse (bad key, shape or value; calls out of order) throws
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
