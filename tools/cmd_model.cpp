// Placeholder until the CPU-model work lands: synth, info, logits, run.
#include "tools/commands.h"

namespace gj::tools {
void add_model_commands(CLI::App&) {}
}  // namespace gj::tools
