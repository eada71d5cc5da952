#include "jit/nvrtc_compiler.h"

#include <link.h>
#include <nvrtc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <sstream>

#include "cache/sha256.h"
#include "cache/store.h"
#include "jit/ptxas_resources.h"

namespace gj::jit {

namespace {

struct ProgramDeleter {
    void operator()(nvrtcProgram p) const { nvrtcDestroyProgram(&p); }
};
using Program = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

Program create_program(const std::string& source, const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    std::vector<const char*> names, texts;
    for (const auto& [n, t] : headers) {
        names.push_back(n.c_str());
        texts.push_back(t.c_str());
    }
    nvrtcProgram p = nullptr;
    nvrtcResult r = nvrtcCreateProgram(&p, source.c_str(), name.c_str(), int(headers.size()),
                                       texts.data(), names.data());
    if (r != NVRTC_SUCCESS)
        throw std::runtime_error(
            fmt::format("nvrtcCreateProgram({}) failed: {}", name, nvrtcGetErrorString(r)));
    return Program(p);
}

std::string program_log(nvrtcProgram p) {
    size_t size = 0;
    if (nvrtcGetProgramLogSize(p, &size) != NVRTC_SUCCESS || size <= 1) return {};
    std::string log(size, '\0');
    nvrtcGetProgramLog(p, log.data());
    log.resize(size - 1);  // drop the terminating NUL
    return log;
}

std::string get_ptx(nvrtcProgram p) {
    size_t size = 0;
    if (nvrtcGetPTXSize(p, &size) != NVRTC_SUCCESS || size == 0) return {};
    std::string ptx(size, '\0');
    if (nvrtcGetPTX(p, ptx.data()) != NVRTC_SUCCESS) return {};
    if (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
    return ptx;
}

std::string get_cubin(nvrtcProgram p) {
    size_t size = 0;
    if (nvrtcGetCUBINSize(p, &size) != NVRTC_SUCCESS || size == 0) return {};
    std::string cubin(size, '\0');
    if (nvrtcGetCUBIN(p, cubin.data()) != NVRTC_SUCCESS) return {};
    return cubin;
}

NvrtcIdentity probe_identity() {
    NvrtcIdentity id;
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    id.version = fmt::format("{}.{}", major, minor);
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0) {
        id.supported_archs.resize(n);
        nvrtcGetSupportedArchs(id.supported_archs.data());
    }
    // nvrtcVersion has no build number, but two builds of one major.minor may generate different
    // code; the preprocessor knows it, so compile one global holding it and read it from the PTX.
    id.build = id.version;
    try {
        Program p = create_program(
            "extern \"C\" __device__ int gj_nvrtc_build = "
            "__CUDACC_VER_BUILD__;\n",
            "gj_nvrtc_probe.cu");
        std::string arch =
            fmt::format("--gpu-architecture=compute_{}",
                        id.supported_archs.empty() ? 75 : id.supported_archs.front());
        const char* opts[] = {arch.c_str()};
        if (nvrtcCompileProgram(p.get(), 1, opts) == NVRTC_SUCCESS) {
            std::string ptx = get_ptx(p.get());
            std::smatch m;
            if (std::regex_search(ptx, m, std::regex(R"(gj_nvrtc_build = (\d+);)")))
                id.build = fmt::format("{}.{}", id.version, m[1].str());
            if (std::regex_search(ptx, m, std::regex(R"(Compiler Build ID: (\S+))")))
                id.build_id = m[1].str();
        }
    } catch (const std::exception&) {
        // Keep major.minor: the key is still correct, only less precise across builds.
    }
    return id;
}

// The file this process's NVRTC code comes from: the loaded libnvrtc.so, or the executable when
// NVRTC is linked in statically. Its path, size, mtime and inode key the identity record: an
// upgrade or another toolkit is another file (a new inode and mtime at least).
struct LibraryFile {
    std::string path;
    uint64_t size = 0, inode = 0;
    int64_t mtime_ns = 0;
};

std::optional<LibraryFile> nvrtc_library_file() {
    std::string path;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
            std::string_view name = info->dlpi_name ? info->dlpi_name : "";
            size_t slash = name.rfind('/');
            if (!name.substr(slash == std::string_view::npos ? 0 : slash + 1)
                     .starts_with("libnvrtc.so"))
                return 0;
            *static_cast<std::string*>(out) = std::string(name);
            return 1;
        },
        &path);
    if (path.empty()) path = "/proc/self/exe";
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    return LibraryFile{path, static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_ino),
                       int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

nlohmann::json record_json(const LibraryFile& lib, const NvrtcIdentity& id) {
    return {{"library", lib.path},      {"size", lib.size},
            {"mtime_ns", lib.mtime_ns}, {"inode", lib.inode},
            {"version", id.version},    {"build", id.build},
            {"build_id", id.build_id},  {"supported_archs", id.supported_archs}};
}

// The identity a record holds, when the record describes `lib` and this NVRTC's version.
std::optional<NvrtcIdentity> read_record(const std::filesystem::path& file, const LibraryFile& lib,
                                         const std::string& version) {
    auto text = cache::read_file(file);
    if (!text) return std::nullopt;
    auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    try {
        if (!j.is_object() || j.at("library") != lib.path || j.at("size") != lib.size ||
            j.at("mtime_ns") != lib.mtime_ns || j.at("inode") != lib.inode ||
            j.at("version") != version)
            return std::nullopt;
        NvrtcIdentity id;
        id.version = version;
        id.build = j.at("build").get<std::string>();
        id.build_id = j.at("build_id").get<std::string>();
        id.supported_archs = j.at("supported_archs").get<std::vector<int>>();
        if (!id.build.starts_with(version) || id.supported_archs.empty()) return std::nullopt;
        return id;
    } catch (const nlohmann::json::exception&) {
        return std::nullopt;
    }
}

// Atomic (temp file + rename) so a reader never sees half a record; a failure only costs the
// next process a probe (an unwritable cache is reported by the kernel cache itself).
void write_record(const std::filesystem::path& file, const LibraryFile& lib,
                  const NvrtcIdentity& id) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    if (ec) return;
    std::filesystem::path tmp =
        file.parent_path() / fmt::format(".tmp-{}-{}-{:08x}", file.filename().string(), ::getpid(),
                                         std::random_device{}());
    try {
        cache::write_file_synced(tmp, record_json(lib, id).dump(2));
        std::filesystem::rename(tmp, file);
    } catch (const std::exception&) {
        std::filesystem::remove(tmp, ec);
    }
}

NvrtcIdentity recorded_or_probed_identity(const std::filesystem::path& record_dir, bool write) {
    if (record_dir.empty()) return probe_identity();
    auto lib = nvrtc_library_file();
    if (!lib) return probe_identity();
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    const std::string version = fmt::format("{}.{}", major, minor);
    const std::string key = cache::sha256_hex(fmt::format(
        "{}\n{}\n{}\n{}\n{}", lib->path, lib->size, lib->mtime_ns, lib->inode, version));
    const std::filesystem::path file =
        record_dir / "nvrtc-identity" / (key.substr(0, 16) + ".json");
    if (auto id = read_record(file, *lib, version)) return *id;
    NvrtcIdentity id = probe_identity();
    // A probe that could not read the build number is not worth keeping: the next one may.
    if (write && id.build != id.version) write_record(file, *lib, id);
    return id;
}

int arch_number(const std::string& arch) {
    static const std::regex arch_re(R"(sm_(\d{2,3})[af]?)");
    std::smatch m;
    if (!std::regex_match(arch, m, arch_re))
        throw std::invalid_argument(fmt::format(
            "target architecture '{}' is not valid (expected sm_<digits>, optionally with an "
            "a or f suffix, e.g. sm_90 or sm_90a)",
            arch));
    return std::stoi(m[1].str());
}

}  // namespace

int NvrtcIdentity::version_number() const {
    int major = 0, minor = 0;
    std::sscanf(version.c_str(), "%d.%d", &major, &minor);
    return major * 1000 + minor * 10;
}

const NvrtcIdentity& nvrtc_identity(const std::filesystem::path& record_dir, bool write_record) {
    static const NvrtcIdentity id = recorded_or_probed_identity(record_dir, write_record);
    return id;
}

std::vector<std::string> canonical_options(const CompileOptions& opts) {
    int sm = arch_number(opts.arch);
    const auto& supported = nvrtc_identity().supported_archs;
    if (!supported.empty() &&
        std::find(supported.begin(), supported.end(), sm) == supported.end()) {
        std::string list;
        for (int a : supported) list += fmt::format("{}sm_{}", list.empty() ? "" : ", ", a);
        throw std::invalid_argument(fmt::format("NVRTC {} cannot compile for {} (it supports {})",
                                                nvrtc_identity().version, opts.arch, list));
    }
    std::vector<std::string> o = {"--gpu-architecture=" + opts.arch, "-std=c++17",
                                  "--ptxas-options=-v"};
    // NVRTC 12.9+ keeps its own cache in the driver's compute cache when a driver is loaded: a
    // hit there skips ptxas, so the log loses the register/spill report, and it duplicates what
    // our cache stores. Ours is the cache; NVRTC must compile.
    if (nvrtc_identity().version_number() >= 12090) o.push_back("--no-cache");
    if (opts.lineinfo) o.push_back("-lineinfo");
    if (opts.maxrregcount > 0) o.push_back(fmt::format("--maxrregcount={}", opts.maxrregcount));
    o.insert(o.end(), opts.extra.begin(), opts.extra.end());
    return o;
}

std::string numbered_listing(const std::string& source) {
    std::string out;
    std::istringstream in(source);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) out += fmt::format("{:5} | {}\n", ++n, line);
    return out;
}

std::vector<std::string> ptx_entries(const std::string& ptx) {
    static const std::regex entry_re(R"(\.entry\s+([A-Za-z_$][A-Za-z0-9_$]*))");
    std::vector<std::string> out;
    for (std::sregex_iterator it(ptx.begin(), ptx.end(), entry_re), end; it != end; ++it)
        out.push_back((*it)[1].str());
    return out;
}

NvrtcOutput nvrtc_compile(const std::string& source, const std::string& program_name,
                          const std::vector<std::string>& options,
                          const std::vector<std::string>& entries,
                          const std::vector<std::pair<std::string, std::string>>& headers) {
    auto t0 = std::chrono::steady_clock::now();
    Program p = create_program(source, program_name + ".cu", headers);
    std::vector<const char*> argv;
    for (const auto& o : options) argv.push_back(o.c_str());
    nvrtcResult r = nvrtcCompileProgram(p.get(), static_cast<int>(argv.size()), argv.data());
    NvrtcOutput out;
    out.log = program_log(p.get());
    std::string opt_text;
    for (const auto& o : options) opt_text += " " + o;
    if (r != NVRTC_SUCCESS)
        throw CompileError(
            fmt::format("NVRTC failed to compile {} ({}); options:{}\n"
                        "--- NVRTC log ---\n{}\n--- rendered source ---\n{}",
                        program_name, nvrtcGetErrorString(r), opt_text,
                        out.log.empty() ? "(empty)" : out.log, numbered_listing(source)),
            out.log, source);
    out.ptx = get_ptx(p.get());
    out.cubin = get_cubin(p.get());
    out.ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (out.cubin.empty())
        throw CompileError(fmt::format("NVRTC produced no CUBIN for {} (options:{}); a real "
                                       "architecture sm_XX is required",
                                       program_name, opt_text),
                           out.log, source);
    std::vector<std::string> defined = ptx_entries(out.ptx);
    for (const auto& e : entries) {
        if (std::find(defined.begin(), defined.end(), e) != defined.end()) continue;
        std::string have;
        for (const auto& d : defined) have += (have.empty() ? "" : ", ") + d;
        throw CompileError(
            fmt::format("{}: entry point {} is not defined by the compiled program "
                        "(it defines: {}); declare it extern \"C\" __global__\n"
                        "--- rendered source ---\n{}",
                        program_name, e, have.empty() ? "none" : have, numbered_listing(source)),
            out.log, source);
    }
    out.resources = parse_ptxas_resources(out.log, entries);
    return out;
}

}  // namespace gj::jit
