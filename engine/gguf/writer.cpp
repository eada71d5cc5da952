// GGUF writer: the header, metadata and tensor table are encoded in memory (validating every
// value against its declared type), the file is sized up front, and tensor payloads are written
// at their offsets with pwrite, so they may arrive in any order and from several threads.
#include "engine/gguf/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>

#include "engine/gguf/checked_math.h"
#include "engine/gguf/format.h"
#include "engine/gguf/partial_cleanup.h"

namespace gj::gguf {

namespace {

class Encoder {
  public:
    std::vector<uint8_t> bytes;

    // resize + memcpy rather than insert of the value's bytes: GCC 12 at -O3 reports a false
    // -Wstringop-overflow for the inlined insert of 4 bytes.
    template <typename T>
    void put(T v) {
        const size_t at = bytes.size();
        bytes.resize(at + sizeof(T));
        std::memcpy(bytes.data() + at, &v, sizeof(T));
    }
    void put_string(std::string_view s) {
        put<uint64_t>(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
    }

    // Payload of v (no type tag); validates that the stored alternative and range fit the type.
    void put_value(const Value& v, std::string_view key, int depth) {
        auto bad = [&](const char* why) {
            return std::invalid_argument(fmt::format("GGUF writer: metadata key '{}' ({}): {}", key,
                                                     value_type_name(v.type), why));
        };
        auto uns = [&](uint64_t max) {
            auto p = std::get_if<uint64_t>(&v.data);
            if (!p) throw bad("value does not hold an unsigned integer");
            if (*p > max) throw bad("value out of range");
            return *p;
        };
        auto sig = [&](int64_t min, int64_t max) {
            auto p = std::get_if<int64_t>(&v.data);
            if (!p) throw bad("value does not hold a signed integer");
            if (*p < min || *p > max) throw bad("value out of range");
            return *p;
        };
        auto flt = [&]() {
            auto p = std::get_if<double>(&v.data);
            if (!p) throw bad("value does not hold a floating-point number");
            return *p;
        };
        switch (v.type) {
            case ValueType::UINT8:
                put<uint8_t>(static_cast<uint8_t>(uns(UINT8_MAX)));
                break;
            case ValueType::UINT16:
                put<uint16_t>(static_cast<uint16_t>(uns(UINT16_MAX)));
                break;
            case ValueType::UINT32:
                put<uint32_t>(static_cast<uint32_t>(uns(UINT32_MAX)));
                break;
            case ValueType::UINT64:
                put<uint64_t>(uns(UINT64_MAX));
                break;
            case ValueType::INT8:
                put<int8_t>(static_cast<int8_t>(sig(INT8_MIN, INT8_MAX)));
                break;
            case ValueType::INT16:
                put<int16_t>(static_cast<int16_t>(sig(INT16_MIN, INT16_MAX)));
                break;
            case ValueType::INT32:
                put<int32_t>(static_cast<int32_t>(sig(INT32_MIN, INT32_MAX)));
                break;
            case ValueType::INT64:
                put<int64_t>(sig(INT64_MIN, INT64_MAX));
                break;
            case ValueType::FLOAT32:
                put<float>(static_cast<float>(flt()));
                break;
            case ValueType::FLOAT64:
                put<double>(flt());
                break;
            case ValueType::BOOL: {
                auto p = std::get_if<bool>(&v.data);
                if (!p) throw bad("value does not hold a bool");
                put<uint8_t>(*p ? 1 : 0);
                break;
            }
            case ValueType::STRING: {
                auto p = std::get_if<std::string>(&v.data);
                if (!p) throw bad("value does not hold a string");
                put_string(*p);
                break;
            }
            case ValueType::ARRAY: {
                auto p = std::get_if<std::vector<Value>>(&v.data);
                if (!p) throw bad("value does not hold an array");
                if (!valid_value_type(static_cast<uint32_t>(v.array_type)))
                    throw bad("invalid array element type");
                if (depth >= kMaxArrayDepth) throw bad("arrays nested too deep");
                put<uint32_t>(static_cast<uint32_t>(v.array_type));
                put<uint64_t>(p->size());
                for (const Value& e : *p) {
                    if (e.type != v.array_type)
                        throw bad("array element type differs from the declared element type");
                    put_value(e, key, depth + 1);
                }
                break;
            }
            default:
                throw bad("invalid value type");
        }
    }
};

void pwrite_all(int fd, const uint8_t* p, uint64_t n, uint64_t offset, const std::string& path) {
    constexpr uint64_t kMaxChunk = uint64_t{1} << 30;  // Linux writes at most ~2 GiB per call
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, static_cast<size_t>(std::min(n, kMaxChunk)),
                                   static_cast<off_t>(offset));
        if (w < 0) {
            if (errno == EINTR) continue;
            throw std::runtime_error(fmt::format("{}: write of {} bytes at offset {} failed: {}",
                                                 path, n, offset, std::strerror(errno)));
        }
        p += w;
        n -= static_cast<uint64_t>(w);
        offset += static_cast<uint64_t>(w);
    }
}

// Creates "<path>.partial-XXXXXX" (XXXXXX random) beside `path` with O_EXCL and returns its
// descriptor. A fixed name such as "<path>.partial" would be truncated if it already existed,
// which destroys a user's file of that name, or the writer's own input when the input is that
// file (quantize m.gguf.partial m.gguf). O_EXCL never opens an existing file: a name that is
// taken just draws another. The mode is 0644 less the umask, as for any file the tool writes
// (mkstemp would give 0600).
int create_unique_partial(const std::filesystem::path& path, std::filesystem::path& partial) {
    static constexpr char kChars[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::random_device rd;
    std::mt19937_64 rng((uint64_t(rd()) << 32) ^ rd());
    int err = 0;
    for (int attempt = 0; attempt < 100; ++attempt) {
        std::string suffix = ".partial-";
        for (int i = 0; i < 6; ++i) suffix += kChars[rng() % (sizeof kChars - 1)];
        partial = path;
        partial += suffix;
        const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) return fd;
        err = errno;
        if (err != EEXIST) break;
    }
    throw std::runtime_error(fmt::format("{}: cannot create a temporary file beside it ({}): {}",
                                         path.string(), partial.string(), std::strerror(err)));
}

}  // namespace

struct Writer::Impl {
    struct Tensor {
        std::string name;
        ggml::Type type;
        std::vector<uint64_t> dims;
        uint64_t n_bytes = 0;
        uint64_t offset = 0;                     // within the data section
        std::atomic<uint64_t> bytes_written{0};  // sum over chunks; checked by finish()
    };

    uint64_t alignment;
    std::vector<std::pair<std::string, Value>> kv;  // insertion order, as gguf-py writes it
    std::map<std::string, size_t, std::less<>> kv_index;
    std::vector<std::unique_ptr<Tensor>> tensors;
    std::map<std::string, size_t, std::less<>> tensor_index;
    uint64_t data_size = 0;  // running end of the data section (padded)

    std::filesystem::path final_path, partial_path;
    int fd = -1;
    int cleanup = -1;  // partial_path's registration for removal on a fatal signal
    uint64_t data_start = 0;
    bool begun = false, finished = false;

    void require_not_begun(const char* what) const {
        if (begun) throw std::logic_error(fmt::format("GGUF writer: {} after begin()", what));
    }

    Tensor& lookup(std::string_view name) {
        if (!begun || finished)
            throw std::logic_error("GGUF writer: tensor data written outside begin()..finish()");
        auto it = tensor_index.find(name);
        if (it == tensor_index.end())
            throw std::invalid_argument(
                fmt::format("GGUF writer: tensor '{}' was not declared", name));
        return *tensors[it->second];
    }

    // Closes and removes the partial file; used on every failure path.
    void abandon() noexcept {
        if (fd >= 0) {
            ::close(fd);
            fd = -1;
            std::error_code ec;
            std::filesystem::remove(partial_path, ec);
        }
        unregister_partial_file(cleanup);
        cleanup = -1;
    }
};

Writer::Writer(uint64_t alignment) : impl_(std::make_unique<Impl>()) {
    if (alignment == 0 || !std::has_single_bit(alignment) || alignment > UINT32_MAX)
        throw std::invalid_argument(
            fmt::format("GGUF writer: alignment {} is not a power of two", alignment));
    impl_->alignment = alignment;
}

Writer::~Writer() {
    impl_->abandon();
}

void Writer::set(std::string key, Value v) {
    impl_->require_not_begun("set()");
    if (key.empty() || key.size() > 65535)
        throw std::invalid_argument(
            fmt::format("GGUF writer: metadata key length {} (1 to 65535 allowed)", key.size()));
    if (auto it = impl_->kv_index.find(key); it != impl_->kv_index.end()) {
        impl_->kv[it->second].second = std::move(v);
        return;
    }
    impl_->kv_index.emplace(key, impl_->kv.size());
    impl_->kv.emplace_back(std::move(key), std::move(v));
}

void Writer::set_u8(std::string key, uint8_t v) {
    set(std::move(key), Value::make_u8(v));
}
void Writer::set_i8(std::string key, int8_t v) {
    set(std::move(key), Value::make_i8(v));
}
void Writer::set_u16(std::string key, uint16_t v) {
    set(std::move(key), Value::make_u16(v));
}
void Writer::set_i16(std::string key, int16_t v) {
    set(std::move(key), Value::make_i16(v));
}
void Writer::set_u32(std::string key, uint32_t v) {
    set(std::move(key), Value::make_u32(v));
}
void Writer::set_i32(std::string key, int32_t v) {
    set(std::move(key), Value::make_i32(v));
}
void Writer::set_u64(std::string key, uint64_t v) {
    set(std::move(key), Value::make_u64(v));
}
void Writer::set_i64(std::string key, int64_t v) {
    set(std::move(key), Value::make_i64(v));
}
void Writer::set_f32(std::string key, float v) {
    set(std::move(key), Value::make_f32(v));
}
void Writer::set_f64(std::string key, double v) {
    set(std::move(key), Value::make_f64(v));
}
void Writer::set_bool(std::string key, bool v) {
    set(std::move(key), Value::make_bool(v));
}
void Writer::set_string(std::string key, std::string v) {
    set(std::move(key), Value::make_string(std::move(v)));
}

namespace {
template <typename T, typename Make>
Value array_of(const std::vector<T>& v, ValueType elem, Make make) {
    std::vector<Value> out;
    out.reserve(v.size());
    for (const auto& x : v) out.push_back(make(x));
    return Value::make_array(elem, std::move(out));
}
}  // namespace

void Writer::set_u32_array(std::string key, const std::vector<uint32_t>& v) {
    set(std::move(key), array_of(v, ValueType::UINT32, Value::make_u32));
}
void Writer::set_i32_array(std::string key, const std::vector<int32_t>& v) {
    set(std::move(key), array_of(v, ValueType::INT32, Value::make_i32));
}
void Writer::set_f32_array(std::string key, const std::vector<float>& v) {
    set(std::move(key), array_of(v, ValueType::FLOAT32, Value::make_f32));
}
void Writer::set_bool_array(std::string key, const std::vector<bool>& v) {
    set(std::move(key), array_of(v, ValueType::BOOL, [](bool b) { return Value::make_bool(b); }));
}
void Writer::set_string_array(std::string key, const std::vector<std::string>& v) {
    set(std::move(key), array_of(v, ValueType::STRING, Value::make_string));
}

uint64_t Writer::add_tensor(std::string name, ggml::Type type, std::vector<uint64_t> dims) {
    impl_->require_not_begun("add_tensor()");
    auto bad = [&](const std::string& why) {
        return std::invalid_argument(fmt::format("GGUF writer: tensor '{}': {}", name, why));
    };
    if (name.empty() || name.size() > kMaxTensorNameLen)
        throw bad(fmt::format("name length {} (1 to {} allowed)", name.size(), kMaxTensorNameLen));
    if (impl_->tensor_index.contains(name)) throw bad("declared twice");
    if (dims.empty() || dims.size() > kMaxDims)
        throw bad(fmt::format("{} dimensions (1 to {} allowed)", dims.size(), kMaxDims));
    uint64_t n = 1;
    for (uint64_t d : dims) {
        auto p = checked_mul(n, d);
        if (d == 0 || !p || *p > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw bad("zero dimension or element count overflow");
        n = *p;
    }
    if (dims[0] % ggml::type_info(type).block_elems != 0)
        throw bad(fmt::format("first dimension {} is not a multiple of the {} block size {}",
                              dims[0], ggml::type_name(type), ggml::type_info(type).block_elems));
    const auto row = ggml::row_bytes(type, dims[0]);
    const auto n_bytes = row ? checked_mul(*row, n / dims[0]) : std::nullopt;
    const auto padded = n_bytes ? align_up(*n_bytes, impl_->alignment) : std::nullopt;
    const auto end = padded ? checked_add(impl_->data_size, *padded) : std::nullopt;
    if (!end) throw bad("byte size overflows");

    auto t = std::make_unique<Impl::Tensor>();
    t->name = name;
    t->type = type;
    t->dims = std::move(dims);
    t->n_bytes = *n_bytes;
    t->offset = impl_->data_size;
    impl_->data_size = *end;
    impl_->tensor_index.emplace(std::move(name), impl_->tensors.size());
    impl_->tensors.push_back(std::move(t));
    return *n_bytes;
}

void Writer::begin(const std::filesystem::path& path) {
    Impl& m = *impl_;
    m.require_not_begun("begin()");

    // general.alignment must agree with the layout; it is only written when not the default.
    if (auto it = m.kv_index.find("general.alignment"); it != m.kv_index.end()) {
        const Value& a = m.kv[it->second].second;
        const auto* p = std::get_if<uint64_t>(&a.data);
        if (a.type != ValueType::UINT32 || !p || *p != m.alignment)
            throw std::invalid_argument(fmt::format(
                "GGUF writer: general.alignment must be the uint32 {} given to the writer",
                m.alignment));
    } else if (m.alignment != kDefaultAlignment) {
        set_u32("general.alignment", static_cast<uint32_t>(m.alignment));
    }

    Encoder enc;
    enc.put<uint32_t>(kMagic);
    enc.put<uint32_t>(3);
    enc.put<uint64_t>(m.tensors.size());
    enc.put<uint64_t>(m.kv.size());
    for (const auto& [key, value] : m.kv) {
        enc.put_string(key);
        enc.put<uint32_t>(static_cast<uint32_t>(value.type));
        enc.put_value(value, key, 0);
    }
    for (const auto& t : m.tensors) {
        enc.put_string(t->name);
        enc.put<uint32_t>(static_cast<uint32_t>(t->dims.size()));
        for (uint64_t d : t->dims) enc.put<uint64_t>(d);
        enc.put<uint32_t>(static_cast<uint32_t>(t->type));
        enc.put<uint64_t>(t->offset);
    }
    m.data_start = *align_up(enc.bytes.size(), m.alignment);
    enc.bytes.resize(m.data_start, 0);
    const uint64_t total = m.data_start + m.data_size;

    // finish() renames over `path`, which fails for a directory: say so before any writing.
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw std::runtime_error(fmt::format("{}: is a directory, not a file name", path.string()));
    m.final_path = path;
    m.fd = create_unique_partial(path, m.partial_path);
    m.cleanup = register_partial_file(m.partial_path.c_str());
    m.begun = true;
    try {
        // Size the file up front: tensor payloads land at their offsets in any order, and the
        // padding between them reads as zeros. Reserving the blocks makes a full disk fail here
        // rather than midway; file systems that cannot reserve just get a sparse file.
        if (total > 0 && ::fallocate(m.fd, 0, 0, static_cast<off_t>(total)) != 0 &&
            errno != EOPNOTSUPP && errno != ENOSYS)
            throw std::runtime_error(fmt::format("{}: cannot reserve {} bytes: {}",
                                                 m.partial_path.string(), total,
                                                 std::strerror(errno)));
        if (::ftruncate(m.fd, static_cast<off_t>(total)) != 0)
            throw std::runtime_error(fmt::format("{}: cannot size to {} bytes: {}",
                                                 m.partial_path.string(), total,
                                                 std::strerror(errno)));
        pwrite_all(m.fd, enc.bytes.data(), enc.bytes.size(), 0, m.partial_path.string());
    } catch (...) {
        m.abandon();
        m.finished = true;
        throw;
    }
}

void Writer::write_tensor_data(std::string_view name, std::span<const uint8_t> bytes) {
    Impl::Tensor& t = impl_->lookup(name);
    if (bytes.size() != t.n_bytes)
        throw std::invalid_argument(fmt::format("GGUF writer: tensor '{}' needs {} bytes, got {}",
                                                name, t.n_bytes, bytes.size()));
    write_tensor_chunk(name, 0, bytes);
}

void Writer::write_tensor_chunk(std::string_view name, uint64_t offset_in_tensor,
                                std::span<const uint8_t> bytes) {
    Impl& m = *impl_;
    Impl::Tensor& t = m.lookup(name);
    const auto end = checked_add(offset_in_tensor, bytes.size());
    if (!end || *end > t.n_bytes)
        throw std::invalid_argument(
            fmt::format("GGUF writer: chunk of {} bytes at {} exceeds tensor '{}' ({} bytes)",
                        bytes.size(), offset_in_tensor, name, t.n_bytes));
    const uint64_t before = t.bytes_written.fetch_add(bytes.size());
    if (before + bytes.size() > t.n_bytes)
        throw std::invalid_argument(fmt::format(
            "GGUF writer: tensor '{}' written more than once (overlapping chunks)", name));
    pwrite_all(m.fd, bytes.data(), bytes.size(), m.data_start + t.offset + offset_in_tensor,
               m.partial_path.string());
}

void Writer::finish() {
    Impl& m = *impl_;
    if (!m.begun || m.finished)
        throw std::logic_error("GGUF writer: finish() without a matching begin()");
    m.finished = true;
    try {
        std::string missing;
        for (const auto& t : m.tensors)
            if (t->bytes_written.load() != t->n_bytes)
                missing += fmt::format("{}'{}' ({} of {} bytes)", missing.empty() ? "" : ", ",
                                       t->name, t->bytes_written.load(), t->n_bytes);
        if (!missing.empty())
            throw std::logic_error(fmt::format("GGUF writer: {}: tensor data incomplete: {}",
                                               m.final_path.string(), missing));
        const int fd = m.fd;
        m.fd = -1;
        if (::close(fd) != 0) {
            const int err = errno;
            std::error_code ec;
            std::filesystem::remove(m.partial_path, ec);
            throw std::runtime_error(
                fmt::format("{}: close failed: {}", m.partial_path.string(), std::strerror(err)));
        }
        std::error_code ec;
        std::filesystem::rename(m.partial_path, m.final_path, ec);
        if (ec) {
            std::error_code ignored;
            std::filesystem::remove(m.partial_path, ignored);
            throw std::runtime_error(fmt::format("{}: cannot rename from {}: {}",
                                                 m.final_path.string(), m.partial_path.string(),
                                                 ec.message()));
        }
        unregister_partial_file(m.cleanup);
        m.cleanup = -1;
    } catch (...) {
        m.abandon();
        throw;
    }
}

}  // namespace gj::gguf
