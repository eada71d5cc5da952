#include "jit/nccl_device.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <glob.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "cache/sha256.h"
#include "cache/store.h"
#include "jit/env_flags.h"

namespace gj::jit {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> glob_dirs(const std::string& pattern) {
    std::vector<std::string> out;
    glob_t g{};
    if (::glob(pattern.c_str(), GLOB_ONLYDIR, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    return out;
}

// The device headers the engine's kernels include (and the patch needs).
bool has_device_headers(const fs::path& dir) {
    std::error_code ec;
    return fs::is_regular_file(dir / "nccl.h", ec) &&
           fs::is_regular_file(dir / "nccl_device" / "utility.h", ec) &&
           (fs::is_regular_file(dir / "nccl_device" / "impl" / "lsa_barrier__funcs.h", ec) ||
            fs::is_regular_file(dir / "nccl_device" / "impl" / "mem_barrier__funcs.h", ec)) &&
           fs::is_regular_file(dir / "nccl_device" / "impl" / "core__funcs.h", ec);
}

// Stand-ins for the headers NVRTC lacks: only what nccl.h and nccl_device/ use on the device.
constexpr const char* kStdint = R"(#pragma once
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long intptr_t;
typedef unsigned long long uintptr_t;
)";
// Spelled as libcu++ spells them, which defines them again (identical redefinitions are legal).
constexpr const char* kLimits = R"(#pragma once
#define INT_MAX   0x7fffffff
#define INT_MIN   (-INT_MAX - 1)
#define UINT_MAX  0xffffffff
#define LLONG_MAX  0x7fffffffffffffffLL
)";
// nccl.h declares host functions; with __host__ empty (and -default-device) they become device
// declarations nothing calls.
constexpr const char* kCudaRuntime = R"(#pragma once
typedef struct CUstream_st* cudaStream_t;
#undef __host__
#define __host__
)";
constexpr const char* kEmpty = "#pragma once\n";

}  // namespace

int nccl_header_version(const std::string& nccl_h) {
    const auto text = cache::read_file(nccl_h);
    if (!text) return 0;
    static const std::regex re(R"(#define\s+NCCL_VERSION_CODE\s+(\d+))");
    std::smatch m;
    return std::regex_search(*text, m, re) ? std::atoi(m[1].str().c_str()) : 0;
}

std::optional<std::string> find_nccl_device_headers(const Flags& flags,
                                                    const std::string& library_file, int version,
                                                    std::string* why) {
    std::vector<fs::path> dirs;
    const std::string& given = flags.get_string("GEMMAJIT_NCCL_INCLUDE");
    if (!given.empty()) {
        dirs.emplace_back(given);
    } else {
        const fs::path lib = fs::path(library_file).parent_path();
        if (!lib.empty()) {
            dirs.push_back(lib / ".." / "include");
            dirs.push_back(lib / ".." / ".." / "include");
        }
        for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
            if (const char* root = std::getenv(var); root && *root)
                dirs.push_back(fs::path(root) / "include");
        dirs.emplace_back("/usr/include");
        dirs.emplace_back("/usr/local/include");
        dirs.emplace_back("/usr/local/cuda/include");
        for (const auto& d : glob_dirs("/usr/local/cuda-*/include")) dirs.emplace_back(d);
    }
    std::string looked;
    for (const fs::path& d : dirs) {
        std::error_code ec;
        const fs::path dir = fs::weakly_canonical(d, ec);
        const std::string name = ec ? d.string() : dir.string();
        if (!fs::is_regular_file(dir / "nccl.h", ec)) {
            looked += fmt::format("{}{} (no nccl.h)", looked.empty() ? "" : "; ", name);
            continue;
        }
        const int v = nccl_header_version((dir / "nccl.h").string());
        if (v != version) {
            looked += fmt::format("{}{} (NCCL {})", looked.empty() ? "" : "; ", name, v);
            continue;
        }
        if (!has_device_headers(dir)) {
            looked += fmt::format("{}{} (no nccl_device/)", looked.empty() ? "" : "; ", name);
            continue;
        }
        return name;
    }
    if (why)
        *why = fmt::format("no device headers of NCCL {} (the library at {}); looked in {}",
                           version, library_file, looked.empty() ? "nothing" : looked);
    return std::nullopt;
}

std::string cuda_include_dir() {
    // NVRTC's own install first: its libcu++ is the one it was released with.
    std::vector<fs::path> dirs;
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) && info.dli_fname) {
        const fs::path lib = fs::path(info.dli_fname).parent_path();
        dirs.push_back(lib / ".." / "include");
        dirs.push_back(lib / ".." / ".." / "include");
    }
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
        if (const char* root = std::getenv(var); root && *root)
            dirs.push_back(fs::path(root) / "include");
    dirs.emplace_back("/usr/local/cuda/include");
    for (const auto& d : glob_dirs("/usr/local/cuda-*/include")) dirs.emplace_back(d);
    for (const fs::path& d : dirs) {
        std::error_code ec;
        const bool libcu = fs::is_regular_file(d / "cccl" / "cuda" / "atomic", ec) ||
                           fs::is_regular_file(d / "cuda" / "atomic", ec);
        if (fs::is_regular_file(d / "cuda_fp16.h", ec) && libcu) {
            const fs::path c = fs::weakly_canonical(d, ec);
            return ec ? d.string() : c.string();
        }
    }
    return {};
}

NcclDeviceCompileInputs nccl_device_compile_inputs(const std::string& nccl_include) {
    const fs::path dir(nccl_include);
    const std::string cuda = cuda_include_dir();
    if (cuda.empty())
        throw std::runtime_error(
            "NCCL's device API needs the CUDA headers (cuda_fp16.h, libcu++'s cuda/atomic) and "
            "none were found (CUDA_HOME, CUDA_PATH, the NVRTC library's install, "
            "/usr/local/cuda*)");
    auto utility = cache::read_file(dir / "nccl_device" / "utility.h");
    if (!utility)
        throw std::runtime_error(fmt::format("cannot read {}/nccl_device/utility.h", nccl_include));
    // loadConst's branches on alignof(T), each declaring an array of sizeof(T) / alignment
    // elements: made `if constexpr`, so that the untaken ones are never instantiated.
    const std::string from = "if (alignof(T) == ", to = "if constexpr (alignof(T) == ";
    for (size_t at = utility->find(from); at != std::string::npos;
         at = utility->find(from, at + to.size()))
        utility->replace(at, from.size(), to);
    int already = 0;  // (a copy patched by hand before counts the same)
    for (size_t at = utility->find(to); at != std::string::npos; at = utility->find(to, at + 1))
        ++already;
    if (already != 4)  // 1-, 2-, 4-, 8-byte alignment and the rest
        throw std::runtime_error(fmt::format(
            "{}/nccl_device/utility.h: loadConst is not the form this engine patches ({} of 4 "
            "alignment branches found)",
            nccl_include, already));
    // The digest covers nccl.h, nccl_device.h and every file under nccl_device/, by relative path.
    std::vector<fs::path> files = {dir / "nccl.h", dir / "nccl_device.h"};
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir / "nccl_device", ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) files.push_back(it->path());
    std::sort(files.begin(), files.end());
    std::string all;
    for (const fs::path& f : files) {
        const auto text = cache::read_file(f);
        all += fs::relative(f, dir, ec).string() + '\0' + (text ? *text : std::string()) + '\0';
    }
    NcclDeviceCompileInputs in;
    in.options = {"-I" + nccl_include, "-I" + cuda, "-default-device"};
    if (fs::is_regular_file(fs::path(cuda) / "cccl" / "cuda" / "atomic", ec))
        in.options.push_back("-I" + (fs::path(cuda) / "cccl").string());
    in.headers = {{"stdint.h", kStdint},
                  {"stdbool.h", kEmpty},
                  {"limits.h", kLimits},
                  {"cuda.h", kEmpty},
                  {"cuda_runtime.h", kCudaRuntime},
                  {"gj_nccl_utility.h", *utility}};
    // The stand-ins and the patched copy are part of what is compiled too.
    for (const auto& [name, text] : in.headers) all += name + '\0' + text + '\0';
    in.key_line =
        fmt::format("// NCCL device headers: {} (NCCL {}), contents sha256 {}", nccl_include,
                    nccl_header_version((dir / "nccl.h").string()), cache::sha256_hex(all));
    return in;
}

}  // namespace gj::jit
