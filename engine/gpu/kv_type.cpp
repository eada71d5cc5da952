#include "engine/gpu/kv_type.h"

#include <fmt/format.h>

#include "engine/model/gemma4_config.h"

namespace gj::gemma4 {

KvType kv_type_from_name(std::string_view name) {
    if (name == "f16") return KvType::F16;
    if (name == "bf16") return KvType::BF16;
    if (name == "q8_0") return KvType::Q8_0;
    throw ConfigError(fmt::format("KV cache type \"{}\" is not one of f16, bf16, q8_0", name));
}

const char* kv_type_name(KvType kv) {
    switch (kv) {
        case KvType::F16:
            return "f16";
        case KvType::BF16:
            return "bf16";
        case KvType::Q8_0:
            return "q8_0";
    }
    return "?";
}

}  // namespace gj::gemma4
