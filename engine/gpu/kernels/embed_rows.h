// embed_rows family: the spec of kernel_templates/embed.cu, the row gather + scale of token_embd
// and of the PLE table (per_layer_token_embd), read in the table's GGUF type.
//
// Spec name: "embed_rows.<type>.n<n>.v<vocab>[.split]" (family "embed"; .split: a K-quant table
// in the split layout, shared with the tied LM head's matvec).
// Launch (from the spec constants): block THREADS, grid (ceil(N / 4 / THREADS), T).
#pragma once

#include "engine/gguf/ggml_types.h"
#include "engine/gpu/kernels/matvec.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Row gather + scale from an n-wide table of `vocab` rows stored as f32/f16/bf16/q8_0/q4_0 or a
// K-quant (q4_k/q5_k/q6_k):
// "embed_rows.<type>.n<n>.v<vocab>[.split]", the table in `layout` (Split: the K-quants only).
// Throws ConfigError for another type, std::invalid_argument for n not a multiple of 4 (32 for
// q8_0/q4_0, 256 for the K-quants) or a split layout the type does not have.
jit::KernelSpec embed_rows_spec(int n, ggml::Type table_type, int vocab,
                                MatvecLayout layout = MatvecLayout::Ggml);

}  // namespace gj::gemma4
