#include "engine/gpu/gpu_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "engine/base/thread_pool.h"
#include "engine/gguf/dequant.h"
#include "engine/gguf/half.h"
#include "engine/gguf/reader.h"
#include "engine/gpu/host_to_device.h"
#include "engine/gpu/kernel_plan.h"
#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/convert_f32.h"
#include "engine/gpu/kernels/dequant_f16.h"
#include "engine/gpu/kernels/embed_rows.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/gemm_wgmma.h"
#include "engine/gpu/kernels/logits.h"
#include "engine/gpu/kernels/matvec.h"
#include "engine/gpu/kernels/mmq.h"
#include "engine/gpu/kernels/moe.h"
#include "engine/gpu/kernels/ple.h"
#include "engine/gpu/kernels/quantize_q8_1.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/session.h"
#include "engine/model/weights.h"
#include "jit/cuda_driver.h"
#include "jit/env_flags.h"
#include "jit/jit.h"

namespace gj::gemma4 {

namespace {

using spec_util::is_float_type;
bool is_block_quant(ggml::Type t) {
    return t == ggml::Type::Q8_0 || t == ggml::Type::Q4_0;
}
uint64_t type_bytes(ggml::Type t, uint64_t rows, uint64_t cols) {
    return rows * *ggml::row_bytes(t, cols);
}

}  // namespace

GpuModel::~GpuModel() = default;

std::vector<const GpuMatrix*> GpuModel::matrices() const {
    std::vector<const GpuMatrix*> out;
    for (const GpuLayer& g : layers_)
        for (const GpuMatrix* m :
             {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down, &g.inp_gate, &g.proj, &g.router})
            if (m->present()) out.push_back(m);
    for (const GpuMatrix* m : {&lm_head_, &ple_model_proj_})
        if (m->present()) out.push_back(m);
    return out;
}

std::unique_ptr<GpuModel> GpuModel::open_model(std::shared_ptr<const ModelFile> file,
                                               const GpuModelOptions& opts) {
    std::unique_ptr<GpuModel> m(new GpuModel());
    m->path_ = file->path();
    m->flags_ = opts.flags ? *opts.flags : jit::Flags::process();
    m->model_file_ = std::move(file);
    m->file_ = &m->model_file_->gguf();
    m->cfg_ = m->model_file_->config();
    WeightOptions wopts;
    wopts.f32_copy_limit_bytes = 0;  // matrices stay in the mapping until uploaded
    m->weights_ = std::make_unique<Weights>(*m->file_, m->cfg_, wopts);
    m->vocab_rows_ = Range{0, m->cfg_.vocab_size};
    m->tp_ = opts.tp;
    if (m->tp_.active()) {
        // Slices of the row-parallel matrices' inputs are whole weight blocks of their types.
        int block = 32;
        for (const LayerWeights& lw : m->weights_->layers)
            for (const Matrix* x : {&lw.attn_output, &lw.ffn_down, &lw.ffn_gate, &lw.ffn_up})
                if (x->present()) block = std::max(block, spec_util::matvec_block_elems(x->type()));
        const ShardPlan plan = plan_shards(m->cfg_, m->tp_.ranks, block);
        const RankShard& mine = plan.shards.at(size_t(m->tp_.rank));
        m->cfg_ = mine.config;
        m->shard_ = mine.layers;
        m->vocab_rows_ = mine.vocab;
    }
    m->plan_layout(opts);
    return m;
}

std::unique_ptr<GpuModel> GpuModel::load(std::shared_ptr<const ModelFile> file,
                                         const GpuModelOptions& opts) {
    GpuModelOptions o = opts;
    o.target_arch = jit::Device::get().arch();  // what GpuKernels compiles for
    std::unique_ptr<GpuModel> m = open_model(std::move(file), o);
    m->plan_memory(opts);
    m->agree_across_ranks(opts);
    m->upload(opts);
    return m;
}

std::unique_ptr<GpuModel> GpuModel::load(const std::filesystem::path& path,
                                         const GpuModelOptions& opts) {
    return load(ModelFile::open(path), opts);
}

std::vector<jit::KernelSpec> GpuModel::kernel_specs(const std::filesystem::path& path,
                                                    const GpuModelOptions& opts) {
    return open_model(ModelFile::open(path), opts)->kernels_.specs();
}

// ---- Planning: types, layouts, kernels, memory ------------------------------------------------

// Types, layouts and kernels of every tensor, and the bytes they take: no GPU involved, so
// `gemmajit kernels/precompile --model` list exactly the set a load compiles.
void GpuModel::plan_layout(const GpuModelOptions& opts) {
    const jit::Flags& flags = flags_;
    const Config& c = cfg_;
    const Weights& w = *weights_;

    kv_geo_.context = opts.context > 0 ? opts.context : c.context_length;
    if (kv_geo_.context > c.context_length)
        throw GpuModelError(fmt::format("context {} exceeds the {} positions {} was trained for",
                                        kv_geo_.context, c.context_length, c.name));
    kv_geo_.max_chunk =
        opts.prefill_chunk > 0 ? opts.prefill_chunk : int(flags.get_int("GEMMAJIT_PREFILL_CHUNK"));
    chunk_default_ = opts.prefill_chunk <= 0 && !flags.is_set("GEMMAJIT_PREFILL_CHUNK");
    kv_geo_.max_chunk = std::min(kv_geo_.max_chunk, kv_geo_.context);
    kv_geo_.type = kv_type_from_flags(flags);
    if (opts.sequences < 1 || opts.sequences > kMaxSequences)
        throw GpuModelError(fmt::format("{} sequences requested; a session holds 1 to {}",
                                        opts.sequences, kMaxSequences));
    kv_geo_.sequences = opts.sequences;
    const bool repack = flags.get_bool("GEMMAJIT_REPACK");
    const bool blas = flags.get_bool("GEMMAJIT_BLAS");
    // Prefill products of Q8_0/Q4_0 matrices (split layout only), GEMMAJIT_MMQ_VARIANT: cuBLAS
    // on F16 copies dequantized per layer as for K-quants (MoE experts keep the int8 GEMM, the LM
    // head its GEMM), the wgmma GEMM (sm_90 only), both by chunk length (auto on sm_90), the int8
    // mma.sync GEMM, or the batched matvecs. A load asks whether cuBLAS loads where the choice
    // depends on it; planning alone (kernel_specs, no target) takes it to load.
    const std::string arch =
        opts.target_arch.empty() ? jit::default_target_arch(flags) : opts.target_arch;
    const bool blas_loads = opts.target_arch.empty() || !blas ||
                            flags.get_string("GEMMAJIT_MMQ_VARIANT") == "none" ||
                            jit::Blas::get() != nullptr;
    const QuantPrefill quant_prefill = quant_prefill_choice(flags, arch, blas_loads);
    const FlashWgmma flash_wgmma = flash_wgmma_mode(flags, arch);
    const bool mmq = quant_prefill != QuantPrefill::Matvec;
    const bool quant_blas =
        quant_prefill == QuantPrefill::Blas || quant_prefill == QuantPrefill::WgmmaBlas;
    const bool wgmma =
        quant_prefill == QuantPrefill::Wgmma || quant_prefill == QuantPrefill::WgmmaBlas;
    const bool wgmma_producer = flags.get_bool("GEMMAJIT_WGMMA_PRODUCER");
    copy_min_rows_ = quant_prefill == QuantPrefill::WgmmaBlas ? gemma4::copy_min_rows(cfg_.d_model)
                                                              : kPrefillCols + 1;
    bool blas_half = false;  // some cuBLAS product takes f16/bf16 activations
    bool gemm_bf16 = false;  // some prefill GEMM takes bf16 activations (gemm_wgmma)

    // Every matrix: kept in its type when a kernel reads it, else dequantized to F16.
    std::map<std::string, std::pair<int, uint64_t>> dequantized;  // type -> tensors, bytes
    const int prefetch = int(flags.get_int("GEMMAJIT_MATVEC_PREFETCH"));
    const MatvecShapes shapes = parse_matvec_shapes(flags.get_string("GEMMAJIT_MATVEC_SHAPE"));
    std::vector<bool> shape_applied(shapes.size(), false);
    auto decode_spec = [&](jit::KernelSpec s) {
        return kernels_
            .add(with_matvec_shapes(with_decode_prefetch(std::move(s), prefetch), shapes,
                                    &shape_applied))
            .name;
    };
    // `prefill_gemm`: whether T-token products may take cuBLAS through a dequantized F16 copy
    // (not for the LM head, whose copy would be as large as the vocabulary).
    // `rows` / `cols`: the tensor-parallel slice of the tensor (count 0: all of it).
    // `ple`: a PLE gate or projection (its decode spec gets the entry that makes its input).
    auto plan_matrix = [&](const Matrix& m, bool prefill_gemm = true, Range rows = {},
                           Range cols = {}, PleInput ple = PleInput::None) {
        GpuMatrix g;
        g.name = m.name();
        g.rows = rows.count ? rows.count : int(m.rows());
        g.cols = cols.count ? cols.count : int(m.cols());
        g.row0 = rows.first;
        g.col0 = cols.first;
        const ggml::Type t = m.type();
        // Kept in its type, a matrix of a type with the split layout is repacked to it.
        const MatvecLayout kept_layout =
            repack && spec_util::has_split(t) ? MatvecLayout::Split : MatvecLayout::Ggml;
        if (is_block_quant(t) && g.cols % 32 == 0) {
            g.type = t;
            g.layout = kept_layout;
            g.spec_decode = decode_spec(matvec_spec(t, g.cols, 1, g.layout, g.rows, ple));
            g.spec_prefill = kernels_.add(matvec_spec(t, g.cols, kPrefillCols, g.layout)).name;
            const bool copies = quant_blas && prefill_gemm && g.layout == MatvecLayout::Split;
            if (copies) {
                g.blas = true;
                g.spec_dequant = kernels_.add(dequant_f16_spec(t, g.cols, g.layout)).name;
                wants_blas_ = true;
                blas_half = true;
            }
            // The GEMM: alone, or (WgmmaBlas) for the chunks too short for the copies.
            if (mmq && g.layout == MatvecLayout::Split && (!copies || wgmma)) {
                g.spec_gemm = kernels_
                                  .add(wgmma ? gemm_wgmma_spec(t, g.cols, g.rows, wgmma_producer)
                                             : mmq_spec(t, g.cols, g.rows))
                                  .name;
                g.gemm_bf16 = wgmma;
                gemm_bf16 = gemm_bf16 || wgmma;
            }
        } else if (spec_util::has_dequant_f16(t) &&
                   g.cols % spec_util::matvec_block_elems(t) == 0) {
            // K-quants and Q4_1/Q5_0/Q5_1: read by the decode matvecs in their GGUF blocks, or
            // (GEMMAJIT_REPACK) repacked at load to the split layout; prefill
            // chunks multiply an F16 copy made per chunk in the session scratch with cuBLAS.
            g.type = t;
            g.layout = kept_layout;
            g.spec_decode = decode_spec(matvec_spec(t, g.cols, 1, g.layout, g.rows, ple));
            g.spec_prefill = kernels_.add(matvec_spec(t, g.cols, kPrefillCols, g.layout)).name;
            if (blas && prefill_gemm) {
                g.blas = true;
                g.spec_dequant = kernels_.add(dequant_f16_spec(t, g.cols, g.layout)).name;
                wants_blas_ = true;
                blas_half = true;
            }
        } else {
            g.type = is_float_type(t) ? t : ggml::Type::F16;
            if (g.type != t) {
                auto& d = dequantized[ggml::type_name(t)];
                d.first += 1;
                d.second += type_bytes(t, g.rows, g.cols);
            }
            g.spec_decode = decode_spec(matvec_f_spec(g.type, g.cols, 1, g.rows, ple));
            g.spec_prefill = kernels_.add(matvec_f_spec(g.type, g.cols, kPrefillCols)).name;
            g.blas = blas;
            wants_blas_ = wants_blas_ || blas;
            blas_half = blas_half || (blas && g.type != ggml::Type::F32);
        }
        g.bytes = matrix_bytes(g.type, g.layout, g.rows, g.cols);
        return g;
    };
    // The scratch range of the F16 copy of a quantized matrix within its layer's slot: every
    // matrix of a layer gets its own range (the session dequantizes a whole layer ahead, while
    // the layer before computes), and the slot is as large as the largest layer's copies.
    // Copies of matrices without a GEMM come first in the slot, so that a session whose chunks
    // never reach copy_min_rows() needs only their part (dequant_slot_bytes()).
    auto place_scratch = [&](GpuMatrix& g, uint64_t offset) {
        if (g.spec_dequant.empty()) return offset;
        g.scratch_offset = offset;
        const uint64_t end = offset + uint64_t(g.rows) * g.cols * 2;
        dequant_slot_ = std::max(dequant_slot_, end);
        if (g.spec_gemm.empty()) dequant_slot_no_gemm_ = std::max(dequant_slot_no_gemm_, end);
        return end;
    };
    // `split`: a K-quant table in the split layout (the tied LM head's, which shares it).
    auto plan_table = [&](const Matrix& m, bool split = false) {
        GpuTable g;
        g.name = m.name();
        g.rows = int(m.rows());
        g.cols = int(m.cols());
        const ggml::Type t = m.type();
        g.type = is_float_type(t) || is_block_quant(t) ||
                         (spec_util::has_dequant_f16(t) &&
                          g.cols % spec_util::matvec_block_elems(t) == 0)
                     ? t
                     : ggml::Type::F16;
        if (g.type != t) {
            auto& d = dequantized[ggml::type_name(t)];
            d.first += 1;
            d.second += type_bytes(t, g.rows, g.cols);
        }
        if (split && g.type == t && spec_util::is_kquant_split(t)) g.layout = MatvecLayout::Split;
        g.bytes = matrix_bytes(g.type, g.layout, g.rows, g.cols);
        g.spec = kernels_.add(embed_rows_spec(g.cols, g.type, g.rows, g.layout)).name;
        return g;
    };

    // A stacked expert tensor [E][per][cols] of matrices of `piece` rows (a fused gate|up expert
    // holds two): block types repacked per matrix to the split layout (GEMMAJIT_REPACK,
    // moe_experts_split) for the split matvecs and the grouped tensor-core GEMM of prefill
    // (mmq_moe_reads), read in place by the grouped matvecs with GEMMAJIT_REPACK=0, or
    // dequantized to F16 when no matvec reads the type.
    const bool moe_gemm = mmq && flags.get_bool("GEMMAJIT_MOE_GEMM");
    auto plan_experts = [&](const Matrix& first, int per, int piece) {
        GpuExperts x;
        const gguf::TensorInfo& t = file_->tensor(first.name());
        x.per_expert = per;
        x.piece_rows = piece;
        x.all.name = first.name();
        x.all.rows = c.n_experts * per;
        x.all.cols = int(first.cols());
        const bool read = spec_util::has_matvec(t.type) && x.all.cols % 32 == 0 &&
                          x.all.cols % spec_util::matvec_block_elems(t.type) == 0;
        x.all.type = read ? t.type : ggml::Type::F16;
        if (!read) {
            auto& d = dequantized[ggml::type_name(t.type)];
            d.first += 1;
            d.second += t.n_bytes;
        }
        if (repack && moe_experts_split(x.all.type, piece, x.all.cols))
            x.all.layout = MatvecLayout::Split;
        x.all.bytes = matrix_bytes(x.all.type, x.all.layout, x.all.rows, x.all.cols);
        x.expert_bytes = x.all.bytes / uint64_t(c.n_experts);
        x.spec_one = kernels_.add(matvec_moe_spec(x.all.type, x.all.cols, 1, x.all.layout)).name;
        const jit::KernelSpec& batch =
            kernels_.add(matvec_moe_spec(x.all.type, x.all.cols, kPrefillCols, x.all.layout));
        x.spec_batch = batch.name;
        x.batch_cols = int(spec_constant(batch, "NCOLS"));
        return x;
    };

    uint64_t weights = 0, staging = 0;
    auto account = [&](const GpuMatrix& g) {
        weights += g.bytes;
        if (g.layout == MatvecLayout::Split) staging = std::max(staging, g.bytes);
    };

    // The tied LM head reads token_embd: the gather's table serves it directly when both are in
    // one layout (a K-quant table takes the LM head's split layout: the gather reads it too);
    // a split Q8_0 / Q4_0 LM head gets its own copy.
    // A tensor-parallel rank's LM head is its vocabulary rows, its own copy even when tied (a
    // row slice of a split-layout table is no sub-buffer of it).
    const bool tied = w.output.name() == w.token_embd.name() && !tp_.active();
    lm_head_ = plan_matrix(w.output, false, tp_.active() ? vocab_rows_ : Range{});
    token_embd_ = plan_table(w.token_embd, tied && lm_head_.layout == MatvecLayout::Split);
    weights += token_embd_.bytes;
    if (token_embd_.layout == MatvecLayout::Split) staging = std::max(staging, token_embd_.bytes);
    lm_head_shares_ =
        tied && lm_head_.layout == token_embd_.layout && lm_head_.type == token_embd_.type;
    if (!lm_head_shares_) account(lm_head_);

    layers_.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerConfig& lc = c.layers[l];
        const LayerWeights& lw = w.layers[l];
        GpuLayer& g = layers_[l];
        // A tensor-parallel rank's slices: its query heads' rows of Q and columns of the output
        // projection, its KV heads' rows of K and V, its FFN columns (gate/up rows, down
        // columns). Whole tensors otherwise (empty ranges).
        Range q_rows, kv_rows, ffn;
        if (tp_.active()) {
            const LayerShard& sh = shard_[size_t(l)];
            q_rows = Range{sh.q_heads.first * lc.head_dim, sh.q_heads.count * lc.head_dim};
            kv_rows = Range{sh.kv_heads.first * lc.head_dim, sh.kv_heads.count * lc.head_dim};
            ffn = sh.ffn;
        }
        g.q = plan_matrix(lw.attn_q, true, q_rows);
        account(g.q);
        if (lc.has_kv) {
            g.k = plan_matrix(lw.attn_k, true, kv_rows);
            account(g.k);
            if (lc.has_v_proj) {
                g.v = plan_matrix(lw.attn_v, true, kv_rows);
                account(g.v);
            }
        }
        // An _M mix's layer that keeps V in Q6_K: its decode Q, K and V in one launch still.
        if (lc.has_kv && lc.has_v_proj && g.q.spec_decode == g.k.spec_decode &&
            g.v.layout == g.q.layout)
            if (auto s = qkv_multi_v_spec(kernels_.spec(g.q.spec_decode), g.q.type, g.v.type))
                g.spec_qkv_multi_v = kernels_.add(std::move(*s)).name;
        g.o = plan_matrix(lw.attn_output, true, {}, q_rows);
        g.gate = plan_matrix(lw.ffn_gate, true, ffn);
        g.up = plan_matrix(lw.ffn_up, true, ffn);
        g.down = plan_matrix(lw.ffn_down, true, {}, ffn);
        for (GpuMatrix* m : {&g.o, &g.gate, &g.up, &g.down}) account(*m);
        if (g.gate.type != g.up.type || g.gate.layout != g.up.layout)
            throw GpuModelError(fmt::format(
                "{}: layer {} stores ffn_gate as {} and ffn_up as {}; the fused gate|up matvec "
                "needs one type",
                path_.string(), l, ggml::type_name(g.gate.type), ggml::type_name(g.up.type)));
        if (c.has_ple()) {
            g.inp_gate = plan_matrix(lw.inp_gate, true, {}, {}, PleInput::Gate);
            g.proj = plan_matrix(lw.proj, true, {}, {}, PleInput::Proj);
            account(g.inp_gate);
            account(g.proj);
        }
        if (c.is_moe()) {
            g.moe = true;
            g.router = plan_matrix(lw.router, false);
            if (!is_float_type(g.router.type))
                throw GpuModelError(fmt::format(
                    "{}: layer {} stores its router ffn_gate_inp as {}; the GPU path reads a "
                    "float router (f32, f16 or bf16), as llama.cpp's quantizer keeps it",
                    path_.string(), l, ggml::type_name(lw.router.type())));
            account(g.router);
            const int F = c.expert_ffn_dim;
            const bool fused = lw.gate_exps.at(0).name() == lw.up_exps.at(0).name();
            g.gate_up = plan_experts(lw.gate_exps.at(0), fused ? 2 * F : F, F);
            if (!fused) g.up_exps = plan_experts(lw.up_exps.at(0), F, F);
            g.down_exps = plan_experts(lw.down_exps.at(0), c.d_model, c.d_model);
            // The grouped GEMM takes both products or neither (gate|up writes the Q8_1 rows that
            // down reads, both grouped alike).
            auto gemm_reads = [](const GpuExperts& x) {
                return mmq_moe_reads(x.all.type, x.all.layout, x.all.cols);
            };
            if (moe_gemm && gemm_reads(g.gate_up) && gemm_reads(g.down_exps))
                for (GpuExperts* x : {&g.gate_up, &g.down_exps})
                    x->spec_gemm =
                        kernels_.add(mmq_moe_spec(x->all.type, x->all.cols, x->piece_rows)).name;
            if (!fused && (g.up_exps.all.type != g.gate_up.all.type ||
                           g.up_exps.all.layout != g.gate_up.all.layout))
                throw GpuModelError(fmt::format(
                    "{}: layer {} stores its expert gate and up tensors as {} and {}; the fused "
                    "gate|up matvec needs one type",
                    path_.string(), l, ggml::type_name(g.gate_up.all.type),
                    ggml::type_name(g.up_exps.all.type)));
            for (const GpuExperts* x : {&g.gate_up, &g.up_exps, &g.down_exps})
                if (x->present()) account(x->all);
        }
        if (g.gate.blas) {
            g.gate.spec_geglu = kernels_.add(gelu_mul_spec(lc.ffn_dim)).name;
            blas_ffn_ = true;
        }
        uint64_t offset = 0;
        for (const bool with_gemm : {false, true})
            for (GpuMatrix* m :
                 {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down, &g.inp_gate, &g.proj})
                if (m->spec_gemm.empty() != with_gemm) offset = place_scratch(*m, offset);
        g.qkv_one_product = flags.get_bool("GEMMAJIT_MERGE_QKV") && lc.has_kv &&
                            copy_follows(g.q, g.k) && (!lc.has_v_proj || copy_follows(g.k, g.v));
        // One gate|up product where it is at most 24576 rows: on the H200 (pp512, 2026-11-30)
        // 12288-row products gained 2.5% (E2B), 20480 0.6% (E4B), 21504 1-1.8% (31B per rank at
        // TP=2); 30720 lost 0.9% (12B), 43008 0.5% (31B).
        g.gate.up_follows = flags.get_bool("GEMMAJIT_MERGE_GATE_UP") &&
                            copy_follows(g.gate, g.up) && g.gate.rows + g.up.rows <= 24576;
        g.attn_prep_spec = kernels_.add(attn_prep_spec(c, l, kv_geo_.type)).name;
        // GEMMAJIT_FLASH_MMA: tensor-core attention where the head dim allows it.
        const bool mma = flags.get_bool("GEMMAJIT_FLASH_MMA") && lc.head_dim % 64 == 0;
        g.flash_spec = kernels_.add(flash_decode_spec(c, l, kv_geo_.type, mma)).name;
        if (flags.get_bool("GEMMAJIT_FLASH_PREFILL")) {
            // Tiled for kFlashPrefillDefaultChunk rows (512), not this load's chunk: the kernel set
            // does not depend on the chunk a session asks for (`precompile --model` covers it).
            g.flash_prefill_spec = kernels_.add(flash_prefill_spec(c, l, kv_geo_.type)).name;
            if (flash_wgmma != FlashWgmma::Off)
                for (const auto& spec : flash_prefill_wgmma_specs(c, l, kv_geo_.type))
                    g.flash_prefill_wgmma_specs.push_back(kernels_.add(spec).name);
            g.flash_wgmma_always = flash_wgmma == FlashWgmma::Always;
        }
    }
    if (c.has_ple()) {
        ple_table_ = plan_table(w.per_layer_token_embd);
        ple_model_proj_ = plan_matrix(w.per_layer_model_proj);
        account(ple_model_proj_);
        place_scratch(ple_model_proj_, 0);  // dequantized in place, before any layer
        spec_ple_finish_ = kernels_.add(ple_finish_spec(c.n_layers, c.ple_dim)).name;
        spec_gelu_mul_ = kernels_.add(gelu_mul_spec(c.ple_dim)).name;
    }
    plan_residual_norms();
    if (c.is_moe()) spec_moe_ = kernels_.add(moe_spec(c)).name;
    spec_quantize_ = kernels_.add(quantize_spec()).name;
    // (Also a tensor-parallel rank's: its prefill all-reduces move bf16.)
    if (blas_half || gemm_bf16 || tp_.active())
        spec_convert_ = kernels_.add(convert_f32_spec()).name;
    spec_logits_ = kernels_.add(logits_spec(lm_head_.rows, std::min(kMaxTopK, lm_head_.rows))).name;

    // Every fp32 vector: norms (d, head dims, P) and one float per layer scale.
    uint64_t vector_floats = 0;
    for (const auto& lw : w.layers)
        vector_floats += lw.attn_norm.size() + lw.q_norm.size() + lw.k_norm.size() +
                         lw.post_attention_norm.size() + lw.ffn_norm.size() +
                         lw.post_ffw_norm.size() + lw.post_norm.size() + lw.router_scale.size() +
                         lw.expert_scale.size() + lw.pre_ffw_norm_2.size() +
                         lw.post_ffw_norm_1.size() + lw.post_ffw_norm_2.size() + 13 * 64;
    vector_floats += w.output_norm.size() + w.per_layer_proj_norm.size() + 2 * 64;
    weights += vector_floats * sizeof(float);

    decode_bytes_ = 0;
    for (const GpuMatrix* m : matrices()) decode_bytes_ += m->bytes;
    // A token reads only its K experts of a MoE layer's E.
    for (const GpuLayer& g : layers_)
        for (const GpuExperts* x : {&g.gate_up, &g.up_exps, &g.down_exps})
            if (x->present()) decode_bytes_ += x->expert_bytes * uint64_t(c.n_experts_used);
    decode_bytes_ += token_embd_.bytes / std::max(1, token_embd_.rows);
    if (c.has_ple()) decode_bytes_ += ple_table_.bytes / std::max(1, ple_table_.rows);

    // A shape set by hand that no decode matvec of this model took (a width or type it does not
    // have, or a PLE gate's spec that keeps its threads): said, not silently dropped.
    for (size_t i = 0; i < shapes.size(); ++i)
        if (!shape_applied[i])
            notices_.push_back(fmt::format(
                "GEMMAJIT_MATVEC_SHAPE: no decode matvec of this model took {}.k{}{}={}x{}x{}",
                ggml::type_name(shapes[i].type), shapes[i].k, shapes[i].geglu ? ".geglu" : "",
                shapes[i].shape.threads, shapes[i].shape.rows, shapes[i].shape.unroll));
    for (const auto& [type, d] : dequantized)
        notices_.push_back(fmt::format(
            "{} tensor{} stored as {} ({}): no GPU kernel reads {}, so they are dequantized to "
            "F16 on upload",
            d.first, d.first == 1 ? "" : "s", type, format_gib(d.second), type));

    mem_.weights = weights;
    mem_.ple_table = ple_table_.bytes;
    mem_.staging = staging;
}

// ---- Upload -----------------------------------------------------------------------------------

void GpuModel::upload(const GpuModelOptions& opts) {
    auto say = [&](const std::string& s) {
        if (opts.progress) opts.progress(s);
    };
    jit::Device& dev = jit::Device::get();
    const jit::DriverApi& api = jit::driver();
    const CUstream stream = dev.stream();
    const Weights& w = *weights_;
    for (const auto& n : notices_) say(n);

    if (wants_blas_) {
        std::string why;
        blas_ = jit::Blas::get(&why);
        if (!blas_) say(why + ": prefill products of float weights stay on the batched matvecs");
    }
    say(fmt::format("{}: {} kernels for {}", cfg_.name, kernels_.size(), dev.arch()));
    // A tensor-parallel worker's JIT lines would repeat rank 0's.
    kernels_.build(flags_, say,
                   tp_.rank > 0 ? jit::LogSink([](const std::string&) {}) : jit::LogSink{});

    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t total = mem_.weights + (mem_.ple_on_gpu ? mem_.ple_table : 0);
    say(fmt::format("uploading {} of weights to {}{}", format_gib(total), dev.name(),
                    cfg_.has_ple() && !mem_.ple_on_gpu
                        ? fmt::format(" (PLE table, {}, stays in pinned host memory)",
                                      format_gib(mem_.ple_table))
                        : std::string()));
    uint64_t done = 0, next_report = uint64_t(1) << 30;
    auto progressed = [&](uint64_t bytes) {
        done += bytes;
        if (done >= next_report) {
            say(fmt::format("  {} / {}", format_gib(done), format_gib(total)));
            next_report += uint64_t(1) << 30;
        }
    };

    jit::DeviceBuffer staging;
    if (mem_.staging) staging = jit::DeviceBuffer(mem_.staging);
    ThreadPool pool;
    // Tensor bytes reach the GPU through the pinned staging ring (GEMMAJIT_PARALLEL_UPLOAD), or
    // as one pageable copy each.
    std::optional<HostToDevice> h2d;
    if (flags_.get_bool("GEMMAJIT_PARALLEL_UPLOAD")) h2d.emplace(stream, pool);
    auto copy_to_gpu = [&](CUdeviceptr dst, const void* src, uint64_t n, const std::string& what) {
        if (h2d)
            h2d->copy(dst, src, n);
        else
            jit::check_driver(api.cuMemcpyHtoDAsync(dst, src, n, stream),
                              "cuMemcpyHtoDAsync(" + what + ")");
    };

    // Host rows of a matrix the GPU cannot read, as F16, in pieces of ~64 MiB: rows
    // [row0, row0 + rows) and columns [col0, col0 + cols) of the tensor.
    auto upload_dequantized = [&](const gguf::TensorInfo& t, CUdeviceptr dst, uint64_t rows,
                                  uint64_t cols, uint64_t row0 = 0, uint64_t col0 = 0) {
        // Sized to the piece actually used: a 64 MiB buffer cleared for every small tensor cost
        // seconds on a model of many small matrices.
        const uint64_t piece_rows =
            std::min(rows, std::max<uint64_t>(1, (uint64_t(64) << 20) / (cols * 2)));
        std::vector<uint16_t> half(piece_rows * cols);
        const uint64_t file_cols = t.dims.at(0);
        const uint64_t src_row_bytes = *ggml::row_bytes(t.type, file_cols);
        for (uint64_t r0 = 0; r0 < rows; r0 += piece_rows) {
            const uint64_t n = std::min(piece_rows, rows - r0);
            pool.parallel_for(n, [&](size_t i) {
                thread_local std::vector<float> row;
                row.resize(file_cols);
                dequantize_row(t.type, t.data + (row0 + r0 + i) * src_row_bytes, row.data(),
                               int64_t(file_cols));
                for (uint64_t j = 0; j < cols; ++j) half[i * cols + j] = f32_to_f16(row[col0 + j]);
            });
            jit::check_driver(
                api.cuMemcpyHtoDAsync(dst + r0 * cols * 2, half.data(), n * cols * 2, stream),
                "cuMemcpyHtoDAsync(dequantized " + t.name + ")");
            dev.synchronize();  // `half` is refilled next
        }
    };
    auto alloc = [&](uint64_t bytes) {
        buffers_.emplace_back(bytes);
        return buffers_.back().ptr();
    };
    // A tensor's GGUF bytes into the staging buffer, for the repacks that read them.
    auto stage = [&](const gguf::TensorInfo& t) {
        copy_to_gpu(staging.ptr(), t.data, t.n_bytes, t.name);
        if (h2d) h2d->flush();  // the repacks read the staging
    };
    // n_rows rows of GGUF blocks at src repacked into the split layout at dst by the repack entry
    // of matvec spec `spec` (one thread per 32 elements).
    auto repack = [&](const std::string& spec, ggml::Type type, CUdeviceptr src, CUdeviceptr dst,
                      int n_rows, int cols) {
        void* args[] = {&src, &dst, &n_rows};
        const uint64_t blocks = uint64_t(n_rows) * (cols / 32);
        kernels_.get(spec, repack_entry(type))
            .launch({unsigned((blocks + 255) / 256)}, {256}, 0, stream, args);
    };
    // The GGUF bytes of a matrix's slice (a tensor-parallel shard): a row range is a piece of
    // the tensor; a column range is gathered row by row (whole blocks) into `gathered`.
    std::vector<uint8_t> gathered;
    auto slice = [&](const gguf::TensorInfo& t, const GpuMatrix& g) -> gguf::TensorInfo {
        gguf::TensorInfo out = t;
        const uint64_t file_cols = t.dims.at(0);
        const uint64_t row_bytes = *ggml::row_bytes(t.type, file_cols);
        const uint64_t slice_row_bytes = *ggml::row_bytes(t.type, uint64_t(g.cols));
        out.n_bytes = slice_row_bytes * uint64_t(g.rows);
        if (uint64_t(g.cols) == file_cols) {
            out.data = t.data + uint64_t(g.row0) * row_bytes;
            return out;
        }
        const uint64_t skip = *ggml::row_bytes(t.type, uint64_t(g.col0));
        gathered.resize(out.n_bytes);
        pool.parallel_for(uint64_t(g.rows), [&](size_t r) {
            std::memcpy(gathered.data() + r * slice_row_bytes,
                        t.data + (uint64_t(g.row0) + r) * row_bytes + skip, slice_row_bytes);
        });
        out.data = gathered.data();
        return out;
    };
    auto upload_matrix = [&](GpuMatrix& g) {
        const gguf::TensorInfo& whole = file_->tensor(g.name);
        g.ptr = alloc(g.bytes);
        if (g.type != whole.type) {
            upload_dequantized(whole, g.ptr, g.rows, g.cols, g.row0, g.col0);
            progressed(g.bytes);
            return;
        }
        const gguf::TensorInfo t = slice(whole, g);
        if (g.layout == MatvecLayout::Split) {
            stage(t);
            repack(g.spec_decode, g.type, staging.ptr(), g.ptr, g.rows, g.cols);
        } else {
            copy_to_gpu(g.ptr, t.data, t.n_bytes, g.name);
            if (h2d && t.data == gathered.data()) h2d->flush();  // `gathered` is refilled next
        }
        if (!h2d && t.data == gathered.data()) dev.synchronize();
        progressed(g.bytes);
    };
    // A stacked expert tensor: in the split layout each expert's matrices are repacked on their
    // own (piece_rows rows each), so every expert reads like a dense split matrix.
    auto upload_experts = [&](GpuExperts& x) {
        GpuMatrix& g = x.all;
        if (g.layout != MatvecLayout::Split) return upload_matrix(g);
        const gguf::TensorInfo& t = file_->tensor(g.name);
        g.ptr = alloc(g.bytes);
        stage(t);
        const uint64_t src_bytes = type_bytes(g.type, x.piece_rows, g.cols),
                       dst_bytes = matrix_bytes(g.type, g.layout, x.piece_rows, g.cols);
        for (int p = 0; p < g.rows / x.piece_rows; ++p)
            repack(x.spec_one, g.type, staging.ptr() + p * src_bytes, g.ptr + p * dst_bytes,
                   x.piece_rows, g.cols);
        progressed(g.bytes);
    };
    auto upload_table = [&](GpuTable& g, bool on_gpu) {
        const gguf::TensorInfo& t = file_->tensor(g.name);
        if (!on_gpu) {
            pinned_ple_ = PinnedHost(g.bytes);
            uint8_t* dst = pinned_ple_.as<uint8_t>();
            if (g.type == t.type) {
                const uint64_t piece = uint64_t(64) << 20;
                pool.parallel_for((t.n_bytes + piece - 1) / piece, [&](size_t i) {
                    const uint64_t off = i * piece;
                    std::memcpy(dst + off, t.data + off, std::min(piece, t.n_bytes - off));
                });
            } else {
                const uint64_t src_row_bytes = *ggml::row_bytes(t.type, uint64_t(g.cols));
                pool.parallel_for(uint64_t(g.rows), [&](size_t r) {
                    thread_local std::vector<float> row;
                    row.resize(g.cols);
                    dequantize_row(t.type, t.data + r * src_row_bytes, row.data(), g.cols);
                    uint16_t* out = reinterpret_cast<uint16_t*>(dst) + r * g.cols;
                    for (int j = 0; j < g.cols; ++j) out[j] = f32_to_f16(row[j]);
                });
            }
            g.ptr = pinned_ple_.device_ptr();
            g.on_gpu = false;
            return;
        }
        g.ptr = alloc(g.bytes);
        if (g.type != t.type) {
            upload_dequantized(t, g.ptr, uint64_t(g.rows), uint64_t(g.cols));
        } else if (g.layout == MatvecLayout::Split) {  // repacked by the tied LM head's spec
            stage(t);
            repack(lm_head_.spec_decode, g.type, staging.ptr(), g.ptr, g.rows, g.cols);
        } else {
            copy_to_gpu(g.ptr, t.data, t.n_bytes, g.name);
        }
        progressed(g.bytes);
    };

    upload_table(token_embd_, true);
    if (lm_head_shares_)
        lm_head_.ptr = token_embd_.ptr;
    else
        upload_matrix(lm_head_);
    for (int l = 0; l < cfg_.n_layers; ++l) {
        GpuLayer& g = layers_[l];
        for (GpuMatrix* m :
             {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down, &g.inp_gate, &g.proj, &g.router})
            if (m->present()) upload_matrix(*m);
        for (GpuExperts* x : {&g.gate_up, &g.up_exps, &g.down_exps})
            if (x->present()) upload_experts(*x);
        if (g.moe) {  // each expert's up half: the second half of a fused expert, or its own
            const uint64_t row_bytes = g.gate_up.expert_bytes / uint64_t(g.gate_up.per_expert);
            g.up_ptr = g.up_exps.present()
                           ? g.up_exps.all.ptr
                           : g.gate_up.all.ptr + uint64_t(cfg_.expert_ffn_dim) * row_bytes;
        }
    }
    if (cfg_.has_ple()) {
        upload_matrix(ple_model_proj_);
        upload_table(ple_table_, mem_.ple_on_gpu);
    }

    // fp32 vectors: one arena, each vector 256-byte aligned (float4 loads).
    std::vector<float> arena;
    std::vector<std::pair<CUdeviceptr*, size_t>> fixups;
    auto place = [&](CUdeviceptr* target, const std::vector<float>& v) {
        if (v.empty()) return;
        arena.resize((arena.size() + 63) / 64 * 64);
        fixups.push_back({target, arena.size()});
        arena.insert(arena.end(), v.begin(), v.end());
    };
    for (int l = 0; l < cfg_.n_layers; ++l) {
        const LayerWeights& lw = w.layers[l];
        GpuLayer& g = layers_[l];
        place(&g.attn_norm, lw.attn_norm);
        place(&g.q_norm, lw.q_norm);
        place(&g.k_norm, lw.k_norm);
        place(&g.post_attention_norm, lw.post_attention_norm);
        place(&g.ffn_norm, lw.ffn_norm);
        place(&g.post_ffw_norm, lw.post_ffw_norm);
        place(&g.post_norm, lw.post_norm);
        place(&g.output_scale, std::vector<float>{lw.output_scale});
        if (g.moe) {
            // The router's input scale with 1/sqrt(d) folded in (the CPU reference multiplies
            // by the two in turn: the router logits differ by fp32 rounding at most).
            std::vector<float> router_norm(lw.router_scale.size());
            const float root = float(1.0 / std::sqrt(double(cfg_.d_model)));
            for (size_t i = 0; i < router_norm.size(); ++i)
                router_norm[i] = lw.router_scale[i] * root;
            place(&g.router_norm, router_norm);
            place(&g.expert_scale, lw.expert_scale);
            place(&g.pre_ffw_norm_2, lw.pre_ffw_norm_2);
            place(&g.post_ffw_norm_1, lw.post_ffw_norm_1);
            place(&g.post_ffw_norm_2, lw.post_ffw_norm_2);
        }
    }
    place(&output_norm_, w.output_norm);
    place(&ple_proj_norm_, w.per_layer_proj_norm);
    vectors_ = jit::DeviceBuffer(arena.size() * sizeof(float));
    copy_to_gpu(vectors_.ptr(), arena.data(), arena.size() * sizeof(float), "norm vectors");
    for (auto [target, offset] : fixups) *target = vectors_.ptr() + offset * sizeof(float);
    std::string bound;
    if (h2d) {
        // What bounds the upload: reading the file into staging (disk or page cache, page
        // faults) or the bus (waiting for a slot's previous copy to finish).
        const HostToDevice::Stats st = h2d->finish();
        bound = fmt::format(
            " [staging: read {:.2f} s at {:.1f} GB/s, bus wait {:.2f} s]", st.fill_seconds,
            st.fill_seconds > 0 ? double(st.bytes) / st.fill_seconds / 1e9 : 0.0, st.wait_seconds);
    }
    dev.synchronize();  // staging and the host arena go away next

    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    say(fmt::format("weights on the GPU in {:.1f} s ({:.1f} GB/s){}; {}", s,
                    s > 0 ? double(done) / s / 1e9 : 0.0, bound, mem_.describe()));
}

std::string GpuModel::summary() const {
    std::string types;
    for (const auto& [t, b] : layer_bytes_by_type())
        types +=
            fmt::format("{}{} {}", types.empty() ? "" : ", ", ggml::type_name(t), format_gib(b));
    return fmt::format(
        "{} ({} layers, d {}, context {}{}, KV {}), layer matrices: {}; LM head {} {}; "
        "decode reads {} per token",
        cfg_.name, cfg_.n_layers, cfg_.d_model, kv_geo_.context,
        kv_geo_.sequences > 1 ? fmt::format(" x {} sequences", kv_geo_.sequences) : "",
        kv_type_name(kv_geo_.type), types, ggml::type_name(lm_head_.type),
        lm_head_.layout == MatvecLayout::Split ? "(split)" : "(GGUF blocks)",
        format_gib(decode_bytes_));
}

}  // namespace gj::gemma4
