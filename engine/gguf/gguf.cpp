// GGUF reader and writer. The reader trusts nothing in the file: every count, length, size and
// offset is checked against the bytes that remain before anything is allocated or dereferenced,
// so a hostile file costs at most a small constant times its own size in memory and time.
#include "engine/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace gj::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;          // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;         // nested arrays deeper than this are refused
constexpr size_t kMaxTensorNameLen = 63;  // GGML_MAX_NAME - 1: llama.cpp refuses longer names
// Each array element becomes a Value (~48 bytes), so a file made of one huge u8 array would cost
// ~48x its size in memory. Real files hold ~1.5M elements (vocabulary, scores, types, merges);
// this cap keeps a hostile file's metadata under ~1 GB while leaving ten times that headroom.
constexpr uint64_t kMaxMetadataElements = uint64_t{1} << 24;

bool valid_value_type(uint32_t t) {
    return t <= static_cast<uint32_t>(ValueType::FLOAT64);
}

// Bytes of one serialized element of type t (scalars), or the least bytes it can take (strings:
// the length prefix; arrays: element type + count). Used to bound counts before allocating.
uint64_t min_encoded_size(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::BOOL:
            return 1;
        case ValueType::UINT16:
        case ValueType::INT16:
            return 2;
        case ValueType::UINT32:
        case ValueType::INT32:
        case ValueType::FLOAT32:
            return 4;
        case ValueType::UINT64:
        case ValueType::INT64:
        case ValueType::FLOAT64:
        case ValueType::STRING:
            return 8;
        case ValueType::ARRAY:
            return 12;
    }
    return 1;
}

bool is_unsigned(ValueType t) {
    return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 ||
           t == ValueType::UINT64;
}
bool is_signed(ValueType t) {
    return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 ||
           t == ValueType::INT64;
}
bool is_float(ValueType t) {
    return t == ValueType::FLOAT32 || t == ValueType::FLOAT64;
}

// Keys and names from a hostile file may hold anything; messages show them escaped and bounded.
std::string printable(std::string_view s, size_t max_len = 96) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < max_len; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out += static_cast<char>(c);
        else
            out += fmt::format("\\x{:02x}", c);
    }
    if (s.size() > max_len) out += fmt::format("...({} bytes)", s.size());
    return out;
}

std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}
std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}
// Rounds up to a multiple of a power-of-two alignment; nullopt on overflow.
std::optional<uint64_t> align_up(uint64_t v, uint64_t alignment) {
    auto r = checked_add(v, alignment - 1);
    if (!r) return std::nullopt;
    return *r & ~(alignment - 1);
}

std::string type_mismatch(std::string_view key, const char* wanted, const Value& v) {
    return fmt::format("metadata key '{}': expected {}, found {} {}", printable(key), wanted,
                       value_type_name(v.type), v.to_display(4));
}

}  // namespace

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
            return "uint8";
        case ValueType::INT8:
            return "int8";
        case ValueType::UINT16:
            return "uint16";
        case ValueType::INT16:
            return "int16";
        case ValueType::UINT32:
            return "uint32";
        case ValueType::INT32:
            return "int32";
        case ValueType::FLOAT32:
            return "float32";
        case ValueType::BOOL:
            return "bool";
        case ValueType::STRING:
            return "string";
        case ValueType::ARRAY:
            return "array";
        case ValueType::UINT64:
            return "uint64";
        case ValueType::INT64:
            return "int64";
        case ValueType::FLOAT64:
            return "float64";
    }
    return "invalid";
}

// ------------------------------------------------------------------------------------------------
// Value access

uint64_t Value::as_u64(std::string_view key) const {
    if (is_unsigned(type))
        if (auto p = std::get_if<uint64_t>(&data)) return *p;
    if (is_signed(type))
        if (auto p = std::get_if<int64_t>(&data); p && *p >= 0) return static_cast<uint64_t>(*p);
    throw FormatError(type_mismatch(key, "an unsigned integer", *this));
}

int64_t Value::as_i64(std::string_view key) const {
    if (is_signed(type))
        if (auto p = std::get_if<int64_t>(&data)) return *p;
    if (is_unsigned(type))
        if (auto p = std::get_if<uint64_t>(&data);
            p && *p <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            return static_cast<int64_t>(*p);
    throw FormatError(type_mismatch(key, "a signed integer", *this));
}

double Value::as_f64(std::string_view key) const {
    if (is_float(type))
        if (auto p = std::get_if<double>(&data)) return *p;
    // Integers convert only when the double holds them exactly (|v| <= 2^53).
    constexpr uint64_t kExact = uint64_t{1} << 53;
    if (is_unsigned(type))
        if (auto p = std::get_if<uint64_t>(&data); p && *p <= kExact)
            return static_cast<double>(*p);
    if (is_signed(type))
        if (auto p = std::get_if<int64_t>(&data);
            p && *p <= static_cast<int64_t>(kExact) && *p >= -static_cast<int64_t>(kExact))
            return static_cast<double>(*p);
    throw FormatError(type_mismatch(key, "a number", *this));
}

bool Value::as_bool(std::string_view key) const {
    if (type == ValueType::BOOL)
        if (auto p = std::get_if<bool>(&data)) return *p;
    throw FormatError(type_mismatch(key, "a bool", *this));
}

const std::string& Value::as_string(std::string_view key) const {
    if (type == ValueType::STRING)
        if (auto p = std::get_if<std::string>(&data)) return *p;
    throw FormatError(type_mismatch(key, "a string", *this));
}

const std::vector<Value>& Value::as_array(std::string_view key) const {
    if (type == ValueType::ARRAY)
        if (auto p = std::get_if<std::vector<Value>>(&data)) return *p;
    throw FormatError(type_mismatch(key, "an array", *this));
}

std::string Value::to_display(size_t max_elems) const {
    struct Visitor {
        size_t max_elems;
        ValueType type;
        std::string operator()(uint64_t v) const { return std::to_string(v); }
        std::string operator()(int64_t v) const { return std::to_string(v); }
        std::string operator()(double v) const {
            // A float32 prints as the shortest float that reads back the same (1e-06, not the
            // double expansion 9.99999997e-07 of the same bits).
            if (type == ValueType::FLOAT32) return fmt::format("{}", static_cast<float>(v));
            return fmt::format("{}", v);
        }
        std::string operator()(bool v) const { return v ? "true" : "false"; }
        std::string operator()(const std::string& v) const {
            return fmt::format("\"{}\"", printable(v, 120));
        }
        std::string operator()(const std::vector<Value>& v) const {
            std::string out = "[";
            for (size_t i = 0; i < v.size() && i < max_elems; ++i) {
                if (i) out += ", ";
                out += v[i].to_display(max_elems);
            }
            if (v.size() > max_elems) out += fmt::format(", ... ({} total)", v.size());
            return out + "]";
        }
    };
    return std::visit(Visitor{max_elems, type}, data);
}

// ------------------------------------------------------------------------------------------------
// Reader

// Cursor over the untrusted bytes; every read is bounds-checked and failures name the field and
// the byte offset where it starts.
struct FileParser {
    const uint8_t* data;
    size_t size;
    size_t pos = 0;
    const std::filesystem::path& name;
    File& out;
    uint64_t elements_left = kMaxMetadataElements;  // array elements still allowed

    [[noreturn]] void fail(size_t at, const std::string& what) const {
        throw FormatError(fmt::format("{}: {} (at byte offset {})", name.string(), what, at));
    }

    size_t remaining() const { return size - pos; }

    // Field descriptions for messages are built only on failure: reading a vocabulary touches
    // over a million values, and formatting a description for each would dominate load time.
    // `what` is a string or a callable returning one.
    template <typename Describe>
    static std::string describe(const Describe& what) {
        if constexpr (std::is_invocable_v<const Describe&>)
            return what();
        else
            return std::string(what);
    }

    template <typename Describe>
    void need(uint64_t n, const Describe& what) const {
        if (n > remaining())
            fail(pos, fmt::format("file truncated: {} needs {} bytes but only {} remain",
                                  describe(what), n, remaining()));
    }

    template <typename T, typename Describe>
    T read(const Describe& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }

    template <typename Describe>
    std::string read_string(const Describe& what) {
        const size_t at = pos;
        const auto len = read<uint64_t>([&] { return describe(what) + " length"; });
        if (len > remaining())
            fail(at, fmt::format("{} has length {} but only {} bytes remain", describe(what), len,
                                 remaining()));
        std::string s(reinterpret_cast<const char*>(data + pos), static_cast<size_t>(len));
        pos += static_cast<size_t>(len);
        return s;
    }

    template <typename Describe>
    ValueType read_value_type(const Describe& what) {
        const size_t at = pos;
        const auto raw = read<uint32_t>(what);
        if (!valid_value_type(raw))
            fail(at, fmt::format("{} is invalid ({})", describe(what), raw));
        return static_cast<ValueType>(raw);
    }

    // Reads the payload of one value of type t (the type tag is already consumed).
    Value read_value(ValueType t, const std::string& key, int depth) {
        Value v;
        v.type = t;
        const auto what = [&] { return fmt::format("value of metadata key '{}'", printable(key)); };
        switch (t) {
            case ValueType::UINT8:
                v.data = uint64_t{read<uint8_t>(what)};
                break;
            case ValueType::INT8:
                v.data = int64_t{read<int8_t>(what)};
                break;
            case ValueType::UINT16:
                v.data = uint64_t{read<uint16_t>(what)};
                break;
            case ValueType::INT16:
                v.data = int64_t{read<int16_t>(what)};
                break;
            case ValueType::UINT32:
                v.data = uint64_t{read<uint32_t>(what)};
                break;
            case ValueType::INT32:
                v.data = int64_t{read<int32_t>(what)};
                break;
            case ValueType::UINT64:
                v.data = read<uint64_t>(what);
                break;
            case ValueType::INT64:
                v.data = read<int64_t>(what);
                break;
            case ValueType::FLOAT32:
                v.data = double{read<float>(what)};
                break;
            case ValueType::FLOAT64:
                v.data = read<double>(what);
                break;
            case ValueType::BOOL: {
                const size_t at = pos;
                const auto b = read<uint8_t>(what);
                if (b > 1) fail(at, fmt::format("{}: bool byte is {}, not 0 or 1", what(), b));
                v.data = b != 0;
                break;
            }
            case ValueType::STRING:
                v.data = read_string(what);
                break;
            case ValueType::ARRAY: {
                const size_t at = pos;
                if (depth >= kMaxArrayDepth)
                    fail(at, fmt::format("metadata key '{}': arrays nested deeper than {}",
                                         printable(key), kMaxArrayDepth));
                v.array_type = read_value_type([&] {
                    return fmt::format("element type of array metadata key '{}'", printable(key));
                });
                const size_t count_at = pos;
                const auto count = read<uint64_t>([&] {
                    return fmt::format("element count of array metadata key '{}'", printable(key));
                });
                // Each element takes at least min_encoded_size bytes, so a count the rest of the
                // file cannot hold is refused before anything is reserved.
                if (count > remaining() / min_encoded_size(v.array_type))
                    fail(count_at,
                         fmt::format("array metadata key '{}' claims {} elements of type {} but "
                                     "only {} bytes remain",
                                     printable(key), count, value_type_name(v.array_type),
                                     remaining()));
                if (count > elements_left)
                    fail(count_at, fmt::format("array metadata key '{}' has {} elements; all "
                                               "arrays together may hold at most {}",
                                               printable(key), count, kMaxMetadataElements));
                elements_left -= count;
                std::vector<Value> elems;
                elems.reserve(static_cast<size_t>(count));
                for (uint64_t i = 0; i < count; ++i)
                    elems.push_back(read_value(v.array_type, key, depth + 1));
                v.data = std::move(elems);
                break;
            }
        }
        return v;
    }

    void parse_header(uint64_t& n_tensors, uint64_t& n_kv) {
        if (size < 4)
            fail(0, fmt::format("file truncated: {} bytes, too small for the GGUF magic", size));
        const auto magic = read<uint32_t>("magic");
        if (magic != kMagic)
            fail(0, fmt::format("not a GGUF file (magic bytes {:02x} {:02x} {:02x} {:02x})",
                                data[0], data[1], data[2], data[3]));
        const auto version = read<uint32_t>("version");
        if (version == 1) fail(4, "GGUF version 1 is not supported (only 2 and 3)");
        if (version == 0x02000000u || version == 0x03000000u)
            fail(4, "big-endian GGUF files are not supported");
        if (version != 2 && version != 3)
            fail(4, fmt::format("unsupported GGUF version {} (only 2 and 3)", version));
        out.version_ = version;
        n_tensors = read<uint64_t>("tensor count");
        n_kv = read<uint64_t>("metadata entry count");
        // Lower bounds on the encoded size of one entry: key length + value type + 1 byte, and
        // name length + n_dims + one dim + type + offset.
        constexpr uint64_t kMinKv = 8 + 4 + 1, kMinTensor = 8 + 4 + 8 + 4 + 8;
        if (n_kv > remaining() / kMinKv)
            fail(16, fmt::format("metadata entry count {} is impossible: only {} bytes remain",
                                 n_kv, remaining()));
        if (n_tensors > remaining() / kMinTensor ||
            n_kv * kMinKv + n_tensors * kMinTensor > remaining())
            fail(8, fmt::format("tensor count {} with {} metadata entries is impossible: only {} "
                                "bytes remain",
                                n_tensors, n_kv, remaining()));
    }

    void parse_metadata(uint64_t n_kv) {
        size_t alignment_at = 0;
        for (uint64_t i = 0; i < n_kv; ++i) {
            const size_t at = pos;
            auto key = read_string([&] { return fmt::format("key of metadata entry {}", i); });
            const auto type = read_value_type(
                [&] { return fmt::format("value type of metadata key '{}'", printable(key)); });
            auto value = read_value(type, key, 0);
            if (out.kv_.contains(key))
                fail(at, fmt::format("duplicate metadata key '{}'", printable(key)));
            if (key == "general.alignment") alignment_at = at;
            out.kv_.emplace(std::move(key), std::move(value));
        }
        if (auto it = out.kv_.find("general.alignment"); it != out.kv_.end()) {
            const Value& a = it->second;
            if (a.type != ValueType::UINT32)
                fail(alignment_at, fmt::format("general.alignment must be uint32, found {}",
                                               value_type_name(a.type)));
            const uint64_t al = a.as_u64("general.alignment");
            if (al == 0 || !std::has_single_bit(al))
                fail(alignment_at, fmt::format("general.alignment {} is not a power of two", al));
            out.alignment_ = al;
        }
    }

    void parse_tensor_table(uint64_t n_tensors) {
        out.tensors_.reserve(static_cast<size_t>(n_tensors));
        std::vector<size_t> entry_at;
        entry_at.reserve(static_cast<size_t>(n_tensors));
        for (uint64_t i = 0; i < n_tensors; ++i) {
            const size_t at = pos;
            TensorInfo t;
            t.name = read_string([&] { return fmt::format("name of tensor {}", i); });
            const std::string who = fmt::format("tensor '{}'", printable(t.name));
            const size_t dims_at = pos;
            const auto n_dims = read<uint32_t>([&] { return who + " dimension count"; });
            if (n_dims == 0 || n_dims > kMaxDims)
                fail(dims_at,
                     fmt::format("{} has {} dimensions (1 to {} allowed)", who, n_dims, kMaxDims));
            uint64_t n_elements = 1;
            for (uint32_t d = 0; d < n_dims; ++d) {
                const size_t dim_at = pos;
                const auto dim =
                    read<uint64_t>([&] { return fmt::format("{} dimension {}", who, d); });
                if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                    fail(dim_at, fmt::format("{} dimension {} is {}", who, d, dim));
                auto prod = checked_mul(n_elements, dim);
                if (!prod || *prod > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                    fail(dim_at, fmt::format("{} element count overflows (dimension {} = {})", who,
                                             d, dim));
                n_elements = *prod;
                t.dims.push_back(dim);
            }
            const size_t type_at = pos;
            const auto raw_type = read<uint32_t>([&] { return who + " type"; });
            const auto info = ggml::type_info(raw_type);
            if (!info) fail(type_at, fmt::format("{} has unknown ggml type id {}", who, raw_type));
            t.type = info->type;
            if (t.dims[0] % info->block_elems != 0)
                fail(type_at, fmt::format("{} of type {}: first dimension {} is not a multiple "
                                          "of the block size {}",
                                          who, info->name, t.dims[0], info->block_elems));
            const auto row = ggml::row_bytes(t.type, t.dims[0]);
            const auto n_bytes = row ? checked_mul(*row, n_elements / t.dims[0]) : std::nullopt;
            if (!n_bytes) fail(type_at, fmt::format("{} byte size overflows", who));
            t.n_elements = n_elements;
            t.n_bytes = *n_bytes;
            t.offset = read<uint64_t>([&] { return who + " data offset"; });
            if (out.tensor_index_.contains(t.name))
                fail(at, fmt::format("duplicate tensor name '{}'", printable(t.name)));
            out.tensor_index_.emplace(t.name, out.tensors_.size());
            out.tensors_.push_back(std::move(t));
            entry_at.push_back(at);
        }

        // The data section starts at the next multiple of the alignment after the table.
        const auto data_start = align_up(pos, out.alignment_);
        if (!data_start) fail(pos, "data section offset overflows");
        out.data_offset_ = *data_start;
        if (n_tensors == 0) return;

        for (size_t i = 0; i < out.tensors_.size(); ++i) {
            TensorInfo& t = out.tensors_[i];
            const std::string who = fmt::format("tensor '{}'", printable(t.name));
            if (t.offset % out.alignment_ != 0)
                fail(entry_at[i], fmt::format("{} data offset {} is not a multiple of the "
                                              "alignment {}",
                                              who, t.offset, out.alignment_));
            const auto begin = checked_add(*data_start, t.offset);
            const auto end = begin ? checked_add(*begin, t.n_bytes) : std::nullopt;
            if (!end || *end > size)
                fail(entry_at[i], fmt::format("{} data ({} bytes at data offset {}) lies beyond "
                                              "the end of the file ({} bytes)",
                                              who, t.n_bytes, t.offset, size));
            t.data = data + *begin;
        }
        // Overlap check on the tensors sorted by offset.
        std::vector<size_t> order(out.tensors_.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return out.tensors_[a].offset < out.tensors_[b].offset;
        });
        for (size_t k = 1; k < order.size(); ++k) {
            const TensorInfo& prev = out.tensors_[order[k - 1]];
            const TensorInfo& cur = out.tensors_[order[k]];
            if (cur.offset < prev.offset + prev.n_bytes)  // no overflow: both lie within the file
                fail(entry_at[order[k]],
                     fmt::format("tensor '{}' data (offset {}) overlaps tensor '{}' (offset {}, "
                                 "{} bytes)",
                                 printable(cur.name), cur.offset, printable(prev.name), prev.offset,
                                 prev.n_bytes));
        }
    }

    static std::unique_ptr<File> run(const uint8_t* data, size_t size,
                                     const std::filesystem::path& name) {
        std::unique_ptr<File> f(new File());
        f->path_ = name;
        f->base_ = data;
        f->size_ = size;
        FileParser p{data, size, 0, name, *f};
        uint64_t n_tensors = 0, n_kv = 0;
        p.parse_header(n_tensors, n_kv);
        p.parse_metadata(n_kv);
        p.parse_tensor_table(n_tensors);
        return f;
    }
};

std::unique_ptr<File> parse(const uint8_t* data, size_t size, const std::filesystem::path& name) {
    return FileParser::run(data, size, name);
}

namespace {
// Owns a read-only mapping until released (so a parse failure unmaps it).
struct Mapping {
    void* addr = nullptr;
    size_t size = 0;
    ~Mapping() {
        if (addr) munmap(addr, size);
    }
};
}  // namespace

std::unique_ptr<File> File::open(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw std::runtime_error(
            fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw std::runtime_error(
            fmt::format("{}: cannot stat: {}", path.string(), std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw std::runtime_error(fmt::format("{}: not a regular file", path.string()));
    }
    Mapping map;
    map.size = static_cast<size_t>(st.st_size);
    if (map.size > 0) {
        void* addr = mmap(nullptr, map.size, PROT_READ, MAP_SHARED, fd, 0);
        if (addr == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            throw std::runtime_error(fmt::format("{}: cannot map {} bytes: {}", path.string(),
                                                 map.size, std::strerror(err)));
        }
        map.addr = addr;
    }
    ::close(fd);  // the mapping keeps the file referenced

    static const uint8_t kEmpty = 0;
    const auto* bytes = map.addr ? static_cast<const uint8_t*>(map.addr) : &kEmpty;
    auto f = parse(bytes, map.size, path);
    f->owns_mapping_ = map.addr != nullptr;
    map.addr = nullptr;  // now owned by the File
    return f;
}

File::~File() {
    if (owns_mapping_) munmap(const_cast<uint8_t*>(base_), size_);
}

const Value* File::find(std::string_view key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

const Value& File::get(std::string_view key) const {
    if (auto v = find(key)) return *v;
    throw FormatError(fmt::format("{}: missing metadata key '{}'", path_.string(), key));
}

uint64_t File::get_u64(std::string_view key) const {
    return get(key).as_u64(key);
}
std::optional<uint64_t> File::get_u64_opt(std::string_view key) const {
    if (auto v = find(key)) return v->as_u64(key);
    return std::nullopt;
}
double File::get_f64(std::string_view key) const {
    return get(key).as_f64(key);
}
std::optional<double> File::get_f64_opt(std::string_view key) const {
    if (auto v = find(key)) return v->as_f64(key);
    return std::nullopt;
}
std::string File::get_string(std::string_view key) const {
    return get(key).as_string(key);
}
std::optional<std::string> File::get_string_opt(std::string_view key) const {
    if (auto v = find(key)) return v->as_string(key);
    return std::nullopt;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
    if (auto t = find_tensor(name)) return *t;
    throw FormatError(fmt::format("{}: missing tensor '{}'", path_.string(), name));
}

// ------------------------------------------------------------------------------------------------
// Writer

namespace {

class Encoder {
  public:
    std::vector<uint8_t> bytes;

    template <typename T>
    void put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        bytes.insert(bytes.end(), p, p + sizeof(T));
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

    m.final_path = path;
    m.partial_path = path;
    m.partial_path += ".partial";
    m.fd = ::open(m.partial_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (m.fd < 0)
        throw std::runtime_error(
            fmt::format("{}: cannot create: {}", m.partial_path.string(), std::strerror(errno)));
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
    } catch (...) {
        m.abandon();
        throw;
    }
}

}  // namespace gj::gguf
