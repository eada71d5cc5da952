#include "engine/gpu/host_to_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "jit/cuda_driver.h"

namespace gj::gemma4 {

namespace {

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Pieces of this size are what one worker reads at a time: large enough that the per-task cost
// vanishes, small enough that a 32 MiB slot spreads over 16 threads.
constexpr size_t kReadTask = size_t(2) << 20;

}  // namespace

HostToDevice::HostToDevice(CUstream stream, ThreadPool& pool, size_t slot_bytes, int slots)
    : stream_(stream), pool_(pool), slot_bytes_(slot_bytes), slots_(size_t(std::max(slots, 2))) {
    start_ = now_seconds();
    for (Slot& s : slots_) {
        s.buffer = PinnedHost(slot_bytes_);
        jit::check_driver(jit::driver().cuEventCreate(&s.done, CU_EVENT_DISABLE_TIMING),
                          "cuEventCreate");
    }
}

HostToDevice::~HostToDevice() {
    const jit::DriverApi& api = jit::driver();
    for (Slot& s : slots_) {
        // Errors are not ours to report here (finish() reports them); the staging must not be
        // freed under a copy still reading it.
        if (s.in_flight) api.cuEventSynchronize(s.done);
        if (s.done) api.cuEventDestroy(s.done);
    }
}

void HostToDevice::copy(CUdeviceptr dst, const void* src, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(src);
    while (n > 0) {
        if (fill_ == slot_bytes_) flush();
        const size_t take = std::min(n, slot_bytes_ - fill_);
        pieces_.push_back(Piece{dst, p, take, fill_});
        fill_ += take;
        dst += take;
        p += take;
        n -= take;
    }
}

void HostToDevice::flush() {
    if (pieces_.empty()) return;
    const jit::DriverApi& api = jit::driver();
    Slot& slot = slots_[current_];
    const double t0 = now_seconds();
    if (slot.in_flight)
        jit::check_driver(api.cuEventSynchronize(slot.done), "cuEventSynchronize(upload slot)");
    const double t1 = now_seconds();

    // Read every piece into the slot, in tasks of at most kReadTask bytes over the pool.
    struct Task {
        uint8_t* to;
        const uint8_t* from;
        size_t n;
    };
    std::vector<Task> tasks;
    uint8_t* base = slot.buffer.as<uint8_t>();
    for (const Piece& piece : pieces_)
        for (size_t off = 0; off < piece.n; off += kReadTask)
            tasks.push_back(
                {base + piece.offset + off, piece.src + off, std::min(kReadTask, piece.n - off)});
    pool_.parallel_for(tasks.size(),
                       [&](size_t i) { std::memcpy(tasks[i].to, tasks[i].from, tasks[i].n); });
    const double t2 = now_seconds();

    for (const Piece& piece : pieces_) {
        jit::check_driver(api.cuMemcpyHtoDAsync(piece.dst, base + piece.offset, piece.n, stream_),
                          fmt::format("cuMemcpyHtoDAsync({} bytes from pinned staging)", piece.n));
        stats_.bytes += piece.n;
        ++stats_.copies;
    }
    jit::check_driver(api.cuEventRecord(slot.done, stream_), "cuEventRecord(upload slot)");
    slot.in_flight = true;
    stats_.wait_seconds += t1 - t0;
    stats_.fill_seconds += t2 - t1;

    pieces_.clear();
    fill_ = 0;
    current_ = (current_ + 1) % slots_.size();
}

HostToDevice::Stats HostToDevice::finish() {
    flush();
    const jit::DriverApi& api = jit::driver();
    const double t0 = now_seconds();
    for (Slot& s : slots_) {
        if (!s.in_flight) continue;
        jit::check_driver(api.cuEventSynchronize(s.done), "cuEventSynchronize(upload slot)");
        s.in_flight = false;
    }
    stats_.wait_seconds += now_seconds() - t0;
    stats_.total_seconds = now_seconds() - start_;
    return stats_;
}

}  // namespace gj::gemma4
