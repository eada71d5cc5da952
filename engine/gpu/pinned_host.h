// Page-locked host memory: fast async copies, and (with unified addressing, which every 64-bit
// CUDA platform has) a pointer kernels can read directly over the bus.
#pragma once

#include <cstddef>

#include "jit/device.h"

namespace gj::gemma4 {

class PinnedHost {
  public:
    PinnedHost() = default;
    explicit PinnedHost(size_t bytes);  // throws jit::DeviceError naming the size
    ~PinnedHost();
    PinnedHost(PinnedHost&& o) noexcept;
    PinnedHost& operator=(PinnedHost&& o) noexcept;

    void* data() const { return ptr_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t size() const { return bytes_; }
    // The same memory as a device address (unified addressing: the host pointer itself).
    CUdeviceptr device_ptr() const { return reinterpret_cast<CUdeviceptr>(ptr_); }

  private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace gj::gemma4
