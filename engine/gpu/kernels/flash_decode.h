// flash_decode family: the spec of kernel_templates/flash_decode.cu, split-K attention over a
// layer's KV cache for decode (and the batched fallback of prefill), entries flash_decode and
// flash_combine, and the split count to launch it with.
//
// Spec name: "flash_decode.hd<hd>.g<group>.kv<Hkv>.w<window>.<f16|bf16|q8_0>[.mma]".
// Launch (from the spec constants):
//   flash_decode:  block THREADS, grid (max_splits, N_KV_HEADS, max_T), dynamic smem SMEM bytes
//                  (above 48 KiB the caller opts in once: ModuleSet::set_max_dynamic_smem)
//   flash_combine: block COMBINE_THREADS, grid (N_KV_HEADS * GROUP * HEAD_DIM / 16, max_T)
// with max_splits from flash_decode_splits below.
#pragma once

#include "engine/gpu/kv_type.h"
#include "engine/model/gemma4_config.h"
#include "jit/kernel_spec.h"

namespace gj::gemma4 {

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

// The max_splits to launch flash_decode with (and to size part_o / part_ml for): about two blocks
// per SM for `n_tokens` queries at the deepest point, never more splits than CHUNK-sized pieces
// of the most keys a query can see (max_keys, capped by WINDOW). Any value >= 1 is correct; this
// one keeps the grid fixed across depths (CUDA graphs) and the partials small.
int flash_decode_splits(const jit::KernelSpec& spec, int max_keys, int n_tokens, int sm_count);

}  // namespace gj::gemma4
