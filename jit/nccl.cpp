#include "jit/nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>

#include "jit/device.h"
#include "jit/env_flags.h"

namespace gj::jit {

namespace {

// The ABI subset of nccl.h the engine calls (ncclResult_t, ncclRedOp_t and ncclDataType_t are C
// enums of int size; ncclSum is 0; a communicator is an opaque pointer).
using Result = int;
constexpr Result kSuccess = 0;
constexpr int kSum = 0;
// Blocks of NCCL's symmetric kernels (NCCL_SYM_CTAS) unless the environment sets it.
constexpr const char* kSymmetricBlocks = "16";

std::string env_or(const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return v && *v ? v : fallback;
}

// Existing files matching a glob pattern, sorted (glob's order).
std::vector<std::string> existing(const std::string& pattern) {
    std::vector<std::string> out;
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    return out;
}

}  // namespace

struct Nccl::Api {
    Result (*get_version)(int*) = nullptr;
    Result (*comm_init_all)(Comm*, int, const int*) = nullptr;
    Result (*get_unique_id)(Nccl::UniqueId*) = nullptr;
    Result (*comm_init_rank)(Comm*, int, Nccl::UniqueId, int) = nullptr;
    Result (*all_gather)(const void*, void*, size_t, int, Comm, CUstream) = nullptr;
    Result (*comm_destroy)(Comm) = nullptr;
    Result (*all_reduce)(const void*, void*, size_t, int, int, Comm, CUstream) = nullptr;
    Result (*group_start)() = nullptr;
    Result (*group_end)() = nullptr;
    const char* (*error_string)(Result) = nullptr;
    // Symmetric memory (2.27+; optional: null in older libraries).
    Result (*mem_alloc)(void**, size_t) = nullptr;
    Result (*mem_free)(void*) = nullptr;
    Result (*window_register)(Comm, void*, size_t, Nccl::Window*, int) = nullptr;
    Result (*window_deregister)(Comm, Nccl::Window) = nullptr;
    // The device API's host side (2.28+; optional).
    Result (*dev_comm_create)(Comm, const void*, void*) = nullptr;
    Result (*dev_comm_destroy)(Comm, const void*) = nullptr;

    void check(Result r, const std::string& what) const {
        if (r != kSuccess)
            throw DeviceError(fmt::format("{}: NCCL error {} ({})", what, r,
                                          error_string ? error_string(r) : "no error text"));
    }
};

std::vector<std::string> Nccl::candidates(const Flags& flags) {
    const std::string& given = flags.get_string("GEMMAJIT_NCCL_LIB");
    if (!given.empty()) {
        // A folder stands for the library in it.
        std::error_code ec;
        if (std::filesystem::is_directory(given, ec))
            return {(std::filesystem::path(given) / "libnccl.so.2").string()};
        return {given};
    }
    std::vector<std::string> out = {"libnccl.so.2"};  // LD_LIBRARY_PATH, ldconfig's cache
    auto add = [&](const std::string& pattern) {
        for (auto& p : existing(pattern))
            if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    };
    // The CUDA install (the toolkit's own copy where it ships one).
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
        const std::string root = env_or(var, "");
        if (root.empty()) continue;
        add(root + "/lib64/libnccl.so.2");
        add(root + "/lib/libnccl.so.2");
    }
    add("/usr/local/cuda/lib64/libnccl.so.2");
    add("/usr/local/cuda/lib/libnccl.so.2");
    add("/usr/local/cuda-*/lib*/libnccl.so.2");
    add("/usr/lib/x86_64-linux-gnu/libnccl.so.2");
    // Python wheels (nvidia-nccl-cu12 / -cu13: site-packages/nvidia/nccl/lib), system-wide, per
    // user, in an active virtual or conda environment, and under pyenv.
    const std::string wheel = "/nvidia/nccl/lib/libnccl.so.2";
    const std::string home = env_or("HOME", "/root");
    for (const std::string& site : {std::string("/usr/lib/python3*/dist-packages"),
                                    std::string("/usr/lib/python3/dist-packages"),
                                    std::string("/usr/local/lib/python3*/dist-packages"),
                                    std::string("/usr/local/lib/python3*/site-packages"),
                                    home + "/.local/lib/python3*/site-packages",
                                    home + "/.pyenv/versions/*/lib/python3*/site-packages",
                                    std::string("/opt/conda/lib/python3*/site-packages")})
        add(site + wheel);
    for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
        const std::string root = env_or(var, "");
        if (!root.empty()) add(root + "/lib/python3*/site-packages" + wheel);
    }
    return out;
}

Nccl& Nccl::get(const Flags& flags) {
    static std::mutex mu;
    static Nccl* instance = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    const std::string& given = flags.get_string("GEMMAJIT_NCCL_LIB");
    if (instance) {
        // One library per process: a flag naming another file cannot be honoured any more.
        const std::vector<std::string> wanted = candidates(flags);
        if (!given.empty() && wanted.front() != instance->path_)
            throw DeviceUnavailable(fmt::format(
                "NCCL is already loaded from {}; GEMMAJIT_NCCL_LIB names {} (one library per "
                "process)",
                instance->path_, wanted.front()));
        return *instance;
    }
    // Before NCCL reads its environment (at the first communicator).
    ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    // NCCL's symmetric kernels run on the fewest blocks its cost model puts within 2.5% of their
    // modelled peak. 16 measured faster on NVLink (H200s, docs/PERFORMANCE.md): 31B Q4_0 TP=2
    // tg128 243.0 -> 254.9 (8 and 32 alike), a 512-token chunk's bf16 all-reduce 38 -> 28 us,
    // pp512 +2.6-6.4% at TP=2 and 4; the 12B's TP=2 decode and the 31B's TP=4 one within 1%.
    ::setenv("NCCL_SYM_CTAS", kSymmetricBlocks, /*overwrite=*/0);
    std::vector<std::string> tried;
    for (const std::string& path : candidates(flags)) {
        void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char* e = ::dlerror();
            tried.push_back(fmt::format("{} ({})", path, e ? e : "not loadable"));
            continue;
        }
        auto api = std::make_unique<Api>();
        std::string missing;
        auto sym = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
            if (!fn && missing.empty()) missing = name;
        };
        sym(api->get_version, "ncclGetVersion");
        sym(api->comm_init_all, "ncclCommInitAll");
        sym(api->get_unique_id, "ncclGetUniqueId");
        sym(api->comm_init_rank, "ncclCommInitRank");
        sym(api->all_gather, "ncclAllGather");
        sym(api->comm_destroy, "ncclCommDestroy");
        sym(api->all_reduce, "ncclAllReduce");
        sym(api->group_start, "ncclGroupStart");
        sym(api->group_end, "ncclGroupEnd");
        sym(api->error_string, "ncclGetErrorString");
        auto optional = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
        };
        optional(api->mem_alloc, "ncclMemAlloc");
        optional(api->mem_free, "ncclMemFree");
        optional(api->window_register, "ncclCommWindowRegister");
        optional(api->window_deregister, "ncclCommWindowDeregister");
        optional(api->dev_comm_create, "ncclDevCommCreate");
        optional(api->dev_comm_destroy, "ncclDevCommDestroy");
        if (!missing.empty()) {
            tried.push_back(fmt::format("{} (lacks {})", path, missing));
            ::dlclose(lib);
            continue;
        }
        int version = 0;
        if (api->get_version(&version) != kSuccess || version / 10000 != 2) {
            tried.push_back(fmt::format("{} (version {} where 2.x is needed)", path, version));
            ::dlclose(lib);
            continue;
        }
        auto* n = new Nccl();  // lives for the process, like the driver table
        n->version_ = version;
        n->api_ = api.release();
        n->path_ = path;
        Dl_info info{};
        n->file_ = ::dladdr(reinterpret_cast<void*>(n->api_->get_version), &info) && info.dli_fname
                       ? info.dli_fname
                       : path;
        instance = n;
        return *instance;
    }
    std::string looked;
    for (const auto& t : tried) looked += (looked.empty() ? "" : "; ") + t;
    throw DeviceUnavailable(fmt::format(
        "NCCL (libnccl.so.2) could not be loaded; tried {}. Install NCCL (the CUDA install's copy "
        "or the Python nvidia-nccl wheel) or set GEMMAJIT_NCCL_LIB to the library file",
        looked));
}

std::vector<Nccl::Comm> Nccl::init_all(const std::vector<int>& devices) {
    std::vector<Comm> comms(devices.size(), nullptr);
    api_->check(api_->comm_init_all(comms.data(), int(devices.size()), devices.data()),
                fmt::format("ncclCommInitAll over {} devices", devices.size()));
    return comms;
}

Nccl::UniqueId Nccl::unique_id() {
    UniqueId id{};
    api_->check(api_->get_unique_id(&id), "ncclGetUniqueId");
    return id;
}

Nccl::Comm Nccl::init_rank(int ranks, const UniqueId& id, int rank) {
    Comm comm = nullptr;
    api_->check(api_->comm_init_rank(&comm, ranks, id, rank),
                fmt::format("ncclCommInitRank (rank {} of {})", rank, ranks));
    return comm;
}

void Nccl::all_reduce(Comm comm, CUdeviceptr buf, size_t count, NcclType type, NcclOp op,
                      CUstream stream) {
    void* p = reinterpret_cast<void*>(buf);
    api_->check(api_->all_reduce(p, p, count, int(type), int(op), comm, stream),
                fmt::format("ncclAllReduce ({} elements)", count));
}

void Nccl::all_gather(Comm comm, CUdeviceptr send, CUdeviceptr recv, size_t count, NcclType type,
                      CUstream stream) {
    api_->check(api_->all_gather(reinterpret_cast<const void*>(send), reinterpret_cast<void*>(recv),
                                 count, int(type), comm, stream),
                fmt::format("ncclAllGather ({} elements per rank)", count));
}

bool Nccl::has_windows() const {
    return api_->mem_alloc && api_->mem_free && api_->window_register && api_->window_deregister;
}

CUdeviceptr Nccl::mem_alloc(size_t bytes) {
    if (!has_windows())
        throw DeviceError(
            fmt::format("NCCL {} at {} has no symmetric memory (ncclMemAlloc)", version_, path_));
    void* p = nullptr;
    api_->check(api_->mem_alloc(&p, bytes), fmt::format("ncclMemAlloc ({} bytes)", bytes));
    return reinterpret_cast<CUdeviceptr>(p);
}

void Nccl::mem_free(CUdeviceptr ptr) {
    if (ptr && api_->mem_free) api_->mem_free(reinterpret_cast<void*>(ptr));
}

Nccl::Window Nccl::register_window(Comm comm, CUdeviceptr buf, size_t bytes) {
    constexpr int kWinCollSymmetric = 1;  // NCCL_WIN_COLL_SYMMETRIC
    Window win = nullptr;
    api_->check(
        api_->window_register(comm, reinterpret_cast<void*>(buf), bytes, &win, kWinCollSymmetric),
        fmt::format("ncclCommWindowRegister ({} bytes)", bytes));
    return win;
}

void Nccl::deregister_window(Comm comm, Window win) {
    if (win && api_->window_deregister) api_->window_deregister(comm, win);
}

namespace {

// ncclDevCommRequirements as 2.28.3 declares it (nccl_device/core.h), and as 2.28.7 and 2.28.9 do
// (barrier, LL all-to-all and GIN counts added). Only the LSA barrier count is asked for; the
// rest stays zero (no multimem, no GIN, no extra resources).
struct DevCommRequirements_2_28_3 {
    void* resource_requirements = nullptr;
    void* team_requirements = nullptr;
    bool lsa_multimem = false;
    int lsa_barrier_count = 0;
};
struct DevCommRequirements_2_28_7 {
    void* resource_requirements = nullptr;
    void* team_requirements = nullptr;
    bool lsa_multimem = false;
    int barrier_count = 0;
    int lsa_barrier_count = 0;
    int rail_gin_barrier_count = 0;
    int lsa_ll_a2a_block_count = 0, lsa_ll_a2a_slot_count = 0;
    bool gin_force_enable = false;
    int gin_context_count = 0;
    int gin_signal_count = 0;
    int gin_counter_count = 0;
};

}  // namespace

bool Nccl::has_device_api() const {
    const bool known = version_ == 22803 || version_ == 22807 || version_ == 22809;
    return known && has_windows() && api_->dev_comm_create && api_->dev_comm_destroy;
}

std::vector<uint8_t> Nccl::dev_comm_create(Comm comm, int lsa_barriers) {
    if (!has_device_api())
        throw DeviceError(fmt::format(
            "NCCL {} at {} has no device API the engine knows (2.28.3, 2.28.7 or 2.28.9)", version_,
            path_));
    std::vector<uint8_t> out(kDevCommBytes, 0);
    Result r;
    if (version_ == 22803) {
        DevCommRequirements_2_28_3 reqs;
        reqs.lsa_barrier_count = lsa_barriers;
        r = api_->dev_comm_create(comm, &reqs, out.data());
    } else {
        DevCommRequirements_2_28_7 reqs;
        reqs.lsa_barrier_count = lsa_barriers;
        r = api_->dev_comm_create(comm, &reqs, out.data());
    }
    api_->check(r, fmt::format("ncclDevCommCreate ({} LSA barriers)", lsa_barriers));
    return out;
}

void Nccl::dev_comm_destroy(Comm comm, const std::vector<uint8_t>& dev_comm) {
    if (comm && !dev_comm.empty() && api_->dev_comm_destroy)
        api_->dev_comm_destroy(comm, dev_comm.data());
}

void Nccl::destroy(Comm comm) {
    if (comm) api_->comm_destroy(comm);
}

void Nccl::all_reduce_sum(std::span<const Comm> comms, std::span<const CUdeviceptr> bufs,
                          size_t count, NcclType type, std::span<const CUstream> streams) {
    if (bufs.size() != comms.size() || streams.size() != comms.size())
        throw std::invalid_argument(fmt::format(
            "all_reduce_sum: {} communicators, {} buffers, {} streams (one of each per rank)",
            comms.size(), bufs.size(), streams.size()));
    api_->check(api_->group_start(), "ncclGroupStart");
    for (size_t r = 0; r < comms.size(); ++r) {
        void* p = reinterpret_cast<void*>(bufs[r]);
        const Result res = api_->all_reduce(p, p, count, int(type), kSum, comms[r], streams[r]);
        if (res != kSuccess) {
            api_->group_end();
            api_->check(res, fmt::format("ncclAllReduce (rank {}, {} elements)", r, count));
        }
    }
    api_->check(api_->group_end(), "ncclGroupEnd (all-reduce)");
}

}  // namespace gj::jit
