// cuBLAS for the products whose weights are floats (F32, F16, BF16): prefill multiplies a whole
// chunk of activations by such a matrix, where a tensor-core GEMM beats the batched matvec by far.
// The library is dlopen'ed on first use (libcublas.so.13, .12 or the unversioned name), like the
// driver, so nothing links it and a machine without it still runs: available() then says why and
// the caller keeps its own kernels.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace gj::jit {

enum class BlasType { F32, F16, BF16 };

class Blas {
  public:
    // The process-wide handle on the current device's primary context, or nullptr when cuBLAS
    // cannot be loaded (`why` gets the reason). Never throws for a missing library.
    static Blas* get(std::string* why = nullptr);

    // y[n][m] = x[n][k] . w[m][k]^T (row-major; one row of y per activation row) with fp32
    // output and fp32 accumulation, on `stream`. w and x have type `t` (an F16/BF16 matrix takes
    // activations converted to its type by the caller; F32 runs on TF32 tensor cores). Throws
    // DeviceError on failure.
    // sm_target > 0: the product is planned for that many SMs (cuBLAS's SM-count target), so a
    // kernel running beside it on another stream keeps the rest; 0: the whole GPU. A cuBLAS
    // without the setting ignores it (sm_target_supported() says which).
    void gemm(CUstream stream, BlasType t, int m, int n, int k, CUdeviceptr w, CUdeviceptr x,
              CUdeviceptr y, int sm_target = 0);
    bool sm_target_supported() const;

    int version() const { return version_; }  // e.g. 130100

  private:
    Blas() = default;
    struct Api;
    Api* api_ = nullptr;
    void* handle_ = nullptr;
    int version_ = 0;
    int sm_target_ = 0;  // the handle's current SM-count target (set only when it changes)
};

}  // namespace gj::jit
