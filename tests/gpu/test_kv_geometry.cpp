// KV cache geometry of the GPU forward (no GPU needed): ring sizes of sliding layers, donors of
// KV-shared layers, total bytes (f16 and q8_0 planes), and the KV type flag.
#include <gtest/gtest.h>

#include "engine/gpu/kv_cache.h"
#include "engine/model/gemma4_config.h"
#include "jit/env_flags.h"

using gj::gemma4::Config;
using gj::gemma4::KvGeometry;
using gj::gemma4::KvType;

TEST(KvGeometry, SlidingRingsHoldTheWindowPlusAChunk) {
    // window + chunk - 1, rounded up to 16; never more than the context.
    EXPECT_EQ(gj::gemma4::sliding_slots(512, 256, 131072), 768);
    EXPECT_EQ(gj::gemma4::sliding_slots(512, 1, 131072), 512);
    EXPECT_EQ(gj::gemma4::sliding_slots(8, 4, 256), 16);
    EXPECT_EQ(gj::gemma4::sliding_slots(1024, 256, 600), 600);
}

TEST(KvGeometry, SharedLayersUseTheirDonorsSlotsAndOwnNoBytes) {
    const Config c = Config::preset("e4b");
    const KvGeometry g{4096, 256, KvType::F16};
    for (int l = 0; l < c.n_layers; ++l) {
        const int src = c.layers[l].kv_source;
        EXPECT_EQ(gj::gemma4::kv_slots(c, l, g), c.layers[src].sliding ? 768 : 4096) << l;
    }
    // Own-KV layers only: 20 sliding (2 heads x 256) and 4 global (2 x 512), K and V, 2 bytes;
    // plus the plane table (two addresses per layer and sequence).
    const uint64_t want = 2 * 2 * (20ull * 768 * 512 + 4ull * 4096 * 1024);
    const uint64_t table = uint64_t(c.n_layers) * 16;
    EXPECT_EQ(gj::gemma4::kv_cache_bytes(c, g), want + table);
    // Every sequence of a server's slots holds planes of its own.
    KvGeometry eight = g;
    eight.sequences = 8;
    EXPECT_EQ(gj::gemma4::kv_cache_bytes(c, eight), 8 * (want + table));
}

TEST(KvGeometry, Q8PlanesHoldInt8PlusAScalePer32) {
    const Config c = Config::preset("e4b");
    const KvGeometry g{4096, 256, KvType::Q8_0};
    // Per plane: slots * kv_dim int8, then slots * kv_dim / 32 fp16 scales (1.0625 bytes each).
    EXPECT_EQ(gj::gemma4::kv_plane_bytes(c, 0, 768, KvType::Q8_0), 768ull * 512 + 768ull * 16 * 2);
    EXPECT_EQ(gj::gemma4::kv_plane_bytes(c, 0, 768, KvType::F16), 768ull * 512 * 2);
    const uint64_t want =
        2 * (20ull * (768 * 512 + 768 * 16 * 2) + 4ull * (4096 * 1024 + 4096 * 32 * 2));
    EXPECT_EQ(gj::gemma4::kv_cache_bytes(c, g), want + uint64_t(c.n_layers) * 16);
    // The tiny presets' head dims (32, 64) are whole blocks; the scale piece starts at
    // slots * kv_dim bytes, a multiple of 16 (the kernels' cp.async alignment).
    const Config tiny = Config::preset("tiny");
    const KvGeometry tg{64, 4, KvType::Q8_0};
    for (int l = 0; l < tiny.n_layers; ++l) {
        const int slots = gj::gemma4::kv_slots(tiny, l, tg);
        EXPECT_EQ(uint64_t(slots) * tiny.kv_dim(l) % 16, 0u) << l;
        EXPECT_EQ(gj::gemma4::kv_plane_bytes(tiny, l, slots, KvType::Q8_0),
                  uint64_t(slots) * tiny.kv_dim(l) * 17 / 16)
            << l;
    }
    // A head dim that is not a multiple of the block is refused by name.
    Config odd = Config::preset("tiny");
    odd.layers[0].head_dim = 48;
    try {
        gj::gemma4::kv_cache_bytes(odd, tg);
        FAIL() << "expected ConfigError";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("head dim 48"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
    }
}

TEST(KvGeometry, KvTypeFlag) {
    using gj::jit::Flags;
    EXPECT_EQ(gj::gemma4::kv_type_from_flags(Flags::parse({})), KvType::F16);
    EXPECT_EQ(gj::gemma4::kv_type_from_flags(Flags::parse({{"GEMMAJIT_KV_TYPE", "bf16"}})),
              KvType::BF16);
    EXPECT_EQ(gj::gemma4::kv_type_from_flags(Flags::parse({{"GEMMAJIT_KV_TYPE", "q8_0"}})),
              KvType::Q8_0);
}
