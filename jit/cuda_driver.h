// The CUDA Driver API, reached through a table filled at run time: dlopen("libcuda.so.1"), then
// cuGetProcAddress (the CUDA 12+ _v2 entry) for every function. Each function is requested at an
// explicit ABI version whose prototype (cudaTypedefs.h PFN_<name>_v<version>) is checked at
// compile time against the one cuda.h declares: asking for "the headers' CUDA_VERSION" is not
// enough, because a header may keep an old prototype under a name whose newest ABI changed
// (CUDA 13: cuCtxSynchronize() vs the 13000 ABI cuCtxSynchronize(CUcontext)).
// Nothing links libcuda, so the binary and every CPU-only command run where no driver exists.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace gj::jit {

// X(name, ABI version): legacy-default-stream variants, each the prototype cuda.h declares for
// `name` (checked by static_assert in cuda_driver.cpp).
// clang-format off
#define GJ_DRIVER_FUNCTIONS(X) \
    X(cuGetErrorName, 6000) \
    X(cuGetErrorString, 6000) \
    X(cuInit, 2000) \
    X(cuDriverGetVersion, 2020) \
    X(cuDeviceGet, 2000) \
    X(cuDeviceGetCount, 2000) \
    X(cuDeviceGetName, 2000) \
    X(cuDeviceGetAttribute, 2000) \
    X(cuDeviceTotalMem, 3020) \
    X(cuDevicePrimaryCtxRetain, 7000) \
    X(cuDevicePrimaryCtxRelease, 11000) \
    X(cuCtxSetCurrent, 4000) \
    X(cuCtxSynchronize, 2000) \
    X(cuMemAlloc, 3020) \
    X(cuMemFree, 3020) \
    X(cuMemcpyHtoDAsync, 3020) \
    X(cuMemcpyDtoHAsync, 3020) \
    X(cuMemcpyDtoDAsync, 3020) \
    X(cuMemsetD8Async, 3020) \
    X(cuMemGetInfo, 3020) \
    X(cuMemAllocHost, 3020) \
    X(cuMemFreeHost, 2000) \
    X(cuStreamCreate, 2000) \
    X(cuStreamCreateWithPriority, 5050) \
    X(cuCtxGetStreamPriorityRange, 5050) \
    X(cuStreamDestroy, 4000) \
    X(cuStreamSynchronize, 2000) \
    X(cuStreamWaitEvent, 3020) \
    X(cuEventCreate, 2000) \
    X(cuEventRecord, 2000) \
    X(cuEventSynchronize, 2000) \
    X(cuEventElapsedTime, 12080) \
    X(cuEventDestroy, 4000) \
    X(cuModuleLoadData, 2000) \
    X(cuModuleUnload, 2000) \
    X(cuModuleGetFunction, 2000) \
    X(cuFuncGetAttribute, 2020) \
    X(cuFuncSetAttribute, 9000) \
    X(cuLaunchKernel, 4000) \
    X(cuLaunchKernelEx, 11060) \
    X(cuStreamBeginCapture, 10010) \
    X(cuStreamEndCapture, 10000) \
    X(cuGraphInstantiateWithFlags, 11040) \
    X(cuGraphLaunch, 10000) \
    X(cuGraphExecDestroy, 10000) \
    X(cuGraphDestroy, 10000)
// clang-format on

struct DriverApi {
#define GJ_DRIVER_MEMBER(name, version) PFN_##name##_v##version name = nullptr;
    GJ_DRIVER_FUNCTIONS(GJ_DRIVER_MEMBER)
#undef GJ_DRIVER_MEMBER
    int driver_version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The table, loaded and cuInit'ed once per process. Throws DeviceUnavailable (one sentence)
// when the library, a function, or a device is missing.
const DriverApi& driver();
// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; works without a driver too.
std::string driver_error_text(CUresult r);
// Throws DeviceError "<what>: <error text>" when r is not CUDA_SUCCESS.
void check_driver(CUresult r, const std::string& what);

}  // namespace gj::jit
