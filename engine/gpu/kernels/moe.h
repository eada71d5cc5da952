// moe family: the spec of kernel_templates/moe.cu, the routing (softmax, top-k, renormalized and
// scaled weights), the grouping of expert slots by expert, and the FFN output of a MoE layer (the
// dense MLP's and the weighted experts' post-norms, summed); the expert products themselves are
// the grouped matvecs (matvec_moe_spec in kernels/matvec.h) and GEMMs (mmq_moe_spec).
//
// Spec name: "moe.e<E>.k<K>.d<D>". Launch (from the spec constants):
//   moe_route:   block 128, grid ceil(T / 4)
//   moe_group:   block THREADS, grid 1
//   moe_route_group: block 128, grid 1 (both of the above, for T <= moe_route_group_max_tokens(K))
//   moe_ffn_out: block 256, grid T
// moe_group_bound gives the most groups a batch can form (the grouped matvecs' grid).
#pragma once

#include "engine/gguf/ggml_types.h"
#include "engine/model/gemma4_config.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Routing, grouping and combining for E experts, K per token, model width D:
// "moe.e<E>.k<K>.d<D>". Throws std::invalid_argument for impossible shapes.
jit::KernelSpec moe_spec(int n_experts, int n_used, int d_model);
jit::KernelSpec moe_spec(const Config& cfg);

// The most tokens moe_route_group takes at once with K experts each: a warp per token (4) and
// every slot in one warp (T * K <= 32).
int moe_route_group_max_tokens(int n_used);

// Groups of at most `cols` slots that T tokens with K experts each can form (every expert's last
// group may be partial): min(T * K, ceil(T * K / cols) + E).
int moe_group_bound(int T, int n_used, int n_experts, int cols);

// Whether experts of `rows` x k weights of type t are repacked to the split layout (each expert's
// matrix on its own, as the split matvecs and the grouped GEMM read it): every block type (Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; split Q4_K / Q5_K are 148 / 180 bytes per 256 weights
// against the file's 144 / 176), k whole blocks, and every expert's planes starting 16-byte
// aligned in the stack (rows * k / 32 a multiple of 8; of 32 for Q4_K / Q5_K, 64 for Q6_K).
bool moe_experts_split(ggml::Type t, int rows, int k);

}  // namespace gj::gemma4
