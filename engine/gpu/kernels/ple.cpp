#include "engine/gpu/kernels/ple.h"

#include <fmt/format.h>

#include <stdexcept>

namespace gj::gemma4 {

jit::KernelSpec ple_finish_spec(int n_layers, int ple_dim) {
    if (n_layers <= 0 || ple_dim <= 0 || ple_dim % 32 != 0)
        throw std::invalid_argument(fmt::format(
            "ple_finish: {} layers of width {} (width must be a positive multiple of 32)", n_layers,
            ple_dim));
    jit::KernelSpec s;
    s.family = "ple";
    s.name = fmt::format("ple_finish.l{}.p{}", n_layers, ple_dim);
    s.constants = {{"P", ple_dim}, {"N_LAYERS", n_layers}};
    s.entries = {"ple_finish"};
    s.priority = 0;
    return s;
}

jit::KernelSpec gelu_mul_spec(int ple_dim) {
    if (ple_dim <= 0 || ple_dim % 32 != 0)
        throw std::invalid_argument(
            fmt::format("gelu_mul: width {} is not a positive multiple of 32", ple_dim));
    jit::KernelSpec s;
    s.family = "ple";
    s.name = fmt::format("gelu_mul.p{}", ple_dim);
    s.constants = {{"P", ple_dim}};
    s.entries = {"gelu_mul",     "gelu_mul_q8",   "gelu_mul_inplace",
                 "gelu_mul_f16", "gelu_mul_pair", "gelu_mul_f16_pair"};
    s.priority = 0;
    return s;
}

}  // namespace gj::gemma4
