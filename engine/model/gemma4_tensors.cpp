#include "engine/model/gemma4_tensors.h"

namespace gj::gemma4 {

std::string layer_tensor_name(int layer, const std::string& suffix) {
    return "blk." + std::to_string(layer) + "." + suffix;
}

std::vector<TensorSpec> expected_tensors(const Config& cfg) {
    using R = TensorRole;
    const uint64_t d = cfg.d_model;
    const uint64_t V = cfg.vocab_size;
    const uint64_t L = cfg.n_layers;
    const uint64_t P = cfg.ple_dim;
    std::vector<TensorSpec> t;

    t.push_back({"token_embd.weight", {d, V}, R::Embedding});
    t.push_back({"output_norm.weight", {d}, R::NormGain});
    bool any_global = false;
    for (const auto& layer : cfg.layers) any_global |= !layer.sliding;
    if (any_global)
        t.push_back({"rope_freqs.weight", {uint64_t(cfg.head_dim_global / 2)}, R::RopeFreqs});
    if (cfg.has_ple()) {
        t.push_back({"per_layer_token_embd.weight", {L * P, V}, R::Embedding});
        t.push_back({"per_layer_model_proj.weight", {d, L * P}, R::PleModelProj});
        t.push_back({"per_layer_proj_norm.weight", {P}, R::NormGain});
    }

    for (int l = 0; l < cfg.n_layers; ++l) {
        const LayerConfig& lc = cfg.layers[l];
        const uint64_t hd = lc.head_dim;
        const uint64_t q = uint64_t(cfg.q_dim(l));
        const uint64_t kv = uint64_t(cfg.kv_dim(l));
        const uint64_t ff = lc.ffn_dim;
        auto add = [&](const std::string& suffix, std::vector<uint64_t> dims, TensorRole role,
                       bool required = true) {
            t.push_back({layer_tensor_name(l, suffix), std::move(dims), role, l, required});
        };
        add("attn_norm.weight", {d}, R::NormGain);
        add("attn_q.weight", {d, q}, R::Linear);
        if (lc.has_kv) {
            add("attn_k.weight", {d, kv}, R::Linear);
            if (lc.has_v_proj) add("attn_v.weight", {d, kv}, R::Linear);
            add("attn_k_norm.weight", {hd}, R::QkNormGain);
        }
        add("attn_output.weight", {q, d}, R::Linear);
        add("attn_q_norm.weight", {hd}, R::QkNormGain);
        add("post_attention_norm.weight", {d}, R::NormGain);
        add("ffn_norm.weight", {d}, R::NormGain);
        add("ffn_gate.weight", {d, ff}, R::Linear);
        add("ffn_up.weight", {d, ff}, R::Linear);
        add("ffn_down.weight", {ff, d}, R::Linear);
        add("post_ffw_norm.weight", {d}, R::NormGain);
        if (cfg.is_moe()) {
            const uint64_t E = cfg.n_experts;
            const uint64_t F = cfg.expert_ffn_dim;
            add("ffn_gate_inp.weight", {d, E}, R::Router);
            add("ffn_gate_inp.scale", {d}, R::RouterScale);
            add("ffn_gate_up_exps.weight", {d, 2 * F, E}, R::Experts);
            add("ffn_down_exps.weight", {F, d, E}, R::Experts);
            add("ffn_down_exps.scale", {E}, R::ExpertScale);
            add("pre_ffw_norm_2.weight", {d}, R::NormGain);
            add("post_ffw_norm_1.weight", {d}, R::NormGain);
            add("post_ffw_norm_2.weight", {d}, R::NormGain);
        }
        if (cfg.has_ple()) {
            add("inp_gate.weight", {d, P}, R::PleLayerProj);
            add("proj.weight", {P, d}, R::PleLayerProj);
            add("post_norm.weight", {d}, R::NormGain);
        }
        add("layer_output_scale.weight", {1}, R::LayerScale, /*required=*/false);
    }
    return t;
}

}  // namespace gj::gemma4
