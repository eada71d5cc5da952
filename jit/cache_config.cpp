#include "jit/cache_config.h"

#include <cstdlib>

namespace gj::jit {

cache::StoreConfig cache_config(const Flags& flags, cache::WarningSink warn) {
    cache::StoreConfig c;
    const std::string& mode = flags.get_string("GEMMAJIT_CACHE");
    c.mode = mode == "0"    ? cache::Mode::Off
             : mode == "ro" ? cache::Mode::ReadOnly
                            : cache::Mode::ReadWrite;
    c.root = flags.get_string("GEMMAJIT_CACHE_DIR");
    if (c.root.empty()) {
        if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
            c.root = std::filesystem::path(xdg) / "gemmajit";
        else if (const char* home = std::getenv("HOME"); home && *home)
            c.root = std::filesystem::path(home) / ".cache" / "gemmajit";
    }
    if (c.root.empty() && c.mode != cache::Mode::Off && warn)
        warn("neither GEMMAJIT_CACHE_DIR, XDG_CACHE_HOME nor HOME is set; the kernel cache is off");
    c.max_bytes = flags.get_size("GEMMAJIT_CACHE_MAX_SIZE");
    c.warn = std::move(warn);
    return c;
}

}  // namespace gj::jit
