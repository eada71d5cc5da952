#include "engine/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>

namespace gj::gemma4 {

namespace {

constexpr uint64_t kElementBytes = 2;  // f16 and bf16

uint64_t plane_bytes(const Config& cfg, int layer, int slots) {
    return uint64_t(slots) * uint64_t(cfg.kv_dim(layer)) * kElementBytes;
}

}  // namespace

KvType kv_type_from_flags(const jit::Flags& flags) {
    const std::string& name = flags.get_string("GEMMAJIT_KV_TYPE");
    const KvType t = kv_type_from_name(name);
    if (t != KvType::F16 && t != KvType::BF16)
        throw ConfigError(fmt::format(
            "GEMMAJIT_KV_TYPE={}: this KV cache type has no attention kernels yet (use f16 or "
            "bf16)",
            name));
    return t;
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
    uint64_t total = 0;
    for (int l = 0; l < cfg.n_layers; ++l)
        if (cfg.layers[l].has_kv) total += 2 * plane_bytes(cfg, l, kv_slots(cfg, l, g));
    return total;
}

KvCache::KvCache(const Config& cfg, const KvGeometry& g)
    : geo_(g), layers_(cfg.n_layers), window_(cfg.sliding_window) {
    if (g.context <= 0 || g.max_chunk <= 0)
        throw std::invalid_argument(fmt::format(
            "KV cache: context {} and chunk {} must be positive", g.context, g.max_chunk));
    for (int l = 0; l < cfg.n_layers; ++l) {
        if (!cfg.layers[l].has_kv) continue;
        const int slots = kv_slots(cfg, l, g);
        const uint64_t bytes = plane_bytes(cfg, l, slots);
        jit::DeviceBuffer k(bytes), v(bytes);
        k.zero();
        v.zero();
        layers_[l] = Layer{k.ptr(), v.ptr(), slots};
        planes_.push_back(std::move(k));
        planes_.push_back(std::move(v));
        bytes_ += 2 * bytes;
        if (cfg.layers[l].sliding)
            min_sliding_slots_ =
                min_sliding_slots_ == 0 ? slots : std::min(min_sliding_slots_, slots);
    }
    for (int l = 0; l < cfg.n_layers; ++l)
        if (!cfg.layers[l].has_kv) layers_[l] = layers_.at(cfg.layers[l].kv_source);
}

bool KvCache::can_rewind(int end, int keep) const {
    if (keep >= end || min_sliding_slots_ == 0) return true;
    // The oldest key a position >= keep may read is keep - window + 1; the dropped positions
    // [keep, end) must not have landed on its slot or a later one's.
    const int oldest = std::max(0, keep - window_ + 1);
    return oldest + min_sliding_slots_ >= end;
}

}  // namespace gj::gemma4
