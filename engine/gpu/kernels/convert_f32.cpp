#include "engine/gpu/kernels/convert_f32.h"

namespace gj::gemma4 {

jit::KernelSpec convert_f32_spec() {
    jit::KernelSpec s;
    s.family = "convert_f32";
    s.name = "convert_f32";
    s.constants = {{"THREADS", 256}};
    s.entries = {"f32_to_f16", "f32_to_bf16"};
    s.priority = 1;
    return s;
}

}  // namespace gj::gemma4
