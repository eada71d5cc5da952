#include "engine/gpu/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>

namespace gj::gemma4 {

uint64_t kv_plane_bytes(const Config& cfg, int layer, int slots, KvType type) {
    const uint64_t elements = uint64_t(slots) * uint64_t(cfg.kv_dim(layer));
    if (type != KvType::Q8_0) return elements * 2;  // f16, bf16
    const int head_dim = cfg.layers.at(layer).head_dim;
    if (head_dim % 32 != 0)
        throw ConfigError(fmt::format(
            "GEMMAJIT_KV_TYPE=q8_0: layer {} of {} has head dim {}, not a multiple of the q8_0 "
            "block (32)",
            layer, cfg.name, head_dim));
    // int8 payload (a multiple of 32 bytes, so the scales start 16-byte aligned), then one fp16
    // scale per 32 elements.
    return elements + elements / 32 * 2;
}

KvType kv_type_from_flags(const jit::Flags& flags) {
    return kv_type_from_name(flags.get_string("GEMMAJIT_KV_TYPE"));
}

int sliding_slots(int window, int max_chunk, int context) {
    const int ring = (window + max_chunk - 1 + 15) / 16 * 16;
    return std::min(ring, context);
}

int kv_slots(const Config& cfg, int layer, const KvGeometry& g) {
    const LayerConfig& lc = cfg.layers.at(cfg.layers.at(layer).kv_source);
    return lc.sliding ? sliding_slots(cfg.sliding_window, g.max_chunk, g.context) : g.context;
}

uint64_t kv_cache_bytes(const Config& cfg, const KvGeometry& g) {
    uint64_t one = 0;
    for (int l = 0; l < cfg.n_layers; ++l)
        if (cfg.layers[l].has_kv) one += 2 * kv_plane_bytes(cfg, l, kv_slots(cfg, l, g), g.type);
    const uint64_t table = uint64_t(cfg.n_layers) * uint64_t(g.sequences) * 16;
    return one * uint64_t(g.sequences) + table;
}

KvCache::KvCache(const Config& cfg, const KvGeometry& g) : geo_(g), window_(cfg.sliding_window) {
    if (g.context <= 0 || g.max_chunk <= 0 || g.sequences <= 0)
        throw std::invalid_argument(
            fmt::format("KV cache: context {}, chunk {} and sequences {} must be positive",
                        g.context, g.max_chunk, g.sequences));
    n_layers_ = cfg.n_layers;
    layers_.resize(size_t(g.sequences) * size_t(n_layers_));
    for (int s = 0; s < g.sequences; ++s) {
        Layer* seq = &layers_[size_t(s) * n_layers_];
        for (int l = 0; l < cfg.n_layers; ++l) {
            if (!cfg.layers[l].has_kv) continue;
            const int slots = kv_slots(cfg, l, g);
            const uint64_t bytes = kv_plane_bytes(cfg, l, slots, g.type);
            jit::DeviceBuffer k(bytes), v(bytes);
            k.zero();
            v.zero();
            seq[l] = Layer{k.ptr(), v.ptr(), slots};
            planes_.push_back(std::move(k));
            planes_.push_back(std::move(v));
            bytes_ += 2 * bytes;
            if (cfg.layers[l].sliding)
                min_sliding_slots_ =
                    min_sliding_slots_ == 0 ? slots : std::min(min_sliding_slots_, slots);
        }
        for (int l = 0; l < cfg.n_layers; ++l)
            if (!cfg.layers[l].has_kv) seq[l] = seq[cfg.layers[l].kv_source];
    }
    std::vector<uint64_t> table(size_t(n_layers_) * g.sequences * 2);
    for (int l = 0; l < n_layers_; ++l)
        for (int s = 0; s < g.sequences; ++s) {
            table[(size_t(l) * g.sequences + s) * 2] = layer(l, s).k;
            table[(size_t(l) * g.sequences + s) * 2 + 1] = layer(l, s).v;
        }
    table_ = jit::DeviceBuffer(std::max<uint64_t>(table.size() * 8, 16));
    table_.upload(table.data(), table.size() * 8);
    bytes_ += table.size() * 8;
}

bool KvCache::can_rewind(int end, int keep) const {
    if (keep >= end || min_sliding_slots_ == 0) return true;
    // The oldest key a position >= keep may read is keep - window + 1; the dropped positions
    // [keep, end) must not have landed on its slot or a later one's.
    const int oldest = std::max(0, keep - window_ + 1);
    return oldest + min_sliding_slots_ >= end;
}

}  // namespace gj::gemma4
