// A bound on the generation requests a server holds at once, running and queued. Each of them
// holds an HTTP thread until its reply is written, so keeping their number below the thread count
// leaves threads free for /health, /metrics and the other cheap endpoints however many clients
// pile up; a request past the bound is turned away at once instead of waiting for a thread.
#pragma once

#include <atomic>
#include <utility>

namespace gj::serve {

class InFlightLimit {
  public:
    explicit InFlightLimit(int limit) : limit_(limit) {}
    InFlightLimit(const InFlightLimit&) = delete;
    InFlightLimit& operator=(const InFlightLimit&) = delete;

    // An admitted request's place; destroying the ticket gives it back, so every way out of a
    // handler (a reply, a thrown error, a client that went away) releases it. Must not outlive
    // the limit it came from.
    class Ticket {
      public:
        Ticket() = default;  // empty: not admitted
        Ticket(Ticket&& o) noexcept : count_(std::exchange(o.count_, nullptr)) {}
        Ticket& operator=(Ticket&& o) noexcept {
            if (this != &o) {
                release();
                count_ = std::exchange(o.count_, nullptr);
            }
            return *this;
        }
        ~Ticket() { release(); }
        explicit operator bool() const { return count_ != nullptr; }

      private:
        friend class InFlightLimit;
        explicit Ticket(std::atomic<int>* count) : count_(count) {}
        void release() {
            if (count_) count_->fetch_sub(1);
            count_ = nullptr;
        }
        std::atomic<int>* count_ = nullptr;
    };

    // A ticket, or an empty one when `limit` requests are already in flight.
    Ticket try_acquire() {
        int n = count_.load();
        // A compare-exchange, not an increment checked afterwards: a burst of requests never
        // pushes the count past the limit, not even for a moment.
        while (n < limit_) {
            if (count_.compare_exchange_weak(n, n + 1)) return Ticket(&count_);
        }
        return Ticket();
    }
    int in_flight() const { return count_.load(); }
    int limit() const { return limit_; }

  private:
    const int limit_;
    std::atomic<int> count_{0};
};

}  // namespace gj::serve
