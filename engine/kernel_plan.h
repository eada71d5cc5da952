// The list of kernel specializations a model needs, derived from its Config and weight type.
#pragma once

#include <vector>

#include "engine/gemma4_config.h"
#include "engine/ggml_types.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Deduplicated by spec name, decode-path kernels first (priority 0). Throws ConfigError for a
// weight type with no kernel.
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, ggml::Type weight_type);

}  // namespace gj::gemma4
