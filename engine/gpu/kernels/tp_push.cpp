#include "engine/gpu/kernels/tp_push.h"

#include <fmt/format.h>

#include <stdexcept>

namespace gj::gemma4 {

jit::KernelSpec tp_push_spec(int d, int ranks, const std::string& nccl_include) {
    if (ranks < 2 || ranks > 8)
        throw std::invalid_argument(
            fmt::format("tp_push: {} ranks (the exchange is for 2 to 8 ranks of one host)", ranks));
    if (d <= 0 || d % 4 != 0)
        throw std::invalid_argument(
            fmt::format("tp_push: width {} is not a positive multiple of 4", d));
    if (nccl_include.empty())
        throw std::invalid_argument("tp_push: the exchange needs NCCL's device headers");
    jit::KernelSpec s;
    s.family = "tp_push";
    s.name = fmt::format("tp_push.n{}.r{}", d, ranks);
    s.constants = {{"N", d}, {"PEERS", ranks}, {"THREADS", 512}};
    s.entries = {"bf16_push_lsa", "lsa_window_pointers"};
    s.nccl_include = nccl_include;
    s.priority = 1;
    return s;
}

}  // namespace gj::gemma4
