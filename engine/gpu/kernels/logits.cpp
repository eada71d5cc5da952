#include "engine/gpu/kernels/logits.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace gj::gemma4 {

jit::KernelSpec logits_spec(int vocab, int topk) {
    if (vocab <= 0 || vocab % 4 != 0)
        throw std::invalid_argument(
            fmt::format("logits: vocabulary size {} is not a positive multiple of 4", vocab));
    if (topk < 1 || topk > 64 || topk > vocab)
        throw std::invalid_argument(
            fmt::format("logits: top-k of {} (1..64 and at most the vocabulary {})", topk, vocab));
    constexpr int threads = 256;
    // argmax: 2 float4 per thread and block; top-k: slices of up to 4096 logits (16 candidates
    // per thread), and the merge of all blocks' candidates no larger than that.
    const int argmax_blocks = std::clamp(vocab / (threads * 8), 1, 1024);
    const int topk_blocks = std::clamp(vocab / 4096, 1, 4096 / topk);
    jit::KernelSpec s;
    s.family = "logits";
    s.name = fmt::format("logits.v{}.k{}", vocab, topk);
    s.constants = {{"V", vocab},
                   {"THREADS", threads},
                   {"ARGMAX_BLOCKS", argmax_blocks},
                   {"TOPK", topk},
                   {"TOPK_BLOCKS", topk_blocks},
                   {"WORK_BYTES", 16 + 8 * (argmax_blocks + int64_t(topk_blocks) * topk)}};
    s.entries = {"softcap_argmax", "softcap_topk", "softcap"};
    s.priority = 0;
    return s;
}

}  // namespace gj::gemma4
