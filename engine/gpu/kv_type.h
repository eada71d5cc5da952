// The KV cache element type as the kernels see it: its names, the templates' KV_TYPE constant and
// the bytes of one cache row (shared by the attention families and the cache).
#pragma once

#include <string_view>

namespace gj::gemma4 {

// KV cache element type (GEMMAJIT_KV_TYPE), the KV_TYPE constant of the attention templates:
// f16, bf16, or q8_0 (int8 payload plane + fp16 scale per 32 elements; kernel_templates/attn_kv.cuh
// defines the layout, kv_cache.h sizes it).
enum class KvType { F16 = 0, BF16 = 1, Q8_0 = 2 };
// "f16" | "bf16" | "q8_0" (the GEMMAJIT_KV_TYPE spellings); throws ConfigError naming the value.
KvType kv_type_from_name(std::string_view name);
const char* kv_type_name(KvType kv);

// The KV_TYPE constant of the attention templates (attn_kv.cuh).
inline int kv_type_constant(KvType kv) {
    return static_cast<int>(kv);
}

// Bytes of one cache row of head_dim elements, and of its scales (q8_0: one fp16 per 32).
inline int kv_row_bytes(KvType kv, int head_dim) {
    return kv == KvType::Q8_0 ? head_dim : 2 * head_dim;
}
inline int kv_scale_row_bytes(KvType kv, int head_dim) {
    return kv == KvType::Q8_0 ? head_dim / 32 * 2 : 0;
}

}  // namespace gj::gemma4
