// flash_prefill family: the spec of kernel_templates/flash_prefill.cu, tensor-core prefill
// attention over a layer's KV cache (entry flash_prefill; q8_0: tiles dequantized to fp16 in
// shared memory, products in fp16), its tiling choice and its shared memory.
//
// Spec name: "flash_prefill.hd<hd>.g<group>.kv<Hkv>.w<window>.<f16|bf16|q8_0>", followed by
// ".m<WM>d<DS>[h]k<KS>w<KW>s<STAGES>x<SPLITS>" (h: scores split by head dims) for a tiling other
// than the default for kFlashPrefillDefaultChunk.
// Launch (from the spec constants): block THREADS, grid (ceil(T * GROUP / BLOCK_ROWS) * SPLITS,
// N_KV_HEADS), dynamic smem SMEM bytes (opt in above 48 KiB); clusters of (SPLITS, 1, 1) blocks
// are compiled in (sm_90+), no workspace.
#pragma once

#include <vector>

#include "engine/gpu/kv_type.h"
#include "engine/model/gemma4_config.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Tensor-core prefill attention over the cache. SPLITS > 1 blocks of a row block form a cluster
// (compiled into the kernel, so cuLaunchKernel works; sm_90+, earlier archs run split 0 alone)
// and share its key tiles. The tiling (warps per block and their roles, keys per tile, pipeline
// depth, key splits) is chosen per head dim, group, KV heads and the expected chunk length
// (`chunk` tokens: the engine's prefill chunk; any T is correct, the split count only aims to
// fill the SMs at that length); the overload taking a FlashPrefillTiling sets it explicitly
// (tests, benchmarks), and the name then spells it unless it is the default one. Throws
// std::invalid_argument for impossible shapes or tilings, ConfigError for a layer whose head count
// is not a multiple of its KV heads. Shared memory is capped at sm_80's opt-in limit (163 KiB).
inline constexpr int kFlashPrefillMaxSmem = 163 * 1024;
inline constexpr int kFlashPrefillDefaultChunk = 512;
// Blocks the default split count aims for (about the SM count of an H100/H200).
inline constexpr int kFlashPrefillTargetBlocks = 128;
struct FlashPrefillTiling {
    int row_warps;   // WM: warps of 16 query rows (BLOCK_ROWS = 16 * row_warps)
    int dim_slices;  // DS: warps splitting a row's head dim of O (sharing its scores)
    int key_sets;    // KS: warps splitting each tile's keys (merged at the end)
    int warp_keys;   // KW: keys per (row warp, key set) and tile: a multiple of 16 and of
                     // 8 * dim_slices; KT = key_sets * warp_keys
    int stages;      // cp.async pipeline depth (>= 2)
    int splits = 1;  // SPLITS: blocks (one cluster) sharing a row block's key tiles: 1, 2, 4, 8
    bool dim_scores = false;  // DIM_SCORES: dim slices split Q K^T by head dims (not by keys)
    bool operator==(const FlashPrefillTiling&) const = default;
};
FlashPrefillTiling flash_prefill_tiling(int head_dim, int group, int n_kv_heads,
                                        int chunk = kFlashPrefillDefaultChunk);
// The key splits that bring a tiling's grid at `chunk` tokens to about kFlashPrefillTargetBlocks
// (1, 2, 4 or 8; the tiling's own splits are ignored).
int flash_prefill_splits(const FlashPrefillTiling& t, int group, int n_kv_heads, int chunk);
jit::KernelSpec flash_prefill_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                   const FlashPrefillTiling& tiling);
jit::KernelSpec flash_prefill_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                   int chunk = kFlashPrefillDefaultChunk);
jit::KernelSpec flash_prefill_spec(const Config& cfg, int layer, KvType kv = KvType::F16,
                                   int chunk = kFlashPrefillDefaultChunk);

// The same attention on Hopper's warpgroup tensor cores (kernel_templates/flash_prefill_wgmma.cu,
// sm_90a only: arch_specific 90) for head dims 64, 128, 256 and 512 over f16 / bf16 caches: entry,
// arguments and launch as above (SPLITS 1). Spec name
// "flash_prefill_wgmma.hd<hd>.g<group>.kv<Hkv>.w<window>.<f16|bf16>.wg<WG>s<STAGES>".
inline constexpr int kFlashPrefillWgmmaMaxSmem = 227 * 1024;  // sm_90's opt-in limit
struct FlashPrefillWgmmaTiling {
    int warpgroups = 2;  // WG: consumer warpgroups of 64 query rows (BLOCK_ROWS = 64 * WG), plus
                         // a producer warpgroup (THREADS = 128 * (WG + 1))
    int stages = 2;      // cp.async pipeline depth (2 or 3) of 64-key tiles
    bool operator==(const FlashPrefillWgmmaTiling&) const = default;
};
bool flash_prefill_wgmma_fits(int head_dim, KvType kv);
// Throws std::invalid_argument for a head dim, cache type or tiling the template does not take
// (or whose shared memory exceeds kFlashPrefillWgmmaMaxSmem: head dim 256 with 2 warpgroups and
// 3 stages).
jit::KernelSpec flash_prefill_wgmma_spec(int head_dim, int group, int n_kv_heads, int window,
                                         KvType kv, const FlashPrefillWgmmaTiling& tiling);
// A layer's wgmma forms, in the order a chunk tries them: two warpgroups and two stages (the K/V
// tiles shared by 128 rows), then one warpgroup and three stages (twice the row blocks for
// shorter chunks); head dim 512 only the first (its two consumers split the head dims of 64 rows);
// none for a layer that does not fit (flash_prefill_wgmma_fits).
std::vector<jit::KernelSpec> flash_prefill_wgmma_specs(const Config& cfg, int layer, KvType kv);
// Whether a T-token chunk's row blocks in `spec` come to about a block per SM (at least 3/4 of
// kFlashPrefillTargetBlocks): fewer, longer blocks leave SMs idle, where the mma.sync kernel's
// key splits fill them. H200, one sliding layer (FlashPrefillBench.DISABLED_Wgmma; mma.sync,
// wgmma 2 x 2, wgmma 1 x 3, us): 31B at 512 tokens 67.3, 38.8, 50.2; 12B at 512 32.8, 34.2, 21.2;
// E4B at 512 21.1, 35.6, 21.2; E4B at 2048 95.5, 46.4, 55.8.
bool flash_prefill_wgmma_pays(const jit::KernelSpec& spec, int T);
// The spec of `specs` (flash_prefill_wgmma_specs' order) a T-token chunk takes: the first that
// pays; with `always` (GEMMAJIT_FLASH_WGMMA=on) the last when none does; else none (nullptr: the
// mma.sync kernel).
const jit::KernelSpec* flash_prefill_wgmma_choice(const std::vector<const jit::KernelSpec*>& specs,
                                                  int T, bool always);

}  // namespace gj::gemma4
