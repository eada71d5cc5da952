#include "engine/gguf/partial_cleanup.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>

namespace gj::gguf {

namespace {

// A fixed table the handler can walk without locks or allocation: a slot is claimed (`used`),
// its path copied, then published (`ready`); the handler only reads published paths.
constexpr int kSlots = 16;
struct Slot {
    std::atomic<bool> used{false}, ready{false};
    char path[PATH_MAX];
};
Slot g_slots[kSlots];

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

void remove_partials_and_reraise(int sig) {
    for (Slot& s : g_slots)
        if (s.ready.load(std::memory_order_acquire)) ::unlink(s.path);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

void install_handlers() {
    for (int sig : kSignals) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL ||
            (old.sa_flags & SA_SIGINFO))
            continue;
        struct sigaction sa {};
        sa.sa_handler = remove_partials_and_reraise;
        ::sigemptyset(&sa.sa_mask);
        for (int other : kSignals) ::sigaddset(&sa.sa_mask, other);
        ::sigaction(sig, &sa, nullptr);
    }
}

}  // namespace

int register_partial_file(const char* path) noexcept {
    static std::once_flag installed;
    try {
        std::call_once(installed, install_handlers);
    } catch (...) {
        return -1;
    }
    const size_t n = std::strlen(path);
    if (n >= PATH_MAX) return -1;
    for (int i = 0; i < kSlots; ++i) {
        bool expected = false;
        if (!g_slots[i].used.compare_exchange_strong(expected, true)) continue;
        std::memcpy(g_slots[i].path, path, n + 1);
        g_slots[i].ready.store(true, std::memory_order_release);
        return i;
    }
    return -1;
}

void unregister_partial_file(int registration) noexcept {
    if (registration < 0 || registration >= kSlots) return;
    g_slots[registration].ready.store(false, std::memory_order_release);
    g_slots[registration].used.store(false, std::memory_order_release);
}

}  // namespace gj::gguf
