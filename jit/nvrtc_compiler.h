// NVRTC: canonical options, one compile straight to CUBIN (PTX kept for inspection), ptxas
// resources, entry-point check, and the compiler identity that enters cache keys and paths.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "jit/jit.h"

namespace gj::jit {

struct CompileOptions {
    std::string arch;                // "sm_90", "sm_90a"
    bool lineinfo = false;           // GEMMAJIT_LINEINFO
    int maxrregcount = 0;            // GEMMAJIT_MAXRREG (0: not passed)
    std::vector<std::string> extra;  // GEMMAJIT_NVRTC_FLAGS, split on spaces
};

// The option list in canonical order: arch, -std, ptxas -v, --no-cache (NVRTC 12.9+), then
// lineinfo, maxrregcount, extras.
// Throws std::invalid_argument when the arch is malformed or this NVRTC cannot target it.
std::vector<std::string> canonical_options(const CompileOptions& opts);

struct NvrtcIdentity {
    std::string version;   // "13.0"
    std::string build;     // "13.0.88" (from __CUDACC_VER_BUILD__), the cache partition name part
    std::string build_id;  // "CL-36424714" from the PTX header; empty if not found
    std::vector<int> supported_archs;  // 75, 80, 86, ..., 120
    std::string full() const { return build + (build_id.empty() ? "" : " " + build_id); }
    int version_number() const;  // 13000 for "13.0"
};
// Probed once per process: a compile of a one-line program, 10 to 20 ms of every run's start.
// With `record_dir` (the kernel cache root) the result is kept in
// `<record_dir>/nvrtc-identity/<hash16>.json`, keyed by the file identity of the NVRTC library
// this process runs (path, size, mtime, inode) and by nvrtcVersion, so later processes read it
// instead of probing; `write_record` false (a read-only cache) only reads. The first call decides
// for the whole process.
const NvrtcIdentity& nvrtc_identity(const std::filesystem::path& record_dir = {},
                                    bool write_record = false);

struct NvrtcOutput {
    std::string ptx;
    std::string cubin;
    std::string log;
    double ms = 0;
    std::vector<KernelResources> resources;  // per entry
};

// Compiles `source` named `<program_name>.cu`, with `headers` (name, text) as in-memory headers
// (found before any include path). Throws CompileError (NVRTC log + numbered listing) on a
// compile failure or when an entry in `entries` is not defined by the program.
NvrtcOutput nvrtc_compile(const std::string& source, const std::string& program_name,
                          const std::vector<std::string>& options,
                          const std::vector<std::string>& entries,
                          const std::vector<std::pair<std::string, std::string>>& headers = {});

// "   1 | line" listing used by CompileError messages.
std::string numbered_listing(const std::string& source);
// Names of the .entry functions a PTX module defines.
std::vector<std::string> ptx_entries(const std::string& ptx);

}  // namespace gj::jit
