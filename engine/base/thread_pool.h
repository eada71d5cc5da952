// A fixed set of worker threads running parallel_for over an index range. Used by the CPU
// reference forward (matrix rows, attention heads) and the synthetic-model writer (tensor chunks).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gj {

// The most threads a pool may have: the upper bound of GEMMAJIT_THREADS (jit/env_flags.cpp), which
// every --threads option shares. Far beyond any useful CPU count, yet low enough that a typo
// cannot exhaust the system's process limit.
inline constexpr int kMaxThreads = 1024;

class ThreadPool {
  public:
    // n_threads <= 0: one per hardware thread (at most kMaxThreads). Throws std::invalid_argument
    // for n_threads > kMaxThreads, and std::runtime_error when a worker thread cannot be started
    // (the workers already started are stopped and joined first).
    explicit ThreadPool(int n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return int(workers_.size()) + 1; }  // the caller works too

    // Calls fn(i) for every i in [0, n), spread over the workers and the calling thread, and
    // returns when all calls have finished. Indices are handed out dynamically, so fn must not
    // depend on which thread runs it. The first exception thrown by fn is rethrown here.
    // Not reentrant: fn must not call parallel_for on the same pool.
    void parallel_for(size_t n, const std::function<void(size_t)>& fn);

  private:
    void worker_loop();
    void run_items();
    void stop_workers() noexcept;  // sets stop_, wakes and joins every worker

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable work_cv_, done_cv_;
    const std::function<void(size_t)>* fn_ = nullptr;
    size_t n_ = 0, next_ = 0;
    int busy_workers_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace gj
