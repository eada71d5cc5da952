// Tensor parallelism (issue 15): how N GPUs split one dense Gemma 4 model, Megatron style, and the
// shape each GPU's kernels are specialized for. No GPU involved: `kernels --tp N` and
// `precompile --tp N` list and compile these plans; the multi-GPU forward pass reads its slices
// from them.
//
// Per layer, rank r of N holds
//   * the query heads [r H / N, (r + 1) H / N): its slice of the Q projection rows (column
//     parallel), of attention and of the output projection's input (row parallel: each rank's
//     partial output is summed by one all-reduce after attention);
//   * the KV heads those query heads read. With at least as many KV heads as ranks they are split
//     like the query heads (each rank reads its own K/V rows and caches only them); with fewer
//     (E2B's single KV head, the 12B's and 31B's global layers) each KV head is replicated on the
//     N / K ranks whose query heads share it, so a head is never cut across GPUs;
//   * a slice of the FFN width, in whole weight blocks (32 elements, 256 for the K-quants): gate
//     and up rows (column parallel), down columns (row parallel, one all-reduce after the FFN).
//     A width that does not split evenly gives some ranks one block more: the JIT specializes each
//     rank's kernels for its own width;
//   * a slice of the vocabulary for the LM head [r V / N, (r + 1) V / N): each rank picks its own
//     top candidates and only those are gathered. The embedding gather reads the whole table (one
//     row per token): a tied table is held whole by every rank beside its LM head slice (a second
//     copy of 1/N of it; a row slice of a split-layout table is no sub-buffer of it).
// Replicated on every rank: norms, the embedding table, and the per-layer-embedding (PLE) parts
// of E2B/E4B (a 256-wide gate and projection per layer, too small to split).
// The mixture-of-experts model is not planned (its experts would split by expert, not by rows).
#pragma once

#include <string>
#include <vector>

#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

// The most GPUs one model is split over.
inline constexpr int kMaxTensorParallel = 8;

struct Range {
    int first = 0, count = 0;
    int end() const { return first + count; }
    bool operator==(const Range&) const = default;
};

// Part r of n of [0, total) in whole units of `unit`: [floor(r U / n), floor((r+1) U / n)) of the
// U = total / unit units, so the parts differ by at most one unit and the larger ones are spread
// (84 blocks over 8 ranks: 10, 11, 10, 11, ...). The vocabulary split is part_of(V, 1, r, n).
Range part_of(int total, int unit, int r, int n);

struct LayerShard {
    Range q_heads;        // query heads of this rank
    Range kv_heads;       // KV heads its query heads read (none on KV-shared layers' own weights:
                          // they read the donor layer's cache, sharded the same way)
    int kv_replicas = 1;  // ranks that hold the same KV heads (> 1: fewer KV heads than ranks)
    Range ffn;            // FFN slice in elements: gate/up rows, down input columns
};

struct RankShard {
    int rank = 0;
    std::vector<LayerShard> layers;
    Range vocab;  // LM head rows
    // The shape this rank's kernels are specialized for: the heads, KV heads and FFN width of its
    // slices (d_model, head dims and the layer pattern unchanged; the vocabulary whole, for the
    // embedding gather; the LM head's rows are `vocab`).
    Config config;
};

struct ShardPlan {
    int ranks = 1;
    int block = 32;  // FFN slices are whole multiples of this many elements
    std::vector<RankShard> shards;
    std::string describe() const;  // one line per rank for logs and `kernels --tp`
};

// The plan of `cfg` over `ranks` GPUs with FFN slices in whole `block`-element weight blocks (32;
// 256 for K-quant weights). Throws ConfigError naming the reason: ranks outside 1..8, a
// mixture-of-experts model, query heads not divisible by the ranks, a layer whose KV heads and the
// ranks do not divide one another (a head would be cut), a rank's heads (the output
// projection's input slice) not whole blocks, an FFN width not a multiple of the block or of
// fewer blocks than ranks.
ShardPlan plan_shards(const Config& cfg, int ranks, int block = 32);

}  // namespace gj::gemma4
