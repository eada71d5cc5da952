// The list of kernel specializations a model needs, derived from its Config and weight type.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/model/gemma4_config.h"
#include "engine/gguf/ggml_types.h"
#include "jit/env_flags.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// KV cache element type (GEMMAJIT_KV_TYPE), the KV_TYPE constant of the attention templates:
// f16, bf16, or q8_0 (int8 payload plane + fp16 scale per 32 elements; kernel_templates/attn_kv.cuh
// defines the layout, kv_cache.h sizes it).
enum class KvType { F16 = 0, BF16 = 1, Q8_0 = 2 };
// "f16" | "bf16" | "q8_0" (the GEMMAJIT_KV_TYPE spellings); throws ConfigError naming the value.
KvType kv_type_from_name(std::string_view name);
const char* kv_type_name(KvType kv);

// Deduplicated by spec name, decode-path kernels first (priority 0). Every matrix, embedding table
// and PLE table is taken to be stored as `weight_type` (f32, f16, bf16, q8_0 or q4_0). Throws
// ConfigError for a weight type with no kernel, or q8_0 KV with flash_mma.
// `flash_mma` is GEMMAJIT_FLASH_MMA (tensor-core decode attention instead of the default fp32 one).
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, ggml::Type weight_type,
                                               KvType kv = KvType::F16, bool flash_mma = false);

// How a quantized matrix sits in GPU memory for the matvec kernels.
enum class MatvecLayout {
    Ggml,   // the GGUF's blocks as-is
    Split,  // payload plane + fp16 scale plane, made once by the spec's repack_<type> entry
};

// The storage of each weight role, for files that mix types (a Q4_0 file with F16 embeddings).
struct PlanTypes {
    ggml::Type matmul;                          // attention, FFN and PLE gate/proj matrices
    ggml::Type token_embd;                      // the embedding gather and the tied LM head
    ggml::Type ple_token_embd;                  // per_layer_token_embd (PLE models)
    ggml::Type ple_model_proj;                  // per_layer_model_proj (PLE models)
    MatvecLayout layout = MatvecLayout::Split;  // for the quantized matrices
    int max_cols = 8;           // > 1: also the matvecs for batches of max_cols columns (prefill)
    KvType kv = KvType::F16;    // KV cache element type of the attention kernels
    bool flash_mma = false;     // GEMMAJIT_FLASH_MMA: tensor-core decode attention
    bool blas = true;           // GEMMAJIT_BLAS: cuBLAS prefill products for float matrices
    bool flash_prefill = true;  // GEMMAJIT_FLASH_PREFILL: tensor-core prefill attention
    bool mmq = true;            // GEMMAJIT_MMQ_VARIANT != none: tensor-core prefill GEMMs
    bool wgmma = false;         // ... as gemm_wgmma (sm_90 only), else int8 mmq
};
// Whether GEMMAJIT_MMQ_VARIANT selects the wgmma GEMM for a plan targeting `arch` (sm_90 or
// sm_90a: "wgmma" or "auto"; else never). Throws ConfigError for "wgmma" with another target.
bool wgmma_gemm_selected(const jit::Flags& flags, const std::string& arch);
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, const PlanTypes& types);

// ---- Single-spec builders (the plan is made of these; the engine and tests use them too). ----
// Launch geometry is read back from the spec's constants with spec_constant(); each template's
// header comment states it. In short:
//   rmsnorm:       block TPR * RPB, grid ceil(rows / RPB)
//   matvec_*:      block THREADS, grid ceil(n_rows / ROWS)
//   quantize_q8_1: block THREADS, grid ceil(8 * n_blocks / THREADS)
//   embed_rows:    block THREADS, grid (ceil(N / 4 / THREADS), T)
//   ple_finish:    block 128, grid ceil(T * L / 4)
//   gelu_mul:      block 128, grid ceil(T * P / 128); gelu_mul_q8: grid ceil(T * P / 512)
//   logits:        block THREADS; grid ARGMAX_BLOCKS (softcap_argmax), TOPK_BLOCKS
//                  (softcap_topk), ceil(n / THREADS) (softcap); workspace WORK_BYTES
//   attn_prep:     block 32 * WARPS, grid (ceil(rows / WARPS), max_T),
//                  rows = N_HEADS + (HAS_KV ? 2 * N_KV_HEADS : 0)
//   flash_decode:  block THREADS, grid (max_splits, N_KV_HEADS, max_T), dynamic smem SMEM bytes
//                  (above 48 KiB the caller opts in once: ModuleSet::set_max_dynamic_smem)
//   flash_combine: block COMBINE_THREADS, grid (N_KV_HEADS * GROUP * HEAD_DIM / 16, max_T)
//   flash_prefill: block THREADS, grid (ceil(T * GROUP / BLOCK_ROWS) * SPLITS, N_KV_HEADS),
//                  dynamic smem SMEM bytes (opt in above 48 KiB); clusters of (SPLITS, 1, 1)
//                  blocks are compiled in (sm_90+), no workspace

// rmsnorm over rows of n floats: "rmsnorm.n<n>.w<0|1>[.add][.scale][.n2][.q8][.p<parts>]".
//   quant:  also write Q8_1 activations (of the second norm's output when norm2); n % 32 == 0
//   add:    y = residual + norm(x) [* w]
//   scale:  y = (residual + norm(x) * w) * (*scale)   (layer_output_scale; needs add)
//   norm2:  also y2 = norm(y) * w2                     (the next pre-norm; needs add)
//   parts:  x is the sum of that many [rows][n] planes (split-K partials of the int8 GEMM;
//           needs add)
// Entry "rmsnorm" without scale and norm2, else "rmsnorm_ext" (see kernel_templates/rmsnorm.cu).
// Throws std::invalid_argument for an impossible combination.
jit::KernelSpec rmsnorm_spec(int n, bool weight, bool quant = false, bool add = false,
                             bool scale = false, bool norm2 = false, int parts = 1);

// matvec of input width k. Q8_0 / Q4_0: "matvec_q8_0.k<k>[.b<ncols>][.split]" (int8 activations);
// F32 / F16 / BF16: the matvec_f_spec below (layout must be Ggml). Throws ConfigError for another
// weight type, std::invalid_argument for k % 32 != 0 or ncols outside 1..8.
jit::KernelSpec matvec_spec(ggml::Type weight_type, int k, int ncols = 1,
                            MatvecLayout layout = MatvecLayout::Ggml);

// matvec for float weights (f32, f16, bf16) against fp32 activations:
// "matvec_f.<type>.k<k>[.b<ncols>]". Throws like matvec_spec.
jit::KernelSpec matvec_f_spec(ggml::Type weight_type, int k, int ncols = 1);

// Prompt-batch GEMM on int8 tensor cores (kernel_templates/mmq.cu): Q8_0 / Q4_0 weights in the
// split layout against Q8_1 activations; entries mmq, mmq_geglu, mmq_geglu_q8. Launch: grid
// (ceil(n_rows / BN), ceil(T / BM)), block THREADS, dynamic smem SMEM (constants of the spec).
// The tile: BM tokens x BN weight rows, a WARPS_M x WARPS_N warp grid, KBS 32-blocks of K per
// pipeline stage, STAGES stages, registers for MIN_BLOCKS resident blocks per SM, and the GeGLU
// entries' passes over the BM tokens (1 or 2; two halve their registers and shared memory).
struct MmqTile {
    int bm = 64, bn = 128, warps_m = 2, warps_n = 4, kbs = 2, stages = 4, min_blocks = 1,
        geglu_passes = 1, splits = 1;  // splits: K split of the plain entry (mmq_reduce)
};
// The K split of the plan's split tiles (the post-norms that read their partials use it too).
inline constexpr int kMmqSplits = 3;
// The tile the plan uses for a k-wide matrix of n_rows rows (measured on the H200 with 512-token
// chunks; kernel_plan.cpp lists the numbers).
MmqTile mmq_tile(ggml::Type weight_type, int k, int n_rows);
// "mmq.<type>.k<k>.m<BM>n<BN>.w<WARPS_M>x<WARPS_N>.s<STAGES>b<KBS>.o<MIN_BLOCKS>p<passes>[.k<splits>]"
// (entries mmq, mmq_geglu, mmq_geglu_q8, mmq_reduce). Throws
// ConfigError for a weight type other than q8_0 / q4_0, std::invalid_argument for k % 32 != 0,
// n_rows < 1 or an impossible tile (BM a multiple of 16 * WARPS_M, BN of 32 * WARPS_N, at most 16
// warps; KBS 1, 2, 4, 8; 2..8 stages; shared memory within 227 KiB per block and 228 KiB per SM).
jit::KernelSpec mmq_spec(ggml::Type weight_type, int k, int n_rows);
jit::KernelSpec mmq_spec(ggml::Type weight_type, int k, const MmqTile& tile);

// Prompt-batch product Y = X W^T on Hopper's warpgroup tensor cores (kernel_templates/
// gemm_wgmma.cu, sm_90a only): Q8_0 / Q4_0 weights in the split layout dequantized to bf16 in
// shared memory, bf16 activations X [T][k]; entries gemm_wgmma (fp32 Y), gemm_wgmma_geglu (fp32),
// gemm_wgmma_geglu_bf16 (bf16, the down projection's input). Launch: grid (ceil(n_rows / R),
// ceil(T / BM)) with R = BN for gemm_wgmma and BN / 2 for the GeGLU entries, block THREADS,
// dynamic smem SMEM (opt in above 48 KiB). The tile: BM tokens (64 or 128: one or two
// warpgroups), BN converted weight rows (64, 128, 256), `stages` copy steps of 64 elements of K,
// and the K split of the plain entry (1 or kMmqSplits, whose partial planes the post-norms read;
// else entry gemm_wgmma_reduce sums them).
struct GemmWgmmaTile {
    int bm = 128, bn = 128, stages = 4, splits = 1;
    bool operator==(const GemmWgmmaTile&) const = default;
};
// The tile the plan uses for a k-wide matrix of n_rows rows (measured with 512-token chunks;
// kernel_plan.cpp lists the numbers).
GemmWgmmaTile gemm_wgmma_tile(ggml::Type weight_type, int k, int n_rows);
// "gemm_wgmma.<type>.k<k>.m<BM>n<BN>.s<stages>[.k<splits>]" (arch_specific 90). Throws
// ConfigError for a weight type other than q8_0 / q4_0, std::invalid_argument for k not a positive
// multiple of 32, n_rows < 1 or an impossible tile (BM 64/128, BN 64/128/256, 3..6 stages, 1..8
// splits, shared memory within 227 KiB).
jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, int n_rows);
jit::KernelSpec gemm_wgmma_spec(ggml::Type weight_type, int k, const GemmWgmmaTile& tile);

// fp32 -> Q8_1 activation quantization (width-independent): "quantize_q8_1".
jit::KernelSpec quantize_spec();

// fp32 -> fp16 / bf16 activations for the cuBLAS products of F16 / BF16 weights (entries
// f32_to_f16, f32_to_bf16): "convert_f32".
jit::KernelSpec convert_f32_spec();

// Row gather + scale from an n-wide table of `vocab` rows stored as f32/f16/bf16/q8_0/q4_0:
// "embed_rows.<type>.n<n>.v<vocab>". Throws ConfigError for another type, std::invalid_argument
// for n not a multiple of 4 (32 for the quantized types).
jit::KernelSpec embed_rows_spec(int n, ggml::Type table_type, int vocab);

// PLE precompute (ple_finish) for L layers of width P: "ple_finish.l<L>.p<P>".
jit::KernelSpec ple_finish_spec(int n_layers, int ple_dim);
// PLE injection gelu(gate) * ple[l] (gelu_mul, gelu_mul_q8), and the in-place GeGLU of the
// float-weight FFN's cuBLAS products (gelu_mul_inplace, P = FFN width): "gelu_mul.p<P>".
jit::KernelSpec gelu_mul_spec(int ple_dim);

// Softcap + argmax / top-k over a vocabulary: "logits.v<vocab>.k<topk>"; topk in 1..64.
jit::KernelSpec logits_spec(int vocab, int topk = 64);

// Q/K norm, V-norm, RoPE and KV append of one layer, fused:
// "attn_prep.hd<hd>.h<H>.kv<Hkv>.rp<pairs>[.keqv].<f16|bf16|q8_0>", or "...rp<pairs>.shared" for
// a KV-shared layer (Q only; no KV type). Throws std::invalid_argument for impossible shapes
// (q8_0: head dims that are not multiples of 32).
jit::KernelSpec attn_prep_spec(int head_dim, int n_heads, int n_kv_heads, int rope_pairs,
                               bool has_kv, bool has_v, KvType kv);
jit::KernelSpec attn_prep_spec(const Config& cfg, int layer, KvType kv = KvType::F16);

// Split-K decode attention and its combine step (entries flash_decode, flash_combine):
// "flash_decode.hd<hd>.g<group>.kv<Hkv>.w<window>.<f16|bf16|q8_0>[.mma]" (window 0 = global
// causal).
// Default: everything in fp32 on CUDA cores (the exact path). tensor_cores (head dims that are
// multiples of 64): Q K^T and P V on mma.sync in the cache's type with fp32 accumulation and an
// fp32 softmax (".mma"); correct, but slower at E4B decode shapes on the H200 so far (13.9 vs
// 10.6 us for a global layer at depth 4096), hence opt-in. Throws std::invalid_argument for
// impossible shapes, ConfigError for tensor_cores with KvType::Q8_0 (the fp32 path dequantizes
// q8_0 rows in shared memory; the mma path has no q8_0 form) or a layer whose head count is not a
// multiple of its KV heads.
jit::KernelSpec flash_decode_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                  bool tensor_cores = false);
jit::KernelSpec flash_decode_spec(const Config& cfg, int layer, KvType kv = KvType::F16,
                                  bool tensor_cores = false);

// The max_splits to launch flash_decode with (and to size part_o / part_ml for): about one block
// per SM for `n_tokens` queries at the deepest point, never more splits than CHUNK-sized pieces
// of the most keys a query can see (max_keys, capped by WINDOW). Any value >= 1 is correct; this
// one keeps the grid fixed across depths (CUDA graphs) and the partials small.
int flash_decode_splits(const jit::KernelSpec& spec, int max_keys, int n_tokens, int sm_count);

// Tensor-core prefill attention over the cache (entry flash_prefill, kernel_templates/
// flash_prefill.cu): "flash_prefill.hd<hd>.g<group>.kv<Hkv>.w<window>.<f16|bf16|q8_0>" (q8_0:
// tiles dequantized to fp16 in shared memory, products in fp16). Launch:
// grid (ceil(T * GROUP / BLOCK_ROWS) * SPLITS, N_KV_HEADS), block THREADS, dynamic smem SMEM
// bytes (opt in above 48 KiB); SPLITS > 1 blocks of a row block form a cluster (compiled into the
// kernel, so cuLaunchKernel works; sm_90+, earlier archs run split 0 alone) and share its key
// tiles. The tiling (warps per block and their roles, keys per tile, pipeline depth, key splits)
// is chosen per head dim, group, KV heads and the expected chunk length (`chunk` tokens: the
// engine's prefill chunk; any T is correct, the split count only aims to fill the SMs at that
// length); the overload taking a FlashPrefillTiling sets it explicitly (tests, benchmarks). A
// tiling other than the default for kFlashPrefillDefaultChunk is spelled in the name
// (".m<WM>d<DS>[h]k<KS>w<KW>s<STAGES>x<SPLITS>", h: scores split by head dims). Throws
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
jit::KernelSpec flash_prefill_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                   const FlashPrefillTiling& tiling);
jit::KernelSpec flash_prefill_spec(int head_dim, int group, int n_kv_heads, int window, KvType kv,
                                   int chunk = kFlashPrefillDefaultChunk);
jit::KernelSpec flash_prefill_spec(const Config& cfg, int layer, KvType kv = KvType::F16,
                                   int chunk = kFlashPrefillDefaultChunk);

// Value of a spec constant; throws std::out_of_range naming the spec and constant.
int64_t spec_constant(const jit::KernelSpec& spec, std::string_view name);

}  // namespace gj::gemma4
