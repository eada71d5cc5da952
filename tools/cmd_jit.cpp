// Placeholder until the JIT-core work lands: env, kernels, precompile, show/src/ptx/sass, cache.
#include "tools/commands.h"

namespace gj::tools {
void add_jit_commands(CLI::App&) {}
}  // namespace gj::tools
