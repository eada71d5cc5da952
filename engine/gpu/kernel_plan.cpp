// Kernel plan: which template specializations a Gemma 4 model needs for its decode path, and the
// launch-geometry choices (threads, rows per block) baked into each of them.
#include "engine/gpu/kernel_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

#include "jit/jit.h"

namespace gj::gemma4 {

namespace {

int round_up(int v, int m) {
    return (v + m - 1) / m * m;
}

int next_pow2(int v) {
    int p = 1;
    while (p < v) p *= 2;
    return p;
}

const char* matvec_type_tag(ggml::Type t) {
    switch (t) {
        case ggml::Type::Q8_0:
            return "q8_0";
        case ggml::Type::Q4_0:
            return "q4_0";
        default:
            return nullptr;
    }
}

bool is_float_type(ggml::Type t) {
    return t == ggml::Type::F32 || t == ggml::Type::F16 || t == ggml::Type::BF16;
}

bool has_matvec(ggml::Type t) {
    return matvec_type_tag(t) || is_float_type(t);
}

// Units (the per-thread work items of matvec_common.cuh) per row.
int matvec_units(ggml::Type t, int k, MatvecLayout layout) {
    if (is_float_type(t)) return k / (t == ggml::Type::F32 ? 4 : 8);  // 16 bytes each
    if (layout == MatvecLayout::Split) return t == ggml::Type::Q8_0 ? k / 16 : k / 32;
    return k / (t == ggml::Type::Q8_0 ? 8 : 16);
}

// Threads split a row's units; enough of them per thread (>= 4) to keep UNROLL batches of loads
// in flight, and not more threads than a quarter of the units.
int matvec_threads(int units) {
    return std::clamp(next_pow2(units / 4 + 1) / 2, 32, 256);
}

void check_matvec_shape(const std::string& what, int k, int ncols) {
    if (k <= 0 || k % 32 != 0)
        throw std::invalid_argument(
            fmt::format("{}: input width {} is not a positive multiple of 32", what, k));
    if (ncols < 1 || ncols > 8)
        throw std::invalid_argument(fmt::format("{}: {} columns (1..8 supported)", what, ncols));
}

std::string supported_types() {
    return "f32, f16, bf16, q8_0, q4_0";
}

}  // namespace

jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant, bool add, bool scale, bool norm2,
                             int parts) {
    if (parts < 1 || parts > 8 || (parts > 1 && !add))
        throw std::invalid_argument(fmt::format(
            "rmsnorm: {} input planes (1..8, more than 1 only with the residual add)", parts));
    if (n <= 0 || n % 4 != 0)
        throw std::invalid_argument(
            fmt::format("rmsnorm: width {} is not a positive multiple of 4", n));
    if (quant && n % 32 != 0)
        throw std::invalid_argument(fmt::format(
            "rmsnorm: quantized output needs a width that is a multiple of 32, got {}", n));
    if ((scale || norm2) && !add)
        throw std::invalid_argument(
            "rmsnorm: the output scale and the chained second norm apply to a residual update "
            "(add)");
    if (n > 16 * 1024 * 4)
        throw std::invalid_argument(
            fmt::format("rmsnorm: width {} is above the 65536 supported", n));
    // About 4 float4 per thread. Narrow rows (head dims) share a warp between several rows;
    // wide rows (d_model) get a block each.
    int tpr, rpb;
    if (n <= 512) {
        tpr = std::clamp(next_pow2((n + 15) / 16), 8, 32);
        rpb = 128 / tpr;
    } else {
        tpr = std::min(1024, round_up((n + 15) / 16, 32));
        rpb = 1;
    }
    jit::KernelSpec s;
    s.family = "rmsnorm";
    s.name = fmt::format("rmsnorm.n{}.w{}{}{}{}{}{}", n, weight ? 1 : 0, add ? ".add" : "",
                         scale ? ".scale" : "", norm2 ? ".n2" : "", quant ? ".q8" : "",
                         parts > 1 ? fmt::format(".p{}", parts) : std::string());
    s.constants = {{"N", n},
                   {"TPR", tpr},
                   {"RPB", rpb},
                   {"WEIGHT", weight ? 1 : 0},
                   {"QUANT", quant ? 1 : 0},
                   {"ADD", add ? 1 : 0},
                   {"SCALE", scale ? 1 : 0},
                   {"NORM2", norm2 ? 1 : 0},
                   {"PARTS", parts}};
    s.entries = {scale || norm2 ? "rmsnorm_ext" : "rmsnorm"};
    s.priority = 0;
    return s;
}

jit::KernelSpec matvec_spec(ggml::Type weight_type, int k, int ncols, MatvecLayout layout) {
    if (is_float_type(weight_type)) {
        if (layout != MatvecLayout::Ggml)
            throw std::invalid_argument(fmt::format("matvec: {} weights have no split layout",
                                                    ggml::type_name(weight_type)));
        return matvec_f_spec(weight_type, k, ncols);
    }
    const char* tag = matvec_type_tag(weight_type);
    if (!tag)
        throw ConfigError(fmt::format("no matvec kernel for weight type {} (supported: {})",
                                      ggml::type_name(weight_type), supported_types()));
    check_matvec_shape(fmt::format("matvec_{}", tag), k, ncols);
    const int units = matvec_units(weight_type, k, layout);
    const int threads = matvec_threads(units);
    // Batches of 4 iterations, unless a row takes 5..7 iterations: then one batch of all of them,
    // so no batch overhangs the row end (ptxas also spills in one such ragged form: K = 10240,
    // split Q8_0, GeGLU, sm_90).
    const int iters = (units + threads - 1) / threads;
    const int unroll = iters > 4 && iters < 8 ? iters : 4;
    jit::KernelSpec s;
    s.family = fmt::format("matvec_{}", tag);
    s.name = fmt::format("matvec_{}.k{}{}{}", tag, k, ncols > 1 ? fmt::format(".b{}", ncols) : "",
                         layout == MatvecLayout::Split ? ".split" : "");
    s.constants = {{"K", k},
                   {"LAYOUT", layout == MatvecLayout::Split ? 1 : 0},
                   {"THREADS", threads},
                   {"ROWS", 1},
                   {"NCOLS", ncols},
                   {"UNROLL", unroll}};
    const std::string base = fmt::format("matvec_{}", tag);
    s.entries = {base, base + "_add", base + "_geglu"};
    if (layout == MatvecLayout::Split) s.entries.push_back(fmt::format("repack_{}", tag));
    s.priority = 0;
    return s;
}

jit::KernelSpec matvec_f_spec(ggml::Type weight_type, int k, int ncols) {
    if (!is_float_type(weight_type))
        throw ConfigError(fmt::format("matvec_f: weight type {} is not f32, f16 or bf16",
                                      ggml::type_name(weight_type)));
    const std::string tag = ggml::type_name(weight_type);
    check_matvec_shape("matvec_f." + tag, k, ncols);
    // About 10 units (16-byte loads) per thread, 32 to 128 threads; at 128 threads each block
    // takes two rows, which halves the activation reads per weight byte. Measured on the H200 at
    // E4B shapes (bf16 / f16, GB/s of the 4.27 TB/s copy bandwidth): 10240 x 2560 (32 threads)
    // ~3.35-3.4 TB/s, GeGLU ~3.8-3.9; 2560 x 10240 (128 threads, 2 rows) ~3.3-3.5; the
    // previous quarter-of-the-units rule gave 2.7-3.2 on the same shapes.
    const int units = matvec_units(weight_type, k, MatvecLayout::Ggml);
    const int threads = std::clamp(next_pow2(units / 10), 32, 128);
    const int rows = threads >= 128 ? 2 : 1;
    // Each column keeps a unit's 4 or 8 fp32 activations per batch step in registers: fewer
    // batched iterations for wide batches keep the kernel free of spills.
    const int unroll = ncols <= 2 ? 4 : ncols <= 4 ? 2 : 1;
    jit::KernelSpec s;
    s.family = "matvec_f";
    s.name = fmt::format("matvec_f.{}.k{}{}", tag, k, ncols > 1 ? fmt::format(".b{}", ncols) : "");
    s.constants = {{"K", k},
                   {"WTYPE", static_cast<int64_t>(weight_type)},
                   {"THREADS", threads},
                   {"ROWS", rows},
                   {"NCOLS", ncols},
                   {"UNROLL", unroll}};
    s.entries = {"matvec_f", "matvec_f_add", "matvec_f_geglu"};
    s.priority = 0;
    return s;
}

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

jit::KernelSpec mmq_spec(ggml::Type weight_type, int k, const MmqTile& t) {
    const char* tag = matvec_type_tag(weight_type);
    if (!tag)
        throw ConfigError(
            fmt::format("no int8 tensor-core GEMM (mmq) for weight type {} (supported: q8_0, q4_0)",
                        ggml::type_name(weight_type)));
    if (k <= 0 || k % 32 != 0)
        throw std::invalid_argument(
            fmt::format("mmq: input width {} is not a positive multiple of 32", k));
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
    // The stage layouts of kernel_templates/mmq.cu: activations, the weight payloads, {d, s} and
    // the fp16 weight scales; the GeGLU entries hold two matrices for BM / GEGLU_PASSES tokens.
    const int w_bytes_per_kb = weight_type == ggml::Type::Q8_0 ? 32 : 16;
    auto stage = [&](int64_t rows, int64_t mats) {
        return rows * t.kbs * 32 + mats * t.bn * t.kbs * w_bytes_per_kb + t.kbs * rows * 8 +
               mats * t.bn * t.kbs * 2;
    };
    const int64_t smem = t.stages * std::max(stage(t.bm, 1), stage(t.bm / t.geglu_passes, 2));
    // 227 KiB per block; the SM's 228 KiB also hold 1 KiB per resident block.
    if (smem > 227 * 1024 || t.min_blocks * (smem + 1024) > 228 * 1024)
        throw std::invalid_argument(
            fmt::format("mmq: tile {} needs {} bytes of shared memory per block (at most 227 KiB, "
                        "228 KiB per SM for all resident blocks)",
                        tile, smem));
    jit::KernelSpec s;
    s.family = "mmq";
    s.name = fmt::format("mmq.{}.k{}.{}", tag, k, tile);
    s.constants = {{"K", k},
                   {"WTYPE", weight_type == ggml::Type::Q8_0 ? 0 : 1},
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
    s.entries = {"mmq", "mmq_geglu", "mmq_geglu_q8", "mmq_reduce"};
    s.priority = 1;
    return s;
}

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

bool wgmma_gemm_selected(const jit::Flags& flags, const std::string& arch) {
    const std::string variant = flags.get_string("GEMMAJIT_MMQ_VARIANT");
    const bool sm90 = arch == "sm_90" || arch == "sm_90a";
    if (variant == "wgmma" && !sm90)
        throw ConfigError(fmt::format(
            "GEMMAJIT_MMQ_VARIANT=wgmma needs an sm_90 GPU (wgmma is sm_90a-only); this plan "
            "targets {}",
            arch));
    return variant == "wgmma" || (variant == "auto" && sm90);
}

jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, int n_rows) {
    if (n_rows < 1)
        throw std::invalid_argument(fmt::format("gemm_wgmma: {} weight rows (at least 1)", n_rows));
    return gemm_wgmma_spec(weight_type, k, gemm_wgmma_tile(weight_type, k, n_rows));
}

jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, const GemmWgmmaTile& t) {
    const char* tag = matvec_type_tag(weight_type);
    if (!tag)
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

jit::KernelSpec quantize_spec() {
    jit::KernelSpec s;
    s.family = "quantize_q8_1";
    s.name = "quantize_q8_1";
    s.constants = {{"THREADS", 256}};
    s.entries = {"quantize_q8_1"};
    s.priority = 0;
    return s;
}

jit::KernelSpec convert_f32_spec() {
    jit::KernelSpec s;
    s.family = "convert_f32";
    s.name = "convert_f32";
    s.constants = {{"THREADS", 256}};
    s.entries = {"f32_to_f16", "f32_to_bf16"};
    s.priority = 1;
    return s;
}

jit::KernelSpec embed_rows_spec(int n, ggml::Type table_type, int vocab) {
    if (!has_matvec(table_type))
        throw ConfigError(fmt::format("no embedding gather for table type {} (supported: {})",
                                      ggml::type_name(table_type), supported_types()));
    const bool quantized = matvec_type_tag(table_type) != nullptr;
    if (n <= 0 || n % (quantized ? 32 : 4) != 0)
        throw std::invalid_argument(
            fmt::format("embed_rows: row width {} is not a positive multiple of {} ({} table)", n,
                        quantized ? 32 : 4, ggml::type_name(table_type)));
    if (vocab <= 0)
        throw std::invalid_argument(fmt::format("embed_rows: vocabulary of {} rows", vocab));
    jit::KernelSpec s;
    s.family = "embed";
    s.name = fmt::format("embed_rows.{}.n{}.v{}", ggml::type_name(table_type), n, vocab);
    s.constants = {{"N", n},
                   {"WTYPE", static_cast<int64_t>(table_type)},
                   {"VOCAB", vocab},
                   {"THREADS", std::clamp(round_up(n / 4, 32), 32, 256)}};
    s.entries = {"embed_rows"};
    s.priority = 0;
    return s;
}

// ---- Attention ----------------------------------------------------------------------------

KvType kv_type_from_name(std::string_view name) {
    if (name == "f16") return KvType::F16;
    if (name == "bf16") return KvType::BF16;
    if (name == "q8_0") return KvType::Q8_0;
    throw ConfigError(fmt::format("KV cache type \"{}\" is not one of f16, bf16, q8_0", name));
}

const char* kv_type_name(KvType kv) {
    switch (kv) {
        case KvType::F16:
            return "f16";
        case KvType::BF16:
            return "bf16";
        case KvType::Q8_0:
            return "q8_0";
    }
    return "?";
}

namespace {

// The KV_TYPE constant of the attention templates (attn_kv.cuh).
int kv_type_constant(KvType kv) {
    return static_cast<int>(kv);
}

// Bytes of one cache row of head_dim elements, and of its scales (q8_0: one fp16 per 32).
int kv_row_bytes(KvType kv, int head_dim) {
    return kv == KvType::Q8_0 ? head_dim : 2 * head_dim;
}
int kv_scale_row_bytes(KvType kv, int head_dim) {
    return kv == KvType::Q8_0 ? head_dim / 32 * 2 : 0;
}

int prev_pow2(int v) {
    int p = 1;
    while (p * 2 <= v) p *= 2;
    return p;
}

}  // namespace

jit::KernelSpec attn_prep_spec(int head_dim, int n_heads, int n_kv_heads, int rope_pairs,
                               bool has_kv, bool has_v, KvType kv) {
    if (head_dim <= 0 || head_dim % 8 != 0)
        throw std::invalid_argument(
            fmt::format("attn_prep: head dim {} is not a positive multiple of 8", head_dim));
    if (n_heads <= 0 || n_kv_heads <= 0)
        throw std::invalid_argument(
            fmt::format("attn_prep: {} heads, {} KV heads", n_heads, n_kv_heads));
    if (rope_pairs < 0 || rope_pairs > head_dim / 2)
        throw std::invalid_argument(fmt::format("attn_prep: {} RoPE pairs for head dim {} (0..{})",
                                                rope_pairs, head_dim, head_dim / 2));
    if (has_kv && kv == KvType::Q8_0 && head_dim % 32 != 0)
        throw std::invalid_argument(fmt::format(
            "attn_prep: a q8_0 KV cache needs a head dim that is a multiple of 32, not {}",
            head_dim));
    const int kv_const = has_kv ? kv_type_constant(kv) : 0;
    jit::KernelSpec s;
    s.family = "attn_prep";
    s.name =
        fmt::format("attn_prep.hd{}.h{}.kv{}.rp{}{}", head_dim, n_heads, n_kv_heads, rope_pairs,
                    !has_kv ? ".shared"
                    : has_v ? fmt::format(".{}", kv_type_name(kv))
                            : fmt::format(".keqv.{}", kv_type_name(kv)));
    // One warp per head row; 4 rows per block keeps blocks small enough that a decode step
    // (one token, 8..64 rows) still spreads over several SMs.
    s.constants = {{"HEAD_DIM", head_dim},     {"N_HEADS", n_heads},
                   {"N_KV_HEADS", n_kv_heads}, {"ROPE_PAIRS", rope_pairs},
                   {"HAS_KV", has_kv ? 1 : 0}, {"HAS_V", has_kv && has_v ? 1 : 0},
                   {"KV_TYPE", kv_const},      {"WARPS", 4}};
    s.entries = {"attn_prep"};
    s.priority = 0;
    return s;
}

jit::KernelSpec ple_finish_spec(int n_layers, int ple_dim) {
    if (n_layers <= 0 || ple_dim <= 0 || ple_dim % 32 != 0)
        throw std::invalid_argument(fmt::format(
            "ple_finish: {} layers of width {} (width must be a positive multiple of 32)", n_layers,
            ple_dim));
    jit::KernelSpec s;
    s.family = "ple";
    s.name = fmt::format("ple_finish.l{}.p{}", n_layers, ple_dim);
    s.constants = {{"P", ple_dim}, {"N_LAYERS", n_layers}};
    s.entries = {"ple_finish"};
    s.priority = 0;
    return s;
}

jit::KernelSpec gelu_mul_spec(int ple_dim) {
    if (ple_dim <= 0 || ple_dim % 32 != 0)
        throw std::invalid_argument(
            fmt::format("gelu_mul: width {} is not a positive multiple of 32", ple_dim));
    jit::KernelSpec s;
    s.family = "ple";
    s.name = fmt::format("gelu_mul.p{}", ple_dim);
    s.constants = {{"P", ple_dim}};
    s.entries = {"gelu_mul", "gelu_mul_q8", "gelu_mul_inplace"};
    s.priority = 0;
    return s;
}

jit::KernelSpec logits_spec(int vocab, int topk) {
    if (vocab <= 0 || vocab % 4 != 0)
        throw std::invalid_argument(
            fmt::format("logits: vocabulary size {} is not a positive multiple of 4", vocab));
    if (topk < 1 || topk > 64 || topk > vocab)
        throw std::invalid_argument(
            fmt::format("logits: top-k of {} (1..64 and at most the vocabulary {})", topk, vocab));
    constexpr int threads = 256;
    // argmax: 2 float4 per thread and block; top-k: slices of up to 4096 logits (16 candidates
    // per thread), and the merge of all blocks' candidates no larger than that.
    const int argmax_blocks = std::clamp(vocab / (threads * 8), 1, 1024);
    const int topk_blocks = std::clamp(vocab / 4096, 1, 4096 / topk);
    jit::KernelSpec s;
    s.family = "logits";
    s.name = fmt::format("logits.v{}.k{}", vocab, topk);
    s.constants = {{"V", vocab},
                   {"THREADS", threads},
                   {"ARGMAX_BLOCKS", argmax_blocks},
                   {"TOPK", topk},
                   {"TOPK_BLOCKS", topk_blocks},
                   {"WORK_BYTES", 16 + 8 * (argmax_blocks + int64_t(topk_blocks) * topk)}};
    s.entries = {"softcap_argmax", "softcap_topk", "softcap"};
    s.priority = 0;
    return s;
}

jit::KernelSpec attn_prep_spec(const Config& cfg, int layer, KvType kv) {
    const LayerConfig& l = cfg.layers.at(layer);
    return attn_prep_spec(l.head_dim, cfg.n_heads, l.n_kv_heads, l.rope_pairs, l.has_kv,
                          l.has_v_proj, kv);
}

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

namespace {
// Query heads per KV head of a layer; throws ConfigError when they do not divide.
int gqa_group(const Config& cfg, int layer) {
    const LayerConfig& l = cfg.layers.at(layer);
    if (l.n_kv_heads <= 0 || cfg.n_heads % l.n_kv_heads != 0)
        throw ConfigError(fmt::format("model {}: layer {} has {} heads over {} KV heads", cfg.name,
                                      layer, cfg.n_heads, l.n_kv_heads));
    return cfg.n_heads / l.n_kv_heads;
}
}  // namespace

jit::KernelSpec flash_decode_spec(const Config& cfg, int layer, KvType kv, bool tensor_cores) {
    const LayerConfig& l = cfg.layers.at(layer);
    return flash_decode_spec(l.head_dim, gqa_group(cfg, layer), l.n_kv_heads,
                             l.sliding ? cfg.sliding_window : 0, kv, tensor_cores);
}

int flash_decode_splits(const jit::KernelSpec& spec, int max_keys, int n_tokens, int sm_count) {
    const int64_t chunk = spec_constant(spec, "CHUNK"), window = spec_constant(spec, "WINDOW");
    const int64_t kv_heads = spec_constant(spec, "N_KV_HEADS");
    const int64_t keys =
        std::max<int64_t>(1, window > 0 ? std::min<int64_t>(window, max_keys) : max_keys);
    const int64_t useful = (keys + chunk - 1) / chunk;
    const int64_t per_sm = (std::max(1, sm_count) + kv_heads * std::max(1, n_tokens) - 1) /
                           (kv_heads * std::max(1, n_tokens));
    return static_cast<int>(std::clamp<int64_t>(per_sm, 1, useful));
}

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
    const int64_t blocks =
        (int64_t(std::max(1, chunk)) * std::max(1, group) + 16 * t.row_warps - 1) /
        (16 * t.row_warps) * std::max(1, n_kv_heads);
    while (t.splits < 8 && blocks * t.splits < kFlashPrefillTargetBlocks) t.splits *= 2;
    return t;
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
    return flash_prefill_spec(l.head_dim, gqa_group(cfg, layer), l.n_kv_heads,
                              l.sliding ? cfg.sliding_window : 0, kv, chunk);
}

int64_t spec_constant(const jit::KernelSpec& spec, std::string_view name) {
    for (const auto& [n, v] : spec.constants)
        if (n == name) return v;
    throw std::out_of_range(fmt::format("kernel spec {} has no constant {}", spec.name, name));
}

std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, ggml::Type weight_type, KvType kv,
                                               bool flash_mma) {
    PlanTypes types{weight_type, weight_type, weight_type, weight_type};
    types.kv = kv;
    types.flash_mma = flash_mma;
    return build_kernel_plan(cfg, types);
}

std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, const PlanTypes& types) {
    for (const auto& [role, t] :
         {std::pair{"matrices", types.matmul}, std::pair{"token_embd", types.token_embd},
          std::pair{"per_layer_token_embd", types.ple_token_embd},
          std::pair{"per_layer_model_proj", types.ple_model_proj}})
        if (!has_matvec(t))
            throw ConfigError(fmt::format("model {}: no kernel for {} stored as {} (supported: {})",
                                          cfg.name, role, ggml::type_name(t), supported_types()));
    if (cfg.d_model <= 0 || cfg.n_heads <= 0 || cfg.layers.empty() || cfg.vocab_size <= 0)
        throw ConfigError(
            fmt::format("model {}: config has no shape (d_model {}, heads {}, {} layers, "
                        "vocabulary {})",
                        cfg.name, cfg.d_model, cfg.n_heads, cfg.layers.size(), cfg.vocab_size));
    if (types.max_cols < 1 || types.max_cols > 8)
        throw std::invalid_argument(
            fmt::format("kernel plan: batches of {} columns (1..8 supported)", types.max_cols));

    std::vector<jit::KernelSpec> plan;
    std::set<std::string> names;
    auto add = [&](jit::KernelSpec s) {
        if (names.insert(s.name).second) plan.push_back(std::move(s));
    };
    const int d = cfg.d_model;
    const bool q_mat = matvec_type_tag(types.matmul) != nullptr;  // int8 activations
    std::vector<int> col_counts = {1};
    if (types.max_cols > 1) col_counts.push_back(types.max_cols);
    auto add_matvec = [&](ggml::Type t, int k) {
        for (int ncols : col_counts)
            add(matvec_spec(t, k, ncols, is_float_type(t) ? MatvecLayout::Ggml : types.layout));
    };

    // Embedding gathers: token_embd (d wide) and the PLE table (L * P wide).
    add(embed_rows_spec(d, types.token_embd, cfg.vocab_size));
    if (cfg.has_ple())
        add(embed_rows_spec(cfg.n_layers * cfg.ple_dim, types.ple_token_embd, cfg.vocab_size));

    // Norms over the residual stream. Pre-norms feeding matvecs (attn_norm, ffn_norm,
    // output_norm) quantize their output for int8 matrices. Post-norms add into the stream
    // (post_attention_norm, post_ffw_norm, PLE post_norm); the layer's last one also applies
    // layer_output_scale; each may chain the next pre-norm (.n2). With PLE, the stream after the
    // FFN is itself the PLE gate's input (quantized for int8 matrices). The MoE block also has
    // a plain weighted norm (post_ffw_norm_1/2) and the router's weightless one.
    add(rmsnorm_spec(d, true, q_mat, false));
    add(rmsnorm_spec(d, true, false, true));
    add(rmsnorm_spec(d, true, false, true, true));
    add(rmsnorm_spec(d, true, q_mat, true, false, true));
    add(rmsnorm_spec(d, true, q_mat, true, true, true));
    if (cfg.has_ple() && q_mat) add(rmsnorm_spec(d, true, true, true));
    if (cfg.is_moe()) {
        add(rmsnorm_spec(d, true, false, false));
        add(rmsnorm_spec(d, false, false, false));
    }
    // Per-head norms: Q/K norm (weighted, shared across heads) on every layer, V-norm
    // (weightless) on layers that own their KV.
    for (const auto& l : cfg.layers) {
        if (l.head_dim <= 0)
            throw ConfigError(
                fmt::format("model {}: a layer has head_dim {}", cfg.name, l.head_dim));
        add(rmsnorm_spec(l.head_dim, true));
        if (l.has_kv) add(rmsnorm_spec(l.head_dim, false));
    }

    // Activations not produced by a quantizing norm (attention output, GeGLU output, the PLE
    // context projection's input).
    if (q_mat || matvec_type_tag(types.token_embd) || matvec_type_tag(types.ple_model_proj))
        add(quantize_spec());

    // One matvec per distinct input width: d (q/k/v, gate/up, PLE inp_gate), the attention
    // output width per layer type (o-proj), each FFN width (down; E2B's double-wide layers and
    // the MoE model's dense MLP included) and P (PLE proj). Then the tied LM head and the PLE
    // context projection (both d wide) in their own types.
    std::set<int> widths = {d};
    for (size_t i = 0; i < cfg.layers.size(); ++i) {
        widths.insert(cfg.q_dim(static_cast<int>(i)));
        if (cfg.layers[i].ffn_dim > 0) widths.insert(cfg.layers[i].ffn_dim);
    }
    if (cfg.has_ple()) widths.insert(cfg.ple_dim);
    for (int k : widths) add_matvec(types.matmul, k);
    add_matvec(types.token_embd, d);
    if (cfg.has_ple()) add_matvec(types.ple_model_proj, d);

    // Prefill products of the quantized matrices on the int8 tensor-core GEMM (split layout
    // only), one specialization per (input width, output rows) tile choice; the post-norms after
    // split-K products (attention output, FFN down) read their partial planes.
    if (types.mmq && types.layout == MatvecLayout::Split && q_mat) {
        add(rmsnorm_spec(d, true, true, true, false, true, kMmqSplits));
        add(rmsnorm_spec(d, true, true, true, true, true, kMmqSplits));
        if (cfg.has_ple()) add(rmsnorm_spec(d, true, true, true, false, false, kMmqSplits));
    }
    if (types.mmq && types.layout == MatvecLayout::Split) {
        auto add_gemm = [&](ggml::Type t, int k, int n) {
            if (matvec_type_tag(t) && n > 0)
                add(types.wgmma ? gemm_wgmma_spec(t, k, n) : mmq_spec(t, k, n));
        };
        if (types.wgmma) add(convert_f32_spec());  // the GEMMs' bf16 activations
        for (int l = 0; l < static_cast<int>(cfg.layers.size()); ++l) {
            const LayerConfig& lc = cfg.layers[l];
            add_gemm(types.matmul, d, cfg.q_dim(l));
            if (lc.has_kv) add_gemm(types.matmul, d, cfg.kv_dim(l));
            add_gemm(types.matmul, cfg.q_dim(l), d);
            if (lc.ffn_dim > 0) {
                add_gemm(types.matmul, d, lc.ffn_dim);
                add_gemm(types.matmul, lc.ffn_dim, d);
            }
            if (cfg.has_ple()) {
                add_gemm(types.matmul, d, cfg.ple_dim);
                add_gemm(types.matmul, cfg.ple_dim, d);
            }
        }
        add_gemm(types.token_embd, d, cfg.vocab_size);
        if (cfg.has_ple()) add_gemm(types.ple_model_proj, d, cfg.n_layers * cfg.ple_dim);
    }

    // PLE precompute and injection; the final softcap with the token choice.
    if (cfg.has_ple()) {
        add(ple_finish_spec(cfg.n_layers, cfg.ple_dim));
        add(gelu_mul_spec(cfg.ple_dim));
    }
    add(logits_spec(cfg.vocab_size));

    // Prefill products of float matrices through cuBLAS: activations converted to F16/BF16, and
    // the GeGLU joining the separate gate and up products.
    if (types.blas) {
        bool half = false;
        for (ggml::Type t : {types.matmul, types.token_embd, types.ple_model_proj})
            half = half || t == ggml::Type::F16 || t == ggml::Type::BF16;
        if (half) add(convert_f32_spec());
        if (is_float_type(types.matmul))
            for (const auto& l : cfg.layers)
                if (l.ffn_dim > 0) add(gelu_mul_spec(l.ffn_dim));
    }

    // Attention per layer: the fused Q/K/V prep (Q only on KV-shared layers) and split-K decode
    // attention with its combine, for the layer's head dim, GQA group and window.
    for (int l = 0; l < static_cast<int>(cfg.layers.size()); ++l) {
        add(attn_prep_spec(cfg, l, types.kv));
        add(flash_decode_spec(cfg, l, types.kv, types.flash_mma));
        if (types.flash_prefill) add(flash_prefill_spec(cfg, l, types.kv));
    }
    return plan;
}

}  // namespace gj::gemma4
