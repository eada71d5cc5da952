// The CUDA Driver API, reached through a table filled at run time: dlopen("libcuda.so.1"), then
// cuGetProcAddress (the CUDA 12+ _v2 entry) for every function, asking for the ABI of the
// CUDA_VERSION these headers declare, so each pointer has exactly the prototype cuda.h gives it
// (cuMemAlloc -> cuMemAlloc_v2, cuGraphInstantiate -> cuGraphInstantiateWithFlags, ...).
// Nothing links libcuda, so the binary and every CPU-only command run where no driver exists.
#pragma once

#include <cuda.h>

#include <string>

namespace gj::jit {

#define GJ_DRIVER_FUNCTIONS(X)                                                                   \
    X(cuGetErrorName)                                                                            \
    X(cuGetErrorString)                                                                          \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)        \
        X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)                  \
            X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuMemAlloc)    \
                X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync)                \
                    X(cuMemcpyDtoHAsync) X(cuMemsetD8) X(cuMemGetInfo) X(cuMemAllocHost)         \
                        X(cuMemFreeHost) X(cuStreamCreate) X(cuStreamDestroy)                    \
                            X(cuStreamSynchronize) X(cuEventCreate) X(cuEventRecord)             \
                                X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy)    \
                                    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) \
                                        X(cuFuncGetAttribute) X(cuFuncSetAttribute)              \
                                            X(cuLaunchKernel) X(cuStreamBeginCapture)            \
                                                X(cuStreamEndCapture) X(cuGraphInstantiate)      \
                                                    X(cuGraphLaunch) X(cuGraphExecDestroy)       \
                                                        X(cuGraphDestroy)

struct DriverApi {
#define GJ_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
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
