// attn_prep family: the spec of kernel_templates/attn_prep.cu, everything between a layer's Q/K/V
// projections and its attention in one launch (Q/K norm, V-norm, RoPE, KV cache append).
//
// Spec name: "attn_prep.hd<hd>.h<H>.kv<Hkv>.rp<pairs>[.keqv].<f16|bf16|q8_0>", or
// "attn_prep.hd<hd>.h<H>.kv<Hkv>.rp<pairs>.shared" for a KV-shared layer.
// Launch (from the spec constants): block 32 * WARPS, grid (ceil(rows / WARPS), max_T),
// rows = N_HEADS + (HAS_KV ? 2 * N_KV_HEADS : 0).
#pragma once

#include "engine/gpu/kv_type.h"
#include "engine/model/gemma4_config.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Q/K norm, V-norm, RoPE and KV append of one layer, fused:
// "attn_prep.hd<hd>.h<H>.kv<Hkv>.rp<pairs>[.keqv].<f16|bf16|q8_0>", or "...rp<pairs>.shared" for
// a KV-shared layer (Q only; no KV type). Throws std::invalid_argument for impossible shapes
// (q8_0: head dims that are not multiples of 32).
jit::KernelSpec attn_prep_spec(int head_dim, int n_heads, int n_kv_heads, int rope_pairs,
                               bool has_kv, bool has_v, KvType kv);
jit::KernelSpec attn_prep_spec(const Config& cfg, int layer, KvType kv = KvType::F16);

}  // namespace gj::gemma4
