#include "engine/gpu/pinned_host.h"

#include <fmt/format.h>

#include <utility>

#include "jit/cuda_driver.h"

namespace gj::gemma4 {

PinnedHost::PinnedHost(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    jit::Device::get().make_current();
    jit::check_driver(jit::driver().cuMemAllocHost(&ptr_, bytes),
                      fmt::format("cuMemAllocHost({} bytes of pinned host memory)", bytes));
}

PinnedHost::~PinnedHost() {
    if (ptr_) jit::driver().cuMemFreeHost(ptr_);  // nothing useful to do with an error here
}

PinnedHost::PinnedHost(PinnedHost&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
    if (this != &o) {
        if (ptr_) jit::driver().cuMemFreeHost(ptr_);
        ptr_ = std::exchange(o.ptr_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

}  // namespace gj::gemma4
