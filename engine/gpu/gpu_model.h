// A Gemma 4 model on the GPU: the GGUF's weights uploaded once, in their own quantization
// (Q8_0/Q4_0/Q4_K/Q5_K/Q6_K matrices repacked on the GPU into the split layout the matvecs read
// fastest, a tied K-quant embedding table with its LM head; F32/F16/BF16 as they are;
// any other type dequantized to F16 on upload with a one-line notice), the per-layer
// embedding table on the GPU when it fits (else in pinned host memory the kernels read directly),
// and the model's kernel set compiled and loaded. Placement is planned before anything is
// allocated: a model that cannot fit fails with the memory it needs and what is free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "engine/gpu/gpu_kernels.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kv_cache.h"
#include "engine/gpu/pinned_host.h"
#include "engine/gpu/shard_plan.h"
#include "engine/gpu/tensor_parallel.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/model_file.h"
#include "jit/blas.h"
#include "jit/device.h"
#include "jit/env_flags.h"

namespace gj::gguf {
class File;
}

namespace gj::gemma4 {

class Weights;

// The GPU path does not cover this model or these settings (memory, context); what() says what
// and what to do instead.
struct GpuModelError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct GpuModelOptions {
    int context = 0;  // positions a session may hold; 0: the model's context length
    // Tokens per prefill chunk; 0: GEMMAJIT_PREFILL_CHUNK (when that is unset, its default is
    // halved down to kMinAutoChunk before the context is reduced, if memory is short).
    int prefill_chunk = 0;
    // Sequences a session holds (a server's slots), each with its own KV cache of `context`
    // positions; the memory plan counts them all.
    int sequences = 1;
    std::function<void(const std::string&)> progress;  // status lines; null: silent
    // GEMMAJIT_* settings (kill switches, KV type, memory limit); null: the process's. Tests pass
    // explicit ones to compare a fast path with its exact counterpart in one process.
    const jit::Flags* flags = nullptr;
    // The architecture the plan targets (it picks the prefill GEMM variant); empty:
    // jit::default_target_arch. A load sets the GPU's own, which it compiles for.
    std::string target_arch;
    // Tensor parallelism: load only rank tp.rank's shard of tp.ranks (shard_plan.h), its kernels
    // specialized for the shard's shapes; the session runs its collectives on tp.comm.
    TensorParallel tp;
};

// Activation columns of the batched (prefill) matvecs: a chunk runs in groups of this many
// tokens, each group reading the weights once.
inline constexpr int kPrefillCols = 8;
// The smallest prefill chunk a load with the default GEMMAJIT_PREFILL_CHUNK falls back to when
// memory is short (the tensor-core products fill the GPU from about 512 rows).
inline constexpr int kMinAutoChunk = 512;
// Most sequences one session holds (`serve --parallel` is bounded by it).
inline constexpr int kMaxSequences = 256;
// Candidates of the top-k readout (the logits kernel's TOPK): temperature sampling with any
// top-k up to this many picks from them.
inline constexpr int kMaxTopK = 64;

// One weight matrix on the GPU and the matvec specializations that multiply by it.
struct GpuMatrix {
    std::string name;
    ggml::Type type = ggml::Type::F32;  // as stored on the GPU
    MatvecLayout layout = MatvecLayout::Ggml;
    int rows = 0, cols = 0;  // y[rows] = W x[cols]
    // A tensor-parallel shard: the slice starts at this row and column of the file's tensor
    // (columns in whole weight blocks).
    int row0 = 0, col0 = 0;
    CUdeviceptr ptr = 0;
    uint64_t bytes = 0;
    std::string spec_decode;      // one activation column
    std::string spec_prefill;     // kPrefillCols columns
    std::string spec_gemm;        // Q8_0/Q4_0 split layout: the tensor-core GEMM of prefill chunks
                                  // (GEMMAJIT_MMQ_VARIANT); empty: the batched matvecs
    bool gemm_bf16 = false;       // spec_gemm is gemm_wgmma (bf16 activations), else mmq (Q8_1)
    bool blas = false;            // prefill products through cuBLAS (GEMMAJIT_BLAS): float weights,
                                  // and quantized ones (not the LM head) from a dequantized F16
                                  // copy (K-quants and fallbacks; Q8_0/Q4_0 by the MMQ variant)
    std::string spec_push;        // a tensor-parallel row-parallel matrix (attention output, FFN
                                  // down): spec_decode storing into every rank's window
                                  // (matvec_push_spec; GEMMAJIT_TP_PUSH); else empty
    std::string spec_geglu;       // an FFN gate with blas: the gelu_mul.p<rows> joining gate and up
    std::string spec_dequant;     // quantized with blas: dequant_f16.<type>.k<cols>, whose copy
    uint64_t scratch_offset = 0;  // goes to this byte offset of its layer's scratch slot (each
                                  // matrix of a layer has its own range)
    // An FFN gate whose up copy follows its own (copy_follows): prefill's gate and up products
    // as one cuBLAS product, each token's gate|up row, which the GeGLU reads as its two halves
    // (GEMMAJIT_MERGE_GATE_UP; where that product is at most 24576 rows, as measured).
    bool up_follows = false;
    bool present() const { return rows > 0; }
    // Q8_0/Q4_0 and the K-quants: the input arrives as Q8_1 activations; float types read fp32
    // activations.
    bool quantized() const { return spec_util::quant_type_tag(type) != nullptr; }
};

// Whether b's F16 copy directly follows a's in their layer's scratch, both made for the same
// chunks: one product over both then reads them as one matrix of a.rows + b.rows rows.
inline bool copy_follows(const GpuMatrix& a, const GpuMatrix& b) {
    return a.present() && b.present() && a.blas && b.blas && !a.spec_dequant.empty() &&
           !b.spec_dequant.empty() && a.cols == b.cols &&
           a.spec_gemm.empty() == b.spec_gemm.empty() &&
           b.scratch_offset == a.scratch_offset + uint64_t(a.rows) * a.cols * 2;
}

// A table read by row (token embedding, PLE table) with the embed_rows kernel.
struct GpuTable {
    std::string name;
    ggml::Type type = ggml::Type::F32;
    MatvecLayout layout = MatvecLayout::Ggml;  // Split: a K-quant table shared with the LM head
    int rows = 0, cols = 0;
    CUdeviceptr ptr = 0;  // device memory, or a pinned host pointer when !on_gpu
    uint64_t bytes = 0;
    bool on_gpu = true;
    std::string spec;  // embed_rows specialization
};

// One stacked expert tensor of a MoE layer, [E][per_expert rows][cols] in its GGUF layout (or
// dequantized to F16), or (block types, all.layout Split; moe_experts_split) with each expert's
// matrix repacked on its own (a fused gate|up expert as its gate and up halves, each a split matrix
// of F rows), and the grouped kernels that read it (matvec_*.moe, and mmq .moe in prefill).
struct GpuExperts {
    GpuMatrix all;              // the whole tensor: rows = E * per_expert
    int per_expert = 0;         // rows of one expert (2F for a fused gate|up tensor)
    int piece_rows = 0;         // rows of one matrix a kernel reads (F or d)
    uint64_t expert_bytes = 0;  // one expert's matrix
    std::string spec_gemm;      // the grouped int8 tensor-core GEMM of prefill (mmq_moe_reads,
                                // GEMMAJIT_MOE_GEMM); empty: the grouped matvecs
    std::string spec_one;       // groups of one slot (a single-token decode step)
    std::string spec_batch;     // groups of up to batch_cols slots (kPrefillCols, or fewer)
    int batch_cols = 1;
    bool present() const { return all.present(); }
};

struct GpuLayer {
    GpuMatrix q, k, v, o, gate, up, down, inp_gate, proj;
    // MoE (26B-A4B): the router {d -> E} (float), the routed experts (gate_up holds gate and up
    // of each expert when the file fuses them, else gate only and up_exps the up halves), and
    // the fp32 vectors: the router's input scale over sqrt(d), the per-expert scale, the experts'
    // pre-norm and the post-norms of the dense MLP and of the experts.
    bool moe = false;
    GpuMatrix router;
    GpuExperts gate_up, up_exps, down_exps;
    CUdeviceptr up_ptr = 0;  // expert 0's up half (each expert's: + e * expert_bytes)
    CUdeviceptr router_norm = 0, expert_scale = 0, pre_ffw_norm_2 = 0, post_ffw_norm_1 = 0,
                post_ffw_norm_2 = 0;
    // fp32 vectors (and the layer output scale as one float) in the model's vector arena.
    CUdeviceptr attn_norm = 0, q_norm = 0, k_norm = 0, post_attention_norm = 0, ffn_norm = 0,
                post_ffw_norm = 0, post_norm = 0, output_scale = 0;
    // Prefill's Q, K and V products as one cuBLAS product (GEMMAJIT_MERGE_QKV): their F16
    // copies lie side by side in the layer's scratch (Q, K, then V; no V on k_eq_v layers), so
    // one product over q.rows + k.rows (+ v.rows) weight rows writes each token's Q|K|V row.
    bool qkv_one_product = false;
    // Decode's Q, K and V in one launch where V's type differs from Q's and K's (an _M mix's
    // Q4_K / Q5_K layer keeping V in Q6_K): the multi entry reading V in its own type
    // (matvec_multi_v_spec); empty otherwise (one spec for all three, or three launches).
    std::string spec_qkv_multi_v;
    int qkv_rows() const { return q.rows + k.rows + (v.present() ? v.rows : 0); }
    std::string attn_prep_spec, flash_spec;
    // Tensor-core prefill attention (GEMMAJIT_FLASH_PREFILL; not for a q8_0 KV cache); empty:
    // prefill attends through flash_spec, one query at a time.
    std::string flash_prefill_spec;
    // Its wgmma forms (GEMMAJIT_FLASH_WGMMA, sm_90, f16/bf16 caches), taken
    // per chunk by flash_prefill_wgmma_choice (`always`: GEMMAJIT_FLASH_WGMMA=on).
    std::vector<std::string> flash_prefill_wgmma_specs;
    bool flash_wgmma_always = false;
};

// Device memory the model and one session need, decided before any allocation.
struct MemoryPlan {
    uint64_t weights = 0;    // matrices, embedding tables (the PLE table only when on the GPU)
    uint64_t ple_table = 0;  // per_layer_token_embd
    bool ple_on_gpu = true;
    uint64_t staging = 0;  // largest repacked matrix, held only while loading
    uint64_t kv = 0;       // KV caches of every sequence for the planned context
    int sequences = 1;
    uint64_t work = 0;     // activations, attention partials, logits
    uint64_t reserve = 0;  // modules, graphs, driver
    uint64_t free = 0;     // what the driver reports (or GEMMAJIT_GPU_MEMORY_LIMIT)
    uint64_t needed() const;
    std::string describe() const;  // "weights 4.8 GiB + PLE table 2.8 GiB (GPU) + ..."
};

// "1.23 GiB": the unit of the memory plan's messages.
std::string format_gib(uint64_t bytes);

class GpuModel {
  public:
    // Plans placement, compiles the kernel set and uploads the weights of an open model file
    // (kept alive by the model). Throws GpuModelError (does not fit, bad context),
    // ConfigError (bad tensors), jit::DeviceUnavailable (no GPU).
    static std::unique_ptr<GpuModel> load(std::shared_ptr<const ModelFile> file,
                                          const GpuModelOptions& opts = {});
    // Opens the GGUF and loads it; also ConfigError / gguf::FormatError for a bad file.
    static std::unique_ptr<GpuModel> load(const std::filesystem::path& path,
                                          const GpuModelOptions& opts = {});
    // The kernel specializations load() would compile for this file and these settings, without
    // touching a GPU (for `gemmajit kernels/precompile --model`).
    static std::vector<jit::KernelSpec> kernel_specs(const std::filesystem::path& path,
                                                     const GpuModelOptions& opts = {});
    ~GpuModel();
    GpuModel(const GpuModel&) = delete;
    GpuModel& operator=(const GpuModel&) = delete;

    const Config& config() const { return cfg_; }
    const std::filesystem::path& path() const { return path_; }
    GpuKernels& kernels() { return kernels_; }
    const GpuKernels& kernels() const { return kernels_; }
    const KvGeometry& kv_geometry() const { return kv_geo_; }
    int prefill_chunk() const { return kv_geo_.max_chunk; }
    const MemoryPlan& memory() const { return mem_; }
    const jit::Flags& flags() const { return flags_; }  // the settings it was loaded with

    const std::vector<GpuLayer>& layers() const { return layers_; }
    // Every matrix on the GPU (layer matrices, LM head, PLE projection), absent ones left out.
    std::vector<const GpuMatrix*> matrices() const;
    const GpuTable& token_embd() const { return token_embd_; }
    const GpuMatrix& lm_head() const { return lm_head_; }
    // The tensor-parallel split this model is one rank of (ranks 1: the whole model), and the
    // vocabulary rows its LM head holds ([0, vocab) unsplit).
    const TensorParallel& tensor_parallel() const { return tp_; }
    Range vocab_rows() const { return vocab_rows_; }
    CUdeviceptr output_norm() const { return output_norm_; }
    // PLE (when config().has_ple()).
    const GpuTable& ple_table() const { return ple_table_; }
    const GpuMatrix& ple_model_proj() const { return ple_model_proj_; }
    CUdeviceptr ple_proj_norm() const { return ple_proj_norm_; }

    // Specializations of the width-generic kernels (names in kernels()); see plan_layout() for the
    // norm chain.
    // f16: the form writing the f16 input of F16 cuBLAS products instead of Q8_1 (empty unless
    // some layer matrix is such a product; never with parts > 1).
    const std::string& spec_prenorm(bool f16 = false) const {
        return f16 ? spec_h16_[0] : spec_prenorm_;
    }
    // parts > 1: the form that reads the split-K partial planes of the product before it.
    // bf16_in 1: the form that reads a tensor-parallel prefill chunk's bf16 all-reduced product
    // (one plane: a rank sums its split-K planes before the all-reduce); more: the form that
    // sums that many ranks' bf16 products pushed into this rank's window (tp_prefill_push).
    // Empty unless the model is split (a session asking for it then fails to find the kernel).
    const std::string& spec_post_prenorm(int parts = 1, bool f16 = false, int bf16_in = 0) const {
        if (bf16_in) return spec_xb16_[bf16_in > 1].post_prenorm[f16 ? 1 : 0];
        return parts > 1 ? spec_parts_[0] : f16 ? spec_h16_[1] : spec_post_prenorm_;
    }
    const std::string& spec_post_scale_prenorm(int parts = 1, bool f16 = false,
                                               int bf16_in = 0) const {
        if (bf16_in) return spec_xb16_[bf16_in > 1].post_scale_prenorm[f16 ? 1 : 0];
        return parts > 1 ? spec_parts_[1] : f16 ? spec_h16_[2] : spec_post_scale_prenorm_;
    }
    // The decode post-norms that sum the tensor-parallel ranks' products themselves, through
    // NCCL's device API (rmsnorm_lsa_spec of the two above in their fp32, Q8_1 form); empty where
    // that path is off or unavailable (tp_fused_norm_note() says why).
    const std::string& spec_lsa_post_prenorm() const { return spec_lsa_.post_prenorm; }
    const std::string& spec_lsa_post_scale_prenorm() const { return spec_lsa_.post_scale_prenorm; }
    bool tp_fused_norm() const { return !spec_lsa_.post_prenorm.empty(); }
    // Their push forms (rmsnorm_lsa_push_spec; GEMMAJIT_TP_PUSH), read after the row-parallel
    // matvecs' push forms (GpuMatrix::spec_push); empty where off.
    const std::string& spec_push_post_prenorm() const { return spec_lsa_.push_post_prenorm; }
    const std::string& spec_push_post_scale_prenorm() const {
        return spec_lsa_.push_post_scale_prenorm;
    }
    bool tp_push() const { return !spec_lsa_.push_post_prenorm.empty(); }
    // A prefill chunk's bf16 products pushed into every rank's window and summed by the
    // post-norms (kernel_templates/tp_push.cu; GEMMAJIT_TP_PREFILL_PUSH): the push's spec, empty
    // where off.
    const std::string& spec_tp_push() const { return spec_lsa_.prefill_push; }
    bool tp_prefill_push() const { return !spec_lsa_.prefill_push.empty(); }
    // The push's grid, the same on every rank: GEMMAJIT_TP_PUSH_BLOCKS, at most (and by default)
    // the fewest SMs of any rank's GPU, so that every rank's blocks run at once (each waits for
    // the other ranks' same block). Before the ranks have agreed, this GPU's SMs. 0 where off.
    int tp_push_blocks() const;
    const std::string& tp_fused_norm_note() const { return spec_lsa_.note; }
    const std::string& spec_post_quant(int parts = 1, int bf16_in = 0) const {  // PLE models
        if (bf16_in) return spec_xb16_[bf16_in > 1].post_quant;
        return parts > 1 ? spec_parts_[2] : spec_post_quant_;
    }
    const std::string& spec_quantize() const { return spec_quantize_; }
    const std::string& spec_ple_finish() const { return spec_ple_finish_; }
    const std::string& spec_gelu_mul() const { return spec_gelu_mul_; }
    const std::string& spec_logits() const { return spec_logits_; }  // softcap, argmax, top-k
    // MoE: routing, grouping, and the FFN output (the dense and expert post-norms, summed).
    const std::string& spec_moe() const { return spec_moe_; }
    // A MoE layer's post_attention_norm with its three norms of the residual (ffn_norm, router
    // input, experts' pre-norm) in one launch; parts as spec_post_prenorm.
    const std::string& spec_moe_norms(int parts = 1) const {
        return spec_moe_norms_[parts > 1 ? 1 : 0];
    }
    // fp32 -> f16/bf16 activations for cuBLAS (when some matrix with blas is F16/BF16).
    const std::string& spec_convert() const { return spec_convert_; }

    // cuBLAS for the prefill products of float weights: null when no matrix wants it, when
    // GEMMAJIT_BLAS=0, or when the library could not be loaded (a notice said so).
    jit::Blas* blas() const { return blas_; }
    // Whether some layer's FFN gate|up pair is float with blas (the session then keeps an fp32
    // gate buffer for the two-product GeGLU).
    bool blas_ffn() const { return blas_ffn_; }
    // The session scratch that holds the F16 copies of quantized matrices for prefill products:
    // two slots (the layer computing and the next one, dequantized meanwhile), each as large as
    // the largest layer's copies; 0: no matrix needs one.
    // (Copies of matrices that also have a GEMM count only when the chunk reaches
    // copy_min_rows(): a session of shorter chunks never makes them.)
    uint64_t dequant_slot_bytes() const {
        return gemm_copies_made() ? dequant_slot_ : dequant_slot_no_gemm_;
    }
    // Whether this load's prefill chunks reach copy_min_rows(), so that matrices with a GEMM
    // ever take their F16 copies.
    bool gemm_copies_made() const { return kv_geo_.max_chunk >= copy_min_rows_; }
    // The shortest prefill chunk whose products of a Q8_0/Q4_0 matrix that also has a GEMM
    // (spec_gemm) take its F16 copy (QuantPrefill::WgmmaBlas); matrices without a GEMM take
    // their copies from kPrefillCols + 1 rows.
    int copy_min_rows() const { return copy_min_rows_; }
    uint64_t dequant_scratch_bytes() const { return 2 * dequant_slot_bytes(); }

    // Weight bytes one decode step reads (every layer matrix, the LM head, the PLE projection
    // and the two gathered embedding rows): the numerator of the decode GB/s figure.
    uint64_t decode_weight_bytes() const { return decode_bytes_; }
    // GPU bytes of the layer matrices (routed experts included; not the LM head or the PLE
    // context projection) by weight type.
    std::map<ggml::Type, uint64_t> layer_bytes_by_type() const;
    std::string summary() const;  // one line: name, types, placement, memory

  private:
    GpuModel() = default;
    static std::unique_ptr<GpuModel> open_model(std::shared_ptr<const ModelFile> file,
                                                const GpuModelOptions& opts);
    void plan_layout(const GpuModelOptions& opts);
    void plan_memory(const GpuModelOptions& opts);
    // The residual stream's norm specializations (residual_norms.cpp); after the layers' plans.
    void plan_residual_norms();
    void plan_fused_all_reduce_norms();
    // The post-norms reading bf16 products (rmsnorm_bf16_input_specs) into spec_xb16_[which].
    void add_bf16_input_norms(int which, int planes);
    // Tensor parallelism: every rank takes the smallest context and prefill chunk any rank's
    // memory plan chose (each plans against its own GPU's free memory), so that all ranks run
    // the same chunks and stop at the same position: their collectives must match.
    void agree_across_ranks(const GpuModelOptions& opts);
    void upload(const GpuModelOptions& opts);

    std::filesystem::path path_;
    std::shared_ptr<const ModelFile> model_file_;  // the weights point into its mapping
    const gguf::File* file_ = nullptr;             // model_file_->gguf()
    Config cfg_;  // a tensor-parallel rank's: its shard's shape (shard_plan.h)
    jit::Flags flags_;
    TensorParallel tp_;
    std::vector<LayerShard> shard_;  // per layer, when tp_.active()
    Range vocab_rows_;
    std::unique_ptr<Weights> weights_;
    GpuKernels kernels_;
    KvGeometry kv_geo_;
    bool chunk_default_ = false;  // the chunk is GEMMAJIT_PREFILL_CHUNK's default (may shrink)
    int tp_min_sms_ = 0;  // the fewest SMs of any rank's GPU (agree_across_ranks; 0: not yet)
    int copy_min_rows_ = kPrefillCols + 1;
    MemoryPlan mem_;

    std::vector<GpuLayer> layers_;
    GpuTable token_embd_, ple_table_;
    GpuMatrix lm_head_, ple_model_proj_;
    bool lm_head_shares_ = false;  // the tied LM head reads token_embd_'s buffer
    CUdeviceptr output_norm_ = 0, ple_proj_norm_ = 0;
    std::string spec_prenorm_, spec_post_prenorm_, spec_post_scale_prenorm_, spec_post_quant_,
        spec_quantize_, spec_ple_finish_, spec_gelu_mul_, spec_logits_, spec_convert_, spec_moe_,
        spec_moe_norms_[2];
    std::string spec_parts_[3];  // the post-norms above reading kMmqSplits partial planes
    std::string spec_h16_[3];    // the pre-norm and the two chained post-norms writing f16
    struct {  // the post-norms reading a bf16 all-reduce sum (rmsnorm_bf16_input_specs), [1]
              // the ranks' pushed products (planes = ranks)
        std::string post_prenorm[2], post_scale_prenorm[2], post_quant;
    } spec_xb16_[2];
    struct {  // the decode post-norms summing the ranks' products (spec_lsa_post_prenorm)
        std::string post_prenorm, post_scale_prenorm;
        std::string push_post_prenorm, push_post_scale_prenorm;
        std::string prefill_push;  // tp_push_spec (GEMMAJIT_TP_PREFILL_PUSH)
        std::string note;          // why they are not planned, on a split model
    } spec_lsa_;
    jit::Blas* blas_ = nullptr;
    bool wants_blas_ = false, blas_ffn_ = false;
    uint64_t decode_bytes_ = 0, dequant_slot_ = 0, dequant_slot_no_gemm_ = 0;

    // Storage: one device buffer per matrix/table, the fp32 vector arena, the pinned PLE table.
    std::vector<jit::DeviceBuffer> buffers_;
    jit::DeviceBuffer vectors_;
    PinnedHost pinned_ple_;
    std::vector<std::string> notices_;  // dequantized-on-upload types, one line each
};

}  // namespace gj::gemma4
