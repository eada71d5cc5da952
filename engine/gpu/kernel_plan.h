// The kernel plan: the list of kernel specializations a model needs, derived from its Config and
// weight types. The spec rules of each family (names, constants, tiles) live in
// engine/gpu/kernels/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kv_type.h"
#include "engine/gpu/shard_plan.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/quant_mix.h"
#include "jit/env_flags.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Deduplicated by spec name, decode-path kernels first (priority 0). Every matrix, embedding table
// and PLE table is taken to be stored as `weight_type` (f32, f16, bf16, q8_0, q4_0 or a K-quant
// q4_k/q5_k/q6_k, whose widths must then be whole 256-element super-blocks). Throws
// ConfigError for a weight type with no kernel, or q8_0 KV with flash_mma.
// `flash_mma` is GEMMAJIT_FLASH_MMA (tensor-core decode attention instead of the default fp32 one).
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, ggml::Type weight_type,
                                               KvType kv = KvType::F16, bool flash_mma = false);

// The storage of each weight role, for files that mix types (a Q4_0 file with F16 embeddings).
struct PlanTypes {
    ggml::Type matmul;                          // attention, FFN and PLE gate/proj matrices
    ggml::Type token_embd;                      // the embedding gather and the tied LM head
    ggml::Type ple_token_embd;                  // per_layer_token_embd (PLE models)
    ggml::Type ple_model_proj;                  // per_layer_model_proj (PLE models)
    MatvecLayout layout = MatvecLayout::Split;  // for the quantized matrices
    int max_cols = 8;            // > 1: also the matvecs for batches of max_cols columns (prefill)
    KvType kv = KvType::F16;     // KV cache element type of the attention kernels
    bool flash_mma = false;      // GEMMAJIT_FLASH_MMA: tensor-core decode attention
    bool blas = true;            // GEMMAJIT_BLAS: cuBLAS prefill products for float matrices
                                 // (and K-quant ones, through dequant_f16 copies)
    bool flash_prefill = true;   // GEMMAJIT_FLASH_PREFILL: tensor-core prefill attention
    bool flash_wgmma = false;    // GEMMAJIT_FLASH_WGMMA != off on sm_90: also its wgmma form
    bool mmq = true;             // GEMMAJIT_MMQ_VARIANT != none: tensor-core prefill GEMMs
    bool wgmma = false;          // ... as gemm_wgmma (sm_90 only), else int8 mmq
    bool wgmma_producer = true;  // GEMMAJIT_WGMMA_PRODUCER: its warp-specialized form
    bool quant_blas = false;     // Q8_0/Q4_0 layer matrices (may) multiply F16 copies
                                 // (dequant_f16) with cuBLAS (the LM head keeps its GEMM, MoE
                                 // experts their int8 GEMM); with wgmma as well: both (WgmmaBlas,
                                 // by chunk length)
    int decode_prefetch = 2;     // GEMMAJIT_MATVEC_PREFETCH (its default): sixteenths of each
                                 // weight row a decode matvec block asks L2 for
                                 // (with_decode_prefetch)
    MatvecShapes matvec_shapes = {};  // GEMMAJIT_MATVEC_SHAPE: decode matvec shapes set by hand
                                      // (with_matvec_shapes)
    int lm_head_rows = 0;  // LM head rows (0: the vocabulary; a tensor-parallel rank: its
                           // vocabulary slice, engine/gpu/shard_plan.h)
    int push_ranks = 0;    // > 1: a rank of that many whose row-parallel decode products
                           // (attention output, FFN down) also take their push form
                           // (matvec_push_spec; GEMMAJIT_TP_PUSH)
    // The type some layers keep V in while their Q and K are `matmul` (an _M mix's Q6_K attn_v
    // tensors): where has_multi_v takes the pair, the decode multi spec that reads it
    // (matvec_multi_v_spec).
    std::optional<ggml::Type> other_v = std::nullopt;
};
// How prefill chunks multiply Q8_0/Q4_0 layer matrices (GEMMAJIT_MMQ_VARIANT).
enum class QuantPrefill {
    Matvec,  // "none": the batched dp4a matvecs
    Mma,     // the int8 mma.sync GEMM (sm_80+)
    Wgmma,   // the bf16 warpgroup GEMM of weights dequantized in shared memory (sm_90)
    Blas,    // cuBLAS on F16 copies of each layer dequantized ahead (needs cuBLAS)
    // Both, by chunk length (sm_90 with cuBLAS): Wgmma for chunks shorter than
    // copy_min_rows(d_model), whose copies would cost more than the products save; Blas from
    // there on.
    WgmmaBlas,
};
// The choice of GEMMAJIT_MMQ_VARIANT for a plan targeting `arch` with cuBLAS loadable or not
// (`blas_available`; GEMMAJIT_BLAS=0 counts as not): "auto" takes WgmmaBlas on sm_90 (measured
// fastest there at every chunk length, docs/PERFORMANCE.md), Wgmma there without cuBLAS, Mma
// elsewhere. Throws ConfigError for "wgmma" on another target and for "blas" without cuBLAS.
//
// Under WgmmaBlas, the shortest prefill chunk whose Q8_0/Q4_0 products go through F16 copies: the
// copies cost about five reads of every layer matrix per chunk whatever its length, the products
// save a share of the GEMM time that grows with it. Measured on the H100 (pp T, tokens/s, wgmma /
// copies): E4B Q8_0 128: 12805 / 12615, 256: 17868 / 22238; 31B Q4_0 256: 5066 / 4504, 512:
// 5071 / 6516 (its wgmma tiles are more efficient, so copies pay later).
int copy_min_rows(int d_model);
// GEMMAJIT_FLASH_WGMMA for a plan targeting `arch`: Off on any target but sm_90 / sm_90a (auto
// there means the mma.sync prefill attention alone); Auto and Always as flash_prefill_wgmma_choice
// takes them. Throws ConfigError for "on" on another target.
enum class FlashWgmma { Off, Auto, Always };
FlashWgmma flash_wgmma_mode(const jit::Flags& flags, const std::string& arch);
QuantPrefill quant_prefill_choice(const jit::Flags& flags, const std::string& arch,
                                  bool blas_available);
// The prefill product choices of `flags` (GEMMAJIT_MMQ_VARIANT, GEMMAJIT_BLAS) for a plan
// targeting `arch`, as a GPU load with cuBLAS makes them: sets mmq, wgmma, quant_blas and blas;
// also the decode matvecs' L2 prefetch (GEMMAJIT_MATVEC_PREFETCH: decode_prefetch) and shapes set
// by hand (GEMMAJIT_MATVEC_SHAPE: matvec_shapes; throws ConfigError for a bad entry).
void apply_prefill_flags(PlanTypes& types, const jit::Flags& flags, const std::string& arch);
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, const PlanTypes& types);

// The plan of the preset `cfg` stored with a quant mix (engine/model/quant_mix.h: q4_k_m, ...):
// each tensor gets the mix's type, then the type a GPU load uploads it as (a type without GPU
// kernels is dequantized to F16, as GpuModel does); the plan is the union of the plans of the
// matrix types that occur (one when all matrices upload alike). `base` gives the other settings.
std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, const QuantMix& mix,
                                               PlanTypes base);
// The PlanTypes that plan builds on, one per matrix type of the mix (each with the embedding and
// PLE types the mix gives them, and other_v where the mix stores some layers' V in another type
// than their Q and K).
std::vector<PlanTypes> mix_plan_types(const Config& cfg, const QuantMix& mix, PlanTypes base);

// The decode forms of a tensor-parallel split that compile against NCCL's device headers
// (docs/TENSOR_PARALLEL.md): the post-norms that meet the other ranks at an LSA barrier and sum
// their products themselves (GEMMAJIT_TP_FUSED_NORM), and with `push` (GEMMAJIT_TP_PUSH) the
// post-norms' push forms and the row-parallel matvecs' (attention output, FFN down).
// fused_norm_plan (engine/gpu/tensor_parallel.h) says whether a load takes them, and against
// which headers.
struct FusedNormPlan {
    std::string headers;  // the folder of nccl.h and nccl_device/ of the library that runs them
    bool push = false;    // GEMMAJIT_TP_PUSH: the decode products pushed into every window
    // GEMMAJIT_TP_PREFILL_PUSH: a prefill chunk's bf16 products too, on splits of up to this
    // many ranks (a rank stores its whole product into each of the others' windows, so from 4
    // ranks on it sends more over NVLink than NCCL's all-reduce does).
    int prefill_push_ranks = 0;
    bool prefill_push(int ranks) const { return ranks >= 2 && ranks <= prefill_push_ranks; }
};

// The union of the plans of every rank of a tensor-parallel split (engine/gpu/shard_plan.h): each
// rank's shard shape planned with each of `types` and its vocabulary slice as the LM head's rows
// (ranks of one shape share their specializations); with `fused`, the forms it names as well.
std::vector<jit::KernelSpec> build_kernel_plan(const ShardPlan& shards,
                                               const std::vector<PlanTypes>& types,
                                               const FusedNormPlan* fused = nullptr);

}  // namespace gj::gemma4
