#include "engine/gpu/kernels/flash_decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "engine/gpu/kernels/spec_util.h"

namespace gj::gemma4 {

using spec_util::next_pow2;
using spec_util::prev_pow2;

jit::KernelSpec flash_decode_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                  bool tensor_cores) {
    // Lanes hold 1, 2 or 4 consecutive dims, or 8 per 256-dim stripe (flash_decode.cu).
    if (!(head_dim == 32 || head_dim == 64 || head_dim == 128 ||
          (head_dim > 0 && head_dim % 256 == 0)))
        throw std::invalid_argument(fmt::format(
            "flash_decode: head dim {} is not supported (32, 64, 128 or a multiple of 256)",
            head_dim));
    if (group < 1 || group > 256 || n_kv_heads < 1 || n_kv_heads > 65535 || window < 0)
        throw std::invalid_argument(fmt::format("flash_decode: group {}, {} KV heads, window {}",
                                                group, n_kv_heads, window));
    if (kv == KvType::Q8_0 && tensor_cores)
        throw ConfigError(
            "flash_decode: the tensor-core path (GEMMAJIT_FLASH_MMA=1) does not read a q8_0 KV "
            "cache (GEMMAJIT_KV_TYPE=q8_0); use one of the two alone");
    const int kv_const = kv_type_constant(kv);
    // The tensor-core path needs 16-dim k-steps and 8 chunks per row for its swizzle.
    const bool mma = tensor_cores && head_dim % 64 == 0;
    int qw, ksets, tile, kb;
    if (mma) {
        // A warp: 8 queries (the mma N) over 16 rows per tile; two warps split a 32-row tile.
        qw = 8;
        kb = 16;
        ksets = 2;
        tile = kb * ksets;
    } else {
        // Registers: a warp keeps QW queries and their QW outputs at HEAD_DIM / 32 dims per
        // lane; 64 floats of each is the budget (hd 512: 4 queries, hd 256: 8). Larger groups
        // split over query sets of warps that read the same shared-memory rows.
        const int dpl = head_dim / 32;
        qw = std::min({next_pow2(group), std::max(1, 64 / dpl), 16});
        ksets = std::max(1, 4 / ((group + qw - 1) / qw));
        // A stage holds TILE K rows and TILE V rows, about 16 KiB of each.
        tile = std::clamp(prev_pow2(16384 / (2 * head_dim)), 16, 64);
        kb = std::min(32 / qw, tile / ksets);
    }
    const int qsets = (group + qw - 1) / qw;
    // A stage: the tile's K and V rows (q8_0: payloads and scales).
    const int stage_bytes =
        2 * tile * (kv_row_bytes(kv, head_dim) + kv_scale_row_bytes(kv, head_dim));
    // Three stages keep two tiles in flight while one is consumed; two where three would take
    // more than 100 KiB (hd 512 tiles of 32 rows), so that two blocks can share an SM.
    const int stages = 3 * stage_bytes <= 100 * 1024 ? 3 : 2;
    const int threads = 32 * qsets * ksets;
    const int q_bytes = mma ? qsets * qw * head_dim * 2 : 0;  // queries as mma operands
    const int smem =
        std::max(stages * stage_bytes + q_bytes, qsets * ksets * qw * (head_dim + 2) * 4);
    if (smem > 160 * 1024 || threads > 1024)
        throw std::invalid_argument(fmt::format(
            "flash_decode: head dim {} with group {} needs {} B of shared memory and {} threads "
            "(160 KiB, 1024 max)",
            head_dim, group, smem, threads));
    jit::KernelSpec s;
    s.family = "flash_decode";
    s.name = fmt::format("flash_decode.hd{}.g{}.kv{}.w{}.{}{}", head_dim, group, n_kv_heads, window,
                         kv_type_name(kv), mma ? ".mma" : "");
    s.constants = {{"HEAD_DIM", head_dim},
                   {"GROUP", group},
                   {"N_KV_HEADS", n_kv_heads},
                   {"WINDOW", window},
                   {"KV_TYPE", kv_const},
                   {"MMA", mma ? 1 : 0},
                   {"CHUNK", tile},
                   {"TILE", tile},
                   {"STAGES", stages},
                   {"THREADS", threads},
                   {"QW", qw},
                   {"KB", kb},
                   {"SMEM", smem},
                   {"COMBINE_THREADS", 128}};
    s.entries = {"flash_decode", "flash_combine"};
    s.priority = 0;
    return s;
}

jit::KernelSpec flash_decode_spec(const Config& cfg, int layer, KvType kv, bool tensor_cores) {
    const LayerConfig& l = cfg.layers.at(layer);
    return flash_decode_spec(l.head_dim, spec_util::gqa_group(cfg, layer), l.n_kv_heads,
                             l.sliding ? cfg.sliding_window : 0, kv, tensor_cores);
}

int flash_decode_splits(const jit::KernelSpec& spec, int max_keys, int n_tokens, int sm_count) {
    const int64_t chunk = spec_constant(spec, "CHUNK"), window = spec_constant(spec, "WINDOW");
    const int64_t kv_heads = spec_constant(spec, "N_KV_HEADS");
    const int64_t keys =
        std::max<int64_t>(1, window > 0 ? std::min<int64_t>(window, max_keys) : max_keys);
    const int64_t useful = (keys + chunk - 1) / chunk;
    // Two blocks per SM (the shared memory of the model shapes' specs fits two): one alone
    // leaves the SM idle while its few warps wait on the next tile. H200, depth 4096, kernel
    // alone: 31B sliding layer 11.1 us with 9 splits -> 7.6 with 16, global 24.8 with 33 ->
    // 18.2 with 66; tg128 at depth 4096: 31B Q4_0 160.2 -> 165.9, E4B Q4_0 472.7 -> 480.6
    // (depth 0 unchanged).
    const int64_t per_sm =
        (2 * int64_t(std::max(1, sm_count)) + kv_heads * std::max(1, n_tokens) - 1) /
        (kv_heads * std::max(1, n_tokens));
    return static_cast<int>(std::clamp<int64_t>(per_sm, 1, useful));
}

}  // namespace gj::gemma4
