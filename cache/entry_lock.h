// An advisory, cross-process lock on one cache entry: flock(2) on a lock file beside the entry
// (`<family>/<name>-<key16>.lock`). It only saves work (one process compiles a missing entry, the
// others wait for its publish); correctness never depends on it, because a publish is an atomic
// rename that a second writer cannot tear.
//
// Lock files are removed by whoever releases them, while still holding the lock, and an acquirer
// checks after flock succeeds that the file it locked is still the one at the path (same device and
// inode); if not, a releaser unlinked it meanwhile and the acquirer starts over. So unlinking never
// lets two processes hold "the" lock of one path, and no lock file outlives its use except one left
// by a killed holder, which the kernel unlocked at its death: the next acquirer takes it over, and
// prune removes leftovers the same way (lock without waiting, unlink while holding).
#pragma once

#include <chrono>
#include <filesystem>

namespace gj::cache {

class EntryLock {
  public:
    enum class State {
        Unavailable,  // no lock: the file cannot be created or the file system has no flock
        Busy,         // another process holds it (after waiting up to the timeout)
        Held,         // ours until release() or destruction
    };

    EntryLock() = default;  // Unavailable, holds nothing
    EntryLock(EntryLock&& other) noexcept;
    EntryLock& operator=(EntryLock&& other) noexcept;
    EntryLock(const EntryLock&) = delete;
    EntryLock& operator=(const EntryLock&) = delete;
    ~EntryLock();

    // Takes the exclusive lock of `path` (created when missing; its directory must exist), waiting
    // at most `timeout` (zero: one try). Waiting polls with LOCK_NB and sleeps of 5 to 100 ms, so a
    // holder's death is noticed within 100 ms and the waiter never spins. When locking is not
    // possible, `error` (if given) receives the errno that says why.
    static EntryLock acquire(const std::filesystem::path& path, std::chrono::milliseconds timeout,
                             int* error = nullptr);
    // Removes a lock file nobody holds (locks it without waiting, unlinks it while holding);
    // returns whether it was removed.
    static bool remove_if_unheld(const std::filesystem::path& path);

    State state() const { return state_; }
    bool held() const { return state_ == State::Held; }
    // How long acquire() waited for another holder (0 when the lock was free at once).
    std::chrono::milliseconds waited() const { return waited_; }
    // Unlinks the lock file (if it is still ours) and unlocks. Idempotent.
    void release();

  private:
    int fd_ = -1;
    std::filesystem::path path_;
    State state_ = State::Unavailable;
    std::chrono::milliseconds waited_{0};
};

}  // namespace gj::cache
