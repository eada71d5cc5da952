// Public face of the JIT: render -> key -> cache lookup -> NVRTC -> cache publish -> load.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "jit/kernel_spec.h"

namespace gj::jit {

class Flags;
class ModuleSet;

// NVRTC rejected a kernel (or it lacks a declared entry). what() holds the NVRTC log and a
// numbered listing of the rendered source; log() and source() give the parts.
class CompileError : public std::runtime_error {
  public:
    CompileError(const std::string& message, std::string log, std::string source)
        : std::runtime_error(message), log_(std::move(log)), source_(std::move(source)) {}
    const std::string& log() const { return log_; }
    const std::string& source() const { return source_; }

  private:
    std::string log_, source_;
};

// GEMMAJIT_REQUIRE_CACHED=1 and a kernel is not in the cache; what() names the spec and arch.
struct CacheMissError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Resource usage as reported by ptxas (-v) at compile time; -1 when unknown.
struct KernelResources {
    int registers = -1;
    int spill_store_bytes = -1;
    int spill_load_bytes = -1;
    int shared_static_bytes = -1;
    int stack_bytes = -1;
};

struct CompiledKernel {
    KernelSpec spec;
    std::string arch;    // "sm_90", "sm_90a", "sm_80"
    std::string key;     // 64 hex chars, SHA-256 of the key record
    std::string source;  // fully rendered source (helpers inlined)
    std::string ptx;
    std::string cubin;                                 // bytes
    std::string log;                                   // NVRTC/ptxas log
    std::vector<std::string> options;                  // canonical NVRTC options used
    std::vector<KernelResources> resources_per_entry;  // same order as spec.entries
    KernelResources resources;  // the maximum over entries (what tables print)
    double compile_ms = 0;      // NVRTC time (0 on a cache hit)
    bool cache_hit = false;
    std::string entry_dir;  // cache entry path, empty when running without a cache
};

enum class CacheState { Hit, Missing, Damaged, Disabled };

// What one Jit has done so far: its share of the work on a cache other processes fill too.
struct JitStats {
    size_t hits = 0;           // kernels served from the cache
    size_t compiled = 0;       // NVRTC runs
    size_t lock_waits = 0;     // times a miss found another process compiling it (put off or
                               // waited for; a kernel put off and then waited for counts twice)
    size_t lock_timeouts = 0;  // waits that reached GEMMAJIT_CACHE_LOCK_TIMEOUT (then compiled)
};

struct PlanProgress {
    size_t done = 0, total = 0;
    const CompiledKernel* last = nullptr;
};

// Receives warnings, progress and GEMMAJIT_DEBUG lines (one line each, no trailing newline).
using LogSink = std::function<void(const std::string&)>;

// What is wrong with the fields the Jit and `gemmajit show` read from a kernel cache entry's
// meta.json (nvrtc_log, resources, compile_ms, created, last_used, key_record): "field X is
// <type>, expected <type>", empty when nothing is. The Jit's cache store treats an entry it faults
// as damaged (deleted and rebuilt, counted by `cache verify`): the `cache` CLI sets it as the
// store's check_meta too.
std::string kernel_meta_problem(const nlohmann::json& meta);

// Compiles and caches kernels. Thread-safe: compile() may run concurrently for distinct specs.
// The target architecture a plan is made for: GEMMAJIT_ARCH, else the local GPU's, else "sm_90".
std::string default_target_arch(const Flags& flags);

class Jit {
  public:
    Jit();  // configuration from the env-flag registry (cache dir/mode, arch, lineinfo, ...)
    // Configuration from `flags` (tests evaluate an explicit environment); `log` defaults to
    // stderr with a "gemmajit: " prefix.
    explicit Jit(const Flags& flags, LogSink log = {});
    ~Jit();

    // Target arch for this process: default_target_arch(flags).
    std::string default_arch() const;
    std::string cache_root() const;  // effective cache root ("" when the cache is off)

    std::string render(const KernelSpec& spec) const;
    std::string key(const KernelSpec& spec, std::string_view arch) const;
    CacheState cache_state(const KernelSpec& spec, std::string_view arch) const;
    // The file whose lock a process holds while it compiles this kernel into the cache (see
    // cache/entry_lock.h); "" when the cache is off.
    std::string lock_path(const KernelSpec& spec, std::string_view arch) const;

    // Cache hit, or NVRTC compile + publish. A miss takes the entry's cross-process lock first
    // (read-write cache only): when another process is compiling the same kernel this waits for
    // its publish, at most GEMMAJIT_CACHE_LOCK_TIMEOUT, then compiles itself. Throws
    // jit::CompileError (with the NVRTC log and a numbered listing) on failure.
    CompiledKernel compile(const KernelSpec& spec, std::string_view arch);

    // Whole plan on a thread pool (GEMMAJIT_THREADS / jobs), lowest priority value first; a kernel
    // another process is compiling is put off until the rest is done, so processes that start
    // together share the plan's compiles instead of queueing behind one another. Prints
    // one line before ("compiling N kernels for sm_90 into <cache>") and progress after via
    // `progress`. Results are in the order of `specs`.
    std::vector<CompiledKernel> compile_plan(
        const std::vector<KernelSpec>& specs, std::string_view arch, int jobs = 0,
        const std::function<void(const PlanProgress&)>& progress = {});

    // Loads compiled kernels into `modules`. A cache hit the driver rejects is evicted (one
    // warning), recompiled and loaded again; the entry in `kernels` is replaced by the rebuild.
    // Entries of a spec whose SMEM constant exceeds 48 KiB are opted in to that much dynamic
    // shared memory.
    void load(ModuleSet& modules, std::vector<CompiledKernel>& kernels);
    // Deletes the cache entry of `bad` (naming `reason` in one warning) and compiles it afresh.
    CompiledKernel rebuild(const CompiledKernel& bad, std::string_view reason);

    // Prunes the cache to GEMMAJIT_CACHE_MAX_SIZE when this Jit published anything.
    void prune_if_needed();

    JitStats stats() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace gj::jit
