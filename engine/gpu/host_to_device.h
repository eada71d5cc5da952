// Host-to-device copies at the bus's rate, for the weight upload. A plain cuMemcpyHtoDAsync from
// the GGUF mapping is pageable: the driver stages it through its own small pinned buffer on one
// thread, taking every page fault of the mapping on the way (7.5 GB/s for an E4B on the H200).
// Here worker threads read the sources into a ring of pinned staging buffers in parallel (many
// threads take the mapping's page faults at once), and each filled buffer is copied to the
// device asynchronously while the next one fills. Memory stays flat: the ring is the only
// staging (slots x slot_bytes of pinned memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/base/thread_pool.h"
#include "engine/gpu/pinned_host.h"
#include "jit/device.h"

namespace gj::gemma4 {

class HostToDevice {
  public:
    struct Stats {
        uint64_t bytes = 0;        // copied to the device
        double fill_seconds = 0;   // reading sources into staging (the host side)
        double wait_seconds = 0;   // waiting for a slot's previous copy (the bus side)
        double total_seconds = 0;  // from construction to finish()
        int copies = 0;            // cuMemcpyHtoDAsync calls
    };

    // `pool` does the reads (borrowed; the caller's thread helps). A copy of a slot is enqueued
    // on `stream`, so work enqueued there later (a repack kernel) sees the data once flush() ran.
    HostToDevice(CUstream stream, ThreadPool& pool, size_t slot_bytes = size_t(32) << 20,
                 int slots = 4);
    ~HostToDevice();  // waits for the copies in flight (their staging is freed here)
    HostToDevice(const HostToDevice&) = delete;
    HostToDevice& operator=(const HostToDevice&) = delete;

    // Copies n bytes at src to dst. Small copies share a slot; large ones span several. The
    // copy is only queued: src must stay valid, and dst is written, after flush().
    void copy(CUdeviceptr dst, const void* src, size_t n);
    // Reads everything queued into staging and enqueues its device copies on the stream. Call it
    // before enqueuing work that reads what was copied.
    void flush();
    // flush(), then waits until every copy has reached the device.
    Stats finish();

  private:
    struct Piece {
        CUdeviceptr dst;
        const uint8_t* src;
        size_t n;
        size_t offset;  // in the slot
    };
    struct Slot {
        PinnedHost buffer;
        CUevent done = nullptr;  // recorded after the slot's last copy
        bool in_flight = false;
    };

    CUstream stream_;
    ThreadPool& pool_;
    size_t slot_bytes_;
    std::vector<Slot> slots_;
    size_t current_ = 0;  // the slot being packed
    size_t fill_ = 0;     // bytes packed into it
    std::vector<Piece> pieces_;
    Stats stats_;
    double start_ = 0;
};

}  // namespace gj::gemma4
