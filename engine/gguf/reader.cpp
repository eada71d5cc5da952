// GGUF reader. It trusts nothing in the file: every count, length, size and offset is checked
// against the bytes that remain before anything is allocated or dereferenced, so a hostile file
// costs at most a small constant times its own size in memory and time.
#include "engine/gguf/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>

#include "engine/gguf/checked_math.h"
#include "engine/gguf/format.h"

namespace gj::gguf {

namespace {

// Each array element becomes a Value (~48 bytes), so a file made of one huge u8 array would cost
// ~48x its size in memory. Real files hold ~1.5M elements (vocabulary, scores, types, merges);
// this cap keeps a hostile file's metadata under ~1 GB while leaving ten times that headroom.
constexpr uint64_t kMaxMetadataElements = uint64_t{1} << 24;

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

}  // namespace

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

}  // namespace gj::gguf
