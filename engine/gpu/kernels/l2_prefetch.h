// l2_prefetch family: the spec of kernel_templates/l2_prefetch.cu, the side-branch kernel of a
// decode step that asks L2 for the weights the next matvecs read (GEMMAJIT_PREFETCH_AHEAD_MB).
//
// Spec name: "l2_prefetch" (shape-independent: one spec per model); entry l2_prefetch.
// Launch (from the spec constants): block THREADS, grid ceil(bytes / (THREADS * CHUNK)).
#pragma once

#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Up to four weight ranges asked of L2 without waiting: "l2_prefetch".
jit::KernelSpec l2_prefetch_spec();

}  // namespace gj::gemma4
