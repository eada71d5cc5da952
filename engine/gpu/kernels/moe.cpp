#include "engine/gpu/kernels/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "engine/gpu/kernels/spec_util.h"

namespace gj::gemma4 {

jit::KernelSpec moe_spec(int n_experts, int n_used, int d_model) {
    if (n_experts < 1 || n_experts > 1024 || n_used < 1 || n_used > std::min(n_experts, 32) ||
        d_model <= 0 || d_model % 4 != 0)
        throw std::invalid_argument(
            fmt::format("moe: {} experts, {} per token, width {} (1..1024 experts, 1..32 per "
                        "token, a width that is a positive multiple of 4)",
                        n_experts, n_used, d_model));
    jit::KernelSpec s;
    s.family = "moe";
    s.name = fmt::format("moe.e{}.k{}.d{}", n_experts, n_used, d_model);
    // moe_group: 32 warps, fewer where its per-round table of warps x E counts would pass 32 KiB
    // of shared memory (more than 256 experts).
    s.constants = {{"E", n_experts},
                   {"K", n_used},
                   {"D", d_model},
                   {"THREADS", 32 * std::clamp(8192 / n_experts, 1, 32)}};
    s.entries = {"moe_route", "moe_group", "moe_route_group", "moe_ffn_out"};
    s.priority = 0;
    return s;
}

jit::KernelSpec moe_spec(const Config& cfg) {
    return moe_spec(cfg.n_experts, cfg.n_experts_used, cfg.d_model);
}

bool moe_experts_split(ggml::Type t, int rows, int k) {
    // Every plane of an expert starts 16-byte aligned in the stack when the expert holds a
    // multiple of 8 units (32 weights each) of the 32-block types; of 32 for split Q4_K / Q5_K
    // (148 / 180 bytes per 256 weights; their 2-byte sc | m plane at 16.5 / 20.5 bytes per
    // unit); of 64 for Q6_K (210 bytes per 256 weights).
    const int units_multiple = t == ggml::Type::Q6_K                            ? 64
                               : t == ggml::Type::Q4_K || t == ggml::Type::Q5_K ? 32
                                                                                : 8;
    return spec_util::has_split(t) && rows > 0 && k > 0 &&
           k % spec_util::matvec_block_elems(t) == 0 &&
           (int64_t(rows) * (k / 32)) % units_multiple == 0;
}

int moe_route_group_max_tokens(int n_used) {
    return std::min(4, 32 / std::max(1, n_used));
}

int moe_group_bound(int T, int n_used, int n_experts, int cols) {
    const int slots = T * n_used;
    return std::min(slots, (slots + cols - 1) / cols + n_experts);
}

}  // namespace gj::gemma4
