// The processes of a tensor-parallel run without any GPU (engine/gpu/tensor_parallel.h): the
// worker processes RankGroup forks, the command stream from rank 0 to them (the server's mirrored
// session calls), a worker's failure reported by finish() with its rank and exit status, a worker
// that dies while rank 0 still runs ending rank 0 (which would otherwise wait in a collective
// forever), and the rank count checked.
//
// Every group is made in a forked child of the test process, so that what a worker process does
// after returning from the RankGroup constructor (it runs the same code as rank 0) never reaches
// gtest.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/gpu/tensor_parallel.h"
#include "tests/support/test_env.h"

using gj::gemma4::RankGroup;

using gj::test::run_in_child;

TEST(RankGroup, RankCountOutsideOneToEightIsAnError) {
    EXPECT_THROW(RankGroup(0), std::invalid_argument);
    EXPECT_THROW(RankGroup(9), std::invalid_argument);
    RankGroup one(1);  // no processes
    EXPECT_EQ(one.rank(), 0);
    EXPECT_TRUE(one.leader());
    one.finish();
}

// Rank 0 sends three records to two workers; each worker checks them in order and exits 0 at the
// end of the stream; finish() sees every worker succeed.
TEST(RankGroup, WorkersReceiveRankZerosRecordsInOrder) {
    const int status = run_in_child([] {
        RankGroup group(3);
        const std::vector<std::vector<int32_t>> sent = {{1, 2, 3}, {}, {7, -1, 1 << 30, 42}};
        if (!group.leader()) {
            std::vector<int32_t> r;
            for (const auto& want : sent)
                if (!group.receive(r) || r != want) return 10 + group.rank();
            return group.receive(r) ? 20 + group.rank() : 0;  // the stream ended
        }
        for (const auto& r : sent) group.send(r);
        group.finish();
        return 0;
    });
    EXPECT_EQ(status, 0);
}

// A worker that fails is named by finish(), with its exit status.
TEST(RankGroup, FinishNamesTheWorkerThatFailed) {
    const int status = run_in_child([] {
        RankGroup group(3);
        if (group.rank() == 2) ::_exit(5);
        if (!group.leader()) {
            std::vector<int32_t> r;
            while (group.receive(r)) {
            }
            return 0;
        }
        try {
            group.finish();
        } catch (const std::runtime_error& e) {
            const std::string what = e.what();
            return what.find("rank 2 (exit status 5)") != std::string::npos &&
                           what.find("rank 1") == std::string::npos
                       ? 0
                       : 40;
        }
        return 41;  // no error
    });
    EXPECT_EQ(status, 0);
}

// A worker that dies while rank 0 is still busy (e.g. waiting in a collective) ends rank 0 with
// exit status 1 after a short grace period, instead of leaving it waiting forever.
TEST(RankGroup, AWorkerDyingMidRunEndsRankZero) {
    const auto t0 = std::chrono::steady_clock::now();
    const int status = run_in_child([] {
        RankGroup group(2);
        if (!group.leader()) ::_exit(7);
        std::this_thread::sleep_for(std::chrono::seconds(30));  // "stuck in a collective"
        return 0;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(status, 1);
    EXPECT_LT(s, 20.0);
}
