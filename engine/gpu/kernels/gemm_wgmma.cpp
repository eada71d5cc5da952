#include "engine/gpu/kernels/gemm_wgmma.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

namespace {

// The tile shape (BM, BN, stages, splits) for a k-wide matrix of n_rows rows.
GemmWgmmaTile tile_shape(ggml::Type weight_type, int k, int n_rows) {
    // By default the GEMM runs the chunks shorter than copy_min_rows (kernel_plan.h: 256 rows for
    // d_model < 4096, 512 from 4096), so the tiles are the best measured at T = 128 and 256 on the
    // H200 (GemmWgmmaBench.DISABLED_Shapes with GJ_BENCH_T; Q4_0 TFLOP/s at T = 256 / 128):
    //  - 256 tokens x 128 rows for the wide products (31B GeGLU n 21504 464 / 340, n 16384
    //    561 / 381; 568 / 494 at T = 512);
    //  - a K split of 3 wherever the row tiles alone leave SMs idle: 31B n 5376 at k 21504
    //    411 / 327 (unsplit 203 / 137), k 8192 335 / 272, n 4096 256 / 200;
    //  - 31B n 8192: 256 x 64, unsplit (425 / 269);
    //  - the E4B shapes (run below 256 rows): 128 x 64, GeGLU unsplit (n 10240 244 at T = 128),
    //    the rest split 3 (n 2560 at k 10240 174, n 2048 97, n 2560 at k 2048 102, n 512 26).
    // Q8_0 blocks of 256 x 64 (one warpgroup) spill, so Q8_0 takes 128 x 128 for n 8192 (388 at
    // T = 256).
    if (n_rows >= 16384 || (n_rows >= 10240 && k >= 4096)) return {256, 128, 4, 1};
    if (n_rows >= 10240) return {128, 64, 4, 1};
    if (n_rows >= 8192)
        return weight_type == ggml::Type::Q8_0 ? GemmWgmmaTile{128, 128, 4, 1}
                                               : GemmWgmmaTile{256, 64, 4, 1};
    if (n_rows >= 4096) return {256, 128, 4, kMmqSplits};
    return {128, 64, 4, kMmqSplits};
}

}  // namespace

GemmWgmmaTile gemm_wgmma_tile(ggml::Type weight_type, int k, int n_rows, bool producer) {
    // The producer form only for tiles of 64 weight rows (one consumer warpgroup): there it ran
    // as fast or faster (H200, T = 512, Q4_0 TFLOP/s, producer / all threads: 31B n 8192 256 x 64
    // 251 / 209, E4B GeGLU 253 / 248, n 2048 154 / 139, n 2560 149 / 152, n 512 82 / 83). With 128
    // rows (two consumers at 216 registers where the all-threads form takes 248) it ran slower on
    // every shape (31B n 16384 403 / 576, GeGLU 344 / 469, n 5376 380 / 418) and is not built.
    GemmWgmmaTile t = tile_shape(weight_type, k, n_rows);
    t.producer = producer && t.bn == 64;
    return t;
}

jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, int n_rows, bool producer) {
    if (n_rows < 1)
        throw std::invalid_argument(fmt::format("gemm_wgmma: {} weight rows (at least 1)", n_rows));
    return gemm_wgmma_spec(weight_type, k, gemm_wgmma_tile(weight_type, k, n_rows, producer));
}

jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, const GemmWgmmaTile& t) {
    const char* tag = spec_util::quant_type_tag(weight_type);
    if (!spec_util::has_gemm(weight_type))
        throw ConfigError(
            fmt::format("no wgmma GEMM (gemm_wgmma) for weight type {} (supported: q8_0, q4_0)",
                        ggml::type_name(weight_type)));
    if (k <= 0 || k % 32 != 0)
        throw std::invalid_argument(
            fmt::format("gemm_wgmma: input width {} is not a positive multiple of 32", k));
    const std::string tile = fmt::format(
        "m{}n{}.s{}{}{}", t.bm, t.bn, t.stages,
        t.splits > 1 ? fmt::format(".k{}", t.splits) : std::string(), t.producer ? ".p" : "");
    if ((t.bm != 64 && t.bm != 128 && t.bm != 256) || (t.bn != 64 && t.bn != 128) || t.stages < 3 ||
        t.stages > 6 || t.splits < 1 || t.splits > 8 || (t.producer && t.bn != 64))
        throw std::invalid_argument(
            fmt::format("gemm_wgmma: impossible tile {} (BM 64, 128 or 256, BN 64 or 128, 3..6 "
                        "stages, 1..8 K splits, the producer form with BN 64 only)",
                        tile));
    // The layout of kernel_templates/gemm_wgmma.cu: per stage the bf16 activations [BM][64], the
    // payloads [BN][64 or 32 bytes + 16 of padding] and fp16 scales [BN][2], padded to 1 KiB; the
    // epilogue's fp32 tile [BM][BN + 4] over the stages; the producer form's mbarriers (16 bytes
    // per stage); 1 KiB to align the base.
    const int64_t row_pitch = (weight_type == ggml::Type::Q8_0 ? 64 : 32) + 16;
    const int64_t stage = (int64_t{t.bm} * 128 + t.bn * row_pitch + t.bn * 4 + 1023) / 1024 * 1024;
    const int64_t smem = std::max(t.stages * stage, int64_t{t.bm} * (t.bn + 4) * 4) +
                         (t.producer ? 16 * t.stages : 0) + 1024;
    if (smem > 227 * 1024)
        throw std::invalid_argument(fmt::format(
            "gemm_wgmma: tile {} needs {} bytes of shared memory per block (at most 227 KiB)", tile,
            smem));
    jit::KernelSpec s;
    s.family = "gemm_wgmma";
    s.name = fmt::format("gemm_wgmma.{}.k{}.{}", tag, k, tile);
    s.constants = {{"K", k},
                   {"WTYPE", weight_type == ggml::Type::Q8_0 ? 0 : 1},
                   {"BM", t.bm},
                   {"BN", t.bn},
                   {"STAGES", t.stages},
                   {"SPLITS", t.splits},
                   {"PRODUCER", t.producer ? 1 : 0},
                   {"THREADS", 2 * t.bn + (t.producer ? 128 : 0)},
                   {"SMEM", smem}};
    s.entries = {"gemm_wgmma", "gemm_wgmma_geglu", "gemm_wgmma_geglu_bf16", "gemm_wgmma_reduce",
                 "gemm_wgmma_reduce_bf16"};
    s.priority = 1;
    s.arch_specific = 90;
    return s;
}

}  // namespace gj::gemma4
