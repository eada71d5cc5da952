#include "engine/base/thread_pool.h"

namespace gj {

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& w : workers_) w.join();
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
