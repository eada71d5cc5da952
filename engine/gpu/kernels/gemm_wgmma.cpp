#include "engine/gpu/kernels/gemm_wgmma.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "engine/gpu/kernels/spec_util.h"
#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

GemmWgmmaTile gemm_wgmma_tile(ggml::Type /*weight_type*/, int k, int n_rows) {
    // Measured on the H100 at T = 512 (GemmWgmmaBench.DISABLED_Shapes, TFLOP/s Q4_0): 128 x 256
    // tiles win once there are about a wave of them (n 8192: 371 vs 320 for 128 x 128; n 16384:
    // 376; the GeGLU's 128 + 128 rows at n 21504: 324, n 10240: 292), 128 x 128 at n 4096 (319
    // vs 191 for 64 tiles of 256). The n 5376 and 2560 products of deep inputs leave SMs idle
    // without a K split (84 tiles of 128 x 256: 234-257). Narrow products: 64 x 64 (n 2560 at
    // k 2048: 154).
    if (n_rows >= 8192) return {128, 256, 4, 1};
    if (n_rows >= 5120) return {128, 256, 4, k >= 4096 ? kMmqSplits : 1};
    if (n_rows >= 4096) return {128, 128, 4, 1};
    if (n_rows >= 2560 && k >= 4096) return {128, 128, 4, kMmqSplits};
    return {64, 64, 4, 1};
}

jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, int n_rows) {
    if (n_rows < 1)
        throw std::invalid_argument(fmt::format("gemm_wgmma: {} weight rows (at least 1)", n_rows));
    return gemm_wgmma_spec(weight_type, k, gemm_wgmma_tile(weight_type, k, n_rows));
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
    const std::string tile =
        fmt::format("m{}n{}.s{}{}", t.bm, t.bn, t.stages,
                    t.splits > 1 ? fmt::format(".k{}", t.splits) : std::string());
    if ((t.bm != 64 && t.bm != 128) || (t.bn != 64 && t.bn != 128 && t.bn != 256) || t.stages < 3 ||
        t.stages > 6 || t.splits < 1 || t.splits > 8)
        throw std::invalid_argument(
            fmt::format("gemm_wgmma: impossible tile {} (BM 64 or 128, BN 64, 128 or 256, 3..6 "
                        "stages, 1..8 K splits)",
                        tile));
    // The layout of kernel_templates/gemm_wgmma.cu: per stage the bf16 activations [BM][64], the
    // payloads [BN][64 or 32 bytes] and fp16 scales [BN][2], padded to 1 KiB; two conversion
    // buffers of bf16 [BN][64]; 1 KiB to align the base.
    const int64_t raw_row = weight_type == ggml::Type::Q8_0 ? 64 : 32;
    const int64_t stage = (int64_t{t.bm} * 128 + t.bn * raw_row + t.bn * 4 + 1023) / 1024 * 1024;
    const int64_t smem = t.stages * stage + 2 * int64_t{t.bn} * 128 + 1024;
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
                   {"THREADS", 2 * t.bm},
                   {"SMEM", smem}};
    s.entries = {"gemm_wgmma", "gemm_wgmma_geglu", "gemm_wgmma_geglu_bf16", "gemm_wgmma_reduce"};
    s.priority = 1;
    s.arch_specific = 90;
    return s;
}

}  // namespace gj::gemma4
