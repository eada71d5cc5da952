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

bool is_lower_hex(std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_digits(std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What the file type of `p` itself is (a symbolic link is a link, never what it points to).
fs::file_type own_type(const fs::path& p) {
    std::error_code ec;
    fs::file_status st = fs::symlink_status(p, ec);
    return ec ? fs::file_type::not_found : st.type();
}

// Real subfolders only: a symbolic link to a folder is never walked into, so upkeep cannot reach
// outside the root through one.
std::vector<fs::path> subdirs(const fs::path& dir) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code ec2;
        if (it->symlink_status(ec2).type() == fs::file_type::directory && !ec2)
            out.push_back(it->path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

bool is_version_dir_name(const std::string& n) {
    return n.size() >= 2 && n[0] == 'v' && is_digits(std::string_view(n).substr(1));
}

// The family directories of every partition: <root>/v*/<arch>/<compiler>/<family>.
std::vector<fs::path> family_dirs(const fs::path& root) {
    std::vector<fs::path> out;
    for (const auto& v : subdirs(root)) {
        if (!is_version_dir_name(v.filename().string())) continue;
        for (const auto& arch : subdirs(v))
            for (const auto& compiler : subdirs(arch))
                for (const auto& family : subdirs(compiler))
                    if (!is_hidden(family)) out.push_back(family);
    }
    return out;
}

// Whether a folder holds regular files only, as every folder the store writes does (entries and
// their temp and trash forms). One with a subfolder, link or special file is someone else's.
bool holds_only_files(const fs::path& dir) {
    std::error_code ec;
    fs::directory_iterator it(dir, ec), end;
    if (ec) return false;
    for (; it != end; it.increment(ec)) {
        if (ec) return false;
        std::error_code ec2;
        if (it->symlink_status(ec2).type() != fs::file_type::regular || ec2) return false;
    }
    return !ec;
}

// Removes the regular files in `dir`, then `dir` itself when that emptied it: never a subfolder or
// anything a link points to. True when `dir` is gone.
bool remove_files_then_dir(const fs::path& dir) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        std::error_code ec2;
        if (it->symlink_status(ec2).type() == fs::file_type::regular && !ec2)
            files.push_back(it->path());
    }
    for (const auto& f : files) fs::remove(f, ec);
    fs::remove(dir, ec);  // fails, leaving it, when anything else is inside
    return own_type(dir) == fs::file_type::not_found;
}

// `<prefix><entry name>-<pid>-<12 hex>`: a temp (".tmp-") or trash (".trash-") folder the store
// made for an entry (unique_suffix()).
bool is_work_dir_name(std::string_view n, std::string_view prefix) {
    if (!n.starts_with(prefix)) return false;
    n.remove_prefix(prefix.size());
    size_t dash = n.rfind('-');
    if (dash == std::string_view::npos || n.size() - dash - 1 != 12 ||
        !is_lower_hex(n.substr(dash + 1)))
        return false;
    n = n.substr(0, dash);
    dash = n.rfind('-');
    if (dash == std::string_view::npos || !is_digits(n.substr(dash + 1))) return false;
    return is_entry_name(n.substr(0, dash));
}

// The lock files in a family directory (entry_lock.h): empty regular files named
// `<entry name>.lock`.
std::vector<fs::path> lock_files(const fs::path& family) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(family, ec), end; !ec && it != end; it.increment(ec)) {
        std::string n = it->path().filename().string();
        std::string_view stem(n);
        if (!stem.ends_with(kLockSuffix)) continue;
        stem.remove_suffix(std::strlen(kLockSuffix));
        std::error_code ec2, ec3;
        if (is_entry_name(stem) && it->symlink_status(ec2).type() == fs::file_type::regular &&
            !ec2 && it->file_size(ec3) == 0 && !ec3)
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

bool is_entry_name(std::string_view name) {
    constexpr size_t kKeyChars = 16;
    if (name.size() < kKeyChars + 2 || name[name.size() - kKeyChars - 1] != '-') return false;
    if (!is_lower_hex(name.substr(name.size() - kKeyChars))) return false;
    std::string_view spec = name.substr(0, name.size() - kKeyChars - 1);
    return !spec.starts_with(".") && std::all_of(spec.begin(), spec.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '.' || c == '-';
    });
}

std::optional<std::string> read_file(const fs::path& path) {
    // One allocation of the file's size and plain reads: a warm start reads every payload of the
    // plan (megabytes), and a stream that grows by doubling copies and faults it in several times.
    // Only a regular file the store wrote: a FIFO or device put in an entry's place would block
    // the open or the reads (a load that never returns), or read without end, and a link points
    // at something the store did not write. O_NONBLOCK keeps the open itself from waiting.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) return std::nullopt;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return std::nullopt;
    }
    std::string bytes;
    if (st.st_size > 0) bytes.resize(static_cast<size_t>(st.st_size));
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
    // The stamps the store writes: anything but an integer was not written by it.
    for (const char* stamp : {"created", "last_used"})
        if (meta.contains(stamp) && !meta[stamp].is_number_integer()) {
            s.problem = fmt::format("meta.json field {} is not an integer", stamp);
            return s;
        }
    if (meta.contains("last_used")) s.last_used = meta["last_used"].get<int64_t>();
    if (expected_key && meta["key"].get<std::string>() != *expected_key) {
        s.problem = "meta.json belongs to another key";
        return s;
    }
    if (config_.check_meta) {
        std::string problem;
        try {
            problem = config_.check_meta(meta);
        } catch (const std::exception& e) {  // a checker that trips over a field faults it too
            problem = e.what();
        }
        if (!problem.empty()) {
            s.problem = "meta.json " + problem;
            return s;
        }
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
                s.problem = file + " is missing or not a regular file";
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
            s.problem = file + " is missing or not a regular file";
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
    if (!enabled() || !is_entry_name(id.relative_dir().filename().string())) return Lookup::Missing;
    fs::path dir = entry_dir(id);
    std::error_code ec;
    if (!fs::exists(dir, ec)) return Lookup::Missing;
    return inspect(dir, &id.key, nullptr).valid ? Lookup::Hit : Lookup::Damaged;
}

std::optional<Entry> Store::load(const EntryId& id) {
    // An id that cannot name an entry finds none: its folder, if any, is not the store's.
    if (!enabled() || !is_entry_name(id.relative_dir().filename().string())) return std::nullopt;
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

void Store::tag_root() {
    {
        std::lock_guard lock(mutex_);
        if (tagged_) return;
        tagged_ = true;
    }
    fs::path tag = config_.root / kCacheDirTag;
    if (own_type(tag) != fs::file_type::not_found) return;
    // Temp file + rename: a reader never sees half a tag. Failing only costs backups the skip.
    fs::path tmp = config_.root / fmt::format(".{}.tmp-{}", kCacheDirTag, unique_suffix());
    try {
        write_file_synced(
            tmp,
            "Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This file is a cache directory tag created by gemmajit (kernel cache).\n"
            "# For information about cache directory tags, see https://bford.info/cachedir/\n");
        fs::rename(tmp, tag);
    } catch (const std::exception&) {
        std::error_code ec;
        fs::remove(tmp, ec);
    }
}

std::optional<fs::path> Store::publish(const EntryId& id, const Entry& entry) {
    if (config_.mode != Mode::ReadWrite) return std::nullopt;
    // Upkeep recognizes entries by their folder's name; one it would not recognize must not be
    // written, or it would never be pruned.
    if (!is_entry_name(id.relative_dir().filename().string()))
        throw std::invalid_argument(
            fmt::format("cache entry id {} is not valid: its folder name must be <name>-<16 "
                        "lowercase hex> with a name of [A-Za-z0-9_.-] not starting with '.'",
                        id.relative_dir().string()));
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
        tag_root();
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

bool Store::delete_dir(const fs::path& dir) {
    fs::file_type type = own_type(dir);
    if (type == fs::file_type::not_found) return true;
    if (type != fs::file_type::directory || !is_entry_name(dir.filename().string()) ||
        !holds_only_files(dir)) {
        warn_once("foreign:" + dir.string(),
                  fmt::format("{} is left in place: it has a cache entry's name but holds a "
                              "folder, link or special file, which the kernel cache never writes",
                              dir.string()));
        return false;
    }
    // Rename first so no reader ever sees a half-deleted entry, then remove at leisure.
    fs::path trash =
        dir.parent_path() / fmt::format(".trash-{}-{}", dir.filename().string(), unique_suffix());
    if (::rename(dir.c_str(), trash.c_str()) == 0) {
        remove_files_then_dir(trash);  // a folder someone put in meanwhile stays, in the trash
        return true;
    }
    return remove_files_then_dir(dir);
}

void Store::remove(const EntryId& id, std::string_view reason) {
    fs::path dir = entry_dir(id);
    if (!is_entry_name(dir.filename().string())) return;  // not an entry the store could write
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
    // Only folders named and made as the store makes entries: anything else is not the cache's,
    // so it is neither counted nor ever deleted.
    for (const auto& family : family_dirs(config_.root))
        for (const auto& dir : subdirs(family))
            if (is_entry_name(dir.filename().string()) && holds_only_files(dir))
                out.push_back(inspect(dir, nullptr, nullptr, checksums));
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

void Store::remove_leftovers(const fs::path& family, bool all_temps) {
    // Lock files nobody holds (left by a holder that was killed; removing them is safe, see
    // entry_lock.h), leftover trash, and temp dirs of crashed writers (all of them for `clear`,
    // which may cost a writer publishing at that moment its publish, as clearing always could).
    int64_t now = now_seconds();
    for (const auto& lock_file : lock_files(family)) EntryLock::remove_if_unheld(lock_file);
    for (const auto& dir : subdirs(family)) {
        std::string n = dir.filename().string();
        bool trash = is_work_dir_name(n, ".trash-");
        bool tmp = is_work_dir_name(n, ".tmp-") &&
                   (all_temps || now - mtime_seconds(dir) > kAbandonedTempAge);
        if ((trash || tmp) && holds_only_files(dir)) remove_files_then_dir(dir);
    }
}

PruneResult Store::prune(uint64_t max_bytes) {
    PruneResult r;
    if (config_.root.empty() || config_.mode != Mode::ReadWrite) return r;
    for (const auto& family : family_dirs(config_.root)) remove_leftovers(family, false);
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
        if (!delete_dir(e.dir)) continue;
        ++r.removed;
        r.freed_bytes += e.bytes;
        total -= e.bytes;
    }
    r.remaining_bytes = total;
    return r;
}

size_t Store::clear() {
    if (config_.root.empty() || config_.mode != Mode::ReadWrite) return 0;
    size_t n = 0;
    std::set<fs::path> families;
    for (const auto& e : list()) {
        if (delete_dir(e.dir)) ++n;
        families.insert(e.dir.parent_path());
    }
    for (const auto& family : family_dirs(config_.root)) remove_leftovers(family, true);
    // The partition folders that held entries, each once it is empty (fs::remove never removes a
    // folder with anything in it): <family>, <compiler>, <arch>, v<abi>.
    for (const auto& family : families) {
        fs::path dir = family;
        for (int level = 0; level < 4 && dir != config_.root; ++level, dir = dir.parent_path()) {
            std::error_code ec;
            if (!fs::remove(dir, ec)) break;
        }
    }
    return n;
}

}  // namespace gj::cache
