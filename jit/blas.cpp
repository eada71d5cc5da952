#include "jit/blas.h"

#include <cublas_api.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

#include "jit/device.h"

namespace gj::jit {

// The few entry points used, typed by the header's own declarations (nothing is linked).
struct Blas::Api {
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasSetStream_v2) set_stream = nullptr;
    decltype(&cublasGetVersion_v2) get_version = nullptr;
    // cublasGemmEx is overloaded in C++ (a cudaDataType compute-type form), so spelled out.
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void*, const void*, cudaDataType, int, const void*,
                              cudaDataType, int, const void*, void*, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
    decltype(&cublasGetStatusString) status_string = nullptr;
    decltype(&cublasSetSmCountTarget) set_sm_target = nullptr;  // optional (cuBLAS 11.3+)
};

namespace {

std::string status_text(decltype(&cublasGetStatusString) status_string, cublasStatus_t s) {
    const char* text = status_string ? status_string(s) : nullptr;
    return text ? std::string(text) : fmt::format("cuBLAS status {}", int(s));
}

}  // namespace

Blas* Blas::get(std::string* why) {
    static std::once_flag once;
    static Blas* instance = nullptr;
    static std::string failure;
    std::call_once(once, [] {
        void* lib = nullptr;
        for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"})
            if ((lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
        if (!lib) {
            failure = "cuBLAS not found (libcublas.so.13/.12 not on the library path)";
            return;
        }
        auto api = std::make_unique<Api>();
        bool ok = true;
        auto sym = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
            if (!fn) {
                failure = fmt::format("cuBLAS lacks {}", name);
                ok = false;
            }
        };
        sym(api->create, "cublasCreate_v2");
        sym(api->set_stream, "cublasSetStream_v2");
        sym(api->get_version, "cublasGetVersion_v2");
        sym(api->gemm_ex, "cublasGemmEx");
        sym(api->status_string, "cublasGetStatusString");
        if (!ok) return;
        api->set_sm_target = reinterpret_cast<decltype(&cublasSetSmCountTarget)>(
            ::dlsym(lib, "cublasSetSmCountTarget"));
        Device::get().make_current();  // the handle binds to the current (primary) context
        cublasHandle_t handle = nullptr;
        if (const cublasStatus_t s = api->create(&handle); s != CUBLAS_STATUS_SUCCESS) {
            failure = "cublasCreate: " + status_text(api->status_string, s);
            return;
        }
        auto* blas = new Blas();  // lives for the process, like the driver table
        blas->api_ = api.release();
        blas->handle_ = handle;
        blas->api_->get_version(handle, &blas->version_);
        instance = blas;
    });
    if (!instance && why) *why = failure;
    return instance;
}

void Blas::gemm(CUstream stream, BlasType t, int m, int n, int k, CUdeviceptr w, CUdeviceptr x,
                CUdeviceptr y, int sm_target) {
    auto handle = static_cast<cublasHandle_t>(handle_);
    cublasStatus_t s = api_->set_stream(handle, reinterpret_cast<cudaStream_t>(stream));
    if (s == CUBLAS_STATUS_SUCCESS && api_->set_sm_target && sm_target != sm_target_) {
        s = api_->set_sm_target(handle, sm_target);
        if (s == CUBLAS_STATUS_SUCCESS) sm_target_ = sm_target;
    }
    const cudaDataType in = t == BlasType::F32   ? CUDA_R_32F
                            : t == BlasType::F16 ? CUDA_R_16F
                                                 : CUDA_R_16BF;
    const float one = 1.0f, zero = 0.0f;
    // Column-major view: y^T (m x n) = w (k x m, transposed) . x^T (k x n). F32 matrices use the
    // TF32 tensor cores (inputs rounded to 10-bit mantissas, fp32 accumulation): F16/BF16
    // products round their activations at least as much, and plain fp32 SIMT runs these narrow
    // prefill shapes (PLE gate and projection, n = 256) at a few percent of the tensor rate.
    if (s == CUBLAS_STATUS_SUCCESS)
        s = api_->gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one,
                          reinterpret_cast<const void*>(w), in, k, reinterpret_cast<const void*>(x),
                          in, k, &zero, reinterpret_cast<void*>(y), CUDA_R_32F, m,
                          t == BlasType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        throw DeviceError(fmt::format("cublasGemmEx ({}x{}x{}): {}", m, n, k,
                                      status_text(api_->status_string, s)));
}

bool Blas::sm_target_supported() const {
    return api_->set_sm_target != nullptr;
}

}  // namespace gj::jit
