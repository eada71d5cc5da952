#pragma once
// TEMPORARY: the attn helper's builders (uncommitted in its worktree); removed at the merge.
#include "engine/kernel_plan.h"
namespace gj::gemma4 {
enum class KvType { F16 = 0, BF16 = 1, Q8_0 = 2 };
KvType kv_type_from_name(std::string_view name);
const char* kv_type_name(KvType kv);
jit::KernelSpec attn_prep_spec(const Config& cfg, int layer, KvType kv = KvType::F16);
jit::KernelSpec flash_decode_spec(const Config& cfg, int layer, KvType kv = KvType::F16);
int flash_decode_splits(const jit::KernelSpec& spec, int max_keys, int n_tokens, int sm_count);
}  // namespace gj::gemma4
