// NCCL's device API in engine kernels: what NVRTC needs to compile a kernel template that
// includes NCCL's own device headers (nccl_device.h, NCCL 2.28+), so that a kernel of ours can
// meet the other ranks at an LSA barrier and read their symmetric windows directly (the decode
// post-norm that sums the ranks' products itself, docs/TENSOR_PARALLEL.md).
//
// The device structs those headers declare are the ABI of one NCCL release, so a kernel is
// compiled against the headers of exactly the library the process loaded (found by its
// NCCL_VERSION_CODE), and the headers' contents enter the kernel's cache key. The headers are
// written for nvcc; NVRTC needs, besides -default-device (they declare host functions without
// an execution space):
//   - the CUDA headers they include (cuda_fp16.h, libcu++'s <cuda/atomic>) by include path;
//   - small stand-ins for the C and runtime headers NVRTC does not have (stdint.h, stdbool.h,
//     limits.h, cuda.h, cuda_runtime.h: the few types and macros the device headers use);
//   - utility.h's loadConst with `if constexpr` (NVRTC rejects the zero-length arrays of its
//     untaken branches): a patched copy, included first under its own name so that the
//     original's include guard skips the original.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gj::jit {

class Flags;

// The folder holding nccl.h and nccl_device/ of NCCL release `version` (NCCL_VERSION_CODE, e.g.
// 22809) for the library file `library_file`: GEMMAJIT_NCCL_INCLUDE alone when set; else beside
// the library (<lib>/../include, <lib>/../../include: a Python wheel's, the CUDA install's,
// /usr/include for /usr/lib/<multiarch>), /usr/include, /usr/local/include, the CUDA installs'.
// nullopt, with `why` naming what was looked at, when none holds that release's device headers.
std::optional<std::string> find_nccl_device_headers(const Flags& flags,
                                                    const std::string& library_file, int version,
                                                    std::string* why);

// NCCL_VERSION_CODE as the nccl.h at `nccl_h` defines it (22809 for 2.28.9), 0 when it cannot be
// read or defines none.
int nccl_header_version(const std::string& nccl_h);

// The CUDA toolkit's include folder (cuda_fp16.h and libcu++), from CUDA_HOME / CUDA_PATH, the
// NVRTC library's install, /usr/local/cuda and /usr/local/cuda-*; empty when none is found.
std::string cuda_include_dir();

// What a compile against the NCCL headers in `nccl_include` adds: NVRTC options (include paths,
// -default-device), in-memory headers (name, text), and a line naming the headers and a digest
// of their contents, which the rendered source starts with (so that it keys the cache entry).
// Throws std::runtime_error naming the problem when the CUDA headers are missing or utility.h is
// not the form the patch knows.
struct NcclDeviceCompileInputs {
    std::vector<std::string> options;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string key_line;
};
NcclDeviceCompileInputs nccl_device_compile_inputs(const std::string& nccl_include);

}  // namespace gj::jit
