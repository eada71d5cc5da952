#include "jit/ptxas_resources.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>

namespace gj::jit {

namespace {

// The decimal number written right before `suffix` in `line` ("... 12 bytes smem"), or -1.
int number_before(std::string_view line, std::string_view suffix) {
    const size_t at = line.find(suffix);
    if (at == std::string_view::npos) return -1;
    size_t begin = at;
    while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) --begin;
    if (begin == at) return -1;
    int value = 0;
    std::from_chars(line.data() + begin, line.data() + at, value);
    return value;
}

// The function name after `marker` in `line`, up to a quote or the end of the name; "" if absent.
std::string name_after(std::string_view line, std::string_view marker) {
    const size_t at = line.find(marker);
    if (at == std::string_view::npos) return {};
    std::string_view rest = line.substr(at + marker.size());
    size_t n = 0;
    while (n < rest.size() &&
           (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_' || rest[n] == '$'))
        ++n;
    return std::string(rest.substr(0, n));
}

}  // namespace

std::vector<KernelResources> parse_ptxas_resources(std::string_view log,
                                                   const std::vector<std::string>& entries) {
    // ptxas -v prints, per function:
    //   ptxas info    : Compiling entry function 'add1' for 'sm_90'
    //   ptxas info    : Function properties for add1
    //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    //   ptxas info    : Used 8 registers, used 1 barriers, 4096 bytes smem, 400 bytes cmem[0]
    std::map<std::string, KernelResources, std::less<>> found;
    std::string current;
    while (!log.empty()) {
        const size_t eol = log.find('\n');
        const std::string_view line = log.substr(0, eol);
        log = eol == std::string_view::npos ? std::string_view{} : log.substr(eol + 1);
        std::string name = name_after(line, "Compiling entry function '");
        if (name.empty()) name = name_after(line, "Function properties for ");
        if (!name.empty()) {
            current = std::move(name);
            continue;
        }
        if (current.empty()) continue;
        KernelResources& r = found[current];
        if (line.find("bytes stack frame") != std::string_view::npos) {
            r.stack_bytes = number_before(line, " bytes stack frame");
            r.spill_store_bytes = number_before(line, " bytes spill stores");
            r.spill_load_bytes = number_before(line, " bytes spill loads");
        }
        if (const int regs = number_before(line, " registers"); regs >= 0) {
            r.registers = regs;
            r.shared_static_bytes = std::max(0, number_before(line, " bytes smem"));
        }
    }
    std::vector<KernelResources> out;
    for (const auto& e : entries) {
        auto it = found.find(e);
        out.push_back(it == found.end() ? KernelResources{} : it->second);
    }
    return out;
}

KernelResources max_resources(const std::vector<KernelResources>& per_entry) {
    KernelResources m;
    for (const auto& r : per_entry) {
        m.registers = std::max(m.registers, r.registers);
        m.spill_store_bytes = std::max(m.spill_store_bytes, r.spill_store_bytes);
        m.spill_load_bytes = std::max(m.spill_load_bytes, r.spill_load_bytes);
        m.shared_static_bytes = std::max(m.shared_static_bytes, r.shared_static_bytes);
        m.stack_bytes = std::max(m.stack_bytes, r.stack_bytes);
    }
    return m;
}

}  // namespace gj::jit
