#include "cache/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <system_error>

#include "cache/sha256.h"

namespace fs = std::filesystem;

namespace gj::cache {

namespace {

constexpr int64_t kTouchInterval = 3600;  // last_used is refreshed at most hourly
constexpr int64_t kAbandonedTempAge = 3600;
constexpr const char* kMeta = "meta.json";
constexpr const char* kLockSuffix = ".lock";

int64_t now_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string unique_suffix() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    return fmt::format("{}-{:012x}", ::getpid(), rng() & 0xffffffffffffULL);
}

void fsync_dir(const fs::path& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    ::fsync(fd);
    ::close(fd);
}

bool is_hidden(const fs::path& p) {
    return p.filename().string().starts_with(".");
}

std::vector<fs::path> subdirs(const fs::path& dir) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code ec2;
        if (it->is_directory(ec2) && !ec2) out.push_back(it->path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

// The family directories of every partition: <root>/v*/<arch>/<compiler>/<family>.
std::vector<fs::path> family_dirs(const fs::path& root) {
    std::vector<fs::path> out;
    for (const auto& v : subdirs(root)) {
        std::string n = v.filename().string();
        if (n.size() < 2 || n[0] != 'v' || !std::all_of(n.begin() + 1, n.end(), ::isdigit))
            continue;
        for (const auto& arch : subdirs(v))
            for (const auto& compiler : subdirs(arch))
                for (const auto& family : subdirs(compiler))
                    if (!is_hidden(family)) out.push_back(family);
    }
    return out;
}

// The lock files in a family directory (entry_lock.h): regular files named `*.lock`.
std::vector<fs::path> lock_files(const fs::path& family) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(family, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code ec2;
        if (it->is_regular_file(ec2) && !ec2 &&
            it->path().filename().string().ends_with(kLockSuffix))
            out.push_back(it->path());
    }
    return out;
}

int64_t mtime_seconds(const fs::path& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return 0;
    return st.st_mtime;
}

}  // namespace

std::optional<std::string> read_file(const fs::path& path) {
    // One allocation of the file's size and plain reads: a warm start reads every payload of the
    // plan (megabytes), and a stream that grows by doubling copies and faults it in several times.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    struct stat st {};
    std::string bytes;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    char tail[4096];  // past the size fstat gave: confirms the end, or takes what grew since
    for (;;) {
        const bool full = done == bytes.size();
        ssize_t n = full ? ::read(fd, tail, sizeof tail)
                         : ::read(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            ::close(fd);
            return std::nullopt;
        }
        if (n == 0) break;
        if (full) bytes.append(tail, static_cast<size_t>(n));
        done += static_cast<size_t>(n);
    }
    ::close(fd);
    bytes.resize(done);  // shorter than fstat said when it shrank meanwhile
    return bytes;
}

void write_file_synced(const fs::path& path, std::string_view bytes) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + path.string());
    size_t done = 0;
    while (done < bytes.size()) {
        ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int err = errno;
            ::close(fd);
            throw std::system_error(err, std::generic_category(), "write " + path.string());
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0)
        throw std::system_error(errno, std::generic_category(), "fsync/close " + path.string());
}

fs::path EntryId::relative_dir() const {
    return fs::path(fmt::format("v{}", abi)) / arch / compiler / family /
           fmt::format("{}-{}", name, key.substr(0, 16));
}

Store::Store(StoreConfig config) : config_(std::move(config)) {
    if (config_.root.empty()) config_.mode = Mode::Off;
}

fs::path Store::entry_dir(const EntryId& id) const {
    return config_.root / id.relative_dir();
}

void Store::warn_once(const std::string& topic, const std::string& message) {
    {
        std::lock_guard lock(mutex_);
        if (!warned_.insert(topic).second) return;
    }
    if (config_.warn)
        config_.warn(message);
    else
        std::fprintf(stderr, "gemmajit: warning: %s\n", message.c_str());
}

EntrySummary Store::inspect(const fs::path& dir, const std::string* expected_key, Entry* out,
                            bool checksums) const {
    EntrySummary s;
    s.dir = dir;
    auto meta_text = read_file(dir / kMeta);
    if (!meta_text) {
        s.problem = "meta.json is missing";
        return s;
    }
    s.bytes = meta_text->size();
    s.last_used = mtime_seconds(dir / kMeta);
    nlohmann::json meta = nlohmann::json::parse(*meta_text, nullptr, /*allow_exceptions=*/false);
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("payload") ||
        !meta["payload"].is_object() || !meta.contains("key") || !meta["key"].is_string()) {
        s.problem = "meta.json is not a valid entry description";
        return s;
    }
    if (meta.contains("last_used") && meta["last_used"].is_number_integer())
        s.last_used = meta["last_used"].get<int64_t>();
    if (expected_key && meta["key"].get<std::string>() != *expected_key) {
        s.problem = "meta.json belongs to another key";
        return s;
    }
    Entry entry;
    for (const auto& [file, info] : meta["payload"].items()) {
        if (file.find('/') != std::string::npos || !info.is_object() || !info.contains("sha256") ||
            !info["sha256"].is_string() || !info.contains("bytes") ||
            !info["bytes"].is_number_unsigned()) {
            s.problem = "meta.json payload record for " + file + " is malformed";
            return s;
        }
        uint64_t expected_size = info["bytes"].get<uint64_t>();
        if (!checksums) {  // sizes only: cheap enough to run over a whole cache
            std::error_code ec;
            uint64_t size = fs::file_size(dir / file, ec);
            if (ec) {
                s.problem = file + " is missing";
                return s;
            }
            s.bytes += size;
            if (size != expected_size) {
                s.problem = fmt::format("{} has {} bytes, expected {} (truncated?)", file, size,
                                        expected_size);
                return s;
            }
            continue;
        }
        auto bytes = read_file(dir / file);
        if (!bytes) {
            s.problem = file + " is missing";
            return s;
        }
        s.bytes += bytes->size();
        if (bytes->size() != expected_size) {
            s.problem = fmt::format("{} has {} bytes, expected {} (truncated?)", file,
                                    bytes->size(), expected_size);
            return s;
        }
        if (sha256_hex(*bytes) != info["sha256"].get<std::string>()) {
            s.problem = file + " fails its sha256 check (corrupted)";
            return s;
        }
        if (out) entry.files.emplace(file, std::move(*bytes));
    }
    s.valid = true;
    if (out) {
        entry.meta = std::move(meta);
        entry.dir = dir;
        *out = std::move(entry);
    }
    return s;
}

Lookup Store::probe(const EntryId& id) const {
    if (!enabled()) return Lookup::Missing;
    fs::path dir = entry_dir(id);
    std::error_code ec;
    if (!fs::exists(dir, ec)) return Lookup::Missing;
    return inspect(dir, &id.key, nullptr).valid ? Lookup::Hit : Lookup::Damaged;
}

std::optional<Entry> Store::load(const EntryId& id) {
    if (!enabled()) return std::nullopt;
    fs::path dir = entry_dir(id);
    std::error_code ec;
    if (!fs::exists(dir, ec)) return std::nullopt;
    Entry entry;
    EntrySummary s = inspect(dir, &id.key, &entry);
    if (!s.valid) {
        bool ro = config_.mode == Mode::ReadOnly;
        warn_once("damaged:" + dir.string(),
                  fmt::format("cache entry {} is damaged ({}); {}", dir.string(), s.problem,
                              ro ? "recompiling (read-only cache: left in place)"
                                 : "deleting it and recompiling"));
        if (!ro) delete_dir(dir);
        return std::nullopt;
    }
    if (config_.mode == Mode::ReadWrite && now_seconds() - s.last_used >= kTouchInterval)
        touch(dir, entry.meta);
    return entry;
}

void Store::touch(const fs::path& dir, nlohmann::json meta) {
    meta["last_used"] = now_seconds();
    fs::path tmp = dir / (".meta.json.tmp-" + unique_suffix());
    try {
        write_file_synced(tmp, meta.dump(2));
        fs::rename(tmp, dir / kMeta);
    } catch (const std::exception&) {
        // A stale stamp only makes pruning less precise; never fail a load over it.
        std::error_code ec;
        fs::remove(tmp, ec);
    }
}

std::optional<fs::path> Store::publish(const EntryId& id, const Entry& entry) {
    if (config_.mode != Mode::ReadWrite) return std::nullopt;
    {
        std::lock_guard lock(mutex_);
        if (unwritable_) return std::nullopt;
    }
    fs::path final_dir = entry_dir(id);
    fs::path parent = final_dir.parent_path();
    // The temp dir lives next to the final one (same file system, so rename is atomic).
    fs::path tmp =
        parent / fmt::format(".tmp-{}-{}", final_dir.filename().string(), unique_suffix());
    nlohmann::json meta = entry.meta;
    meta["key"] = id.key;
    meta["payload"] = nlohmann::json::object();
    for (const auto& [file, bytes] : entry.files)
        meta["payload"][file] = {{"bytes", bytes.size()}, {"sha256", sha256_hex(bytes)}};
    int64_t now = now_seconds();
    meta["created"] = now;
    meta["last_used"] = now;
    try {
        fs::create_directories(parent);
        fs::create_directory(tmp);
        for (const auto& [file, bytes] : entry.files) write_file_synced(tmp / file, bytes);
        write_file_synced(tmp / kMeta, meta.dump(2));  // last: it is what makes an entry exist
        fsync_dir(tmp);
    } catch (const std::exception& e) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        {
            std::lock_guard lock(mutex_);
            unwritable_ = true;
        }
        warn_once("unwritable",
                  fmt::format("kernel cache {} is not writable ({}); compiled kernels "
                              "are kept in memory for this run only",
                              config_.root.string(), e.what()));
        return std::nullopt;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
        if (::rename(tmp.c_str(), final_dir.c_str()) == 0) {
            fsync_dir(parent);
            return final_dir;
        }
        int err = errno;
        if (err != EEXIST && err != ENOTEMPTY) {
            std::error_code ec;
            fs::remove_all(tmp, ec);
            warn_once("rename:" + final_dir.string(),
                      fmt::format("cannot publish cache entry {} ({}); using it from memory",
                                  final_dir.string(), std::strerror(err)));
            return std::nullopt;
        }
        // Another writer got there first: use its entry when it is sound, else replace it.
        if (inspect(final_dir, &id.key, nullptr).valid) {
            std::error_code ec;
            fs::remove_all(tmp, ec);
            return final_dir;
        }
        delete_dir(final_dir);
    }
    std::error_code ec;
    fs::remove_all(tmp, ec);
    return std::nullopt;
}

void Store::delete_dir(const fs::path& dir) {
    // Rename first so no reader ever sees a half-deleted entry, then remove at leisure.
    fs::path trash =
        dir.parent_path() / fmt::format(".trash-{}-{}", dir.filename().string(), unique_suffix());
    std::error_code ec;
    if (::rename(dir.c_str(), trash.c_str()) == 0)
        fs::remove_all(trash, ec);
    else
        fs::remove_all(dir, ec);
}

void Store::remove(const EntryId& id, std::string_view reason) {
    fs::path dir = entry_dir(id);
    bool ro = config_.mode != Mode::ReadWrite;
    warn_once("damaged:" + dir.string(),
              fmt::format("cache entry {} is damaged ({}); {}", dir.string(), reason,
                          ro ? "recompiling (cache not writable: left in place)"
                             : "deleting it and recompiling"));
    if (!ro) delete_dir(dir);
}

fs::path Store::lock_path(const EntryId& id) const {
    fs::path dir = entry_dir(id);
    return dir.parent_path() / (dir.filename().string() + kLockSuffix);
}

EntryLock Store::lock(const EntryId& id, std::chrono::milliseconds timeout) {
    if (config_.mode != Mode::ReadWrite) return {};
    {
        std::lock_guard lock(mutex_);
        if (unwritable_ || no_flock_) return {};
    }
    fs::path path = lock_path(id);
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) return {};  // the publish that follows warns that the cache is not writable
    int err = 0;
    EntryLock held = EntryLock::acquire(path, timeout, &err);
    // flock's own refusals (some network file systems): locking cannot work anywhere in this
    // cache. Failing to create the file (permissions, read-only mount) is left to publish to
    // report.
    if (err == ENOLCK || err == EOPNOTSUPP || err == EINVAL || err == ENOSYS) {
        {
            std::lock_guard lock(mutex_);
            no_flock_ = true;
        }
        warn_once("flock", fmt::format("cannot lock cache entries in {} (flock: {}); processes "
                                       "that start together may compile the same kernels",
                                       config_.root.string(), std::strerror(err)));
    }
    return held;
}

std::vector<EntrySummary> Store::list(bool checksums) const {
    std::vector<EntrySummary> out;
    if (config_.root.empty()) return out;
    for (const auto& family : family_dirs(config_.root))
        for (const auto& dir : subdirs(family))
            if (!is_hidden(dir)) out.push_back(inspect(dir, nullptr, nullptr, checksums));
    return out;
}

StoreStats Store::stat() const {
    StoreStats st;
    for (const auto& e : list()) {
        st.bytes += e.bytes;
        if (!e.valid) continue;
        ++st.entries;
        fs::path rel = fs::relative(e.dir, config_.root);
        auto it = rel.begin();
        fs::path partition;
        for (int i = 0; i < 3 && it != rel.end(); ++i, ++it) partition /= *it;
        ++st.entries_per_partition[partition.string()];
    }
    return st;
}

std::vector<EntrySummary> Store::verify(bool remove_damaged) {
    std::vector<EntrySummary> damaged;
    for (auto& e : list(true)) {
        if (e.valid) continue;
        if (remove_damaged) delete_dir(e.dir);
        damaged.push_back(std::move(e));
    }
    return damaged;
}

PruneResult Store::prune(uint64_t max_bytes) {
    PruneResult r;
    if (config_.root.empty()) return r;
    // Abandoned temp dirs of crashed writers, leftover trash, and lock files nobody holds (left by
    // a holder that was killed; removing them is safe, see entry_lock.h).
    int64_t now = now_seconds();
    for (const auto& family : family_dirs(config_.root)) {
        for (const auto& lock_file : lock_files(family)) EntryLock::remove_if_unheld(lock_file);
        for (const auto& dir : subdirs(family)) {
            std::string n = dir.filename().string();
            bool trash = n.starts_with(".trash-");
            bool stale_tmp = n.starts_with(".tmp-") && now - mtime_seconds(dir) > kAbandonedTempAge;
            if (trash || stale_tmp) {
                std::error_code ec;
                fs::remove_all(dir, ec);
            }
        }
    }
    std::vector<EntrySummary> entries = list();
    // Damaged entries go first, then least recently used.
    std::sort(entries.begin(), entries.end(), [](const EntrySummary& a, const EntrySummary& b) {
        if (a.valid != b.valid) return !a.valid;
        return a.last_used < b.last_used;
    });
    uint64_t total = 0;
    for (const auto& e : entries) total += e.bytes;
    for (const auto& e : entries) {
        bool over = max_bytes > 0 && total > max_bytes;
        if (e.valid && !over) break;
        delete_dir(e.dir);
        ++r.removed;
        r.freed_bytes += e.bytes;
        total -= e.bytes;
    }
    r.remaining_bytes = total;
    return r;
}

size_t Store::clear() {
    size_t n = 0;
    for (const auto& e : list()) {
        delete_dir(e.dir);
        ++n;
    }
    std::error_code ec;
    for (const auto& v : subdirs(config_.root)) {
        std::string name = v.filename().string();
        if (name.size() >= 2 && name[0] == 'v' &&
            std::all_of(name.begin() + 1, name.end(), ::isdigit))
            fs::remove_all(v, ec);
    }
    return n;
}

}  // namespace gj::cache
