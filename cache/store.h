// The on-disk, content-addressed kernel store. Knows nothing about CUDA: an entry is a set of named
// payload files plus a meta.json, addressed by an EntryId whose key is a caller-computed hash.
//
// Layout: <root>/v<abi>/<arch>/<compiler>/<family>/<name>-<key16>/{payload files, meta.json}
// Publishing writes a temp dir next to the final one, fsyncs, then renames it into place, so a
// reader (who takes no lock) sees either no entry or a complete one. A writer that misses may first
// take the entry's advisory lock (entry_lock.h), so that other processes wait for its publish
// instead of compiling the same entry; nothing depends on that lock for correctness. An entry whose
// meta.json is missing or invalid does not exist; one whose payload fails its checksum is deleted
// with a warning.
//
// Upkeep (prune, verify, clear, damage repair) only ever deletes what the store itself writes, as
// the root may be shared with or mistyped onto other files: entry folders named
// `<name>-<16 lowercase hex>` that hold nothing but files (the store never writes a folder inside
// an entry), its own `.tmp-`/`.trash-` folders of entries, and empty `<entry>.lock` files. Anything
// else under the root is left alone, and `clear` removes entries and the folders they emptied,
// never whole trees. The root gets a CACHEDIR.TAG (bford.info/cachedir) on the first publish so
// that backup tools skip it; caches made before it are read and maintained as before.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cache/entry_lock.h"

namespace gj::cache {

enum class Mode { ReadWrite, ReadOnly, Off };

using WarningSink = std::function<void(const std::string&)>;

struct StoreConfig {
    std::filesystem::path root;
    Mode mode = Mode::ReadWrite;
    uint64_t max_bytes = 0;  // 0: no cap
    WarningSink warn;        // receives each warning once (nullptr: stderr)
    // The caller's own meta.json fields, checked on every inspection: what is wrong with them
    // (empty: nothing). An entry it faults is damaged like one that fails a checksum (deleted and
    // rebuilt, counted by verify). nullptr: not checked.
    std::function<std::string(const nlohmann::json& meta)> check_meta = nullptr;
};

struct EntryId {
    int abi = 0;
    std::string arch;      // "sm_90a"
    std::string compiler;  // "nvrtc-13.0.88"
    std::string family;
    std::string name;  // readable spec name
    std::string key;   // lowercase hex digest, at least 16 characters
    std::filesystem::path relative_dir() const;
};

// Whether `name` is an entry folder's name as the store writes it: `<name>-<16 lowercase hex>`,
// the name being 1+ characters of [A-Za-z0-9_.-] that do not start with '.'.
bool is_entry_name(std::string_view name);

// The Cache Directory Tagging file the store writes into its root.
inline constexpr const char* kCacheDirTag = "CACHEDIR.TAG";

struct Entry {
    std::map<std::string, std::string> files;  // payload: file name -> bytes
    // Caller's metadata. On publish the store adds "key", "payload" (size + sha256 per file),
    // "created" and "last_used" (Unix seconds); on load it is returned as stored.
    nlohmann::json meta = nlohmann::json::object();
    std::filesystem::path dir;  // where the entry lives (set by load/publish)
};

enum class Lookup { Hit, Missing, Damaged };

struct EntrySummary {
    std::filesystem::path dir;
    uint64_t bytes = 0;
    int64_t last_used = 0;
    bool valid = false;
    std::string problem;  // why it is not valid
};

struct StoreStats {
    size_t entries = 0;
    uint64_t bytes = 0;
    std::map<std::string, size_t> entries_per_partition;  // "v1/sm_90/nvrtc-13.0.88" -> count
};

struct PruneResult {
    size_t removed = 0;
    uint64_t freed_bytes = 0;
    uint64_t remaining_bytes = 0;
};

class Store {
  public:
    explicit Store(StoreConfig config);

    const StoreConfig& config() const { return config_; }
    bool enabled() const { return config_.mode != Mode::Off; }
    std::filesystem::path entry_dir(const EntryId& id) const;

    // Checks without changing anything (CLI status): Hit, Missing or Damaged.
    Lookup probe(const EntryId& id) const;
    // A verified entry, or nullopt. A damaged entry is deleted (unless read-only) with one warning.
    // A hit refreshes the entry's last_used stamp when it is older than an hour.
    std::optional<Entry> load(const EntryId& id);
    // Publishes atomically; returns the entry dir (ours, or another writer's that won the race),
    // or nullopt when nothing was written (cache off, read-only, or unwritable: warned once).
    // Throws std::invalid_argument for an id whose folder name is not is_entry_name.
    std::optional<std::filesystem::path> publish(const EntryId& id, const Entry& entry);
    // Deletes an entry that a later stage rejected (e.g. the driver refused its binary).
    void remove(const EntryId& id, std::string_view reason);

    // The advisory lock of an entry (entry_lock.h) that lets one process compile a missing entry
    // while the others wait for its publish, at most `timeout`. Taken only on a read-write cache;
    // Unavailable otherwise, when the lock file cannot be created (publish then says why), and on
    // a file system without flock (one warning, then no more attempts).
    EntryLock lock(const EntryId& id, std::chrono::milliseconds timeout);
    // `<family>/<name>-<key16>.lock`: a file beside the entry's directory, never an entry.
    std::filesystem::path lock_path(const EntryId& id) const;

    // Maintenance (the `cache` CLI).
    // Every entry under the root, all partitions. Without `checksums` only sizes are checked
    // (stat and prune walk the whole cache; verify and load hash every payload).
    std::vector<EntrySummary> list(bool checksums = false) const;
    StoreStats stat() const;
    std::vector<EntrySummary> verify(bool remove_damaged);  // returns the damaged ones
    // Deletes least recently used entries until the total is at most max_bytes; also removes
    // abandoned temp dirs and lock files nobody holds. max_bytes 0 keeps every valid entry.
    // Removes nothing unless the cache is read-write.
    PruneResult prune(uint64_t max_bytes);
    PruneResult prune_to_cap() { return prune(config_.max_bytes); }
    // Removes every entry, the leftovers prune removes, and the partition folders that held them
    // once empty; returns how many entries. Removes nothing unless the cache is read-write.
    size_t clear();

  private:
    void warn_once(const std::string& topic, const std::string& message);
    EntrySummary inspect(const std::filesystem::path& dir, const std::string* expected_key,
                         Entry* out, bool checksums = true) const;
    // Deletes an entry folder (false, with one warning, when it holds more than files).
    bool delete_dir(const std::filesystem::path& dir);
    void touch(const std::filesystem::path& dir, nlohmann::json meta);
    void tag_root();
    void remove_leftovers(const std::filesystem::path& family, bool all_temps);

    StoreConfig config_;
    std::mutex mutex_;
    std::set<std::string> warned_;
    bool unwritable_ = false;
    bool no_flock_ = false;  // the file system refused flock once: do not try again
    bool tagged_ = false;    // CACHEDIR.TAG checked (written when missing) by this store
};

// Reads a whole file; nullopt when it cannot be opened.
std::optional<std::string> read_file(const std::filesystem::path& path);
// Writes, fsyncs and closes a file; throws std::system_error naming the path.
void write_file_synced(const std::filesystem::path& path, std::string_view bytes);

}  // namespace gj::cache
