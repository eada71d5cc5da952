// The kernel cache's configuration as the env flags define it (root, mode, size cap). The cache
// library never reads flags itself; the Jit and the `cache` CLI both build its config here.
#pragma once

#include "cache/store.h"
#include "jit/env_flags.h"

namespace gj::jit {

// Root: GEMMAJIT_CACHE_DIR, else ${XDG_CACHE_HOME:-~/.cache}/gemmajit (empty root: cache off).
cache::StoreConfig cache_config(const Flags& flags, cache::WarningSink warn);

}  // namespace gj::jit
