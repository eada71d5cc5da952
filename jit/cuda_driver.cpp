#include "jit/cuda_driver.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include <mutex>
#include <type_traits>

#include "jit/device.h"

namespace gj::jit {

namespace {

// The pointer type of every entry is exactly the prototype cuda.h declares for that name.
#define GJ_DRIVER_CHECK(name, version)                                        \
    static_assert(std::is_same_v<PFN_##name##_v##version, decltype(&::name)>, \
                  #name " v" #version " does not match the prototype in cuda.h");
GJ_DRIVER_FUNCTIONS(GJ_DRIVER_CHECK)
#undef GJ_DRIVER_CHECK

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

struct LoadResult {
    DriverApi api;
    std::string error;  // empty when usable
};

// Names the CUresult even when the table could not be filled (cuGetErrorName unavailable).
std::string error_name(const DriverApi* api, CUresult r) {
    const char* name = nullptr;
    if (api && api->cuGetErrorName && api->cuGetErrorName(r, &name) == CUDA_SUCCESS && name)
        return name;
    return fmt::format("CUresult {}", static_cast<int>(r));
}

LoadResult load_driver() {
    LoadResult out;
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* err = ::dlerror();
        out.error = fmt::format("no NVIDIA driver found ({}); this command needs a GPU",
                                err ? err : "libcuda.so.1 not found");
        return out;
    }
    auto get_proc = reinterpret_cast<GetProcAddress>(::dlsym(lib, "cuGetProcAddress_v2"));
    if (!get_proc) {
        out.error =
            "the NVIDIA driver is older than CUDA 12 (libcuda.so.1 has no "
            "cuGetProcAddress_v2); this command needs a CUDA 12 or newer driver";
        return out;
    }
    DriverApi& api = out.api;
#define GJ_DRIVER_FETCH(name, version)                                                          \
    {                                                                                           \
        void* fn = nullptr;                                                                     \
        CUdriverProcAddressQueryResult status{};                                                \
        CUresult r = get_proc(#name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status); \
        if (r != CUDA_SUCCESS || !fn || status != CU_GET_PROC_ADDRESS_SUCCESS) {                \
            out.error = fmt::format(                                                            \
                "the NVIDIA driver lacks {} (ABI {}.{}); this command needs a newer driver",    \
                #name, version / 1000, version % 1000 / 10);                                    \
            return out;                                                                         \
        }                                                                                       \
        api.name = reinterpret_cast<decltype(api.name)>(fn);                                    \
    }
    GJ_DRIVER_FUNCTIONS(GJ_DRIVER_FETCH)
#undef GJ_DRIVER_FETCH
    CUresult r = api.cuInit(0);
    if (r == CUDA_ERROR_NO_DEVICE) {
        out.error = "no CUDA device found (cuInit: CUDA_ERROR_NO_DEVICE); this command needs a GPU";
        return out;
    }
    if (r != CUDA_SUCCESS) {
        out.error = fmt::format(
            "the NVIDIA driver failed to initialize (cuInit: {}); this "
            "command needs a working GPU",
            error_name(&api, r));
        return out;
    }
    int count = 0;
    r = api.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
        out.error = "no CUDA device found (cuDeviceGetCount returned 0); this command needs a GPU";
        return out;
    }
    api.cuDriverGetVersion(&api.driver_version);
    return out;
}

const LoadResult& loaded() {
    static const LoadResult result = load_driver();
    return result;
}

}  // namespace

const DriverApi& driver() {
    const LoadResult& r = loaded();
    if (!r.error.empty()) throw DeviceUnavailable(r.error);
    return r.api;
}

bool device_available(std::string* why) {
    const LoadResult& r = loaded();
    if (why) *why = r.error;
    return r.error.empty();
}

std::string driver_error_text(CUresult r) {
    const LoadResult& l = loaded();
    const DriverApi* api = l.api.cuGetErrorName ? &l.api : nullptr;
    std::string text = error_name(api, r);
    const char* desc = nullptr;
    if (api && api->cuGetErrorString && api->cuGetErrorString(r, &desc) == CUDA_SUCCESS && desc)
        text += fmt::format(" ({})", desc);
    return text;
}

void check_driver(CUresult r, const std::string& what) {
    if (r != CUDA_SUCCESS) throw DeviceError(what + ": " + driver_error_text(r));
}

}  // namespace gj::jit
