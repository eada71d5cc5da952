// The server's bound on generation requests in flight: admits up to the limit, refuses past it,
// and gives a place back on every way out (a ticket destroyed by an exception, moved, or
// assigned over), also under many threads at once.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "engine/serve/in_flight.h"
#include "tools/http_server.h"

namespace {

using gj::serve::InFlightLimit;

TEST(InFlightLimit, AdmitsUpToTheLimitAndReleasesOnDestruction) {
    InFlightLimit limit(2);
    {
        InFlightLimit::Ticket a = limit.try_acquire();
        InFlightLimit::Ticket b = limit.try_acquire();
        EXPECT_TRUE(a);
        EXPECT_TRUE(b);
        EXPECT_FALSE(limit.try_acquire());  // a refused request holds no place
        EXPECT_EQ(limit.in_flight(), 2);
    }
    EXPECT_EQ(limit.in_flight(), 0);
    EXPECT_TRUE(limit.try_acquire());
    EXPECT_EQ(limit.in_flight(), 0);  // the temporary ticket is gone already
}

TEST(InFlightLimit, AThrowingHandlerGivesItsPlaceBack) {
    InFlightLimit limit(1);
    auto handler = [&] {
        InFlightLimit::Ticket t = limit.try_acquire();
        ASSERT_TRUE(t);
        throw std::runtime_error("bad request");
    };
    EXPECT_THROW(handler(), std::runtime_error);
    EXPECT_EQ(limit.in_flight(), 0);
}

TEST(InFlightLimit, MovedTicketsReleaseOnce) {
    InFlightLimit limit(3);
    InFlightLimit::Ticket a = limit.try_acquire();
    InFlightLimit::Ticket b(std::move(a));  // what the server hands to its content provider
    EXPECT_FALSE(a);
    EXPECT_EQ(limit.in_flight(), 1);
    InFlightLimit::Ticket c = limit.try_acquire();
    b = std::move(c);  // b's place is given back, c's moves in
    EXPECT_EQ(limit.in_flight(), 1);
    b = InFlightLimit::Ticket();
    EXPECT_EQ(limit.in_flight(), 0);
}

TEST(InFlightLimit, ConcurrentRequestsNeverExceedTheLimit) {
    constexpr int kLimit = 3, kThreads = 8, kRounds = 2000;
    InFlightLimit limit(kLimit);
    std::atomic<int> holding{0}, most{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
        threads.emplace_back([&] {
            for (int r = 0; r < kRounds; ++r) {
                InFlightLimit::Ticket t = limit.try_acquire();
                if (!t) continue;
                const int now = ++holding;
                int m = most.load();
                while (now > m && !most.compare_exchange_weak(m, now)) {
                }
                std::this_thread::yield();
                --holding;
            }
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_LE(most.load(), kLimit);
    EXPECT_EQ(limit.in_flight(), 0);
}

// The server's thread pool sized from --parallel: the bound stays well above the slot count, and
// threads stay free for /health and /metrics.
TEST(InFlightLimit, DefaultHttpThreadsLeaveRoomForAQueueAndFreeThreads) {
    EXPECT_EQ(gj::tools::default_http_threads(1), 32);
    EXPECT_EQ(gj::tools::default_http_threads(6), 32);
    EXPECT_EQ(gj::tools::default_http_threads(16), 72);
    EXPECT_GT(gj::tools::kFreeHttpThreads, 0);
    for (int parallel : {1, 4, 8, 64, 256}) {
        const int bound = gj::tools::default_http_threads(parallel) - gj::tools::kFreeHttpThreads;
        EXPECT_GE(bound, 3 * parallel) << parallel;
    }
}

}  // namespace
