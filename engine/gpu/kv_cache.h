// The GPU KV cache of one or more sequences (a server's slots): per sequence and layer that owns
// KV, a K plane and a V plane
// [slots][n_kv_heads][head_dim] of the KV element type (issue-4 contract); a q8_0 plane is that
// array of int8 followed by its fp16 scales [slots][n_kv_heads][head_dim / 32]
// (kernel_templates/attn_kv.cuh). Global layers keep
// every position (slots = context); sliding layers keep a ring of the window plus the largest
// prefill chunk minus one, indexed pos % slots, so a chunk never overwrites a key that one of
// its own queries still needs. KV-shared layers alias their donor's planes. The kernels find a
// token's planes through a per-layer device table of every sequence's plane addresses, so one
// launch (and one captured decode graph) serves tokens of any sequences.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/gpu/kv_type.h"
#include "engine/model/gemma4_config.h"
#include "jit/device.h"
#include "jit/env_flags.h"

namespace gj::gemma4 {

// GEMMAJIT_KV_TYPE (the KvType enum and its names are kv_type.h's).
KvType kv_type_from_flags(const jit::Flags& flags);

struct KvGeometry {
    int context = 0;    // positions a sequence may hold
    int max_chunk = 1;  // most tokens appended by one prefill chunk
    KvType type = KvType::F16;
    int sequences = 1;  // independent sequences, each with its own planes
};

// Ring slots of a sliding layer: window + max_chunk - 1 rounded up to 16, or the whole context
// when that is smaller (the ring then never wraps).
int sliding_slots(int window, int max_chunk, int context);
// Slots of layer l (its donor's for a KV-shared layer).
int kv_slots(const Config& cfg, int layer, const KvGeometry& g);
// Device bytes of one K or V plane of `slots` positions of layer l (q8_0: payload + scales).
// Throws ConfigError for q8_0 with a head dim that is not a multiple of 32.
uint64_t kv_plane_bytes(const Config& cfg, int layer, int slots, KvType type);
// Device bytes the whole cache takes (every sequence, and the plane table).
uint64_t kv_cache_bytes(const Config& cfg, const KvGeometry& g);

class KvCache {
  public:
    struct Layer {
        CUdeviceptr k = 0, v = 0;  // the donor's planes on KV-shared layers
        int slots = 0;
    };

    // Allocates every plane of every sequence (zeroed, so a never-written slot reads as 0, not
    // NaN) and the plane table.
    KvCache(const Config& cfg, const KvGeometry& g);

    int sequences() const { return geo_.sequences; }
    const Layer& layer(int l, int seq = 0) const {
        return layers_.at(size_t(seq) * n_layers_ + size_t(l));
    }
    // Layer l's plane table on the device: [sequences][2] addresses (K plane, V plane), the `kv`
    // argument of attn_prep and flash_decode.
    CUdeviceptr table(int l) const { return table_.ptr() + uint64_t(l) * geo_.sequences * 16; }
    const KvGeometry& geometry() const { return geo_; }
    uint64_t bytes() const { return bytes_; }
    // Whether positions [keep, end) can be dropped and later rewritten without losing any key a
    // position < keep still needs: global layers always; a sliding ring only while the dropped
    // span has not overwritten the window before `keep`.
    bool can_rewind(int end, int keep) const;

  private:
    KvGeometry geo_;
    std::vector<jit::DeviceBuffer> planes_;
    std::vector<Layer> layers_;  // [sequences][n_layers]
    jit::DeviceBuffer table_;    // [n_layers][sequences][2] plane addresses
    int n_layers_ = 0;
    int min_sliding_slots_ = 0;  // smallest ring (0 without sliding layers)
    int window_ = 0;
    uint64_t bytes_ = 0;
};

}  // namespace gj::gemma4
