// Placeholder until the tokenizer/chat/sampler work lands: run.
#include "tools/commands.h"

namespace gj::tools {
void add_run_commands(CLI::App&) {}
}  // namespace gj::tools
