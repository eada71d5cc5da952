// Kernel plan: which template specializations a Gemma 4 model needs, for its decode path and its
// prefill; each family's spec builder (engine/gpu/kernels/) bakes in the launch-geometry choices.
#include "engine/gpu/kernel_plan.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "engine/gpu/kernels/attn_prep.h"
#include "engine/gpu/kernels/convert_f32.h"
#include "engine/gpu/kernels/dequant_f16.h"
#include "engine/gpu/kernels/embed_rows.h"
#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/flash_prefill.h"
#include "engine/gpu/kernels/gemm_wgmma.h"
#include "engine/gpu/kernels/logits.h"
#include "engine/gpu/kernels/mmq.h"
#include "engine/gpu/kernels/moe.h"
#include "engine/gpu/kernels/ple.h"
#include "engine/gpu/kernels/quantize_q8_1.h"
#include "engine/gpu/kernels/rmsnorm.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/kernels/tp_push.h"
#include "engine/model/gemma4_tensors.h"

namespace gj::gemma4 {

using spec_util::has_gemm;
using spec_util::has_matvec;
using spec_util::is_float_type;
using spec_util::is_kquant;
using spec_util::quant_type_tag;
using spec_util::supported_types;

namespace {

// Whether a plan targets sm_90, the architecture the wgmma kernels (sm_90a) are compiled for.
bool sm90_target(const std::string& arch) {
    return arch == "sm_90" || arch == "sm_90a";
}

}  // namespace

FlashWgmma flash_wgmma_mode(const jit::Flags& flags, const std::string& arch) {
    const std::string mode = flags.get_string("GEMMAJIT_FLASH_WGMMA");
    if (mode == "on" && !sm90_target(arch))
        throw ConfigError(fmt::format(
            "GEMMAJIT_FLASH_WGMMA=on needs an sm_90 GPU (wgmma is sm_90a-only); this plan "
            "targets {}",
            arch));
    if (mode == "off" || !sm90_target(arch)) return FlashWgmma::Off;
    return mode == "on" ? FlashWgmma::Always : FlashWgmma::Auto;
}

QuantPrefill quant_prefill_choice(const jit::Flags& flags, const std::string& arch,
                                  bool blas_available) {
    const std::string variant = flags.get_string("GEMMAJIT_MMQ_VARIANT");
    const bool sm90 = sm90_target(arch);
    const bool blas = blas_available && flags.get_bool("GEMMAJIT_BLAS");
    if (variant == "wgmma" && !sm90)
        throw ConfigError(fmt::format(
            "GEMMAJIT_MMQ_VARIANT=wgmma needs an sm_90 GPU (wgmma is sm_90a-only); this plan "
            "targets {}",
            arch));
    if (variant == "blas" && !blas)
        throw ConfigError(
            flags.get_bool("GEMMAJIT_BLAS")
                ? "GEMMAJIT_MMQ_VARIANT=blas needs cuBLAS, which could not be loaded"
                : "GEMMAJIT_MMQ_VARIANT=blas needs cuBLAS products (GEMMAJIT_BLAS=1)");
    if (variant == "none") return QuantPrefill::Matvec;
    if (variant == "mma") return QuantPrefill::Mma;
    if (variant == "wgmma") return QuantPrefill::Wgmma;
    if (variant == "blas") return QuantPrefill::Blas;
    return !sm90 ? QuantPrefill::Mma : blas ? QuantPrefill::WgmmaBlas : QuantPrefill::Wgmma;
}

int copy_min_rows(int d_model) {
    return d_model >= 4096 ? 512 : 256;
}

void apply_prefill_flags(PlanTypes& types, const jit::Flags& flags, const std::string& arch) {
    const QuantPrefill q = quant_prefill_choice(flags, arch, true);
    types.blas = flags.get_bool("GEMMAJIT_BLAS");
    types.mmq = q != QuantPrefill::Matvec;
    types.wgmma = q == QuantPrefill::Wgmma || q == QuantPrefill::WgmmaBlas;
    types.wgmma_producer = flags.get_bool("GEMMAJIT_WGMMA_PRODUCER");
    types.quant_blas = q == QuantPrefill::Blas || q == QuantPrefill::WgmmaBlas;
    types.decode_prefetch = int(flags.get_int("GEMMAJIT_MATVEC_PREFETCH"));
    types.matvec_shapes = parse_matvec_shapes(flags.get_string("GEMMAJIT_MATVEC_SHAPE"));
    types.flash_wgmma = flash_wgmma_mode(flags, arch) != FlashWgmma::Off;
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

    if (types.lm_head_rows < 0 || types.lm_head_rows > cfg.vocab_size)
        throw std::invalid_argument(fmt::format("kernel plan: an LM head of {} rows ({} tokens)",
                                                types.lm_head_rows, cfg.vocab_size));
    const int lm_rows = types.lm_head_rows > 0 ? types.lm_head_rows : cfg.vocab_size;

    std::vector<jit::KernelSpec> plan;
    std::set<std::string> names;
    auto add = [&](jit::KernelSpec s) {
        if (names.insert(s.name).second) plan.push_back(std::move(s));
    };
    const int d = cfg.d_model;
    const bool q_mat = quant_type_tag(types.matmul) != nullptr;  // int8 activations
    std::vector<int> col_counts = {1};
    if (types.max_cols > 1) col_counts.push_back(types.max_cols);
    // A K-quant file stores rows that are not whole super-blocks in a 32-block fallback type
    // (planned with that type), so K-quant kernels exist only for widths of whole super-blocks.
    auto fits = [](ggml::Type t, int k) { return !is_kquant(t) || k % 256 == 0; };
    // Block-quant matrices (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) take the plan's
    // layout; float ones are read as they are.
    auto layout_of = [&](ggml::Type t) {
        return spec_util::has_split(t) ? types.layout : MatvecLayout::Ggml;
    };
    // n: the matrix's rows (single-column shapes of some types depend on them).
    // ple: a PLE gate or projection (its single-column spec has the entry making its input).
    auto matvec_of = [&](ggml::Type t, int k, int ncols, int n, PleInput ple = PleInput::None) {
        return with_matvec_shapes(
            with_decode_prefetch(matvec_spec(t, k, ncols, layout_of(t), ncols == 1 ? n : 0, ple),
                                 types.decode_prefetch),
            types.matvec_shapes);
    };
    auto add_matvec = [&](ggml::Type t, int k, int n, PleInput ple = PleInput::None) {
        if (!fits(t, k)) return;
        for (int ncols : col_counts) add(matvec_of(t, k, ncols, n, ple));
    };

    // Embedding gathers: token_embd (d wide) and the PLE table (L * P wide). A K-quant
    // token_embd takes the split layout of the tied LM head, whose buffer it is (GpuModel splits
    // it only when tied, as every Gemma 4 file is: `kernels --model` plans an untied one right).
    add(embed_rows_spec(d, types.token_embd, cfg.vocab_size,
                        spec_util::is_kquant_split(types.token_embd) && fits(types.token_embd, d)
                            ? types.layout
                            : MatvecLayout::Ggml));
    if (cfg.has_ple())
        add(embed_rows_spec(cfg.n_layers * cfg.ple_dim, types.ple_token_embd, cfg.vocab_size));

    // Norms over the residual stream. Pre-norms feeding matvecs (attn_norm, ffn_norm,
    // output_norm) quantize their output for int8 matrices. Post-norms add into the stream
    // (post_attention_norm, post_ffw_norm, PLE post_norm); the layer's last one also applies
    // layer_output_scale; each may chain the next pre-norm (.n2). With PLE, the stream after the
    // FFN is itself the PLE gate's input (quantized for int8 matrices). The MoE block's
    // post_attention_norm also writes the router's input (with its scale) and the experts'
    // pre-norm (.moe); its FFN output norms are moe_ffn_out (the moe family).
    add(rmsnorm_spec(d, true, q_mat, false));
    add(rmsnorm_spec(d, true, false, true));
    add(rmsnorm_spec(d, true, false, true, true));
    add(rmsnorm_spec(d, true, q_mat, true, false, true));
    add(rmsnorm_spec(d, true, q_mat, true, true, true));
    if (cfg.has_ple() && q_mat) add(rmsnorm_spec(d, true, true, true));
    if (cfg.is_moe()) add(rmsnorm_spec(d, true, true, true, false, true, 1, true));
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
    if (q_mat || quant_type_tag(types.token_embd) || quant_type_tag(types.ple_model_proj))
        add(quantize_spec());

    // One matvec per distinct input width (and row count, where it changes the shape): d (q/k/v,
    // gate/up, PLE inp_gate), the attention output width per layer type (o-proj), each FFN width
    // (down; E2B's double-wide layers and the MoE model's dense MLP included) and P (PLE proj).
    // Then the tied LM head and the PLE context projection (both d wide) in their own types.
    std::set<std::pair<int, int>> shapes;  // (input width, rows) of every layer matrix
    for (size_t i = 0; i < cfg.layers.size(); ++i) {
        const int l = static_cast<int>(i), ffn = cfg.layers[i].ffn_dim;
        shapes.insert({d, cfg.q_dim(l)});
        shapes.insert({cfg.q_dim(l), d});
        if (cfg.layers[i].has_kv) shapes.insert({d, cfg.kv_dim(l)});
        if (ffn > 0) {
            shapes.insert({d, ffn});
            shapes.insert({ffn, d});
        }
    }
    std::set<int> widths;  // the input widths alone (the prefill dequantization specs)
    for (auto [k, n] : shapes) widths.insert(k);
    for (auto [k, n] : shapes) add_matvec(types.matmul, k, n);
    // A tensor-parallel rank's row-parallel decode products in their push form: the attention
    // output and FFN down matvecs, d rows each (a MoE model is never split).
    if (types.push_ranks > 1 && !cfg.is_moe())
        for (size_t i = 0; i < cfg.layers.size(); ++i) {
            const int l = static_cast<int>(i), ffn = cfg.layers[i].ffn_dim;
            for (int k : {cfg.q_dim(l), ffn})
                if (k > 0 && fits(types.matmul, k))
                    add(matvec_push_spec(matvec_of(types.matmul, k, 1, d), types.push_ranks));
        }
    // Layers whose V is stored in another type than Q and K (an _M mix's Q6_K attn_v) run their
    // decode Q, K and V in one launch of the mixed multi spec (GpuModel plans it per layer).
    if (types.other_v && fits(types.matmul, d))
        for (size_t i = 0; i < cfg.layers.size(); ++i)
            if (cfg.layers[i].has_kv && cfg.layers[i].has_v_proj)
                if (auto s = qkv_multi_v_spec(matvec_of(types.matmul, d, 1, cfg.q_dim(int(i))),
                                              types.matmul, *types.other_v))
                    add(std::move(*s));
    if (cfg.has_ple()) {  // the PLE gate (d -> P) and projection (P -> d)
        widths.insert({d, cfg.ple_dim});
        add_matvec(types.matmul, d, cfg.ple_dim, PleInput::Gate);
        add_matvec(types.matmul, cfg.ple_dim, d, PleInput::Proj);
    }
    // MoE: the router (a float matrix: quantizers keep it unquantized; f32 in our files) and the
    // grouped expert matvecs of gate|up (input d) and down (input F), with the routing kernels.
    if (cfg.is_moe()) {
        add(moe_spec(cfg));
        for (int ncols : col_counts)
            add(with_matvec_shapes(
                with_decode_prefetch(
                    matvec_f_spec(ggml::Type::F32, d, ncols, ncols == 1 ? cfg.n_experts : 0),
                    types.decode_prefetch),
                types.matvec_shapes));
        // Experts in the split layout (each expert repacked on its own: moe_experts_split); the
        // grouped int8 tensor-core GEMMs of prefill (gate|up: d -> F, down: F -> d) for the types
        // and layouts they read (mmq_moe_reads). A load takes the GEMMs only for both products
        // at once: a plan of one type lists each it can read (a mix's types make the pairs).
        const int F = cfg.expert_ffn_dim;
        auto expert_layout = [&](int rows, int k) {
            return types.layout == MatvecLayout::Split && moe_experts_split(types.matmul, rows, k)
                       ? MatvecLayout::Split
                       : MatvecLayout::Ggml;
        };
        for (auto [k, rows] : {std::pair{d, F}, std::pair{F, d}})
            if (fits(types.matmul, k)) {
                for (int ncols : col_counts)
                    add(matvec_moe_spec(types.matmul, k, ncols, expert_layout(rows, k)));
                if (types.mmq && mmq_moe_reads(types.matmul, expert_layout(rows, k), k))
                    add(mmq_moe_spec(types.matmul, k, rows));
            }
    }
    add_matvec(types.token_embd, d, lm_rows);
    if (cfg.has_ple()) add_matvec(types.ple_model_proj, d, cfg.n_layers * cfg.ple_dim);

    // Prefill products of the quantized matrices on the int8 tensor-core GEMM (split layout
    // only), one specialization per (input width, output rows) tile choice; the post-norms after
    // split-K products (attention output, FFN down) read their partial planes.
    // Q8_0/Q4_0 layer matrices through cuBLAS only (GEMMAJIT_MMQ_VARIANT=blas): no layer GEMMs;
    // with the wgmma GEMM as well (WgmmaBlas): both.
    const bool quant_blas = types.quant_blas && types.layout == MatvecLayout::Split;
    const bool layer_gemms = !quant_blas || types.wgmma;
    if (types.mmq && types.layout == MatvecLayout::Split && has_gemm(types.matmul) && layer_gemms) {
        add(rmsnorm_spec(d, true, true, true, false, true, kMmqSplits));
        add(rmsnorm_spec(d, true, true, true, true, true, kMmqSplits));
        if (cfg.is_moe()) add(rmsnorm_spec(d, true, true, true, false, true, kMmqSplits, true));
        if (cfg.has_ple()) add(rmsnorm_spec(d, true, true, true, false, false, kMmqSplits));
    }
    if (types.mmq && types.layout == MatvecLayout::Split) {
        auto add_gemm = [&](ggml::Type t, int k, int n, bool lm_head = false) {
            if (has_gemm(t) && n > 0 && (lm_head || layer_gemms))
                add(types.wgmma ? gemm_wgmma_spec(t, k, n, types.wgmma_producer)
                                : mmq_spec(t, k, n));
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
        add_gemm(types.token_embd, d, lm_rows, true);
        if (cfg.has_ple()) add_gemm(types.ple_model_proj, d, cfg.n_layers * cfg.ple_dim);
    }

    // PLE precompute and injection; the final softcap with the token choice.
    if (cfg.has_ple()) {
        add(ple_finish_spec(cfg.n_layers, cfg.ple_dim));
        add(gelu_mul_spec(cfg.ple_dim));
    }
    add(logits_spec(lm_rows));

    // Prefill products of float matrices through cuBLAS: activations converted to F16/BF16, and
    // the GeGLU joining the separate gate and up products. K-quant matrices (not the LM head)
    // take the same products from an F16 copy dequantized per chunk, one spec per input width.
    if (types.blas) {
        // Types whose (non-LM-head) matrices take F16 copies.
        auto copied = [&](ggml::Type t) {
            return spec_util::has_dequant_f16(t) || (quant_blas && has_gemm(t));
        };
        bool half = false;
        for (ggml::Type t : {types.matmul, types.token_embd, types.ple_model_proj})
            half = half || t == ggml::Type::F16 || t == ggml::Type::BF16 || copied(t);
        if (half) add(convert_f32_spec());
        if (is_float_type(types.matmul) || copied(types.matmul))
            for (const auto& l : cfg.layers)
                if (l.ffn_dim > 0) add(gelu_mul_spec(l.ffn_dim));
        // The norms before attention and the FFN writing the f16 input of those products.
        if (types.matmul == ggml::Type::F16 || copied(types.matmul))
            for (auto [add_, scale, norm2] :
                 {std::tuple{false, false, false}, std::tuple{true, false, true},
                  std::tuple{true, true, true}})
                add(rmsnorm_spec(d, true, true, add_, scale, norm2, 1, false, true));
        if (copied(types.matmul))
            for (int k : widths)
                if (fits(types.matmul, k))
                    add(dequant_f16_spec(types.matmul, k, layout_of(types.matmul)));
        if (cfg.has_ple() && copied(types.ple_model_proj))
            add(dequant_f16_spec(types.ple_model_proj, d, layout_of(types.ple_model_proj)));
    }

    // Attention per layer: the fused Q/K/V prep (Q only on KV-shared layers) and split-K decode
    // attention with its combine, for the layer's head dim, GQA group and window.
    for (int l = 0; l < static_cast<int>(cfg.layers.size()); ++l) {
        add(attn_prep_spec(cfg, l, types.kv));
        add(flash_decode_spec(cfg, l, types.kv, types.flash_mma));
        if (types.flash_prefill) {
            add(flash_prefill_spec(cfg, l, types.kv));
            if (types.flash_wgmma)
                for (const auto& spec : flash_prefill_wgmma_specs(cfg, l, types.kv)) add(spec);
        }
    }
    return plan;
}

}  // namespace gj::gemma4

namespace gj::gemma4 {

std::vector<PlanTypes> mix_plan_types(const Config& cfg, const QuantMix& mix, PlanTypes base) {
    const std::vector<TensorSpec> specs = expected_tensors(cfg);
    std::vector<MixTensor> in;
    for (const TensorSpec& t : specs) in.push_back({t.name, t.dims, ggml::Type::F32});
    const std::vector<ggml::Type> types = mix_types(mix, in, cfg.n_layers);
    auto upload = [](ggml::Type t) { return has_matvec(t) ? t : ggml::Type::F16; };
    std::set<ggml::Type> matrix_types;
    std::map<std::string, ggml::Type> layer_q;  // "blk.<l>." -> attn_q's type
    std::map<ggml::Type, ggml::Type> other_v;   // Q's type -> the V type of a mixed multi
    PlanTypes p = base;
    for (size_t i = 0; i < specs.size(); ++i) {
        const ggml::Type t = upload(types[i]);
        const std::string& name = specs[i].name;
        if (name.ends_with(".attn_q.weight"))
            layer_q[name.substr(0, name.size() - std::strlen("attn_q.weight"))] = t;
        if (name.ends_with(".attn_v.weight")) {
            const auto q = layer_q.find(name.substr(0, name.size() - std::strlen("attn_v.weight")));
            if (q != layer_q.end() && has_multi_v(q->second, t)) other_v[q->second] = t;
        }
        if (specs[i].name == "token_embd.weight")
            p.token_embd = t;
        else if (specs[i].name == "per_layer_token_embd.weight")
            p.ple_token_embd = t;
        else if (specs[i].role == TensorRole::PleModelProj)
            p.ple_model_proj = t;
        else if (specs[i].role == TensorRole::Linear || specs[i].role == TensorRole::Experts ||
                 specs[i].role == TensorRole::PleLayerProj)
            matrix_types.insert(t);
    }
    std::vector<PlanTypes> out;
    for (ggml::Type t : matrix_types) {
        p.matmul = t;
        const auto v = other_v.find(t);
        p.other_v = v != other_v.end() ? std::optional(v->second) : std::nullopt;
        out.push_back(p);
    }
    return out;
}

namespace {

// The union of several plans, each spec once, in the order first seen.
struct PlanUnion {
    std::vector<jit::KernelSpec> plan;
    std::set<std::string> names;
    void add(std::vector<jit::KernelSpec> specs) {
        for (auto& s : specs)
            if (names.insert(s.name).second) plan.push_back(std::move(s));
    }
};

}  // namespace

std::vector<jit::KernelSpec> build_kernel_plan(const Config& cfg, const QuantMix& mix,
                                               PlanTypes base) {
    PlanUnion all;
    for (const PlanTypes& p : mix_plan_types(cfg, mix, base)) all.add(build_kernel_plan(cfg, p));
    return std::move(all.plan);
}

std::vector<jit::KernelSpec> build_kernel_plan(const ShardPlan& shards,
                                               const std::vector<PlanTypes>& types,
                                               const FusedNormPlan* fused) {
    PlanUnion all;
    const int ranks = static_cast<int>(shards.shards.size());
    // bf16 prefill all-reduces: the conversion to bf16, the post-norms reading the bf16 sums.
    if (ranks > 1) {
        all.add({convert_f32_spec()});
        // Every rank has the whole d_model and the PLE (neither is split): rank 0's config says.
        const Config& rank0 = shards.shards.front().config;
        const int d = rank0.d_model;
        all.add(rmsnorm_bf16_input_specs(d, rank0.has_ple()).all());
        // The decode post-norms that sum the ranks' products (GpuModel's
        // plan_fused_all_reduce_norms plans the same from a load).
        if (fused) all.add(rmsnorm_lsa_specs(d, ranks, fused->headers, fused->push).all());
        // A prefill chunk's products pushed into every rank's window and the post-norms that sum
        // them (plan_fused_all_reduce_norms, GEMMAJIT_TP_PREFILL_PUSH).
        if (fused && fused->prefill_push(ranks)) {
            all.add({tp_push_spec(d, ranks, fused->headers)});
            all.add(rmsnorm_bf16_input_specs(d, rank0.has_ple(), ranks).all());
        }
    }
    for (const RankShard& rank : shards.shards)
        for (PlanTypes p : types) {
            p.lm_head_rows = rank.vocab.count;
            if (ranks > 1 && fused && fused->push) p.push_ranks = ranks;
            all.add(build_kernel_plan(rank.config, p));
        }
    return std::move(all.plan);
}

}  // namespace gj::gemma4
