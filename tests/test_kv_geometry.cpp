// KV cache geometry of the GPU forward (no GPU needed): ring sizes of sliding layers, donors of
// KV-shared layers, total bytes, and the KV type flag.
#include <gtest/gtest.h>

#include "engine/gemma4_config.h"
#include "engine/kv_cache.h"
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
    // Own-KV layers only: 20 sliding (2 heads x 256) and 4 global (2 x 512), K and V, 2 bytes.
    const uint64_t want = 2 * 2 * (20ull * 768 * 512 + 4ull * 4096 * 1024);
    EXPECT_EQ(gj::gemma4::kv_cache_bytes(c, g), want);
}

TEST(KvGeometry, KvTypeFlag) {
    using gj::jit::Flags;
    EXPECT_EQ(gj::gemma4::kv_type_from_flags(Flags::parse({})), KvType::F16);
    EXPECT_EQ(gj::gemma4::kv_type_from_flags(Flags::parse({{"GEMMAJIT_KV_TYPE", "bf16"}})),
              KvType::BF16);
    try {
        gj::gemma4::kv_type_from_flags(Flags::parse({{"GEMMAJIT_KV_TYPE", "q8_0"}}));
        FAIL() << "q8_0 has no attention kernels";
    } catch (const gj::gemma4::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
    }
}
