#include "engine/gpu/shard_plan.h"

#include <fmt/format.h>

namespace gj::gemma4 {

Range part_of(int total, int unit, int r, int n) {
    const int units = total / unit;
    const int first = int(int64_t(units) * r / n), end = int(int64_t(units) * (r + 1) / n);
    return Range{first * unit, (end - first) * unit};
}

ShardPlan plan_shards(const Config& cfg, int ranks, int block) {
    auto fail = [&](const std::string& why) {
        throw ConfigError(fmt::format("model {}: no tensor-parallel plan over {} GPUs: {}",
                                      cfg.name, ranks, why));
    };
    if (ranks < 1 || ranks > kMaxTensorParallel)
        fail(fmt::format("the GPU count must be 1 to {}", kMaxTensorParallel));
    if (block < 1) fail(fmt::format("weight block of {} elements", block));
    if (cfg.is_moe())
        fail(
            "mixture-of-experts models are not split (only the dense models: E2B, E4B, 12B, "
            "31B)");
    if (cfg.n_heads % ranks != 0)
        fail(fmt::format("its {} query heads do not split evenly", cfg.n_heads));
    const int hq = cfg.n_heads / ranks;
    ShardPlan plan;
    plan.ranks = ranks;
    plan.block = block;
    for (int r = 0; r < ranks; ++r) {
        RankShard s;
        s.rank = r;
        s.config = cfg;
        s.config.n_heads = hq;
        s.vocab = part_of(cfg.vocab_size, 1, r, ranks);
        for (int l = 0; l < cfg.n_layers; ++l) {
            const LayerConfig& lc = cfg.layers[l];
            const int kv = lc.n_kv_heads, group = cfg.n_heads / kv;  // query heads per KV head
            LayerShard ls;
            ls.q_heads = Range{r * hq, hq};
            if (kv % ranks == 0) {
                ls.kv_heads = Range{r * (kv / ranks), kv / ranks};
            } else if (ranks % kv == 0) {
                // Fewer KV heads than ranks: this rank's query heads all read one KV head, which
                // the ranks / kv ranks sharing it each hold whole.
                ls.kv_heads = Range{ls.q_heads.first / group, 1};
                ls.kv_replicas = ranks / kv;
            } else {
                fail(fmt::format(
                    "layer {} has {} KV heads, which neither split over the GPUs nor share them "
                    "evenly (a head would be cut)",
                    l, kv));
            }
            // The output projection reads this rank's heads: whole blocks of them.
            if (hq * lc.head_dim % block != 0)
                fail(
                    fmt::format("layer {}'s {} query heads of {} per GPU are not whole "
                                "{}-element blocks of the output projection's input",
                                l, hq, lc.head_dim, block));
            if (lc.ffn_dim % block != 0 || lc.ffn_dim / block < ranks)
                fail(
                    fmt::format("layer {}'s FFN width {} is not {} or more whole {}-element "
                                "blocks",
                                l, lc.ffn_dim, ranks, block));
            ls.ffn = part_of(lc.ffn_dim, block, r, ranks);
            s.config.layers[l].n_kv_heads = ls.kv_heads.count;
            s.config.layers[l].ffn_dim = ls.ffn.count;
            s.layers.push_back(ls);
        }
        s.config.validate();
        plan.shards.push_back(std::move(s));
    }
    return plan;
}

std::string ShardPlan::describe() const {
    std::string out;
    for (const RankShard& s : shards) {
        // Layers of one kind (sliding or global) share their head split; the FFN slice may differ
        // per layer only where the model's widths do (E2B's double-wide layers).
        const LayerShard* sliding = nullptr;
        const LayerShard* global = nullptr;
        int ffn_min = s.layers.front().ffn.count, ffn_max = ffn_min;
        for (size_t l = 0; l < s.layers.size(); ++l) {
            (s.config.layers[l].sliding ? sliding : global) = &s.layers[l];
            ffn_min = std::min(ffn_min, s.layers[l].ffn.count);
            ffn_max = std::max(ffn_max, s.layers[l].ffn.count);
        }
        auto kv = [](const LayerShard* ls) {
            if (!ls) return std::string("-");
            return fmt::format(
                "{}..{}{}", ls->kv_heads.first, ls->kv_heads.end() - 1,
                ls->kv_replicas > 1 ? fmt::format(" (x{} replicated)", ls->kv_replicas) : "");
        };
        const LayerShard& any = s.layers.front();
        out += fmt::format(
            "rank {}: query heads {}..{}, KV heads sliding {} / global {}, FFN {} columns, "
            "vocabulary rows {}..{}\n",
            s.rank, any.q_heads.first, any.q_heads.end() - 1, kv(sliding), kv(global),
            ffn_min == ffn_max ? std::to_string(ffn_min) : fmt::format("{}..{}", ffn_min, ffn_max),
            s.vocab.first, s.vocab.end() - 1);
    }
    return out;
}

}  // namespace gj::gemma4
