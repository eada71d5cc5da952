#include "jit/grid_dependency.h"

#include <cctype>

namespace gj::jit {

namespace {

// Offset of the declaration `.entry <name>` (the name followed by a non-identifier character),
// or npos.
size_t find_entry(std::string_view ptx, std::string_view name) {
    constexpr std::string_view kEntry = ".entry ";
    for (size_t at = ptx.find(kEntry); at != std::string_view::npos;
         at = ptx.find(kEntry, at + 1)) {
        const size_t name_at = at + kEntry.size();
        if (ptx.compare(name_at, name.size(), name) != 0) continue;
        const size_t end = name_at + name.size();
        if (end < ptx.size() &&
            (std::isalnum(static_cast<unsigned char>(ptx[end])) || ptx[end] == '_'))
            continue;
        return at;
    }
    return std::string_view::npos;
}

}  // namespace

bool ptx_entry_waits_on_grid(std::string_view ptx, std::string_view entry) {
    const size_t at = find_entry(ptx, entry);
    if (at == std::string_view::npos) return false;
    // The body runs to the next function declaration (entry or func) or the end of the module.
    size_t end = ptx.size();
    for (std::string_view next : {".entry ", ".func "}) {
        const size_t n = ptx.find(next, at + 1);
        if (n != std::string_view::npos && n < end) end = n;
    }
    return ptx.substr(at, end - at).find("griddepcontrol.wait") != std::string_view::npos;
}

}  // namespace gj::jit
