#include "engine/gpu/kernels/flash_prefill.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "engine/gpu/kernels/spec_util.h"

namespace gj::gemma4 {

FlashPrefillTiling flash_prefill_tiling(int head_dim, int group, int n_kv_heads, int chunk) {
    // 16-row warps keep O for their head-dim slice in registers: HEAD_DIM / DS / 2 floats per
    // thread, at most 128 (hd 512 splits its head dim over two warps, which split Q K^T by head
    // dims and add their partial scores: fewer shared-memory bytes per mma than re-reading Q for
    // 8 keys each). Row blocks of 64 rows (16 tokens of a 4-head group) read each K/V tile from
    // L2 once for twice the rows of the former 32-row blocks; at hd 512 that leaves room for two
    // stages of 16-key tiles (Q rows 64 KiB + 2 x 32 KiB + partial scores 8 KiB). A chunk then
    // has few row blocks (E4B, 512 tokens: 32 per KV head), so key splits (clusters of blocks
    // sharing a row block's key tiles) bring the grid to about one block per SM.
    // These defaults follow a shared-memory and L2 traffic estimate; they are not yet timed on
    // the GPU (the former 32-row tilings measured on the H200 at E4B shapes, T = 512, pos0 0 /
    // 4096: hd 256 window 512 27 / 29 us, hd 512 53 / 391 us).
    FlashPrefillTiling t = head_dim >= 512   ? FlashPrefillTiling{4, 2, 1, 16, 2, 1, true}
                           : head_dim >= 256 ? FlashPrefillTiling{4, 1, 2, 32, 2}
                                             : FlashPrefillTiling{4, 1, 2, 32, 3};
    t.splits = flash_prefill_splits(t, group, n_kv_heads, chunk);
    return t;
}

int flash_prefill_splits(const FlashPrefillTiling& t, int group, int n_kv_heads, int chunk) {
    const int64_t rows = 16 * std::max(1, t.row_warps);
    const int64_t blocks = (int64_t(std::max(1, chunk)) * std::max(1, group) + rows - 1) / rows *
                           std::max(1, n_kv_heads);
    int splits = 1;
    while (splits < 8 && blocks * splits < kFlashPrefillTargetBlocks) splits *= 2;
    return splits;
}

namespace {

// Dynamic shared memory of kernel_templates/flash_prefill.cu for a (valid) tiling: Q rows, the
// stages, and for shared scores (ds > 1) row maxima and P per (row warp, key set) (with scores
// split by head dims: the group's fp32 partial scores instead); after the loop the key sets'
// merge area and the key splits' partials reuse it.
int flash_prefill_smem(int head_dim, KvType kv, const FlashPrefillTiling& t) {
    const int kt = t.key_sets * t.warp_keys, rows = 16 * t.row_warps, row_bytes = 2 * head_dim;
    const int share = t.dim_slices == 1 ? 0
                      : t.dim_scores
                          ? t.row_warps * t.key_sets * t.dim_slices * 16 * t.warp_keys * 4
                          : t.row_warps * t.key_sets * 16 * (t.dim_slices * 4 + t.warp_keys * 2);
    // q8_0: a stage holds the int8 payload rows and fp16 scales of K and V (each plane padded to
    // 16 bytes), and one fp16 tile holds the dequantized K and V rows.
    const int stage = kv == KvType::Q8_0 ? 2 * ((kt * (head_dim + head_dim / 16) + 15) / 16 * 16)
                                         : 2 * kt * row_bytes;
    const int conv = kv == KvType::Q8_0 ? 2 * kt * row_bytes : 0;
    const int pipe = rows * row_bytes + t.stages * stage + conv + share;
    const int merge = (t.key_sets - 1) * rows * (head_dim * 4 + 8);
    const int split_bytes = t.splits > 1 ? rows * (head_dim * 4 + 12) : 0;
    return std::max({pipe, merge, split_bytes});
}

}  // namespace

jit::KernelSpec flash_prefill_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                   const FlashPrefillTiling& tiling) {
    if (!(head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256 ||
          head_dim == 512))
        throw std::invalid_argument(fmt::format(
            "flash_prefill: head dim {} is not supported (32, 64, 128, 256 or 512)", head_dim));
    if (group < 1 || group > 256 || n_kv_heads < 1 || n_kv_heads > 65535 || window < 0)
        throw std::invalid_argument(fmt::format("flash_prefill: group {}, {} KV heads, window {}",
                                                group, n_kv_heads, window));
    const int kv_const = kv_type_constant(kv);
    const auto& [wm, ds, ks, kw, stages, splits, dim_scores] = tiling;
    const int dslice = ds > 0 ? head_dim / ds : 0;
    const int threads = 32 * wm * ds * ks;
    if (wm < 1 || ds < 1 || ks < 1 || kw < 16 || kw % 16 != 0 ||
        (!dim_scores && kw % (8 * ds) != 0) || (dim_scores && ds == 1) || stages < 2 ||
        threads > 1024 || head_dim % ds != 0 || dslice % 16 != 0 ||
        (ds > 1 && (dslice % 64 != 0 || wm * ks > 15)) ||
        !(splits == 1 || splits == 2 || splits == 4 || splits == 8))
        throw std::invalid_argument(fmt::format(
            "flash_prefill: tiling {} row warps x {} dim slices x {} key sets, {} keys per warp, "
            "{} stages, {} key splits{} is impossible for head dim {}",
            wm, ds, ks, kw, stages, splits, dim_scores ? ", scores split by dims" : "", head_dim));
    const int kt = ks * kw, rows = 16 * wm;
    const int smem = flash_prefill_smem(head_dim, kv, tiling);
    if (smem > kFlashPrefillMaxSmem)
        throw std::invalid_argument(fmt::format(
            "flash_prefill: head dim {} with {} rows and {}-key tiles x {} stages needs {} B of "
            "shared memory ({} max)",
            head_dim, rows, kt, stages, smem, kFlashPrefillMaxSmem));
    // Independent accumulator chains for S: at least 4 n-tile chains per warp.
    const int nt = (dim_scores ? kw : kw / ds) / 8;
    const int s_sets = std::clamp(4 / nt, 1, 4);
    jit::KernelSpec s;
    s.family = "flash_prefill";
    s.name = fmt::format("flash_prefill.hd{}.g{}.kv{}.w{}.{}", head_dim, group, n_kv_heads, window,
                         kv_type_name(kv));
    if (tiling != flash_prefill_tiling(head_dim, group, n_kv_heads, kFlashPrefillDefaultChunk))
        s.name += fmt::format(".m{}d{}{}k{}w{}s{}x{}", wm, ds, dim_scores ? "h" : "", ks, kw,
                              stages, splits);
    s.constants = {{"HEAD_DIM", head_dim},
                   {"GROUP", group},
                   {"N_KV_HEADS", n_kv_heads},
                   {"WINDOW", window},
                   {"KV_TYPE", kv_const},
                   {"WM", wm},
                   {"DS", ds},
                   {"DIM_SCORES", dim_scores ? 1 : 0},
                   {"KS", ks},
                   {"KT", kt},
                   {"STAGES", stages},
                   {"THREADS", threads},
                   {"BLOCK_ROWS", rows},
                   {"SPLITS", splits},
                   {"S_SETS", s_sets},
                   {"SMEM", smem}};
    s.entries = {"flash_prefill"};
    s.priority = 1;
    return s;
}

jit::KernelSpec flash_prefill_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                   int chunk) {
    FlashPrefillTiling t = flash_prefill_tiling(head_dim, group, n_kv_heads, chunk);
    // A q8_0 cache adds the fp16 tile to the stages: where the f16 tiling already fills the
    // shared memory, tiles of half the keys (the name then spells the tiling).
    if (kv == KvType::Q8_0 && flash_prefill_smem(head_dim, kv, t) > kFlashPrefillMaxSmem &&
        t.warp_keys % (32 * (t.dim_scores ? 1 : t.dim_slices)) == 0)
        t.warp_keys /= 2;
    return flash_prefill_spec(head_dim, group, n_kv_heads, window, kv, t);
}

jit::KernelSpec flash_prefill_spec(const Config& cfg, int layer, KvType kv, int chunk) {
    const LayerConfig& l = cfg.layers.at(layer);
    return flash_prefill_spec(l.head_dim, spec_util::gqa_group(cfg, layer), l.n_kv_heads,
                              l.sliding ? cfg.sliding_window : 0, kv, chunk);
}

bool flash_prefill_wgmma_fits(int head_dim, KvType kv) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512) &&
           (kv == KvType::F16 || kv == KvType::BF16);
}

jit::KernelSpec flash_prefill_wgmma_spec(int head_dim, int group, int n_kv_heads, int window,
                                         KvType kv, const FlashPrefillWgmmaTiling& tiling) {
    if (!flash_prefill_wgmma_fits(head_dim, kv))
        throw std::invalid_argument(fmt::format(
            "flash_prefill_wgmma: head dim {} over a {} cache is not supported (64, 128, 256 or "
            "512; f16 or bf16)",
            head_dim, kv_type_name(kv)));
    if (group < 1 || group > 256 || n_kv_heads < 1 || n_kv_heads > 65535 || window < 0)
        throw std::invalid_argument(fmt::format(
            "flash_prefill_wgmma: group {}, {} KV heads, window {}", group, n_kv_heads, window));
    const auto [wg, stages] = tiling;
    // Head dim 512: the two consumers split the head dims of the same 64 rows (O of 256 dims
    // each), in tiles of 32 keys (the stages of 64 would not fit beside Q).
    const int dsplit = head_dim == 512 ? 2 : 1, kt = head_dim == 512 ? 32 : 64;
    if ((wg != 1 && wg != 2) || (stages != 2 && stages != 3) || (dsplit == 2 && wg != 2))
        throw std::invalid_argument(fmt::format(
            "flash_prefill_wgmma: {} warpgroups and {} stages (1 or 2, 2 at head dim 512; 2 or 3)",
            wg, stages));
    const int rows = 64 * wg / dsplit;
    // Q rows, the stages, a full and an empty barrier per stage, the partial scores of the two
    // consumers (head dim 512, two buffers); 1 KiB to align the base.
    const int smem = 1024 + rows * head_dim * 2 + stages * (2 * kt * head_dim * 2 + 16) +
                     (dsplit == 2 ? 2 * wg * 64 * kt * 4 : 0);
    if (smem > kFlashPrefillWgmmaMaxSmem)
        throw std::invalid_argument(fmt::format(
            "flash_prefill_wgmma: head dim {} with {} warpgroups and {} stages needs {} B of "
            "shared memory ({} max)",
            head_dim, wg, stages, smem, kFlashPrefillWgmmaMaxSmem));
    jit::KernelSpec s;
    s.family = "flash_prefill_wgmma";
    s.name = fmt::format("flash_prefill_wgmma.hd{}.g{}.kv{}.w{}.{}.wg{}s{}", head_dim, group,
                         n_kv_heads, window, kv_type_name(kv), wg, stages);
    s.constants = {{"HEAD_DIM", head_dim},
                   {"GROUP", group},
                   {"N_KV_HEADS", n_kv_heads},
                   {"WINDOW", window},
                   {"KV_TYPE", kv_type_constant(kv)},
                   {"WG", wg},
                   {"KT", kt},
                   {"STAGES", stages},
                   {"THREADS", 128 * (wg + 1)},
                   {"BLOCK_ROWS", rows},
                   {"DSPLIT", dsplit},
                   {"SPLITS", 1},
                   {"SMEM", smem}};
    s.entries = {"flash_prefill"};
    s.priority = 1;
    s.arch_specific = 90;
    return s;
}

std::vector<jit::KernelSpec> flash_prefill_wgmma_specs(const Config& cfg, int layer, KvType kv) {
    const LayerConfig& l = cfg.layers.at(layer);
    std::vector<jit::KernelSpec> out;
    if (!flash_prefill_wgmma_fits(l.head_dim, kv)) return out;
    for (const FlashPrefillWgmmaTiling t :
         {FlashPrefillWgmmaTiling{2, 2}, FlashPrefillWgmmaTiling{1, 3}}) {
        if (l.head_dim == 512 && t.warpgroups != 2) continue;  // two consumers split its dims
        out.push_back(flash_prefill_wgmma_spec(l.head_dim, spec_util::gqa_group(cfg, layer),
                                               l.n_kv_heads, l.sliding ? cfg.sliding_window : 0, kv,
                                               t));
    }
    return out;
}

bool flash_prefill_wgmma_pays(const jit::KernelSpec& spec, int T) {
    const int64_t rows = int64_t(std::max(0, T)) * spec_constant(spec, "GROUP");
    const int64_t block_rows = spec_constant(spec, "BLOCK_ROWS");
    const int64_t blocks = (rows + block_rows - 1) / block_rows * spec_constant(spec, "N_KV_HEADS");
    return blocks * 4 >= int64_t(kFlashPrefillTargetBlocks) * 3;
}

const jit::KernelSpec* flash_prefill_wgmma_choice(const std::vector<const jit::KernelSpec*>& specs,
                                                  int T, bool always) {
    for (const jit::KernelSpec* s : specs)
        if (flash_prefill_wgmma_pays(*s, T)) return s;
    return always && !specs.empty() ? specs.back() : nullptr;
}

}  // namespace gj::gemma4
