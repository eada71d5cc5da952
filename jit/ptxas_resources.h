// Per-entry resource usage parsed from the ptxas -v lines in an NVRTC log.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "jit/jit.h"

namespace gj::jit {

// Resources for each name in `entries` (in that order; -1 fields where the log says nothing).
std::vector<KernelResources> parse_ptxas_resources(std::string_view log,
                                                   const std::vector<std::string>& entries);
// Field-wise maximum (what one summary row shows).
KernelResources max_resources(const std::vector<KernelResources>& per_entry);

}  // namespace gj::jit
