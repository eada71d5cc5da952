#include "engine/gpu/kernels/mmq.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

MmqTile mmq_tile(ggml::Type weight_type, int k, int n_rows) {
    // Chosen on the H200 at T = 512 among the tiles gpu_test_mmq covers, by how many tiles a
    // 512-token chunk gives 132 SMs, within sm_80's 160 KiB of shared memory per block (TOP/s,
    // Q8_0 / Q4_0, at the E4B shapes):
    //  - few rows (n 512; Q8_0 also n 2048): 64 x 64 tiles of 4 warps, two blocks per SM
    //    (n512 45 / 46, n2048 131 / -);
    //  - at least 80 128 x 128 tiles (n 2560 at any K, n 4096): 8 warps of 64 x 32, one block per
    //    SM, GeGLU in two passes of 64 tokens (k2048 105 / 102, k4096 107 / 105, k10240 113 / 111,
    //    n4096 175 / 168);
    //  - otherwise (Q4_0 n 2048, the GeGLU widths): 64 x 128 tiles of 8 warps of 32 x 32; Q4_0
    //    with 8 blocks of K per stage (n2048 153, GeGLU 206), Q8_0 with 2 blocks per stage, three
    //    stages, two blocks per SM (GeGLU 188; its 8-block form needs 176 KiB).
    const bool q8 = weight_type == ggml::Type::Q8_0;
    const int wide_tiles = (n_rows + 127) / 128 * 4;  // 128 x 128 tiles at T = 512
    if (n_rows <= 1024 || (q8 && wide_tiles < 80)) return MmqTile{64, 64, 2, 2, 4, 4, 2, 1};
    // The 128 x 128 tiles of a deep product (k >= 2048) split K in three: 80 tiles alone fill 60%
    // of the SMs; 240 run in two full waves of a third of the work each.
    if (n_rows < 4224 && wide_tiles >= 80)
        return MmqTile{128, 128, 2, 4, 4, 3, 1, 2, k >= 2048 && wide_tiles < 100 ? kMmqSplits : 1};
    return q8 ? MmqTile{64, 128, 2, 4, 2, 3, 2, 1} : MmqTile{64, 128, 2, 4, 8, 2, 1, 1};
}

jit::KernelSpec mmq_spec(ggml::Type weight_type, int k, int n_rows) {
    if (n_rows < 1)
        throw std::invalid_argument(fmt::format("mmq: {} weight rows (at least 1)", n_rows));
    return mmq_spec(weight_type, k, mmq_tile(weight_type, k, n_rows));
}

namespace {

// The block types the grouped expert GEMM reads (the layer GEMM: has_gemm's Q8_0 / Q4_0).
bool moe_gemm_type(ggml::Type t) {
    using T = ggml::Type;
    return spec_util::has_gemm(t) || t == T::Q4_1 || t == T::Q5_0 || t == T::Q5_1 || t == T::Q4_K ||
           t == T::Q5_K || t == T::Q6_K;
}

jit::KernelSpec mmq_spec_of(ggml::Type weight_type, int k, const MmqTile& t, bool moe) {
    using T = ggml::Type;
    const char* tag = spec_util::quant_type_tag(weight_type);
    if (moe ? !moe_gemm_type(weight_type) : !spec_util::has_gemm(weight_type))
        throw ConfigError(fmt::format(
            "no int8 tensor-core GEMM (mmq{}) for weight type {} (supported: q8_0, q4_0{})",
            moe ? " of grouped experts" : "", ggml::type_name(weight_type),
            moe ? ", q4_1, q5_0, q5_1, q4_k, q5_k, q6_k" : ""));
    if (k <= 0 || k % 32 != 0)
        throw std::invalid_argument(
            fmt::format("mmq: input width {} is not a positive multiple of 32", k));
    const bool kq = spec_util::is_kquant(weight_type);
    if (kq && k % 256 != 0)
        throw std::invalid_argument(
            fmt::format("mmq: {} rows are whole 256-element super-blocks (input width {})",
                        ggml::type_name(weight_type), k));
    const std::string tile = fmt::format(
        "m{}n{}.w{}x{}.s{}b{}.o{}p{}{}", t.bm, t.bn, t.warps_m, t.warps_n, t.stages, t.kbs,
        t.min_blocks, t.geglu_passes, t.splits > 1 ? fmt::format(".k{}", t.splits) : std::string());
    const int warps = t.warps_m * t.warps_n;
    if (t.warps_m < 1 || t.warps_n < 1 || warps > 16 || t.bm < 16 || t.bm % (16 * t.warps_m) != 0 ||
        t.bn < 32 || t.bn % (32 * t.warps_n) != 0 ||
        (t.kbs != 1 && t.kbs != 2 && t.kbs != 4 && t.kbs != 8) || t.stages < 2 || t.stages > 8 ||
        t.min_blocks < 1 || t.min_blocks * warps > 64 || t.geglu_passes < 1 || t.geglu_passes > 2 ||
        t.bm % (16 * t.warps_m * t.geglu_passes) != 0 || t.splits < 1 || t.splits > 8)
        throw std::invalid_argument(fmt::format(
            "mmq: impossible tile {} (BM a multiple of 16 * WARPS_M, BN of 32 * WARPS_N, at most "
            "16 warps, KBS 1/2/4/8, 2..8 stages, at most 64 warps per SM, 1 or 2 GeGLU passes "
            "of whole m16 tiles per warp, 1..8 K splits)",
            tile));
    // The stage layouts of kernel_templates/mmq.cu: activations, per matrix the weight payload,
    // fifth / top bits, the K-quants' super-block words and block scales, and {d, s}; the GeGLU
    // entries hold two matrices for BM / GEGLU_PASSES tokens. The K-quants add each warp's scale
    // table per matrix.
    const int64_t payload = weight_type == T::Q8_0 ? 32 : 16;  // bytes per block
    const bool fifth32 = weight_type == T::Q5_0 || weight_type == T::Q5_1 || weight_type == T::Q5_K;
    const int64_t fifth = fifth32                  ? t.bn * t.kbs * 4
                          : weight_type == T::Q6_K ? t.bn * t.kbs * 8
                                                   : 0;  // fifth / top bits
    const int64_t head = kq ? t.bn * 4 : 0;  // the super-blocks' d | dmin (Q6_K: d) words
    const int64_t scale = weight_type == T::Q4_1 || weight_type == T::Q5_1 ? 4 : 2;
    auto layout = [&](int64_t rows, int64_t mats) {
        const int64_t stage = rows * t.kbs * 32 + t.kbs * rows * 8 +
                              mats * (t.bn * t.kbs * payload + fifth + head + t.bn * t.kbs * scale);
        const int64_t tables =
            kq ? int64_t(t.warps_m) * t.warps_n * mats * t.kbs * (t.bn / t.warps_n) * 8 : 0;
        return t.stages * stage + tables;
    };
    const int64_t smem = std::max(layout(t.bm, 1), layout(t.bm / t.geglu_passes, 2));
    // 227 KiB per block; the SM's 228 KiB also hold 1 KiB per resident block. The grouped expert
    // entries keep their slot table (two ints per tile row) in static shared memory.
    const int64_t fixed = moe ? int64_t(t.bm) * 8 : 0;
    if (moe && t.splits != 1)
        throw std::invalid_argument(
            fmt::format("mmq: the grouped expert GEMM does not split K (tile {})", tile));
    if (smem + fixed > 227 * 1024 || t.min_blocks * (smem + fixed + 1024) > 228 * 1024)
        throw std::invalid_argument(
            fmt::format("mmq: tile {} needs {} bytes of shared memory per block (at most 227 KiB, "
                        "228 KiB per SM for all resident blocks)",
                        tile, smem));
    jit::KernelSpec s;
    s.family = "mmq";
    s.name = fmt::format("mmq.{}.k{}.{}", tag, k, tile);
    s.constants = {{"K", k},
                   {"WTYPE", int64_t(weight_type)},
                   {"BM", t.bm},
                   {"BN", t.bn},
                   {"WARPS_M", t.warps_m},
                   {"WARPS_N", t.warps_n},
                   {"KBS", t.kbs},
                   {"STAGES", t.stages},
                   {"MIN_BLOCKS", t.min_blocks},
                   {"GEGLU_PASSES", t.geglu_passes},
                   {"SPLITS", t.splits},
                   {"THREADS", 32 * warps},
                   {"SMEM", smem}};
    s.entries = {"mmq", "mmq_geglu", "mmq_geglu_q8", "mmq_reduce", "mmq_reduce_bf16"};
    if (moe) {
        s.name += ".moe";
        s.constants.push_back({"MOE", 1});
        s.entries = {"mmq_moe", "mmq_moe_geglu", "mmq_moe_geglu_q8"};
    }
    s.priority = 1;
    return s;
}

}  // namespace

jit::KernelSpec mmq_spec(ggml::Type weight_type, int k, const MmqTile& tile) {
    return mmq_spec_of(weight_type, k, tile, false);
}

bool mmq_moe_reads(ggml::Type t, MatvecLayout layout, int k) {
    if (!moe_gemm_type(t) || k <= 0 || k % 32 != 0) return false;
    return layout == MatvecLayout::Split && (!spec_util::is_kquant(t) || k % 256 == 0);
}

MmqTile mmq_moe_tile(ggml::Type weight_type, int k, int n_rows) {
    // A 512-token chunk of 26B-A4B gives each of its 128 experts 32 slots on average, so tiles
    // take 32 slots of one expert (pp512 on the H200: 19520 tokens/s against 18177 with 64-slot
    // tiles, half of whose rows were padding). The gate|up pair (n 704, two matrices) runs on
    // 32 x 64 tiles of 4 warps, the down product (n 2816 over k 704) on 32 x 128 tiles of 8
    // warps; gate|up three blocks per SM (Q8_0's larger stages: two), down two (three leave the
    // module's GeGLU entries 85 registers: they spill). The K-quants' gate|up tiles go three
    // stages deep: Q6_K's (with its top bits and the warps' scale tables) fit three blocks per SM
    // no deeper, and Q4_K / Q5_K's, which fit four, ran faster with three (26B-A4B pp512 on the
    // H200: Q4_K_M 21328 -> 22820, Q5_K_M 17742 -> 19717), as Q4_0's did by a little (26188 ->
    // 26420); Q8_0's two blocks per SM keep four (24925 with four, 24679 with three).
    const bool q8 = weight_type == ggml::Type::Q8_0;
    const bool three = spec_util::is_kquant(weight_type) || weight_type == ggml::Type::Q4_0;
    if (n_rows <= 1024) return MmqTile{kMoeGemmSlots, 64, 2, 2, 4, three ? 3 : 4, q8 ? 2 : 3, 1};
    return MmqTile{kMoeGemmSlots, 128, 2, 4, k >= 1024 ? 4 : 2, 3, 2, 1};
}

jit::KernelSpec mmq_moe_spec(ggml::Type weight_type, int k, int n_rows) {
    if (n_rows < 1)
        throw std::invalid_argument(fmt::format("mmq: {} weight rows (at least 1)", n_rows));
    return mmq_moe_spec(weight_type, k, mmq_moe_tile(weight_type, k, n_rows));
}

jit::KernelSpec mmq_moe_spec(ggml::Type weight_type, int k, const MmqTile& tile) {
    return mmq_spec_of(weight_type, k, tile, true);
}

}  // namespace gj::gemma4
