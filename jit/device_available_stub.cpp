// Temporary: replaced by jit/cuda_driver.cpp (dlopen table) in the JIT-core work.
#include "jit/device.h"
namespace gj::jit {
bool device_available(std::string* why) {
    if (why) *why = "the Driver API table is not implemented yet";
    return false;
}
}  // namespace gj::jit
