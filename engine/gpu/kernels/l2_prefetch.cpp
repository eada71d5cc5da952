#include "engine/gpu/kernels/l2_prefetch.h"

namespace gj::gemma4 {

jit::KernelSpec l2_prefetch_spec() {
    jit::KernelSpec s;
    s.family = "l2_prefetch";
    s.name = "l2_prefetch";
    // 32 threads of 16 KiB: a block asks for 512 KiB, so a few MiB spread over many SMs' TMA
    // units rather than queueing on one.
    s.constants = {{"THREADS", 32}, {"CHUNK", 16384}};
    s.entries = {"l2_prefetch"};
    s.priority = 0;
    return s;
}

}  // namespace gj::gemma4
