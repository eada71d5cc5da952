#include "cache/entry_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>

namespace fs = std::filesystem;

namespace gj::cache {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kFirstPoll{5};
constexpr milliseconds kLongestPoll{100};
// Each restart means some holder released meanwhile, so this bound is never reached in practice;
// it only keeps a pathological file system from looping forever.
constexpr int kMaxRestarts = 1000;

// Whether `fd` is the file now at `path`: false once a releaser has unlinked (or replaced) it.
bool still_at_path(int fd, const fs::path& path) {
    struct stat opened {
    }, named{};
    if (::fstat(fd, &opened) != 0 || ::stat(path.c_str(), &named) != 0) return false;
    return opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
}

// flock without waiting: 0 locked, EWOULDBLOCK held by another, else why locking cannot work.
int try_flock(int fd) {
    for (;;) {
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
        if (errno != EINTR) return errno == EAGAIN ? EWOULDBLOCK : errno;
    }
}

}  // namespace

EntryLock::EntryLock(EntryLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      state_(std::exchange(other.state_, State::Unavailable)),
      waited_(other.waited_) {}

EntryLock& EntryLock::operator=(EntryLock&& other) noexcept {
    if (this != &other) {
        release();
        fd_ = std::exchange(other.fd_, -1);
        path_ = std::move(other.path_);
        state_ = std::exchange(other.state_, State::Unavailable);
        waited_ = other.waited_;
    }
    return *this;
}

EntryLock::~EntryLock() {
    release();
}

EntryLock EntryLock::acquire(const fs::path& path, milliseconds timeout, int* error) {
    EntryLock lock;
    lock.path_ = path;
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    milliseconds poll = kFirstPoll;
    for (int restart = 0; restart < kMaxRestarts; ++restart) {
        int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            if (error) *error = errno;
            return lock;  // Unavailable
        }
        int err;
        while ((err = try_flock(fd)) == EWOULDBLOCK) {
            const auto now = Clock::now();
            if (now >= deadline) break;
            std::this_thread::sleep_for(std::min<Clock::duration>(poll, deadline - now));
            poll = std::min(poll * 2, kLongestPoll);
        }
        lock.waited_ = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
        if (err != 0) {
            ::close(fd);
            if (err == EWOULDBLOCK) {
                lock.state_ = State::Busy;
            } else if (error) {
                *error = err;  // ENOLCK, EOPNOTSUPP, EINVAL: a file system without flock
            }
            return lock;
        }
        if (still_at_path(fd, path)) {
            lock.fd_ = fd;
            lock.state_ = State::Held;
            return lock;
        }
        // We locked a file its holder unlinked on release: the path is free (or has a new file).
        ::close(fd);
    }
    lock.state_ = State::Busy;
    return lock;
}

bool EntryLock::remove_if_unheld(const fs::path& path) {
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return false;
    bool removed = false;
    if (try_flock(fd) == 0 && still_at_path(fd, path)) removed = ::unlink(path.c_str()) == 0;
    ::close(fd);
    return removed;
}

void EntryLock::release() {
    if (fd_ >= 0) {
        // Unlink while still holding it; an acquirer that locks the unlinked file notices and
        // starts over. Only our own file is unlinked (a `cache clear` may have replaced it).
        if (state_ == State::Held && still_at_path(fd_, path_)) ::unlink(path_.c_str());
        ::close(fd_);
        fd_ = -1;
    }
    state_ = State::Unavailable;
}

}  // namespace gj::cache
