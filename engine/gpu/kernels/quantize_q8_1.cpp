#include "engine/gpu/kernels/quantize_q8_1.h"

namespace gj::gemma4 {

jit::KernelSpec quantize_spec() {
    jit::KernelSpec s;
    s.family = "quantize_q8_1";
    s.name = "quantize_q8_1";
    s.constants = {{"THREADS", 256}};
    s.entries = {"quantize_q8_1"};
    s.priority = 0;
    return s;
}

}  // namespace gj::gemma4
