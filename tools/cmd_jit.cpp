// JIT and cache commands: env, kernels, precompile, show, src, ptx, sass, cache.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "cache/store.h"
#include "engine/gpu/gpu_model.h"
#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/tensor_parallel.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/quant_mix.h"
#include "jit/cache_config.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/jit.h"
#include "tools/commands.h"

extern char** environ;  // what a disassembler runs with (run_tool)

namespace fs = std::filesystem;

namespace gj::tools {

namespace {

// Where the kernel plan comes from: a named preset or a GGUF file, plus the weight type.
struct PlanSource {
    std::string variant;
    std::string model;
    std::string wtype;
    int tp = 1;  // GPUs of a tensor-parallel split (engine/gpu/shard_plan.h)
};

void add_plan_options(CLI::App* sub, PlanSource& src) {
    auto* v = sub->add_option("--variant", src.variant,
                              "model preset (e2b, e4b, 12b, 26b-a4b, 31b; default e4b)");
    auto* m =
        sub->add_option("--model", src.model, "GGUF file: the kernels a GPU load of it compiles");
    v->excludes(m);
    sub->add_option("--wtype", src.wtype,
                    "weight type of the preset's matrices (q8_0, q4_0, f16, ..., or a mix: q4_k_m, "
                    "q5_k_m, ...; default q8_0)");
    sub->add_option("--tp", src.tp,
                    "GPUs of a tensor-parallel split: the union of every rank's kernels, each "
                    "specialized for its slice of the heads, FFN and vocabulary")
        ->check(CLI::Range(1, gemma4::kMaxTensorParallel));
}

struct Plan {
    std::string label;
    std::vector<jit::KernelSpec> specs;
    std::string shards;  // --tp > 1: what each rank holds
    std::string fused;   // --tp > 1: whether the decode post-norms take NCCL's device API
};

// A split's plan line about the forms compiled against NCCL's device headers (FusedNormPlan), as
// fused_norm_plan decides them for a load of `ranks` ranks on this machine; returns that
// decision.
std::optional<gemma4::FusedNormPlan> plan_fused_norms(const jit::Flags& flags, int ranks,
                                                      Plan& plan) {
    std::string why;
    auto fused = gemma4::fused_norm_plan(flags, nullptr, &why);
    plan.fused = fused ? fmt::format(
                             "decode post-norms sum the ranks' products themselves{}{} "
                             "(NCCL device headers in {})\n",
                             fused->push ? ", products pushed" : "",
                             fused->prefill_push(ranks)
                                 ? "; prefill chunks' products pushed into every rank's window"
                                 : "",
                             fused->headers)
                       : "fused all-reduce norms off: " + why + "\n";
    return fused;
}

// An --arch value, checked as GEMMAJIT_ARCH would be but reported as the option it came from
// (it reaches the plan through that variable, whose name would only mislead).
void check_arch_option(const std::string& arch) {
    try {
        jit::Flags::parse({{"GEMMAJIT_ARCH", arch}});
    } catch (const jit::FlagError&) {
        throw std::invalid_argument(
            fmt::format("--arch '{}' is not valid: expected sm_<digits> with an optional a/f "
                        "suffix, e.g. sm_90a (several, comma separated, for precompile)",
                        arch));
    }
}

// The process's flags with the target arch set to `arch` (empty: unchanged): a plan depends on its
// target (the prefill GEMM variant), so each arch gets its own.
jit::Flags flags_for_arch(const std::string& arch) {
    jit::EnvMap env = jit::process_environment();
    if (!arch.empty()) {
        check_arch_option(arch);
        env["GEMMAJIT_ARCH"] = arch;
    }
    return jit::Flags::parse(env);
}

Plan load_plan(const PlanSource& src, const std::string& arch) {
    const jit::Flags flags = flags_for_arch(arch);
    Plan plan;
    if (!src.model.empty()) {
        // A file's own tensor types decide each kernel: exactly the set a GPU load compiles.
        if (!src.wtype.empty())
            throw std::invalid_argument(
                "--wtype applies to --variant; with --model the file's tensor types decide");
        plan.label = src.model;
        gemma4::GpuModelOptions opts;
        opts.flags = &flags;
        if (src.tp == 1) {
            plan.specs = gemma4::GpuModel::kernel_specs(src.model, opts);
            return plan;
        }
        // Every rank's load, planned (no GPU; NCCL loaded for its device headers' release): the
        // union of their kernels.
        plan.label += fmt::format(", tensor parallel over {} GPUs", src.tp);
        plan_fused_norms(flags, src.tp, plan);
        std::set<std::string> seen;
        for (int r = 0; r < src.tp; ++r) {
            opts.tp.rank = r;
            opts.tp.ranks = src.tp;
            for (auto& spec : gemma4::GpuModel::kernel_specs(src.model, opts))
                if (seen.insert(spec.name).second) plan.specs.push_back(std::move(spec));
        }
        return plan;
    }
    ggml::Type wtype = ggml::Type::Q8_0;
    const auto t = ggml::type_from_name(src.wtype);
    // A quant mix (q4_k_m, ...; q4_k etc. too, whose files keep some tensors in other types, and
    // the types without GPU kernels) plans each tensor in the type a load uploads it as.
    const auto mix = gemma4::quant_mix_from_name(src.wtype);
    const bool use_mix =
        mix && (!t || gemma4::spec_util::is_kquant(*t) || !gemma4::spec_util::has_matvec(*t));
    if (!src.wtype.empty() && !t && !mix)
        throw std::invalid_argument("--wtype " + src.wtype + " is not a ggml type name or mix (" +
                                    gemma4::quant_mix_names_text() + ")");
    if (t) wtype = *t;
    const std::string variant = src.variant.empty() ? "e4b" : src.variant;
    plan.label = variant + " (" + (use_mix ? mix->name : ggml::type_name(wtype)) + ")";
    // The prefill GEMM variant as a load would pick it (GEMMAJIT_MMQ_VARIANT, the target arch).
    gemma4::PlanTypes types{wtype, wtype, wtype, wtype};
    gemma4::apply_prefill_flags(types, flags, jit::default_target_arch(flags));
    const gemma4::Config cfg = gemma4::Config::preset(variant);
    if (src.tp > 1) {
        const std::vector<gemma4::PlanTypes> type_sets =
            use_mix ? gemma4::mix_plan_types(cfg, *mix, types)
                    : std::vector<gemma4::PlanTypes>{types};
        // Slices in whole blocks of the largest block any matrix type has (at least the 32
        // elements every matvec width is a multiple of).
        int block = 32;
        for (const auto& p : type_sets)
            block = std::max(block, gemma4::spec_util::matvec_block_elems(p.matmul));
        const gemma4::ShardPlan shards = gemma4::plan_shards(cfg, src.tp, block);
        plan.label += fmt::format(", tensor parallel over {} GPUs", src.tp);
        plan.shards = shards.describe();
        const auto fused = plan_fused_norms(flags, src.tp, plan);
        plan.specs = gemma4::build_kernel_plan(shards, type_sets, fused ? &*fused : nullptr);
        return plan;
    }
    plan.specs = use_mix ? gemma4::build_kernel_plan(cfg, *mix, types)
                         : gemma4::build_kernel_plan(cfg, types);
    return plan;
}

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

const char* state_name(jit::CacheState s) {
    switch (s) {
        case jit::CacheState::Hit:
            return "cached";
        case jit::CacheState::Missing:
            return "missing";
        case jit::CacheState::Damaged:
            return "damaged";
        case jit::CacheState::Disabled:
            return "cache off";
    }
    return "?";
}

std::string or_dash(int v) {
    return v < 0 ? "-" : std::to_string(v);
}

const jit::KernelSpec& find_spec(const Plan& plan, const std::string& name) {
    for (const auto& s : plan.specs)
        if (s.name == name) return s;
    std::string names;
    for (const auto& s : plan.specs) names += "\n  " + s.name;
    throw std::invalid_argument(fmt::format(
        "kernel {} is not in the plan of {}; its kernels are:{}", name, plan.label, names));
}

void cmd_env() {
    const jit::Flags& flags = jit::Flags::process();
    size_t width = 5;
    for (const auto& d : jit::flag_table())
        if (flags.is_set(d.name)) width = std::max(width, flags.raw(d.name).size());
    fmt::print("{:<26} {:<{}} {:<8} {:<15} {}\n", "FLAG", "VALUE", width, "DEFAULT", "CLASS",
               "HELP");
    for (const auto& d : jit::flag_table()) {
        std::string value = flags.is_set(d.name) ? flags.raw(d.name) : "-";
        fmt::print("{:<26} {:<{}} {:<8} {:<15} {}\n", d.name, value, width,
                   d.default_value.empty() ? "\"\"" : std::string(d.default_value),
                   d.cls == jit::FlagClass::OutputChanging ? "output-changing" : "neutral", d.help);
    }
    jit::Jit jit;
    fmt::print("\ncache: {}\ntarget: {}\n",
               jit.cache_root().empty() ? std::string("off") : jit.cache_root(),
               jit.default_arch());
}

void cmd_kernels(const PlanSource& src, std::string arch, bool status) {
    jit::Jit jit;
    if (arch.empty()) arch = jit.default_arch();
    Plan plan = load_plan(src, arch);
    fmt::print("{} kernels for {} on {}\n{}{}", plan.specs.size(), plan.label, arch, plan.shards,
               plan.fused);
    size_t width = 4;
    for (const auto& s : plan.specs) width = std::max(width, s.name.size());
    fmt::print("{:<4} {:<{}} {:<16} {}{}\n", "PRIO", "SPEC", width, "FAMILY",
               status ? "CACHE     " : "", "ENTRIES");
    for (const auto& s : plan.specs) {
        std::string entries;
        for (const auto& e : s.entries) entries += (entries.empty() ? "" : ",") + e;
        fmt::print("{:<4} {:<{}} {:<16} {}{}\n", s.priority, s.name, width, s.family,
                   status ? fmt::format("{:<10}", state_name(jit.cache_state(s, arch))) : "",
                   entries);
    }
}

void cmd_precompile(const PlanSource& src, const std::string& archs, int jobs, bool load) {
    if (load) jit::Device::get();  // no GPU: fail before compiling anything
    jit::Jit jit;
    std::vector<std::string> arch_list = split_list(archs);
    if (arch_list.empty()) arch_list.push_back(jit.default_arch());
    for (const auto& arch : arch_list) check_arch_option(arch);  // all before compiling any
    auto t0 = std::chrono::steady_clock::now();
    size_t hits = 0, misses = 0;
    fmt::print("{:<48} {:<7} {:>5} {:>11} {:>9} {:>10} {}\n", "SPEC", "ARCH", "REGS",
               "SPILL(st/ld)", "SMEM", "COMPILE_MS", "CACHE");
    jit::ModuleSet modules;
    double load_ms = -1;
    std::string fused;
    for (const auto& arch : arch_list) {
        const Plan plan = load_plan(src, arch);
        fused = plan.fused;
        std::vector<jit::CompiledKernel> out = jit.compile_plan(plan.specs, arch, jobs);
        if (load && arch == jit::Device::get().arch()) {
            auto l0 = std::chrono::steady_clock::now();
            jit.load(modules, out);
            load_ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - l0)
                    .count();
        }
        for (const auto& k : out) {
            (k.cache_hit ? hits : misses)++;
            const auto& r = k.resources;
            fmt::print(
                "{:<48} {:<7} {:>5} {:>11} {:>9} {:>10} {}\n", k.spec.name, k.arch,
                or_dash(r.registers),
                fmt::format("{}/{}", or_dash(r.spill_store_bytes), or_dash(r.spill_load_bytes)),
                or_dash(r.shared_static_bytes),
                k.cache_hit ? std::string("-") : fmt::format("{:.0f}", k.compile_ms),
                k.cache_hit ? "hit" : "miss");
        }
    }
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("total: {} kernels, {} hits, {} misses, wall {:.2f} s ({})\n", hits + misses, hits,
               misses, wall, jit.cache_root().empty() ? "cache off" : jit.cache_root());
    fmt::print("{}", fused);
    if (load) {
        if (load_ms < 0)
            throw std::invalid_argument(fmt::format(
                "--load needs the GPU's own arch ({}) among --arch", jit::Device::get().arch()));
        fmt::print("loaded {} modules on {} in {:.1f} ms (included in the wall time)\n",
                   modules.size(), jit::Device::get().name(), load_ms);
    }
}

// The kernel named on the command line, compiled (or loaded) for the requested arch.
jit::CompiledKernel compiled_spec(const PlanSource& src, const std::string& name,
                                  std::string arch) {
    jit::Jit jit;
    if (arch.empty()) arch = jit.default_arch();
    const Plan plan = load_plan(src, arch);
    return jit.compile(find_spec(plan, name), arch);
}

// A field of a cache entry's meta.json that `show` cannot print: an error naming the entry.
[[noreturn]] void bad_meta_field(const std::string& entry_dir, const std::string& field,
                                 const std::string& why) {
    throw std::runtime_error(
        fmt::format("cache entry {}: meta.json field {} {} (the cache never writes that; "
                    "remove the entry's folder and its next use rebuilds it)",
                    entry_dir, field, why));
}

void cmd_show(const jit::CompiledKernel& k) {
    nlohmann::json meta;
    if (!k.entry_dir.empty())
        if (auto text = cache::read_file(fs::path(k.entry_dir) / "meta.json"))
            meta = nlohmann::json::parse(*text, nullptr, false);
    // The store and the Jit have checked these fields, but the file is read again here and may
    // have changed since: each is checked before it is read.
    if (meta.is_object())
        if (std::string bad = jit::kernel_meta_problem(meta); !bad.empty())
            throw std::runtime_error(fmt::format("cache entry {}: meta.json {}", k.entry_dir, bad));
    fmt::print("spec      {}\nfamily    {}\narch      {}\nkey       {}\nentry     {}\n",
               k.spec.name, k.spec.family, k.arch, k.key,
               k.entry_dir.empty() ? std::string("(not cached)") : k.entry_dir);
    if (meta.is_object()) {
        auto when = [&](const char* field) {
            if (!meta.contains(field)) return std::string("-");
            // An integer (kernel_meta_problem, above); a value past what time_t or the calendar can
            // hold (localtime gives NULL for it).
            const int64_t seconds = meta[field].get<int64_t>();
            std::time_t t = static_cast<std::time_t>(seconds);
            std::tm tm{};
            char buf[64];
            if (static_cast<int64_t>(t) != seconds || !::localtime_r(&t, &tm) ||
                std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm) == 0)
                bad_meta_field(k.entry_dir, field,
                               fmt::format("({}) is not a time this system can show", seconds));
            return std::string(buf);
        };
        const std::string created = when("created"), last_used = when("last_used");
        fmt::print("created   {}\nlast used {}\ncompile   {:.0f} ms\n", created, last_used,
                   meta.value("compile_ms", 0.0));
        if (meta.contains("key_record")) {
            const auto& kr = meta["key_record"];
            fmt::print("key record:\n  abi {}\n  nvrtc {}\n  source sha256 {} ({} bytes)\n",
                       kr.value("abi", 0), kr.value("nvrtc", ""), kr.value("source_sha256", ""),
                       kr.value("source_bytes", uint64_t{0}));
            const nlohmann::json flags = kr.value("flags", nlohmann::json::object());
            for (const auto& [name, value] : flags.items())
                fmt::print("  {}={}\n", name,
                           value.is_string() ? value.get<std::string>() : value.dump());
        }
    }
    fmt::print("constants:\n");
    for (const auto& [name, value] : k.spec.constants) fmt::print("  {} = {}\n", name, value);
    fmt::print("options:\n");
    for (const auto& o : k.options) fmt::print("  {}\n", o);
    fmt::print("entries:\n");
    for (size_t i = 0; i < k.spec.entries.size(); ++i) {
        const auto& r = k.resources_per_entry.at(i);
        fmt::print("  {}: {} registers, spill {}/{} B (store/load), {} B static smem, {} B stack\n",
                   k.spec.entries[i], or_dash(r.registers), or_dash(r.spill_store_bytes),
                   or_dash(r.spill_load_bytes), or_dash(r.shared_static_bytes),
                   or_dash(r.stack_bytes));
    }
    fmt::print("NVRTC log:\n{}\n", k.log.empty() ? "  (empty)" : k.log);
}

// cuobjdump or nvdisasm from PATH or the default toolkit location; empty when neither exists.
std::string find_disassembler() {
    std::vector<fs::path> dirs;
    if (const char* path = std::getenv("PATH")) {
        std::stringstream ss(path);
        std::string dir;
        while (std::getline(ss, dir, ':'))
            if (!dir.empty()) dirs.emplace_back(dir);
    }
    dirs.emplace_back("/usr/local/cuda/bin");
    for (const char* tool : {"cuobjdump", "nvdisasm"})
        for (const auto& d : dirs)
            if (::access((d / tool).c_str(), X_OK) == 0) return (d / tool).string();
    return {};
}

// Runs `argv` (argv[0] a path) with this process's stdout and stderr, no shell in between, so no
// character of a path can change the command; its exit status, or -(signal) when killed.
int run_tool(const std::vector<std::string>& argv) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = 0;
    if (int err = ::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ); err != 0)
        throw std::runtime_error(fmt::format("cannot run {}: {}", argv[0], std::strerror(err)));
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            throw std::runtime_error(
                fmt::format("waiting for {}: {}", argv[0], std::strerror(errno)));
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// A new file holding `bytes` in the temp folder ($TMPDIR), created by mkstemps (O_EXCL, a random
// name, mode 0600) so that nothing already there, such as a link planted under a name guessed
// in advance, is followed or overwritten.
fs::path scratch_file(const std::string& stem, const std::string& suffix, std::string_view bytes) {
    std::string name = (fs::temp_directory_path() / (stem + "-XXXXXX" + suffix)).string();
    int fd = ::mkstemps(name.data(), static_cast<int>(suffix.size()));
    if (fd < 0)
        throw std::runtime_error(
            fmt::format("cannot create a scratch file {}: {}", name, std::strerror(errno)));
    std::FILE* f = ::fdopen(fd, "wb");
    bool ok = f != nullptr && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    int err = errno;
    if (f == nullptr) {
        ::close(fd);
    } else if (std::fclose(f) != 0 && ok) {  // the buffered tail failed to reach the file
        ok = false;
        err = errno;
    }
    if (!ok) {
        ::unlink(name.c_str());
        throw std::runtime_error(
            fmt::format("cannot write scratch file {}: {}", name, std::strerror(err)));
    }
    return name;
}

void cmd_sass(const jit::CompiledKernel& k) {
    std::string tool = find_disassembler();
    fs::path cubin = k.entry_dir.empty() ? fs::path() : fs::path(k.entry_dir) / "kernel.cubin";
    const bool cached = !cubin.empty() && fs::exists(cubin);
    if (tool.empty())
        throw std::runtime_error(fmt::format(
            "no SASS disassembler: neither cuobjdump nor nvdisasm is on PATH or in "
            "/usr/local/cuda/bin. Install the CUDA toolkit's cuobjdump/nvdisasm (packages "
            "cuda-cuobjdump-13-0 / cuda-nvdisasm-13-0) and run `cuobjdump -sass {}`",
            cached ? cubin.string() : std::string("<the kernel's cubin>")));
    std::optional<fs::path> scratch;
    if (!cached) {
        scratch = scratch_file("gemmajit-" + k.spec.name, ".cubin", k.cubin);
        cubin = *scratch;
    }
    struct RemoveOnExit {  // the scratch file goes whatever happens next
        const std::optional<fs::path>& path;
        ~RemoveOnExit() {
            std::error_code ec;
            if (path) fs::remove(*path, ec);
        }
    } cleanup{scratch};
    std::vector<std::string> argv = {tool};
    if (tool.ends_with("cuobjdump")) argv.push_back("-sass");
    argv.push_back(cubin.string());
    int rc = run_tool(argv);
    if (rc != 0) {
        std::string cmd;
        for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
        throw std::runtime_error(fmt::format("`{}` failed ({} {})", cmd,
                                             rc < 0 ? "killed by signal" : "exit status",
                                             rc < 0 ? -rc : rc));
    }
}

cache::Store open_store() {
    cache::StoreConfig config = jit::cache_config(jit::Flags::process(), [](const std::string& m) {
        std::fprintf(stderr, "gemmajit: warning: %s\n", m.c_str());
    });
    // The fields the Jit reads count as part of an entry, as they do when it loads one.
    config.check_meta = jit::kernel_meta_problem;
    return cache::Store(std::move(config));
}

void cmd_cache(const std::string& action, const std::string& max_size) {
    cache::Store store = open_store();
    if (store.config().root.empty())
        throw std::runtime_error("the kernel cache has no root directory");
    const fs::path& root = store.config().root;
    // Removing entries writes the cache, which GEMMAJIT_CACHE=ro and =0 forbid.
    if ((action == "prune" || action == "clear") && store.config().mode != cache::Mode::ReadWrite)
        throw std::runtime_error(fmt::format(
            "cache {} removes entries, but the kernel cache {} is {} (GEMMAJIT_CACHE={}); "
            "nothing was removed: run it with GEMMAJIT_CACHE=1",
            action, root.string(),
            store.config().mode == cache::Mode::ReadOnly ? "read-only" : "off",
            store.config().mode == cache::Mode::ReadOnly ? "ro" : "0"));
    if (action == "stat") {
        cache::StoreStats st = store.stat();
        const char* mode = store.config().mode == cache::Mode::Off        ? "off (GEMMAJIT_CACHE=0)"
                           : store.config().mode == cache::Mode::ReadOnly ? "read-only"
                                                                          : "read-write";
        fmt::print("root       {}\nmode       {}\nentries    {}\nsize       {}\ncap        {}\n",
                   root.string(), mode, st.entries, jit::format_size(st.bytes),
                   store.config().max_bytes ? jit::format_size(store.config().max_bytes)
                                            : std::string("none"));
        for (const auto& [partition, n] : st.entries_per_partition)
            fmt::print("  {:<40} {} entries\n", partition, n);
    } else if (action == "verify") {
        // Counted before: verify removes the damaged entries only on a read-write cache.
        const size_t total = store.list().size();
        auto damaged = store.verify(store.config().mode == cache::Mode::ReadWrite);
        for (const auto& e : damaged) fmt::print("damaged: {} ({})\n", e.dir.string(), e.problem);
        fmt::print("{} entries checked, {} damaged{}\n", total, damaged.size(),
                   damaged.empty() || store.config().mode != cache::Mode::ReadWrite
                       ? ""
                       : " (removed; they are rebuilt on next use)");
        if (!damaged.empty() && store.config().mode != cache::Mode::ReadWrite)
            throw std::runtime_error("damaged entries left in place (cache is not read-write)");
    } else if (action == "prune") {
        uint64_t cap = store.config().max_bytes;
        if (!max_size.empty()) {
            try {
                cap = jit::parse_size(max_size);
            } catch (const std::invalid_argument& e) {
                throw std::invalid_argument(
                    fmt::format("--max-size '{}' is not valid: {}", max_size, e.what()));
            }
        }
        cache::PruneResult r = store.prune(cap);
        fmt::print("removed {} entries ({}); {} remain under {}\n", r.removed,
                   jit::format_size(r.freed_bytes), jit::format_size(r.remaining_bytes),
                   cap ? jit::format_size(cap) : std::string("no cap"));
    } else if (action == "clear") {
        size_t n = store.clear();
        fmt::print("removed {} entries from {}\n", n, root.string());
    }
}

}  // namespace

void add_jit_commands(CLI::App& app) {
    app.add_subcommand("env", "list every GEMMAJIT_* flag: value, default, class, help")
        ->callback(cmd_env);

    {
        auto src = std::make_shared<PlanSource>();
        auto arch = std::make_shared<std::string>();
        auto status = std::make_shared<bool>(false);
        auto* sub = app.add_subcommand("kernels", "list the kernel plan of a model");
        add_plan_options(sub, *src);
        sub->add_option("--arch", *arch,
                        "target architecture (default: GEMMAJIT_ARCH or the GPU's)");
        sub->add_flag("--status", *status, "show whether each kernel is in the cache");
        sub->callback([=] { cmd_kernels(*src, *arch, *status); });
    }
    {
        auto src = std::make_shared<PlanSource>();
        auto archs = std::make_shared<std::string>();
        auto jobs = std::make_shared<int>(0);
        auto load = std::make_shared<bool>(false);
        auto* sub = app.add_subcommand("precompile", "compile a model's kernels into the cache");
        add_plan_options(sub, *src);
        sub->add_option("--arch", *archs, "comma-separated architectures, e.g. sm_80,sm_90");
        sub->add_option("--jobs", *jobs, "parallel compiles (default GEMMAJIT_THREADS or CPUs)")
            ->check(CLI::Range(0, 1024));
        sub->add_flag("--load", *load, "also load every module on the GPU (measures a warm start)");
        sub->callback([=] { cmd_precompile(*src, *archs, *jobs, *load); });
    }
    struct Stage {
        const char* name;
        const char* help;
        void (*run)(const jit::CompiledKernel&);
    };
    static const Stage stages[] = {
        {"show", "a cached kernel's metadata: options, key record, resources, NVRTC log", cmd_show},
        {"src", "a kernel's rendered CUDA source",
         [](const jit::CompiledKernel& k) { fmt::print("{}", k.source); }},
        {"ptx", "a kernel's PTX", [](const jit::CompiledKernel& k) { fmt::print("{}", k.ptx); }},
        {"sass", "a kernel's SASS (needs cuobjdump or nvdisasm)", cmd_sass},
    };
    for (const Stage& stage : stages) {
        auto src = std::make_shared<PlanSource>();
        auto spec = std::make_shared<std::string>();
        auto arch = std::make_shared<std::string>();
        auto* sub = app.add_subcommand(stage.name, stage.help);
        sub->add_option("SPEC", *spec, "kernel spec name (see `gemmajit kernels`)")->required();
        add_plan_options(sub, *src);
        sub->add_option("--arch", *arch,
                        "target architecture (default: GEMMAJIT_ARCH or the GPU's)");
        auto run = stage.run;
        sub->callback([=] { run(compiled_spec(*src, *spec, *arch)); });
    }
    {
        auto action = std::make_shared<std::string>();
        auto max_size = std::make_shared<std::string>();
        auto* sub = app.add_subcommand("cache", "inspect or maintain the kernel cache");
        sub->add_option("ACTION", *action, "stat | verify | prune | clear")
            ->required()
            ->check(CLI::IsMember({"stat", "verify", "prune", "clear"}));
        sub->add_option("--max-size", *max_size,
                        "prune: cap to prune to (default GEMMAJIT_CACHE_MAX_SIZE)");
        sub->callback([=] { cmd_cache(*action, *max_size); });
    }
}

}  // namespace gj::tools
