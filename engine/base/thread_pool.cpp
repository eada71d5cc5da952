#include "engine/base/thread_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gj {

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads > kMaxThreads)
        throw std::invalid_argument("thread pool: " + std::to_string(n_threads) +
                                    " threads requested; at most " + std::to_string(kMaxThreads) +
                                    " are allowed");
    if (n_threads <= 0)
        n_threads = std::min(kMaxThreads, int(std::max(1u, std::thread::hardware_concurrency())));
    workers_.reserve(size_t(n_threads - 1));  // so only the thread's start can throw below
    try {
        for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::exception& e) {  // std::system_error; std::bad_alloc
        // The workers already running wait on work_cv_: they must be stopped and joined before
        // the members they use are destroyed (a joinable std::thread's destructor terminates).
        const size_t started = workers_.size();
        stop_workers();
        throw std::runtime_error(
            "thread pool: cannot start worker thread " + std::to_string(started + 1) + " of " +
            std::to_string(n_threads - 1) + ": " + e.what() + " (ask for fewer threads)");
    }
}

ThreadPool::~ThreadPool() {
    stop_workers();
}

void ThreadPool::stop_workers() noexcept {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
}

void ThreadPool::run_items() {
    for (;;) {
        size_t i;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (next_ >= n_) return;
            i = next_++;
        }
        try {
            (*fn_)(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
            next_ = n_;  // stop handing out work
        }
    }
}

void ThreadPool::worker_loop() {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            ++busy_workers_;
        }
        run_items();
        {
            std::lock_guard<std::mutex> lock(mu_);
            --busy_workers_;
        }
        done_cv_.notify_all();
    }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
    if (n == 0) return;
    if (workers_.empty() || n == 1) {
        for (size_t i = 0; i < n; ++i) fn(i);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn_ = &fn;
        n_ = n;
        next_ = 0;
        error_ = nullptr;
        ++generation_;
    }
    work_cv_.notify_all();
    run_items();
    std::exception_ptr err;
    {
        std::unique_lock<std::mutex> lock(mu_);
        // Wait until every item ran and no worker still holds a reference to fn.
        done_cv_.wait(lock, [&] { return next_ >= n_ && busy_workers_ == 0; });
        fn_ = nullptr;
        err = error_;
    }
    if (err) std::rethrow_exception(err);
}

}  // namespace gj
