#include "engine/gpu/kernels/attn_prep.h"

#include <fmt/format.h>

#include <stdexcept>

namespace gj::gemma4 {

jit::KernelSpec attn_prep_spec(int head_dim, int n_heads, int n_kv_heads, int rope_pairs,
                               bool has_kv, bool has_v, KvType kv) {
    if (head_dim <= 0 || head_dim % 8 != 0)
        throw std::invalid_argument(
            fmt::format("attn_prep: head dim {} is not a positive multiple of 8", head_dim));
    if (n_heads <= 0 || n_kv_heads <= 0)
        throw std::invalid_argument(
            fmt::format("attn_prep: {} heads, {} KV heads", n_heads, n_kv_heads));
    if (rope_pairs < 0 || rope_pairs > head_dim / 2)
        throw std::invalid_argument(fmt::format("attn_prep: {} RoPE pairs for head dim {} (0..{})",
                                                rope_pairs, head_dim, head_dim / 2));
    if (has_kv && kv == KvType::Q8_0 && head_dim % 32 != 0)
        throw std::invalid_argument(fmt::format(
            "attn_prep: a q8_0 KV cache needs a head dim that is a multiple of 32, not {}",
            head_dim));
    const int kv_const = has_kv ? kv_type_constant(kv) : 0;
    jit::KernelSpec s;
    s.family = "attn_prep";
    s.name =
        fmt::format("attn_prep.hd{}.h{}.kv{}.rp{}{}", head_dim, n_heads, n_kv_heads, rope_pairs,
                    !has_kv ? ".shared"
                    : has_v ? fmt::format(".{}", kv_type_name(kv))
                            : fmt::format(".keqv.{}", kv_type_name(kv)));
    // One warp per head row; 4 rows per block keeps blocks small enough that a decode step
    // (one token, 8..64 rows) still spreads over several SMs.
    s.constants = {{"HEAD_DIM", head_dim},     {"N_HEADS", n_heads},
                   {"N_KV_HEADS", n_kv_heads}, {"ROPE_PAIRS", rope_pairs},
                   {"HAS_KV", has_kv ? 1 : 0}, {"HAS_V", has_kv && has_v ? 1 : 0},
                   {"KV_TYPE", kv_const},      {"WARPS", 4}};
    s.entries = {"attn_prep"};
    s.priority = 0;
    return s;
}

jit::KernelSpec attn_prep_spec(const Config& cfg, int layer, KvType kv) {
    const LayerConfig& l = cfg.layers.at(layer);
    return attn_prep_spec(l.head_dim, cfg.n_heads, l.n_kv_heads, l.rope_pairs, l.has_kv,
                          l.has_v_proj, kv);
}

}  // namespace gj::gemma4
