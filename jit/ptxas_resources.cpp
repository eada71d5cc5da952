#include "jit/ptxas_resources.h"

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

namespace gj::jit {

std::vector<KernelResources> parse_ptxas_resources(std::string_view log,
                                                   const std::vector<std::string>& entries) {
    // ptxas -v prints, per function:
    //   ptxas info    : Compiling entry function 'add1' for 'sm_90'
    //   ptxas info    : Function properties for add1
    //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    //   ptxas info    : Used 8 registers, used 1 barriers, 4096 bytes smem, 400 bytes cmem[0]
    static const std::regex compiling_re(R"(Compiling entry function '([^']+)')");
    static const std::regex properties_re(R"(Function properties for ([A-Za-z0-9_$]+))");
    static const std::regex frame_re(
        R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
    static const std::regex used_re(R"(Used (\d+) registers)");
    static const std::regex smem_re(R"((\d+) bytes smem)");
    std::map<std::string, KernelResources, std::less<>> found;
    std::string current;
    std::istringstream in{std::string(log)};
    std::string line;
    while (std::getline(in, line)) {
        std::smatch m;
        if (std::regex_search(line, m, compiling_re) || std::regex_search(line, m, properties_re)) {
            current = m[1].str();
            continue;
        }
        if (current.empty()) continue;
        KernelResources& r = found[current];
        if (std::regex_search(line, m, frame_re)) {
            r.stack_bytes = std::stoi(m[1].str());
            r.spill_store_bytes = std::stoi(m[2].str());
            r.spill_load_bytes = std::stoi(m[3].str());
        }
        if (std::regex_search(line, m, used_re)) {
            r.registers = std::stoi(m[1].str());
            r.shared_static_bytes = std::regex_search(line, m, smem_re) ? std::stoi(m[1].str()) : 0;
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
