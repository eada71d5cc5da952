#include "jit/jit.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "cache/store.h"
#include "jit/cache_config.h"
#include "jit/cache_key.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/nccl_device.h"
#include "jit/nvrtc_compiler.h"
#include "jit/ptxas_resources.h"
#include "jit/render.h"

namespace fs = std::filesystem;

namespace gj::jit {

namespace {

constexpr const char* kSourceFile = "kernel.cu";
constexpr const char* kPtxFile = "kernel.ptx";
constexpr const char* kCubinFile = "kernel.cubin";

// CPUs this process may use: the affinity mask, capped by a cgroup v2 CPU quota.
int available_cpus() {
    int n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::ifstream in("/sys/fs/cgroup/cpu.max");
    std::string quota, period;
    if (in >> quota >> period && quota != "max") {
        long q = std::atol(quota.c_str()), p = std::atol(period.c_str());
        if (q > 0 && p > 0) n = std::min<int>(n, static_cast<int>(std::max(1L, (q + p - 1) / p)));
    }
    return n;
}

// body(i) for every i in [0, n) on `threads` threads, the caller's among them. After a failure
// no new index starts; the failure of the lowest index is rethrown, as a plain loop would throw it
// (indices start in increasing order, so every lower one has run).
template <typename Body>
void parallel_for(size_t n, size_t threads, const Body& body) {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mutex;
    size_t error_index = SIZE_MAX;
    std::exception_ptr error;
    auto worker = [&] {
        while (!failed) {
            size_t i = next++;
            if (i >= n) return;
            try {
                body(i);
            } catch (...) {
                std::lock_guard lock(mutex);
                if (i < error_index) error_index = i, error = std::current_exception();
                failed = true;
            }
        }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < std::min(threads, n); ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
}

std::vector<std::string> split_words(const std::string& s) {
    std::istringstream in(s);
    std::vector<std::string> out;
    std::string w;
    while (in >> w) out.push_back(w);
    return out;
}

nlohmann::json resources_json(const KernelResources& r) {
    return {{"registers", r.registers},
            {"spill_store_bytes", r.spill_store_bytes},
            {"spill_load_bytes", r.spill_load_bytes},
            {"shared_static_bytes", r.shared_static_bytes},
            {"stack_bytes", r.stack_bytes}};
}

// The types were checked with the entry (kernel_meta_problem); this only fills in what is there.
KernelResources resources_from_json(const nlohmann::json& j) {
    KernelResources r;
    r.registers = j.value("registers", -1);
    r.spill_store_bytes = j.value("spill_store_bytes", -1);
    r.spill_load_bytes = j.value("spill_load_bytes", -1);
    r.shared_static_bytes = j.value("shared_static_bytes", -1);
    r.stack_bytes = j.value("stack_bytes", -1);
    return r;
}

nlohmann::json spec_json(const KernelSpec& s) {
    nlohmann::json constants = nlohmann::json::array();
    for (const auto& [name, value] : s.constants) constants.push_back({name, value});
    nlohmann::json j = {{"family", s.family},     {"name", s.name},
                        {"constants", constants}, {"entries", s.entries},
                        {"priority", s.priority}, {"arch_specific", s.arch_specific}};
    if (!s.nccl_include.empty()) j["nccl_include"] = s.nccl_include;
    return j;
}

// The target a spec compiles for: `arch`, or its architecture-specific form (sm_90 -> sm_90a)
// for a spec that needs one; another arch cannot run that spec.
std::string target_arch(const KernelSpec& spec, std::string_view arch) {
    if (spec.arch_specific == 0) return std::string(arch);
    const std::string want = fmt::format("sm_{}", spec.arch_specific);
    if (arch == want || arch == want + "a") return want + "a";
    throw std::invalid_argument(fmt::format(
        "kernel {} uses {}a-only instructions and cannot be compiled for {} (it belongs to a plan "
        "for {}; plan for {} instead, or set GEMMAJIT_MMQ_VARIANT=mma and "
        "GEMMAJIT_FLASH_WGMMA=off)",
        spec.name, want, arch, want, arch));
}

// GEMMAJIT_TEMPLATE_DIR, which must be a folder when set: a mistyped one would otherwise be
// silently ignored and every template taken from the build.
fs::path template_dir(const Flags& f) {
    fs::path dir = f.get_string("GEMMAJIT_TEMPLATE_DIR");
    if (dir.empty()) return dir;
    std::error_code ec;
    fs::file_status st = fs::status(dir, ec);
    if (!fs::is_directory(st))
        throw std::invalid_argument(fmt::format(
            "GEMMAJIT_TEMPLATE_DIR={} {}: set it to a folder of kernel templates, or unset it",
            dir.string(),
            fs::exists(st) ? "is not a directory" : "does not exist (or cannot be read)"));
    return dir;
}

// The kernel cache's configuration with the Jit's own meta.json fields checked on every read.
cache::StoreConfig kernel_cache_config(const Flags& f, cache::WarningSink warn) {
    cache::StoreConfig c = cache_config(f, std::move(warn));
    c.check_meta = kernel_meta_problem;
    return c;
}

// Thrown through the in-process dedupe when the owner of a key put it off because another process
// is compiling it (compile_plan's first pass); whoever waited on that owner tries again.
struct Deferred {};

// Everything about one (spec, arch) that is known before compiling.
struct Prepared {
    KernelSpec spec;
    std::string arch;
    std::string source;
    std::vector<std::string> options;
    std::vector<std::pair<std::string, std::string>> headers;  // in-memory (NVRTC)
    KeyRecord record;
    std::string key;
    cache::EntryId id;
};

}  // namespace

struct Jit::Impl {
    Flags flags;
    LogSink log;
    int debug = 0;
    TemplateSource templates;
    cache::Store store;
    CompileOptions base;
    bool require_cached = false;
    std::chrono::milliseconds lock_timeout;  // 0: never wait for another process
    fs::path dump_dir;
    std::mutex mutex;
    std::map<std::string, std::shared_future<CompiledKernel>> memo;  // key -> result
    std::set<std::string> warned;
    std::atomic<bool> published{false};
    std::atomic<size_t> hits{0}, compiled{0}, lock_waits{0}, lock_timeouts{0};

    Impl(const Flags& f, LogSink sink)
        : flags(f),
          log(sink ? std::move(sink)
                   : [](const std::string&
                            line) { std::fprintf(stderr, "gemmajit: %s\n", line.c_str()); }),
          debug(static_cast<int>(f.get_int("GEMMAJIT_DEBUG"))),
          templates(template_dir(f)),
          store(kernel_cache_config(f, [this](const std::string& m) { log("warning: " + m); })),
          require_cached(f.get_bool("GEMMAJIT_REQUIRE_CACHED")),
          lock_timeout(std::chrono::seconds(f.get_int("GEMMAJIT_CACHE_LOCK_TIMEOUT"))),
          dump_dir(f.get_string("GEMMAJIT_DUMP_DIR")) {
        base.lineinfo = f.get_bool("GEMMAJIT_LINEINFO");
        base.maxrregcount = static_cast<int>(f.get_int("GEMMAJIT_MAXRREG"));
        base.extra = split_words(f.get_string("GEMMAJIT_NVRTC_FLAGS"));
    }

    void warn_once(const std::string& topic, const std::string& message) {
        {
            std::lock_guard lock(mutex);
            if (!warned.insert(topic).second) return;
        }
        log("warning: " + message);
    }

    // What compiles against one folder of NCCL device headers needs, made once per folder.
    std::map<std::string, NcclDeviceCompileInputs> nccl_compile_inputs;
    const NcclDeviceCompileInputs& nccl_inputs(const std::string& dir) {
        std::lock_guard lock(mutex);
        auto it = nccl_compile_inputs.find(dir);
        if (it == nccl_compile_inputs.end())
            it = nccl_compile_inputs.emplace(dir, nccl_device_compile_inputs(dir)).first;
        return it->second;
    }

    Prepared prepare(const KernelSpec& spec, std::string_view arch) {
        // The compiler identity (in every key) comes from its record in the cache when one is
        // there, instead of a probe compile per process.
        nvrtc_identity(store.enabled() ? store.config().root : fs::path(),
                       store.config().mode == cache::Mode::ReadWrite);
        Prepared p;
        p.spec = spec;
        p.arch = target_arch(spec, arch);
        p.source = jit::render(spec, templates);
        CompileOptions opts = base;
        opts.arch = p.arch;
        p.options = canonical_options(opts);
        if (!spec.nccl_include.empty()) {
            const NcclDeviceCompileInputs& in = nccl_inputs(spec.nccl_include);
            p.source = in.key_line + "\n" + p.source;
            p.options.insert(p.options.end(), in.options.begin(), in.options.end());
            p.headers = in.headers;
        }
        p.record.source = p.source;
        p.record.entries = spec.entries;
        p.record.options = p.options;
        p.record.nvrtc = nvrtc_identity().full();
        p.record.arch = p.arch;
        p.record.abi = kEngineAbi;
        p.record.flags = flags.output_changing();
        // GEMMAJIT_ARCH acts only by choosing the target, which the record holds as `arch`; keying
        // the effective target keeps `precompile --arch X` and GEMMAJIT_ARCH=X on one entry.
        for (auto& [name, value] : p.record.flags)
            if (name == "GEMMAJIT_ARCH") value = p.arch;
        p.key = p.record.hash();
        p.id = {kEngineAbi,  p.arch,    "nvrtc-" + nvrtc_identity().build,
                spec.family, spec.name, p.key};
        return p;
    }

    // The kernel an entry holds, or nullopt when its files do not match. Its meta.json fields
    // have the types read here: the store checked them (kernel_meta_problem) before loading it.
    std::optional<CompiledKernel> from_entry(const Prepared& p, cache::Entry& e) {
        auto file = [&](const char* name) -> std::string* {
            auto it = e.files.find(name);
            return it == e.files.end() ? nullptr : &it->second;
        };
        std::string *src = file(kSourceFile), *ptx = file(kPtxFile), *cubin = file(kCubinFile);
        if (!src || !ptx || !cubin || cubin->empty() || *src != p.source) return std::nullopt;
        CompiledKernel k;
        k.spec = p.spec;
        k.arch = p.arch;
        k.key = p.key;
        k.source = std::move(*src);
        k.ptx = std::move(*ptx);
        k.cubin = std::move(*cubin);
        k.log = e.meta.value("nvrtc_log", "");
        k.options = p.options;
        for (const auto& r : e.meta.value("resources", nlohmann::json::array()))
            k.resources_per_entry.push_back(resources_from_json(r));
        k.resources_per_entry.resize(p.spec.entries.size());
        k.resources = max_resources(k.resources_per_entry);
        k.cache_hit = true;
        k.entry_dir = e.dir.string();
        return k;
    }

    void dump(const Prepared& p, const std::string* ptx, const std::string* cubin,
              const std::string& log_text, bool failed) {
        if (dump_dir.empty()) return;
        try {
            fs::create_directories(dump_dir);
            std::string stem = fmt::format("{}-{}", p.spec.name, p.key.substr(0, 16));
            cache::write_file_synced(dump_dir / (stem + ".cu"), p.source);
            if (ptx) cache::write_file_synced(dump_dir / (stem + ".ptx"), *ptx);
            if (cubin) cache::write_file_synced(dump_dir / (stem + ".cubin"), *cubin);
            std::string opts;
            for (const auto& o : p.options) opts += o + "\n";
            cache::write_file_synced(dump_dir / (stem + (failed ? ".failed.log" : ".log")),
                                     "options:\n" + opts + "\nNVRTC log:\n" + log_text);
        } catch (const std::exception& e) {
            warn_once("dump", fmt::format("cannot write GEMMAJIT_DUMP_DIR {}: {}",
                                          dump_dir.string(), e.what()));
        }
    }

    // The cache's entry for `p`, or nullopt (an entry whose files do not match is removed).
    // `waited`: how long we waited for another process's compile of it (for the debug line).
    std::optional<CompiledKernel> cached(const Prepared& p, std::chrono::milliseconds waited = {}) {
        auto t0 = std::chrono::steady_clock::now();
        auto e = store.load(p.id);
        if (!e) return std::nullopt;
        auto k = from_entry(p, *e);
        if (!k) {
            store.remove(p.id, "its files do not match the rendered kernel");
            return std::nullopt;
        }
        ++hits;
        if (debug >= 1)
            log(fmt::format(
                "jit: hit {} {} ({:.1f} ms){}", p.spec.name, p.arch,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count(),
                waited.count() > 0
                    ? fmt::format(" after waiting {} ms for another process's compile",
                                  waited.count())
                    : std::string()));
        trace(*k, p);
        return k;
    }

    // Cache hit, or compile + publish. With `may_defer`, a miss that another process is compiling
    // right now returns nullopt at once instead of waiting for it.
    std::optional<CompiledKernel> build(const Prepared& p, bool allow_load,
                                        bool may_defer = false) {
        if (allow_load)
            if (auto k = cached(p)) return k;
        if (require_cached)
            throw CacheMissError(fmt::format(
                "kernel {} for {} is not in the cache {} and GEMMAJIT_REQUIRE_CACHED=1 forbids "
                "compiling it (run `gemmajit precompile` first)",
                p.spec.name, p.arch,
                store.enabled() ? store.config().root.string() : std::string("(cache off)")));
        // Cross-process dedupe: hold the entry's lock while compiling and publishing, so that other
        // processes missing it wait for our publish instead of compiling it too (see
        // cache/entry_lock.h). A rebuild (!allow_load) replaces an entry and takes no lock.
        cache::EntryLock lock;
        if (allow_load && lock_timeout.count() > 0) {
            lock = store.lock(p.id, may_defer ? std::chrono::milliseconds(0) : lock_timeout);
            if (lock.state() == cache::EntryLock::State::Busy) {
                ++lock_waits;
                if (may_defer) return std::nullopt;
                ++lock_timeouts;
                warn_once("lock-timeout",
                          fmt::format("waited {} s for another process to compile {} into {}; "
                                      "compiling it here (GEMMAJIT_CACHE_LOCK_TIMEOUT)",
                                      lock_timeout.count() / 1000, p.spec.name,
                                      store.config().root.string()));
            } else if (lock.held()) {
                // The previous holder, if any, has published (or died): look again.
                if (lock.waited().count() > 0) ++lock_waits;
                if (auto k = cached(p, lock.waited())) return k;
            }
        }
        NvrtcOutput out;
        try {
            out = nvrtc_compile(p.source, p.spec.name, p.options, p.spec.entries, p.headers);
        } catch (const CompileError& e) {
            dump(p, nullptr, nullptr, e.log(), true);
            throw;
        }
        CompiledKernel k;
        k.spec = p.spec;
        k.arch = p.arch;
        k.key = p.key;
        k.source = p.source;
        k.ptx = std::move(out.ptx);
        k.cubin = std::move(out.cubin);
        k.log = std::move(out.log);
        k.options = p.options;
        k.resources_per_entry = std::move(out.resources);
        k.resources = max_resources(k.resources_per_entry);
        k.compile_ms = out.ms;
        ++compiled;
        dump(p, &k.ptx, &k.cubin, k.log, false);
        if (store.enabled()) {
            cache::Entry e;
            e.files = {{kSourceFile, k.source}, {kPtxFile, k.ptx}, {kCubinFile, k.cubin}};
            nlohmann::json res = nlohmann::json::array();
            for (const auto& r : k.resources_per_entry) res.push_back(resources_json(r));
            e.meta = {{"spec", spec_json(p.spec)}, {"key_record", p.record.to_json()},
                      {"options", p.options},      {"nvrtc_log", k.log},
                      {"resources", res},          {"compile_ms", k.compile_ms}};
            if (auto dir = store.publish(p.id, e)) {
                k.entry_dir = dir->string();
                published = true;
            }
        }
        if (debug >= 1)
            log(fmt::format("jit: miss {} {}: compiled in {:.0f} ms", p.spec.name, p.arch,
                            k.compile_ms));
        trace(k, p);
        return k;
    }

    void trace(const CompiledKernel& k, const Prepared& p) {
        if (debug >= 2)
            for (size_t i = 0; i < k.resources_per_entry.size(); ++i) {
                const auto& r = k.resources_per_entry[i];
                log(
                    fmt::format("jit: {}/{}: {} registers, spills {}/{} B (store/load), {} B "
                                "static smem, {} B stack",
                                k.spec.name, k.spec.entries[i], r.registers, r.spill_store_bytes,
                                r.spill_load_bytes, r.shared_static_bytes, r.stack_bytes));
            }
        if (debug >= 3)
            log(fmt::format("jit: {} source:\n{}", k.spec.name, numbered_listing(k.source)));
        if (debug >= 4) log(fmt::format("jit: {} PTX:\n{}", k.spec.name, k.ptx));
        if (debug >= 5)
            log(fmt::format("jit: {} cache entry {}\nkey {} over record:\n{}", k.spec.name,
                            k.entry_dir.empty() ? std::string("(none)") : k.entry_dir, k.key,
                            p.record.to_json().dump(2)));
    }

    // In-process dedupe: one build per key, concurrent callers wait for it; results are kept.
    // With `may_defer`, nullopt when another process is compiling the key (see build).
    std::optional<CompiledKernel> compile(const Prepared& p, bool may_defer = false) {
        for (;;) {
            std::promise<CompiledKernel> promise;
            std::shared_future<CompiledKernel> future;
            bool owner = false;
            {
                std::lock_guard lock(mutex);
                auto it = memo.find(p.key);
                if (it != memo.end()) {
                    future = it->second;
                } else {
                    future = promise.get_future().share();
                    memo.emplace(p.key, future);
                    owner = true;
                }
            }
            if (!owner) {
                try {
                    return future.get();
                } catch (const Deferred&) {
                    continue;  // its owner put it off: build it ourselves
                }
            }
            try {
                std::optional<CompiledKernel> k = build(p, true, may_defer);
                if (!k) {
                    {
                        std::lock_guard lock(mutex);
                        memo.erase(p.key);
                    }
                    promise.set_exception(std::make_exception_ptr(Deferred{}));
                    return std::nullopt;
                }
                promise.set_value(*k);
                return k;
            } catch (...) {
                promise.set_exception(std::current_exception());
                std::lock_guard lock(mutex);
                memo.erase(p.key);
                throw;
            }
        }
    }
};

std::string kernel_meta_problem(const nlohmann::json& meta) {
    using J = nlohmann::json;
    if (!meta.is_object()) return "is not an object";
    // A field that is there in another type than the one it is read as: what is wrong with it,
    // `where` being the path of the object holding it ("" for the top, "resources[0]." below).
    auto check = [](const J& obj, const std::string& where, const char* field,
                    bool (J::*is)() const noexcept, const char* want) -> std::string {
        auto it = obj.find(field);
        if (it == obj.end() || ((*it).*is)()) return {};
        return fmt::format("field {}{} is {}, expected {}", where, field, it->type_name(), want);
    };
    // Each field the Jit (nvrtc_log, resources) or `gemmajit show` reads.
    for (const std::string& bad :
         {check(meta, "", "nvrtc_log", &J::is_string, "a string"),
          check(meta, "", "compile_ms", &J::is_number, "a number"),
          check(meta, "", "created", &J::is_number_integer, "an integer (Unix seconds)"),
          check(meta, "", "last_used", &J::is_number_integer, "an integer (Unix seconds)"),
          check(meta, "", "resources", &J::is_array, "an array"),
          check(meta, "", "key_record", &J::is_object, "an object")})
        if (!bad.empty()) return bad;
    if (auto res = meta.find("resources"); res != meta.end())
        for (size_t i = 0; i < res->size(); ++i) {
            const J& r = (*res)[i];
            const std::string where = fmt::format("resources[{}]", i);
            if (!r.is_object())
                return fmt::format("field {} is {}, expected an object", where, r.type_name());
            for (const char* f : {"registers", "spill_store_bytes", "spill_load_bytes",
                                  "shared_static_bytes", "stack_bytes"})
                if (std::string bad = check(r, where + ".", f, &J::is_number_integer, "an integer");
                    !bad.empty())
                    return bad;
        }
    if (auto kr = meta.find("key_record"); kr != meta.end())
        for (const std::string& bad :
             {check(*kr, "key_record.", "abi", &J::is_number_integer, "an integer"),
              check(*kr, "key_record.", "source_bytes", &J::is_number_integer, "an integer"),
              check(*kr, "key_record.", "nvrtc", &J::is_string, "a string"),
              check(*kr, "key_record.", "source_sha256", &J::is_string, "a string"),
              check(*kr, "key_record.", "flags", &J::is_object, "an object")})
            if (!bad.empty()) return bad;
    return {};
}

Jit::Jit() : Jit(Flags::process()) {}

Jit::Jit(const Flags& flags, LogSink log) : impl_(std::make_unique<Impl>(flags, std::move(log))) {}

Jit::~Jit() {
    try {
        prune_if_needed();
    } catch (const std::exception&) {
        // Pruning is housekeeping; never let it turn a clean exit into a crash.
    }
}

std::string default_target_arch(const Flags& flags) {
    const std::string& forced = flags.get_string("GEMMAJIT_ARCH");
    if (!forced.empty()) return forced;
    if (device_available()) return Device::get().arch();
    return "sm_90";
}

std::string Jit::default_arch() const {
    return default_target_arch(impl_->flags);
}

std::string Jit::cache_root() const {
    return impl_->store.enabled() ? impl_->store.config().root.string() : std::string();
}

std::string Jit::render(const KernelSpec& spec) const {
    return jit::render(spec, impl_->templates);
}

std::string Jit::key(const KernelSpec& spec, std::string_view arch) const {
    return impl_->prepare(spec, arch).key;
}

CacheState Jit::cache_state(const KernelSpec& spec, std::string_view arch) const {
    if (!impl_->store.enabled()) return CacheState::Disabled;
    switch (impl_->store.probe(impl_->prepare(spec, arch).id)) {
        case cache::Lookup::Hit:
            return CacheState::Hit;
        case cache::Lookup::Damaged:
            return CacheState::Damaged;
        case cache::Lookup::Missing:
            break;
    }
    return CacheState::Missing;
}

std::string Jit::lock_path(const KernelSpec& spec, std::string_view arch) const {
    if (!impl_->store.enabled()) return {};
    return impl_->store.lock_path(impl_->prepare(spec, arch).id).string();
}

CompiledKernel Jit::compile(const KernelSpec& spec, std::string_view arch) {
    return *impl_->compile(impl_->prepare(spec, arch));
}

CompiledKernel Jit::rebuild(const CompiledKernel& bad, std::string_view reason) {
    Prepared p = impl_->prepare(bad.spec, bad.arch);
    impl_->store.remove(p.id, reason);
    CompiledKernel k = *impl_->build(p, false);
    std::promise<CompiledKernel> done;
    done.set_value(k);
    std::lock_guard lock(impl_->mutex);
    impl_->memo.insert_or_assign(p.key, done.get_future().share());
    return k;
}

void Jit::load(ModuleSet& modules, std::vector<CompiledKernel>& kernels) {
    for (auto& k : kernels) {
        try {
            modules.load(k);
        } catch (const ModuleRejected& e) {
            if (!k.cache_hit) throw;
            k = rebuild(k, e.what());
            modules.load(k);
        }
        // A template that takes more than the default 48 KiB of dynamic shared memory says how
        // much in its SMEM constant; every entry of the spec may launch with that much.
        for (const auto& [name, value] : k.spec.constants)
            if (name == "SMEM" && value > 48 * 1024)
                for (const std::string& entry : k.spec.entries)
                    modules.set_max_dynamic_smem(k.spec.name, entry, int(value));
    }
}

JitStats Jit::stats() const {
    return {impl_->hits, impl_->compiled, impl_->lock_waits, impl_->lock_timeouts};
}

void Jit::prune_if_needed() {
    if (!impl_->published.exchange(false) || impl_->store.config().max_bytes == 0) return;
    cache::PruneResult r = impl_->store.prune_to_cap();
    if (r.removed > 0 && impl_->debug >= 1)
        impl_->log(fmt::format("jit: pruned {} cache entries ({} freed) to stay under {}",
                               r.removed, format_size(r.freed_bytes),
                               format_size(impl_->store.config().max_bytes)));
}

std::vector<CompiledKernel> Jit::compile_plan(
    const std::vector<KernelSpec>& specs, std::string_view arch, int jobs,
    const std::function<void(const PlanProgress&)>& progress) {
    const size_t n = specs.size();
    if (jobs <= 0) jobs = static_cast<int>(impl_->flags.get_int("GEMMAJIT_THREADS"));
    if (jobs <= 0) jobs = available_cpus();
    size_t threads = std::clamp<size_t>(std::min<size_t>(jobs, n), 1, std::max<size_t>(n, 1));
    // Rendering and keying the whole plan is most of a warm start's CPU time after the cache
    // reads; it runs on the same threads.
    std::vector<Prepared> prepared(n);
    parallel_for(n, threads, [&](size_t i) { prepared[i] = impl_->prepare(specs[i], arch); });
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return specs[a].priority < specs[b].priority; });

    size_t to_compile = 0;
    std::set<std::string> keys;
    for (const auto& p : prepared) {
        if (!keys.insert(p.key).second) continue;
        std::error_code ec;
        bool cached = impl_->store.enabled() && fs::exists(impl_->store.entry_dir(p.id), ec);
        bool in_memory;
        {
            std::lock_guard lock(impl_->mutex);
            in_memory = impl_->memo.count(p.key) > 0;
        }
        if (!cached && !in_memory) ++to_compile;
    }
    auto t0 = std::chrono::steady_clock::now();
    if (to_compile > 0 || impl_->debug >= 1)
        impl_->log(fmt::format("compiling {} of {} kernel{} for {} into {} ({} thread{})",
                               to_compile, n, n == 1 ? "" : "s", arch,
                               impl_->store.enabled() ? impl_->store.config().root.string()
                                                      : std::string("memory (cache off)"),
                               threads, threads == 1 ? "" : "s"));

    std::vector<CompiledKernel> results(n);
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex progress_mutex;
    size_t done = 0, compiled = 0;
    std::set<std::string> reported;  // a key compiled once but planned twice is reported once
    std::exception_ptr first_error;
    size_t failures = 0;
    // Kernels another process was compiling when we came to them: taken up (waiting for that
    // process's publish, usually long done) once everything else has been started.
    std::deque<size_t> deferred;
    auto worker = [&] {
        while (!stop) {
            size_t i = next++;
            size_t idx;
            if (i < n) {
                idx = order[i];
            } else {
                std::lock_guard lock(progress_mutex);
                if (deferred.empty()) return;
                idx = deferred.front();
                deferred.pop_front();
            }
            try {
                std::optional<CompiledKernel> k = impl_->compile(prepared[idx], i < n);
                if (!k) {
                    std::lock_guard lock(progress_mutex);
                    deferred.push_back(idx);
                    continue;
                }
                results[idx] = std::move(*k);
            } catch (...) {
                std::lock_guard lock(progress_mutex);
                if (!first_error) first_error = std::current_exception();
                ++failures;
                stop = true;
                return;
            }
            std::lock_guard lock(progress_mutex);
            ++done;
            PlanProgress pp{done, n, &results[idx]};
            if (progress) {
                progress(pp);
            } else if (!results[idx].cache_hit && results[idx].compile_ms > 0 &&
                       reported.insert(results[idx].key).second) {
                ++compiled;
                impl_->log(fmt::format("  [{}/{}] {} ({:.0f} ms)", compiled, to_compile,
                                       results[idx].spec.name, results[idx].compile_ms));
            }
        }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    if (first_error) {
        if (failures > 1)
            impl_->log(
                fmt::format("{} kernels failed to compile; the first error follows", failures));
        std::rethrow_exception(first_error);
    }
    if (to_compile > 0 || impl_->debug >= 1)
        impl_->log(fmt::format(
            "{} kernels ready for {} in {:.1f} s", n, arch,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
    prune_if_needed();
    return results;
}

}  // namespace gj::jit
