// The GGUF tensor table a gemma4::Config implies, with llama.cpp's gemma4 names and ggml dim order
// ({ne0 = contiguous input dim, ne1 = output rows, ne2 = experts}). Used by the config validator
// (every tensor present with this shape), the synthetic-model writer (what to write) and the
// weight loader (what to bind).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

// What a tensor is, which decides how llama-quant stores it in real files and how the synthetic
// writer draws its values.
enum class TensorRole {
    Embedding,     // token_embd, per_layer_token_embd: quantized, gathered by row (and LM head)
    Linear,        // projections and FFN matrices: quantized
    Experts,       // stacked MoE expert matrices {in, out, E}: quantized
    PleModelProj,  // per_layer_model_proj: never quantized by llama-quant (BF16 in real files)
    PleLayerProj,  // per-layer inp_gate / proj: F32 in the real E4B Q8_0 file
    Router,        // ffn_gate_inp: never quantized
    NormGain,      // RMSNorm weights (d, head_dim or P); F32
    QkNormGain,    // attn_q_norm / attn_k_norm; F32
    RouterScale,   // ffn_gate_inp.scale {d}; F32
    ExpertScale,   // ffn_down_exps.scale {E}; F32
    LayerScale,    // layer_output_scale {1}; F32
    RopeFreqs,     // rope_freqs {head_dim_global/2}: 1.0 for rotated pairs, 1e30 for the rest
};

struct TensorSpec {
    std::string name;
    std::vector<uint64_t> dims;  // ggml order
    TensorRole role;
    int layer = -1;        // -1 for model-level tensors
    bool required = true;  // false: a loader falls back to a default (layer_output_scale)
    uint64_t fan_in() const { return dims.empty() ? 0 : dims[0]; }
};

// Per-layer tensor names, "blk.<l>.<suffix>".
std::string layer_tensor_name(int layer, const std::string& suffix);

// Every tensor the model needs, model-level tensors first, then layer by layer. KV-shared layers
// list no attn_k/attn_v/attn_k_norm; k_eq_v layers no attn_v; MoE layers use the fused
// ffn_gate_up_exps (gate rows first in each expert).
std::vector<TensorSpec> expected_tensors(const Config& cfg);

}  // namespace gj::gemma4
